// The console's only script. Forms marked data-api="METHOD /admin/..." are
// sent to the admin API as JSON (the sign-in cookie authenticates them; the
// x-manifold-console header proves they come from this page). A form with
// data-swap gets HTML back and puts it in place of that element; with
// data-go, success leads to that page. A tbody marked data-live listens to a
// server-sent event stream and re-fetches its rows.
"use strict";

function formBody(form) {
  const body = {};
  for (const el of form.elements) {
    if (!el.name || el.disabled) continue;
    if (el.hasAttribute("data-bool")) {
      body[el.name] = el.type === "checkbox" ? el.checked : el.value === "true";
    } else if (el.type === "checkbox") {
      if (!Array.isArray(body[el.name])) body[el.name] = [];
      if (el.checked) body[el.name].push(el.value);
    } else if (el.hasAttribute("data-list")) {
      body[el.name] = el.value.split(",").map((s) => s.trim()).filter(Boolean);
    } else if (el.type === "number") {
      if (el.value !== "") body[el.name] = Number(el.value);
    } else if (el.value !== "") {
      body[el.name] = el.value;
    }
  }
  return body;
}

function statusOf(form) {
  return form.querySelector(".status") || document.querySelector("main .status");
}

function say(form, text, isError) {
  const status = statusOf(form);
  if (!status) return;
  status.textContent = text;
  status.classList.toggle("error", Boolean(isError));
}

async function send(form) {
  const [method, url] = form.dataset.api.split(" ");
  const body = formBody(form);
  const init = { method, headers: { "x-manifold-console": "1" }, credentials: "same-origin" };
  if (Object.keys(body).length > 0) {
    init.headers["content-type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  for (const b of form.querySelectorAll("button")) b.disabled = true;
  say(form, "working…");
  try {
    const response = await fetch(url, init);
    if (form.dataset.swap) {
      const text = await response.text();
      const target = document.querySelector(form.dataset.swap);
      if (response.ok && target) {
        target.outerHTML = text;
        return;
      }
      say(form, `${response.status}: ${text.replace(/<[^>]*>/g, " ").trim() || "failed"}`, true);
      return;
    }
    const data = await response.json().catch(() => ({}));
    if (!response.ok) {
      say(form, `${response.status}: ${data.message || data.error || "failed"}`, true);
      return;
    }
    if (form.dataset.then === "secret") {
      document.getElementById("secret-value").textContent = data.token;
      document.getElementById("secret").hidden = false;
      say(form, `created token ${data.id}`);
      refreshTable("tokens");
      return;
    }
    say(form, "done");
    if (form.dataset.go) location.assign(form.dataset.go);
    else location.reload();
  } catch (e) {
    say(form, `failed: ${e}`, true);
  } finally {
    for (const b of form.querySelectorAll("button")) b.disabled = false;
  }
}

// Replaces a table's body with the same table from a fresh copy of the page.
async function refreshTable(id) {
  const response = await fetch(location.href, { credentials: "same-origin" });
  const doc = new DOMParser().parseFromString(await response.text(), "text/html");
  const fresh = doc.getElementById(id);
  const current = document.getElementById(id);
  if (fresh && current) current.replaceWith(fresh);
}

document.addEventListener("submit", (event) => {
  const form = event.target.closest("form[data-api]");
  if (!form) return;
  event.preventDefault();
  send(form);
});

function listen(tbody) {
  const live = document.getElementById("live");
  const source = new EventSource(tbody.dataset.live);
  source.addEventListener("open", () => { if (live) live.textContent = "live"; });
  source.addEventListener("error", () => { if (live) live.textContent = "reconnecting…"; });
  source.addEventListener("approvals", async () => {
    const response = await fetch(tbody.dataset.rows, { credentials: "same-origin" });
    if (response.ok) tbody.innerHTML = await response.text();
  });
}

document.addEventListener("DOMContentLoaded", () => {
  for (const tbody of document.querySelectorAll("[data-live]")) listen(tbody);
});

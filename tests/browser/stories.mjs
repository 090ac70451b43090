// The operator console's browser stories. Headless Debian chromium, driven by
// playwright-core through executablePath, against a real `manifold serve` in
// front of real `manifold-fixture` upstreams; MCP calls go over real HTTP.
// Each story saves a screenshot to $SCREENSHOT_DIR.
//
//   MANIFOLD_BIN=… MANIFOLD_FIXTURE_BIN=… SCREENSHOT_DIR=… node tests/browser/stories.mjs
//
// Run by `cargo test -p manifold --test browser` (so by scripts/test.sh).
import { spawn, execFileSync } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, writeFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const need = (name) => {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set`);
  return value;
};
const manifold = need("MANIFOLD_BIN");
const fixture = need("MANIFOLD_FIXTURE_BIN");
const shots = process.env.SCREENSHOT_DIR || join(here, "screenshots");
rmSync(shots, { recursive: true, force: true });
mkdirSync(shots, { recursive: true });

const playwrightPath = join(here, "node_modules", "playwright-core", "index.mjs");
if (!existsSync(playwrightPath)) {
  console.error("playwright-core is not installed: run scripts/install-test-deps.sh");
  process.exit(1);
}
const { chromium } = await import(playwrightPath);

function findChromium() {
  const candidates = [process.env.CHROMIUM, "/usr/bin/chromium", "/usr/bin/chromium-browser"];
  const found = candidates.find((p) => p && existsSync(p));
  if (!found) {
    console.error("chromium is not installed: run scripts/install-test-deps.sh (apt chromium)");
    process.exit(1);
  }
  return found;
}

// ------------------------------------------------------------ the gateway

const dir = mkdtempSync(join(tmpdir(), "manifold-stories-"));
const rows = [
  ["files", "read_file", "Read a file from the workspace.", { readOnlyHint: true }],
  ["files", "write_file", "Write a file in the workspace.", { readOnlyHint: false, destructiveHint: false }],
  ["files", "delete_file", "Delete a file from the workspace.", { readOnlyHint: false, destructiveHint: true }],
  ["tickets", "list_tickets", "List open tickets.", { readOnlyHint: true }],
  ["tickets", "create_ticket", "Open a ticket in the tracker.", { readOnlyHint: false, destructiveHint: false }],
  ["tickets", "close_ticket", "Close a ticket for good.", { readOnlyHint: false, destructiveHint: true }],
  ["notes", "list_notes", "List the team's notes.", { readOnlyHint: true }],
  ["notes", "add_note", "Add a note for the team.", { readOnlyHint: false, destructiveHint: false }],
  ["notes", "search_notes", "Search the team's notes by keyword.", { readOnlyHint: true }],
];
const schema = {
  type: "object",
  properties: {
    path: { type: "string" }, content: { type: "string" }, title: { type: "string" },
    id: { type: "string" }, password: { type: "string" }, text: { type: "string" },
  },
};
// The playground's form is generated from this one's schema.
const strict = {
  type: "object",
  properties: { path: { type: "string", description: "The file" }, max: { type: "integer" } },
  required: ["path"],
};
rows.push(["files", "count_lines", "Count the lines of a file in the workspace.", { readOnlyHint: true }, strict]);
writeFileSync(
  join(dir, "tools.jsonl"),
  rows.map(([server, name, description, annotations, inputSchema = schema]) =>
    JSON.stringify({ id: `${server}::${name}`, server, name, description, input_schema: inputSchema, annotations }),
  ).join("\n") + "\n",
);
const server = (name, extra = "") =>
  `[[servers]]\nname = "${name}"\ndescription = "The ${name} server"\ncommand = ${JSON.stringify(fixture)}\n` +
  `args = ${JSON.stringify(["catalog", "--file", join(dir, "tools.jsonl"), "--server", name])}\n${extra}\n`;
const configPath = join(dir, "manifold.toml");
writeFileSync(
  configPath,
  `[gateway]
mode = "progressive"
search_strategy = "bm25"

[auth]
required = true

[search.embedding]
enabled = false

[governance]
approval_wait_seconds = 60
redact_keys = ["password", "secret", "token"]

[code_mode]
workers = 1

[admin]
allow_runtime_servers = true
allowed_commands = [${JSON.stringify(fixture)}]

[[policies]]
server = "tickets"
tier = "destructive"
effect = "require_approval"

[[policies]]
server = "tickets"
tier = "write"
effect = "require_approval"

${server("files")}
${server("tickets")}
${server("notes", "autoconnect = false")}`,
);

const cli = (...args) => execFileSync(manifold, [...args, "--config", configPath], { encoding: "utf8" });
// The operator also calls tools, from the playground, as itself.
const adminToken = JSON.parse(cli(
  "token", "create", "--name", "operator", "--action", "admin", "--action", "discover", "--action", "call", "--json",
));
const agentToken = JSON.parse(cli("token", "create", "--name", "agent", "--json"));

async function startGateway() {
  const child = spawn(manifold, ["serve", "--config", configPath, "--listen", "127.0.0.1:0"], {
    env: { ...process.env, MANIFOLD_LOG: "warn,rmcp=warn" },
    stdio: ["ignore", "ignore", "pipe"],
  });
  const url = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error("the gateway did not start in 60 s")), 60_000);
    const lines = createInterface({ input: child.stderr });
    lines.on("line", (line) => {
      const m = line.match(/manifold listening on (http:\/\/\S+)\/mcp/);
      if (m) {
        clearTimeout(timer);
        resolve(m[1]);
      } else if (process.env.STORIES_VERBOSE) {
        console.error(`[manifold] ${line}`);
      }
    });
    child.on("exit", (code) => reject(new Error(`the gateway exited (${code})`)));
  });
  return [child, url];
}
// A story restarts the gateway; every later request goes to the new one.
let [gateway, base] = await startGateway();
async function restartGateway() {
  const exited = new Promise((resolve) => gateway.once("exit", resolve));
  gateway.kill("SIGTERM");
  await exited;
  [gateway, base] = await startGateway();
}

// ------------------------------------------------------- a tiny MCP client

let rpcId = 0;
async function mcp(token, method, params = {}) {
  const response = await fetch(`${base}/mcp`, {
    method: "POST",
    headers: {
      "content-type": "application/json",
      accept: "application/json, text/event-stream",
      "mcp-protocol-version": "2025-11-25",
      authorization: `Bearer ${token}`,
    },
    body: JSON.stringify({ jsonrpc: "2.0", id: ++rpcId, method, params }),
  });
  const text = await response.text();
  let body = null;
  if ((response.headers.get("content-type") || "").includes("text/event-stream")) {
    // The last data line that answers the request.
    for (const line of text.split("\n")) {
      if (line.startsWith("data:")) {
        try {
          const message = JSON.parse(line.slice(5));
          if (message.id !== undefined) body = message;
        } catch {}
      }
    }
  } else {
    try { body = JSON.parse(text); } catch { body = text; }
  }
  return { status: response.status, body };
}
const callTool = (token, name, args) => mcp(token, "tools/call", { name, arguments: args });
const toolText = (r) => (r.body?.result?.content || []).map((c) => c.text || "").join("\n");

// ------------------------------------------------------------- the stories

function check(condition, message) {
  if (!condition) throw new Error(message);
}

const browser = await chromium.launch({
  executablePath: findChromium(),
  headless: true,
  args: ["--no-sandbox", "--disable-gpu"],
});
const context = await browser.newContext({ viewport: { width: 1280, height: 800 } });
const page = await context.newPage();
page.setDefaultTimeout(15_000);
const shot = (name, p = page) => p.screenshot({ path: join(shots, `${name}.png`), fullPage: true });
const row = (tableId, text) => page.locator(`#${tableId} tbody tr`, { hasText: text });
const state = {};

const stories = [
  ["sign in with an admin token; a wrong token is refused", async () => {
    await page.goto(`${base}/console`);
    check(page.url().endsWith("/console/login"), `not sent to sign-in: ${page.url()}`);
    await page.fill("input[name=token]", "mfd_nope_wrong");
    await page.click("button:has-text('Sign in')");
    await page.getByText("Refused: unknown, expired or revoked token.").waitFor();
    await page.fill("input[name=token]", agentToken.token);
    await page.click("button:has-text('Sign in')");
    await page.getByText("Refused: this token lacks the admin action.").waitFor();
    check(page.url().endsWith("/console/login"), "a refused token got in");
    await shot("01-sign-in-refused");
    await page.fill("input[name=token]", adminToken.token);
    await page.click("button:has-text('Sign in')");
    await page.waitForURL(`${base}/console`);
    await page.locator("h1", { hasText: "Overview" }).waitFor();
    check((await page.textContent("#stat-mode")) === "progressive", "mode not shown");
    await shot("01-overview");
  }],

  ["enable a lazy server, and see its tools appear", async () => {
    await page.goto(`${base}/console`);
    const notes = row("servers", "The notes server");
    check((await notes.textContent()).includes("not_connected"), "notes should start disabled");
    const before = Number(await page.textContent("#stat-tools"));
    await Promise.all([page.waitForEvent("load"), notes.locator("button", { hasText: "Enable" }).click()]);
    await row("servers", "The notes server").locator(".badge.connected").waitFor();
    const after = Number(await page.textContent("#stat-tools"));
    check(after === before + 3, `tool count ${before} -> ${after}`);
    await notes.locator("a", { hasText: "notes" }).first().click();
    await page.waitForURL(/\/console\/catalog\?server=notes/);
    await page.getByText("notes__search_notes").waitFor();
    check((await page.textContent("#tool-count")) === "3 tools", "notes should list 3 tools");
    await shot("02-lazy-server-enabled");
  }],

  ["quarantine a tool, then approve the definition its page shows", async () => {
    await page.goto(`${base}/console/tools/files/write_file`);
    await Promise.all([page.waitForEvent("load"), page.locator("button", { hasText: "Quarantine" }).click()]);
    await page.locator("#tool-status .badge.quarantined").waitFor();
    // The button carries the hash this page shows: a definition that changes
    // after the page was drawn is refused, not approved.
    const shown = (await page.textContent("dd code.wrap")).trim();
    const sent = await page.locator('form[data-api$="/approve"] input[name="hash"]').getAttribute("value");
    check(sent === shown && shown.length >= 12, `the approval carries ${sent}, the page shows ${shown}`);
    await Promise.all([page.waitForEvent("load"), page.locator("button", { hasText: "Approve definition" }).click()]);
    await page.locator("#tool-status .badge.approved").waitFor();
    await shot("03-tool-approved");
  }],

  ["search in the playground, and compare two strategies", async () => {
    await page.goto(`${base}/console/search`);
    // bm25 ranks every tool sharing a term; regex matches the phrase literally.
    await page.fill("input[name=q]", "ticket for good");
    await page.selectOption("select[name=a]", "bm25");
    await page.selectOption("select[name=b]", "regex");
    await page.click("button:has-text('Compare')");
    await page.locator("[data-strategy=bm25] li").first().waitFor();
    const left = await page.locator("[data-strategy=bm25] li a").allTextContents();
    const right = await page.locator("[data-strategy=regex] li a").allTextContents();
    check(left.length >= 3 && left[0] === "tickets__close_ticket", `bm25 found ${left}`);
    check(right.length === 1 && right[0] === "tickets__close_ticket", `regex found ${right}`);
    await shot("03-search-playground");
    // A hit leads to the tool page: schema, stub, tier, hash.
    await page.locator("[data-strategy=bm25] li a", { hasText: "tickets__close_ticket" }).click();
    await page.locator("#stub", { hasText: "close_ticket(" }).waitFor();
    check((await page.textContent("#tool-tier")).includes("destructive"), "tier not shown");
    await shot("03-tool-page");
  }],

  ["the playground: search, open a tool, an invalid call then a valid one, and its audit row", async () => {
    await page.goto(`${base}/console/playground`);
    await page.fill("#playground-search input[name=q]", "count the lines of a file");
    await page.selectOption("#playground-search select[name=strategy]", "bm25");
    await page.click("#playground-search button");
    const hit = page.locator("#hits li a", { hasText: "files__count_lines" });
    await hit.waitFor();
    check((await page.getAttribute("#hits", "data-strategy")) === "bm25", "not ranked by bm25");
    await hit.click();
    // The details: description, tier, the TypeScript stub.
    await page.locator("#playground-stub", { hasText: "count_lines(" }).waitFor();
    check((await page.textContent("#details")).includes("Count the lines"), "no description");
    const stub = await page.textContent("#playground-stub");
    check(stub.includes("path: string") && stub.includes("max?: number"), `stub: ${stub}`);
    // The form has one field per property; path is required.
    check(await page.locator("#call-form [data-field=path] input").count() === 1, "no path field");
    check(await page.locator("#call-form [data-field=max] input").count() === 1, "no max field");
    await shot("05-playground-details");

    // Invalid: path left out, max not a number. Each message at its field.
    await page.fill("#call-form input[name='arg.max']", "three");
    await page.click("#call-form button");
    await page.locator("#call-result[data-outcome=invalid_arguments]").waitFor();
    const pathError = await page.textContent("#errors-path");
    const maxError = await page.textContent("#errors-max");
    check(pathError.includes("required"), `path error: ${pathError}`);
    check(maxError.includes("integer"), `max error: ${maxError}`);
    check((await page.inputValue("#call-form input[name='arg.max']")) === "three", "the typed value was lost");
    check((await page.getAttribute("#call-audit", "data-outcome")) === "not_forwarded", "invalid call audited wrongly");
    await shot("05-playground-invalid");

    // Valid: forwarded as the operator, with its activity row.
    await page.fill("#call-form input[name='arg.path']", "/tmp/notes.txt");
    await page.fill("#call-form input[name='arg.max']", "3");
    await page.click("#call-form button");
    await page.locator("#call-result[data-outcome=ok]").waitFor();
    check((await page.textContent("#call-result")).includes("count_lines ok"), "no result");
    check(await page.locator("#errors-path").count() === 0, "old errors are still shown");
    const audit = page.locator("#call-audit");
    check((await audit.getAttribute("data-decision")) === "allowed", "audit decision");
    check((await audit.getAttribute("data-outcome")) === "success", "audit outcome");
    check((await audit.textContent()).includes(`token:${adminToken.id}`), "the call is not the operator's");
    await shot("05-playground-called");
    // The same row is in the audit trail.
    const id = await audit.getAttribute("data-id");
    await page.goto(`${base}/console/audit?kind=activity`);
    const logged = row("audit", "files__count_lines").filter({ hasText: `"id": ${id}` });
    check(await logged.count() === 1, `activity row ${id} not in the trail`);
  }],

  ["create a token, then use it from an MCP client to list tools", async () => {
    await page.goto(`${base}/console/tokens`);
    await page.fill("#create-token input[name=name]", "ci-agent");
    await page.click("button:has-text('Create token')");
    await page.locator("#secret").waitFor({ state: "visible" });
    const secret = (await page.textContent("#secret-value")).trim();
    check(/^mfd_[^_]+_/.test(secret), `not a token: ${secret}`);
    await row("tokens", "ci-agent").waitFor();
    await shot("04-token-created");
    const listed = await mcp(secret, "tools/list");
    check(listed.status === 200, `tools/list: ${listed.status}`);
    const names = listed.body.result.tools.map((t) => t.name);
    check(names.includes("search_tools") && names.includes("execute_code"), `tools: ${names}`);
    const found = await callTool(secret, "search_tools", { query: "read a file" });
    check(toolText(found).includes("files__read_file"), `search: ${toolText(found)}`);
    state.ciToken = secret;
    await page.reload();
    check(await page.locator("#secret").isHidden(), "the secret is shown again");
    check(!(await page.content()).includes(secret), "the secret is in the page after reload");
  }],

  ["a policy denies a call, and the audit shows it", async () => {
    const before = await callTool(agentToken.token, "call_tool", { name: "files__write_file", arguments: { path: "/tmp/a" } });
    check(!before.body.result.isError, `allowed before the rule: ${toolText(before)}`);
    await page.goto(`${base}/console/policies`);
    await page.selectOption("#add-policy select[name=effect]", "deny");
    await page.fill("#add-policy input[name=server]", "files");
    await page.fill("#add-policy input[name=tool]", "write_*");
    await page.fill("#add-policy input[name=description]", "no writes to files");
    await Promise.all([page.waitForEvent("load"), page.click("button:has-text('Add rule')")]);
    await row("policies", "no writes to files").waitFor();
    const after = await callTool(agentToken.token, "call_tool", { name: "files__write_file", arguments: { path: "/tmp/a" } });
    check(after.body.result.isError === true, `not refused: ${toolText(after)}`);
    await shot("05-policy-added");
    await page.goto(`${base}/console/audit?kind=activity`);
    const denied = row("audit", "files__write_file").filter({ hasText: "denied" });
    await denied.first().waitFor();
    await shot("05-audit-shows-denial");
  }],

  ["edit a policy: the changed rule applies to the next call", async () => {
    await page.goto(`${base}/console/policies`);
    await row("policies", "no writes to files").locator("a", { hasText: "Edit" }).click();
    await page.waitForURL(/\/console\/policies\?edit=/);
    const form = page.locator("#edit-policy");
    check((await form.locator("input[name=tool]").inputValue()) === "write_*", "the form is not filled in");
    check((await form.locator("select[name=effect]").inputValue()) === "deny", "effect not filled in");
    await form.locator("input[name=tool]").fill("delete_*");
    await form.locator("input[name=description]").fill("no deletes in files");
    await shot("06-policy-edit");
    await Promise.all([page.waitForURL(`${base}/console/policies`), form.locator("button", { hasText: "Save rule" }).click()]);
    const edited = row("policies", "no deletes in files");
    await edited.waitFor();
    check((await edited.textContent()).includes("delete_*"), "the rule was not changed");
    check(await row("policies", "no writes to files").count() === 0, "the old rule is still there");
    const write = await callTool(agentToken.token, "call_tool", { name: "files__write_file", arguments: { path: "/tmp/a" } });
    check(!write.body.result.isError, `writes still refused: ${toolText(write)}`);
    const del = await callTool(agentToken.token, "call_tool", { name: "files__delete_file", arguments: { path: "/tmp/a" } });
    check(del.body.result.isError === true, `delete not refused: ${toolText(del)}`);
    await shot("06-policy-edited");
  }],

  ["approval journey: a destructive call waits, the operator approves, the call completes", async () => {
    await page.goto(`${base}/console/approvals`);
    await page.locator("#live", { hasText: "live" }).waitFor();
    const started = Date.now();
    const call = callTool(agentToken.token, "call_tool", {
      name: "tickets__close_ticket", arguments: { id: "T-7", password: "hunter2" },
    });
    // No reload: the row arrives over the event stream.
    const pending = row("approvals", "tickets__close_ticket");
    await pending.waitFor();
    const text = await pending.textContent();
    check(text.includes("[redacted]") && !text.includes("hunter2"), `arguments not redacted: ${text}`);
    check(text.includes(`token:${agentToken.id}`) && text.includes("agent"), `who asked is missing: ${text}`);
    await shot("06-approval-pending");
    await Promise.all([page.waitForEvent("load"), pending.locator("button", { hasText: "Approve" }).click()]);
    const result = await call;
    check(result.body.result && !result.body.result.isError, `call failed: ${JSON.stringify(result.body)}`);
    check(toolText(result).includes("close_ticket ok"), `unexpected result: ${toolText(result)}`);
    check(Date.now() - started < 60_000, "the call waited out its timeout");
    await page.locator("#approvals tbody td.empty").waitFor();
    await shot("06-approval-done");
  }],

  ["governed code mode: a script's write waits, the operator denies, the script sees a ToolError", async () => {
    await page.goto(`${base}/console/approvals`);
    await page.locator("#live", { hasText: "live" }).waitFor();
    const run = callTool(agentToken.token, "execute_code", {
      code: `try {
  await tickets.create_ticket({ title: "from a script" });
  return "created";
} catch (e) {
  return \`caught \${e.name}: \${e instanceof ToolError} \${e.message}\`;
}`,
    });
    const pending = row("approvals", "tickets__create_ticket");
    await pending.waitFor();
    await shot("07-script-write-pending");
    await Promise.all([page.waitForEvent("load"), pending.locator("button", { hasText: "Deny" }).click()]);
    const result = await run;
    const out = toolText(result);
    check(out.includes("caught ToolError: true"), `the script did not see a ToolError: ${out}`);
    check(out.includes("denied"), `no denial in: ${out}`);
    await page.goto(`${base}/console/audit?kind=activity`);
    await row("audit", "tickets__create_ticket").first().waitFor();
    await shot("07-script-denied-audit");
  }],

  ["revoke a token, and the next MCP call with it fails", async () => {
    check(state.ciToken, "story 4 did not leave a token");
    const ok = await mcp(state.ciToken, "tools/list");
    check(ok.status === 200, `before revoking: ${ok.status}`);
    await page.goto(`${base}/console/tokens`);
    const ci = row("tokens", "ci-agent");
    await Promise.all([page.waitForEvent("load"), ci.locator("button", { hasText: "Revoke" }).click()]);
    await row("tokens", "ci-agent").locator(".badge.revoked").waitFor();
    const refused = await mcp(state.ciToken, "tools/list");
    check(refused.status === 401, `after revoking: ${refused.status}`);
    await shot("08-token-revoked");
  }],

  ["add a server with the form; it is in the config file and still there after a restart", async () => {
    await page.goto(`${base}/console`);
    const form = page.locator("#add-server");
    await form.locator("input[name=name]").fill("archive");
    await form.locator("input[name=description]").fill("The archive, added from the console");
    await form.locator("input[name=command]").fill(fixture);
    await form.locator("input[name=args]").fill(`catalog, --file, ${join(dir, "tools.jsonl")}, --server, notes`);
    await shot("11-server-form");
    await Promise.all([page.waitForEvent("load"), form.locator("button", { hasText: "Add server" }).click()]);
    await row("servers", "The archive, added from the console").locator(".badge.connected").waitFor();
    const file = readFileSync(configPath, "utf8");
    check(file.includes('name = "archive"'), "not written to the config file");
    check(file.includes("[[policies]]"), "the rest of the file was lost");
    await shot("11-server-added");
    await restartGateway();
    // The session is in the store, so the cookie still signs in.
    await page.goto(`${base}/console`);
    await row("servers", "The archive, added from the console").locator(".badge.connected").waitFor();
    await shot("11-server-after-restart");
  }],

  ["the chart of a server counts the calls made to it", async () => {
    const made = { calls: 0, refused: 0 };
    for (let i = 0; i < 3; i++) {
      const ok = await callTool(agentToken.token, "call_tool", { name: "archive__list_notes", arguments: {} });
      check(!ok.body.result.isError, `call failed: ${toolText(ok)}`);
      made.calls++;
    }
    // Refused by validation before it reaches the server: counted as refused.
    const bad = await callTool(agentToken.token, "call_tool", { name: "archive__search_notes", arguments: { text: 5 } });
    check(bad.body.result.isError === true, `an invalid call went through: ${toolText(bad)}`);
    made.calls++;
    made.refused++;
    await page.goto(`${base}/console`);
    await row("servers", "archive").locator("a", { hasText: "Activity" }).click();
    await page.waitForURL(`${base}/console/servers/archive`);
    const chart = page.locator("#chart");
    await chart.waitFor();
    const figure = {
      calls: Number(await chart.getAttribute("data-calls")),
      errors: Number(await chart.getAttribute("data-errors")),
      refused: Number(await chart.getAttribute("data-refused")),
    };
    check(figure.calls === made.calls && figure.refused === made.refused && figure.errors === 0,
      `chart says ${JSON.stringify(figure)}, made ${JSON.stringify(made)}`);
    // The table has the same numbers, minute by minute, and a median for the forwarded calls.
    const rows = await page.$$eval("#chart-data tbody tr[data-start]", (trs) => trs.map((tr) => ({
      calls: Number(tr.querySelector(".calls").textContent),
      refused: Number(tr.querySelector(".refused").textContent),
      p50: tr.querySelector(".p50").textContent,
    })));
    const sum = (key) => rows.reduce((n, r) => n + r[key], 0);
    check(sum("calls") === made.calls && sum("refused") === made.refused, `table: ${JSON.stringify(rows)}`);
    check(rows.some((r) => /^\d+$/.test(r.p50)), `no p50 in ${JSON.stringify(rows)}`);
    const minutes = await page.$$eval("#chart svg g.minute", (gs) => gs.map((g) => Number(g.dataset.calls)));
    check(minutes.length === 60 && minutes.reduce((a, b) => a + b, 0) === made.calls, `svg: ${minutes}`);
    await shot("12-server-chart");
  }],

  ["remove the server with its page's button; it leaves the config file", async () => {
    await page.goto(`${base}/console/servers/archive`);
    await Promise.all([page.waitForURL(`${base}/console`), page.locator("#remove-server button").click()]);
    await page.locator("#servers").waitFor();
    check(await row("servers", "The archive, added from the console").count() === 0, "still listed");
    check(!readFileSync(configPath, "utf8").includes('name = "archive"'), "still in the config file");
    await shot("13-server-removed");
  }],

  ["every page is usable at 1280x800 and on a 390x844 phone", async () => {
    const paths = [
      "/console", "/console/catalog", "/console/tools/tickets/close_ticket",
      "/console/search?q=note&a=bm25&b=regex", "/console/tokens", "/console/policies",
      "/console/playground?q=lines&strategy=bm25&tool=files__count_lines", "/console/servers/files",
      "/console/approvals", "/console/audit",
    ];
    for (const [label, viewport] of [["desktop", { width: 1280, height: 800 }], ["phone", { width: 390, height: 844 }]]) {
      await page.setViewportSize(viewport);
      for (const path of paths) {
        await page.goto(`${base}${path}`);
        await page.locator("h1").waitFor();
        const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
        check(overflow <= 1, `${path} scrolls sideways by ${overflow}px at ${label} width`);
        const navVisible = await page.locator("nav a[href='/console/approvals']").isVisible();
        check(navVisible, `${path}: navigation hidden at ${label} width`);
        const name = path.split("?")[0].replace(/^\/console\/?/, "").replace(/\//g, "-") || "overview";
        if (label === "phone" || path === "/console") await shot(`09-${label}-${name}`);
      }
    }
    await page.setViewportSize({ width: 1280, height: 800 });
  }],
];

let failed = 0;
const timings = [];
const startedAll = Date.now();
for (const [i, [name, story]] of stories.entries()) {
  const started = Date.now();
  try {
    await story();
    timings.push([i + 1, name, Date.now() - started, "ok"]);
    console.log(`ok   ${i + 1}. ${name} (${Date.now() - started} ms)`);
  } catch (error) {
    failed++;
    timings.push([i + 1, name, Date.now() - started, "FAILED"]);
    console.log(`FAIL ${i + 1}. ${name}: ${error.stack || error}`);
    await shot(`failed-${i + 1}`).catch(() => {});
  }
}
console.log(`${stories.length - failed}/${stories.length} stories passed in ${Date.now() - startedAll} ms; screenshots in ${shots}`);
writeFileSync(join(shots, "timings.json"), JSON.stringify(timings, null, 2));

await browser.close();
gateway.kill("SIGTERM");
rmSync(dir, { recursive: true, force: true });
process.exit(failed ? 1 : 0);

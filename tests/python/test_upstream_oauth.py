"""The gateway as an OAuth client of a protected upstream (issue 19).

A real provider (npm `oidc-provider`, tests/npm/oidc/provider.mjs) guards a real MCP
server (the Python `mcp` SDK's resource server, oauth_upstream.py) that logs whose
token each call carried. `manifold auth login` signs the gateway in (dynamic
registration, authorization code with PKCE; the provider consents by itself and an
HTTP client plays the browser). The gateway then calls, refreshes the short-lived
token by itself, and after a restart goes on without a new sign-in.
"""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import parse_qs, urljoin, urlparse

import httpx2
import pytest
from conftest import MANIFOLD, ROOT, TIMEOUT, free_port, server_block, spawn, start_gateway, toml_str
from test_identity import Provider, audit, browse, post

pytestmark = pytest.mark.anyio

UPSTREAM = ROOT / "tests" / "python" / "oauth_upstream.py"
ACCESS_TTL = 6


def upstream_calls(log: Path) -> list[dict[str, Any]]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def sign_in(config: Path, server: str) -> str:
    """Runs `manifold auth login` and plays the browser; returns its output."""
    login = subprocess.Popen([str(MANIFOLD), "auth", "login", server, "--config", str(config)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert login.stdout is not None
    # Read on a thread, within TIMEOUT: a sign-in that prints less must fail
    # the test, not hang the suite.
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend([login.stdout.readline(), login.stdout.readline()]),
                              daemon=True)
    reader.start()
    reader.join(TIMEOUT)
    if reader.is_alive():
        login.kill()
        login.wait()
        reader.join(TIMEOUT)
    lines += [""] * (2 - len(lines))
    url = lines[1].strip()
    assert url.startswith("http"), (lines, login.stderr.read() if login.poll() is not None else "")
    callback = browse(url, lambda location: "/callback?" in location and location.startswith("http://127.0.0.1:"))
    assert httpx2.get(callback, timeout=TIMEOUT).status_code == 200
    out, err = login.communicate(timeout=TIMEOUT)
    assert login.returncode == 0, err
    return "".join(lines) + out


def start_upstream(work: Path, port: int, provider: Provider, log: Path) -> Any:
    """oauth_upstream.py on `port`, checking tokens from `provider`; returns once it answers."""
    upstream = spawn([sys.executable, str(UPSTREAM), "--port", str(port), "--issuer", provider.issuer,
                      "--jwks", provider.ready["jwks_uri"], "--log", str(log)], work / "upstream.log")
    deadline = time.monotonic() + 30
    while True:
        try:
            if httpx2.get(f"http://127.0.0.1:{port}/.well-known/oauth-protected-resource/mcp", timeout=2).status_code == 200:
                return upstream
        except httpx2.HTTPError:
            pass
        assert time.monotonic() < deadline, upstream.tail()
        time.sleep(0.2)


def whoami(gateway) -> dict[str, Any]:
    response = post(gateway, None, "tools/call", {"name": "tracker__whoami", "arguments": {}})
    assert response.status_code == 200, response.text
    body = response.json()
    assert "result" in body and not body["result"].get("isError"), body
    return body["result"]["structuredContent"]


@pytest.fixture(scope="module")
def protected(binaries: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    work = tmp_path_factory.mktemp("upstream-oauth")
    port = free_port()
    resource = f"http://127.0.0.1:{port}/mcp"
    provider = Provider(work, resource)
    provider.settings(access_ttl=ACCESS_TTL)
    log = work / "upstream-calls.jsonl"
    upstream = start_upstream(work, port, provider, log)
    config = work / "manifold.toml"
    config.write_text(
        f'[gateway]\nmode = "direct"\n\n[store]\ndata_dir = {toml_str(str(work / "data"))}\n\n'
        + server_block("tracker", "An OAuth-protected tracker", url=resource, auth="oauth", scopes=["manifold:call"])
    )
    try:
        yield {"config": config, "provider": provider, "log": log, "work": work}
    finally:
        upstream.stop()
        provider.stop()


async def test_the_gateway_signs_in_calls_refreshes_and_survives_a_restart(protected):
    config, log, work = protected["config"], protected["log"], protected["work"]

    # Before anyone signed in, the server is not usable, and the gateway says how to fix that.
    gateway = start_gateway(config, work / "manifold-before.log")
    try:
        response = post(gateway, None, "tools/call", {"name": "tracker__whoami", "arguments": {}})
        assert "tracker__whoami" not in json.dumps(post(gateway, None, "tools/list").json())
        assert "error" in response.json() or response.json()["result"].get("isError")
        time.sleep(0.5)
        assert "manifold auth login tracker" in gateway.process.log_text()
        # The operator's view says so too (the console renders the same).
        made = subprocess.run([str(MANIFOLD), "token", "create", "--name", "op", "--action", "admin",
                               "--json", "--config", str(config)], capture_output=True, text=True, timeout=TIMEOUT)
        assert made.returncode == 0, made.stderr
        admin = json.loads(made.stdout)["token"]
        servers = httpx2.get(gateway.url.removesuffix("/mcp") + "/admin/servers",
                             headers={"authorization": f"Bearer {admin}"}, timeout=TIMEOUT).json()
        tracker = next(s for s in (servers if isinstance(servers, list) else servers["servers"]) if s["name"] == "tracker")
        assert tracker["state"] == "needs_sign_in" and "manifold auth login tracker" in tracker["error"], tracker
        page = httpx2.get(gateway.url.removesuffix("/mcp") + "/console",
                          headers={"authorization": f"Bearer {admin}"}, timeout=TIMEOUT)
        assert page.status_code == 200 and "needs_sign_in" in page.text, page.status_code
        assert "manifold auth login tracker" in page.text
    finally:
        gateway.process.stop()
    assert upstream_calls(log) == []

    out = sign_in(config, "tracker")
    assert "signed in to tracker" in out
    secret_key = work / "data" / "secret.key"
    assert secret_key.exists() and oct(secret_key.stat().st_mode & 0o777) == "0o600"
    database = (work / "data" / "manifold.db").read_bytes()
    assert b"refresh" not in database.lower() and b"access_token" not in database

    gateway = start_gateway(config, work / "manifold-1.log")
    try:
        assert whoami(gateway)["sub"] == "alice"
        first = upstream_calls(log)
        assert len(first) == 1
        # The access token lives ACCESS_TTL seconds; the gateway refreshes it by itself.
        time.sleep(ACCESS_TTL + 1)
        assert whoami(gateway)["sub"] == "alice"
        second = upstream_calls(log)[-1]
        assert second["jti"] != first[0]["jti"] and second["exp"] > first[0]["exp"], (first, second)
    finally:
        gateway.process.stop()

    # A restart goes on with the stored (refreshed) tokens: no new sign-in.
    gateway = start_gateway(config, work / "manifold-2.log")
    try:
        assert whoami(gateway)["sub"] == "alice"
        assert len(upstream_calls(log)) == 3
        # Signed out while running: a call answers auth_required and how to sign in, at once.
        logout = subprocess.run([str(MANIFOLD), "auth", "logout", "tracker", "--config", str(config)],
                                capture_output=True, text=True, timeout=TIMEOUT)
        assert logout.returncode == 0 and "signed out of tracker" in logout.stdout, logout.stderr
        response = post(gateway, None, "tools/call", {"name": "tracker__whoami", "arguments": {}})
        answer = json.dumps(response.json())
        assert "auth_required" in answer and "manifold auth login tracker" in answer, answer
        assert len(upstream_calls(log)) == 3
    finally:
        gateway.process.stop()
    sign_in(config, "tracker")


async def test_two_replicas_refreshing_at_once_keep_the_grant(protected):
    """The provider rotates refresh tokens and revokes the whole grant when one is
    used twice. Two gateways on one store, whose shared token expired, refresh at
    the same moment: the store's lease lets one at a time, so both calls succeed and
    so do later ones."""
    config, log, work = protected["config"], protected["log"], protected["work"]
    if not (work / "data" / "secret.key").exists():
        sign_in(config, "tracker")
    replicas = [start_gateway(config, work / f"replica-{i}.log") for i in range(2)]
    try:
        for gateway in replicas:
            assert whoami(gateway)["sub"] == "alice"
        for _round in range(2):
            time.sleep(ACCESS_TTL + 1)
            results: list[Any] = [None, None]

            def call(i: int) -> None:
                try:
                    results[i] = whoami(replicas[i])
                except AssertionError as e:  # reported below, with both replicas' answers
                    results[i] = e

            threads = [threading.Thread(target=call, args=(i,)) for i in range(2)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=TIMEOUT)
            assert all(isinstance(r, dict) and r["sub"] == "alice" for r in results), results
        jtis = [c["jti"] for c in upstream_calls(log)[-4:]]
        assert len(set(jtis)) >= 2, jtis
    finally:
        for gateway in replicas:
            gateway.process.stop()


async def test_an_operator_signs_in_from_the_console_of_a_running_gateway(protected):
    """The console's Sign in button: the authorization server sends the browser back to
    the gateway's own /oauth/callback (PKCE state and client kept in the store), and the
    running gateway connects the server, with no restart."""
    config, work = protected["config"], protected["work"]
    subprocess.run([str(MANIFOLD), "auth", "logout", "tracker", "--config", str(config)],
                   capture_output=True, text=True, timeout=TIMEOUT, check=True)
    port = free_port()
    gateway = start_gateway(config, work / "manifold-web.log", listen=f"127.0.0.1:{port}")
    base = f"http://127.0.0.1:{port}"
    try:
        made = subprocess.run([str(MANIFOLD), "token", "create", "--name", "web-op", "--action", "admin",
                               "--json", "--config", str(config)], capture_output=True, text=True, timeout=TIMEOUT)
        admin = {"authorization": f"Bearer {json.loads(made.stdout)['token']}"}
        # Starting a sign-in is an operator's action: refused without an admin token,
        # before any request reaches the authorization server.
        assert httpx2.post(f"{base}/admin/servers/tracker/sign-in", timeout=TIMEOUT).status_code == 401
        console = httpx2.get(f"{base}/console/servers/tracker/sign-in", timeout=TIMEOUT, follow_redirects=False)
        assert console.status_code in (303, 401) and "oauth" not in console.headers.get("location", ""), console
        assert httpx2.get(f"{base}/oauth/callback?code=x&state=forged", timeout=TIMEOUT).status_code == 400
        page = httpx2.get(f"{base}/console", headers=admin, timeout=TIMEOUT)
        assert "/console/servers/tracker/sign-in" in page.text
        with httpx2.Client(follow_redirects=False, timeout=TIMEOUT) as http:
            response = http.get(f"{base}/console/servers/tracker/sign-in", headers=admin)
            assert response.status_code in (302, 303), response.text
            url = response.headers["location"]
            for _ in range(10):
                response = http.get(url)
                if response.status_code not in (302, 303):
                    break
                url = urljoin(url, response.headers["location"])
                if url.startswith(f"{base}/oauth/callback"):
                    response = http.get(url)
                    break
            assert response.status_code == 200 and "Signed in to tracker" in response.text, response.text
            # A callback is used once.
            assert http.get(url).status_code == 400
        assert whoami(gateway)["sub"] == "alice"
    finally:
        gateway.process.stop()


def browse_to_gateway(url: str, base: str) -> httpx2.Response:
    """Plays the browser from a sign-in URL to the gateway's /oauth/callback."""
    callback = browse(url, lambda location: location.startswith(f"{base}/oauth/callback"))
    return httpx2.get(callback, timeout=TIMEOUT)


def sign_in_page(browser: httpx2.Client, url: str, token: str) -> httpx2.Response:
    """Opens a caller's sign-in link (the gateway's page) and pastes `token` there."""
    page = browser.get(url)
    assert page.status_code == 200 and "Sign in to" in page.text, page.text
    state = parse_qs(urlparse(url).query)["state"][0]
    return browser.post(url.split("?")[0], data={"state": state, "token": token})


def sign_in_as_caller(url: str, token: str, base: str) -> httpx2.Response:
    """Plays the caller's browser: the gateway's sign-in page with the caller's own token,
    the authorization server's redirects, and back to /oauth/callback with the cookie the
    page set."""
    with httpx2.Client(follow_redirects=False, timeout=TIMEOUT) as browser:
        sent = sign_in_page(browser, url, token)
        assert sent.status_code == 303, sent.text
        authorize = urljoin(url, sent.headers["location"])
        assert not authorize.startswith(base), authorize
        callback = browse(authorize, lambda location: location.startswith(f"{base}/oauth/callback"))
        return browser.get(callback)


def jwt_claims(token: str) -> dict[str, Any]:
    payload = token.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))


@pytest.fixture(scope="module")
def per_principal(binaries: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Callers sign in to the gateway with the provider (`[auth.oidc]`); the tracker
    upstream, behind the same provider, has `credentials = "per_principal"` with room
    for one caller connection at a time, closed after 3 idle seconds."""
    work = tmp_path_factory.mktemp("per-principal")
    upstream_port, gateway_port = free_port(), free_port()
    upstream_resource = f"http://127.0.0.1:{upstream_port}/mcp"
    base = f"http://127.0.0.1:{gateway_port}"
    provider = Provider(work, upstream_resource, f"{base}/mcp")
    log = work / "upstream-calls.jsonl"
    upstream = start_upstream(work, upstream_port, provider, log)
    config = work / "manifold.toml"
    config.write_text(
        f'[gateway]\nmode = "progressive"\npublic_url = {toml_str(base)}\n\n'
        f'[store]\ndata_dir = {toml_str(str(work / "data"))}\n\n'
        f'[auth]\nrequired = true\nresource_url = {toml_str(base + "/mcp")}\n\n'
        f'[auth.oidc]\nissuer = {toml_str(provider.issuer)}\n\n'
        + server_block("tracker", "An OAuth-protected tracker", url=upstream_resource, auth="oauth",
                       scopes=["manifold:call"], credentials="per_principal",
                       max_principal_connections=1, principal_idle_seconds=3)
        + '\n[[policies]]\nprincipal = "user:carol"\nserver = "tracker"\neffect = "deny"\n'
    )
    gateway = start_gateway(config, work / "manifold.log", listen=f"127.0.0.1:{gateway_port}")
    try:
        yield {"config": config, "provider": provider, "log": log, "gateway": gateway, "base": base}
    finally:
        gateway.process.stop()
        upstream.stop()
        provider.stop()


async def test_each_caller_acts_upstream_as_itself(per_principal):
    gateway, provider, log, base = (per_principal[k] for k in ("gateway", "provider", "log", "base"))
    config = per_principal["config"]
    scope = "openid manifold:discover manifold:call"
    callers = {name: provider.token(name, scope, resource=f"{base}/mcp") for name in ("alice", "bob", "carol")}

    def call(name: str) -> dict[str, Any]:
        response = post(gateway, callers[name], "tools/call", {"name": "tracker__whoami", "arguments": {}})
        assert response.status_code == 200, response.text
        return response.json()

    def sign_in_url(name: str) -> str:
        answer = json.dumps(call(name))
        assert "auth_required" in answer and f"user:{name} to sign in" in answer, answer
        match = re.search(r"open (http\S+?)[\"\s\\]", answer)
        assert match, answer
        return match.group(1)

    def tracker_for(name: str) -> dict[str, Any]:
        response = post(gateway, callers[name], "tools/call",
                        {"name": "search_available_servers", "arguments": {"query": "tracker"}})
        assert response.status_code == 200, response.text
        servers = json.loads(response.json()["result"]["content"][0]["text"])["servers"]
        return next(s for s in servers if s["name"] == "tracker")

    # Nobody has signed in: the server lists nothing for them and says so, and a call
    # answers with the caller's own sign-in URL, before anything reaches the upstream.
    tracker = tracker_for("alice")
    assert tracker["state"] == "needs_sign_in" and tracker["tools"] == 0, tracker
    alice_url, bob_url = sign_in_url("alice"), sign_in_url("bob")
    assert alice_url != bob_url
    assert sign_in_url("alice") == alice_url  # handed out again, not a new sign-in per call
    # One door: carol may not use the tracker, so no sign-in starts for her, by a call
    # or by enable_server.
    for name, arguments in (("tracker__whoami", {}), ("enable_server", {"name": "tracker"})):
        answer = json.dumps(post(gateway, callers["carol"], "tools/call", {"name": name, "arguments": arguments}).json())
        assert "auth_required" not in answer and "authorize" not in answer, answer
        assert "denied by pol_" in answer, answer
    assert upstream_calls(log) == []
    def connections() -> int:
        servers = httpx2.get(f"{base}/admin/servers", headers=admin, timeout=TIMEOUT).json()
        servers = servers if isinstance(servers, list) else servers["servers"]
        return next(s for s in servers if s["name"] == "tracker")["principal_connections"]

    # The operator cannot sign in for the callers.
    made = subprocess.run([str(MANIFOLD), "token", "create", "--name", "op", "--action", "admin",
                           "--json", "--config", str(config)], capture_output=True, text=True, timeout=TIMEOUT)
    admin = {"authorization": f"Bearer {json.loads(made.stdout)['token']}"}
    refused = httpx2.post(f"{base}/admin/servers/tracker/sign-in", headers=admin, timeout=TIMEOUT)
    assert refused.status_code == 400 and "per_principal" in refused.text, refused.text

    # The link is the gateway's own page, not the authorization server.
    assert alice_url.startswith(f"{base}/oauth/sign-in?state="), alice_url
    # Alice sends her link to bob. Signed in as bob, the page refuses him; a
    # browser that skips the page (or got the authorization server's URL from
    # alice's) comes back without alice's cookie and is refused at the callback.
    # Nothing is stored for alice.
    with httpx2.Client(follow_redirects=False, timeout=TIMEOUT) as bobs_browser:
        refused = sign_in_page(bobs_browser, alice_url, callers["bob"])
        assert refused.status_code == 403 and "another caller" in refused.text, refused.text
        assert "set-cookie" not in refused.headers
    with httpx2.Client(follow_redirects=False, timeout=TIMEOUT) as alices_browser:
        sent = sign_in_page(alices_browser, alice_url, callers["alice"])
        assert sent.status_code == 303, sent.text
        alices_authorize_url = urljoin(alice_url, sent.headers["location"])
    provider.settings(login="bob")
    stolen = browse_to_gateway(alices_authorize_url, base)
    assert stolen.status_code == 403 and "did not start this sign-in" in stolen.text, stolen.text
    assert "auth_required" in json.dumps(call("alice"))

    # Each signs in at the provider as themselves (the provider's headless login
    # picks the account), from their own link in their own browser, and the
    # browser returns to the gateway.
    for name, url in (("alice", alice_url), ("bob", bob_url)):
        provider.settings(login=name)
        done = sign_in_as_caller(url, callers[name], base)
        assert done.status_code == 200 and "Signed in to tracker" in done.text, done.text

    # Their calls carry their own tokens: the upstream's log shows who acted. With
    # room for one connection, every switch of caller closes the other's; alice's
    # connection reopens from her stored token.
    order = ["alice", "bob", "alice", "bob"]
    for name in order:
        result = call(name)
        assert "result" in result and not result["result"].get("isError"), result
        assert result["result"]["structuredContent"]["sub"] == name
    seen = upstream_calls(log)
    assert [c["sub"] for c in seen] == order
    assert connections() == 1
    assert len({c["client_id"] for c in seen}) == 1
    # The callers' own gateway tokens never went upstream.
    caller_jtis = {jwt_claims(t)["jti"] for t in callers.values()}
    assert caller_jtis.isdisjoint(c["jti"] for c in seen)
    tracker = tracker_for("bob")
    assert tracker["state"] == "connected" and tracker["tools"] == 1, tracker

    # The audit records whose credential each call used.
    rows = [r for r in audit(config, "activity") if r.get("tool") == "tracker__whoami"]
    used = [(r["principal"], (r.get("details") or {}).get("credential")) for r in rows
            if (r.get("details") or {}).get("refusal") is None]
    assert used[-len(order):] == [(f"user:{n}", f"user:{n}") for n in order], rows

    # The connection closes once it has been idle for 3 s.
    deadline = time.monotonic() + 10
    while connections() != 0:
        assert time.monotonic() < deadline, "the idle connection was not closed"
        time.sleep(0.5)
    result = call("alice")
    assert result["result"]["structuredContent"]["sub"] == "alice"

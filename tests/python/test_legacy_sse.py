"""The legacy HTTP+SSE transport (2024-11-05) both ways, with real parts:

- the Python SDK's `sse_client` pointed at the gateway's `/sse` lists,
  searches, calls, gets a tool error, and a token without `call` is refused;
- the Python SDK's own server run with its `sse` transport as an upstream
  given by URL with no `transport` key: served, the chosen transport logged
  and shown by the admin API, list_changed heard, a restart survived;
- `auto` against each kind of upstream;
- `manifold import` of a Claude Desktop file with a legacy SSE server, whose
  variable reference comes out as the same reference.

Needs only the Python side of scripts/install-test-deps.sh (the `mcp` SDK).
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator, Iterator

import anyio
import pytest
from conftest import (
    CONVERSATION_TIMEOUT,
    MANIFOLD,
    START_TIMEOUT,
    TIMEOUT,
    Gateway,
    Process,
    call,
    found_names,
    free_port,
    list_tool_names,
    payload,
    server_block,
    spawn,
    start_gateway,
    text,
)
from mcp import Client
from mcp.client.sse import sse_client

pytestmark = pytest.mark.anyio

UPSTREAM = Path(__file__).resolve().parent / "sse_upstream.py"


def start_upstream(log: Path, port: int | None = None, transport: str = "sse") -> tuple[Process, str]:
    """The SDK's server on `port` (a free one by default); its URL."""
    port = port or free_port()
    process = spawn([sys.executable, str(UPSTREAM), "--port", str(port), "--transport", transport], log)
    try:
        process.wait_for_line(rf"Uvicorn running on http://127\.0\.0\.1:{port}", START_TIMEOUT)
    except Exception:
        process.stop()
        raise
    path = "/sse" if transport == "sse" else "/mcp"
    return process, f"http://127.0.0.1:{port}{path}"


def cli(config: Path, *args: str) -> str:
    done = subprocess.run(
        [str(MANIFOLD), *args, "--config", str(config)], capture_output=True, text=True, timeout=TIMEOUT
    )
    assert done.returncode == 0, f"manifold {' '.join(args)} failed:\n{done.stderr}"
    return done.stdout


def base(gateway: Gateway) -> str:
    return gateway.url.removesuffix("/mcp")


def admin_servers(gateway: Gateway, token: str) -> dict[str, Any]:
    request = urllib.request.Request(
        f"{base(gateway)}/admin/servers", headers={"Authorization": f"Bearer {token}"}
    )
    with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
        listed = json.load(response)
    servers = listed["servers"] if isinstance(listed, dict) else listed
    return {server["name"]: server for server in servers}


def chosen(server: str, transport: str) -> str:
    """The gateway's log line naming `server`'s transport (fields may be coloured)."""
    return rf"upstream transport chosen\S* \S*server\S*=\S*{server}\s\S*transport\S*=\S*\"{transport}\""


@asynccontextmanager
async def sse_session(gateway: Gateway, token: str | None = None) -> AsyncIterator[Client]:
    """The SDK's SSE client at the gateway's `/sse`, in the legacy era."""
    headers = {"Authorization": f"Bearer {token}"} if token else None
    with anyio.fail_after(CONVERSATION_TIMEOUT):
        async with Client(sse_client(f"{base(gateway)}/sse", headers=headers), mode="legacy") as client:
            yield client


@pytest.fixture(scope="module")
def legacy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A legacy SSE upstream, and a gateway (auth on) whose only server it is,
    given by URL with no `transport` key."""
    work = tmp_path_factory.mktemp("legacy-sse")
    upstream, url = start_upstream(work / "upstream.log")
    settings = f'[auth]\nrequired = true\n\n[store]\ndata_dir = "{work / "data"}"\n\n'
    server = server_block("legacy", "A legacy SSE server", url=url)
    config = work / "manifold.toml"
    config.write_text(f'[gateway]\nmode = "direct"\n\n{settings}{server}')
    gateway = start_gateway(config, work / "manifold.log")
    progressive_config = work / "progressive.toml"
    progressive_config.write_text(f'[gateway]\nmode = "progressive"\n\n{settings}{server}')
    progressive = start_gateway(progressive_config, work / "progressive.log")
    tokens = {
        name: json.loads(cli(config, "token", "create", "--name", name, *actions, "--json"))["token"]
        for name, actions in {
            "caller": ["--action", "discover", "--action", "call"],
            "looker": ["--action", "discover"],
            "operator": ["--action", "admin"],
        }.items()
    }
    state = {
        "gateway": gateway,
        "progressive": progressive,
        "upstream": upstream,
        "url": url,
        "tokens": tokens,
        "work": work,
    }
    yield state
    gateway.process.stop()
    progressive.process.stop()
    state["upstream"].stop()


async def test_an_sse_client_lists_calls_and_is_refused(legacy: dict[str, Any]) -> None:
    gateway, tokens = legacy["gateway"], legacy["tokens"]
    async with sse_session(gateway, tokens["caller"]) as client:
        names = await list_tool_names(client)
        assert {"legacy__echo", "legacy__fail"} <= set(names), names
        echoed = await call(client, "legacy__echo", {"text": "over sse"})
        assert not echoed.is_error and "echo: over sse" in text(echoed), text(echoed)
        failed = await call(client, "legacy__fail")
        assert failed.is_error, text(failed)
    # A token without `call` lists but is refused the call, over the same transport.
    async with sse_session(gateway, tokens["looker"]) as client:
        assert "legacy__echo" in await list_tool_names(client)
        refused = await call(client, "legacy__echo", {"text": "no"})
        assert refused.is_error and "action_not_allowed" in text(refused), text(refused)
    # No token, no stream.
    request = urllib.request.Request(f"{base(gateway)}/sse")
    with pytest.raises(urllib.error.HTTPError) as refused_stream:
        urllib.request.urlopen(request, timeout=TIMEOUT)
    assert refused_stream.value.code == 401


async def test_progress_comes_through_both_sse_hops(legacy: dict[str, Any]) -> None:
    seen: list[float] = []

    async def progress(value: float, total: float | None, message: str | None) -> None:
        seen.append(value)

    async with sse_session(legacy["gateway"], legacy["tokens"]["caller"]) as client:
        with anyio.fail_after(TIMEOUT):
            result = await client.call_tool("legacy__count", {"n": 3}, progress_callback=progress)
        assert "3" in text(result), text(result)
    assert seen == [1, 2, 3], seen


async def test_a_cancelled_call_is_cancelled_upstream(legacy: dict[str, Any], tmp_path: Path) -> None:
    marker = tmp_path / "cancelled"
    async with sse_session(legacy["gateway"], legacy["tokens"]["caller"]) as client:
        with anyio.move_on_after(1):
            await client.call_tool("legacy__wait", {"marker": str(marker)})
        # The client's notifications/cancelled reaches the upstream's tool.
        with anyio.fail_after(TIMEOUT):
            while not marker.exists():
                await anyio.sleep(0.05)
    assert marker.read_text() == "cancelled"


async def test_an_sse_client_searches_and_calls_in_progressive_mode(legacy: dict[str, Any]) -> None:
    async with sse_session(legacy["progressive"], legacy["tokens"]["caller"]) as client:
        assert "search_tools" in await list_tool_names(client)
        found = payload(await call(client, "search_tools", {"query": "echo the text back"}))
        assert "legacy__echo" in found_names(found), found
        echoed = await call(client, "call_tool", {"name": "legacy__echo", "arguments": {"text": "found"}})
        assert "echo: found" in text(echoed), text(echoed)
    async with sse_session(legacy["progressive"], legacy["tokens"]["looker"]) as client:
        refused = await call(client, "call_tool", {"name": "legacy__echo", "arguments": {"text": "no"}})
        assert refused.is_error and "action_not_allowed" in text(refused), text(refused)


async def test_a_legacy_upstream_is_served_heard_and_survives_a_restart(legacy: dict[str, Any]) -> None:
    gateway, tokens = legacy["gateway"], legacy["tokens"]
    gateway.process.wait_for_line(chosen("legacy", "sse"), TIMEOUT)
    assert admin_servers(gateway, tokens["operator"])["legacy"]["transport"] == "sse"
    async with sse_session(gateway, tokens["caller"]) as client:
        # list_changed from the upstream reaches the gateway's catalog.
        grew = await call(client, "legacy__grow")
        assert "grew" in text(grew), text(grew)
        with anyio.fail_after(TIMEOUT):
            while "legacy__grown" not in await list_tool_names(client):
                await anyio.sleep(0.1)
    # The upstream restarts on the same port: the gateway connects again.
    port = int(legacy["url"].split(":")[2].split("/")[0])
    legacy["upstream"].stop()
    legacy["upstream"], _ = start_upstream(legacy["work"] / "upstream-again.log", port)
    async with sse_session(gateway, tokens["caller"]) as client:
        with anyio.fail_after(TIMEOUT):
            while True:
                result = await call(client, "legacy__echo", {"text": "again"})
                if not result.is_error:
                    break
                await anyio.sleep(0.2)
        assert "echo: again" in text(result)


async def test_auto_picks_the_transport_each_upstream_speaks(tmp_path: Path) -> None:
    sse_upstream, sse_url = start_upstream(tmp_path / "sse.log")
    http_upstream, http_url = start_upstream(tmp_path / "http.log", transport="streamable-http")
    config = tmp_path / "manifold.toml"
    config.write_text(
        '[gateway]\nmode = "direct"\n\n'
        + server_block("old", "SSE only", url=sse_url)
        + "\n"
        + server_block("new", "Streamable HTTP", url=http_url)
    )
    gateway = start_gateway(config, tmp_path / "manifold.log")
    try:
        for server, transport in [("old", "sse"), ("new", "streamable_http")]:
            gateway.process.wait_for_line(chosen(server, transport), TIMEOUT)
        async with sse_session(gateway) as client:
            for server in ["old", "new"]:
                result = await call(client, f"{server}__echo", {"text": server})
                assert f"echo: {server}" in text(result), text(result)
    finally:
        gateway.process.stop()
        sse_upstream.stop()
        http_upstream.stop()


async def test_an_imported_sse_server_connects_and_keeps_its_reference(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    upstream, url = start_upstream(tmp_path / "upstream.log")
    claude = tmp_path / "claude_desktop_config.json"
    claude.write_text(
        json.dumps(
            {
                "mcpServers": {
                    "hosted": {
                        "type": "sse",
                        "url": url,
                        "headers": {"Authorization": "Bearer ${HOSTED_TOKEN}"},
                    }
                }
            }
        )
    )
    config = tmp_path / "manifold.toml"
    config.write_text('[gateway]\nmode = "direct"\n')
    imported = subprocess.run(
        [str(MANIFOLD), "import", "--from", str(claude), "--config", str(config), "--write"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert imported.returncode == 0, imported.stderr
    written = config.read_text()
    assert 'transport = "sse"' in written, written
    assert 'Authorization = "Bearer ${HOSTED_TOKEN}"' in written, written
    monkeypatch.setenv("HOSTED_TOKEN", "not-a-real-token")
    gateway = start_gateway(config, tmp_path / "manifold.log")
    try:
        async with sse_session(gateway) as client:
            with anyio.fail_after(TIMEOUT):
                while "hosted__echo" not in await list_tool_names(client):
                    await anyio.sleep(0.1)
            result = await call(client, "hosted__echo", {"text": "imported"})
            assert "echo: imported" in text(result), text(result)
    finally:
        gateway.process.stop()
        upstream.stop()

"""Governance end to end: a real `manifold serve` with auth on, in front of the
real npm `@modelcontextprotocol/server-memory` (whose tools carry read-only,
write and destructive annotations), driven by the real Python MCP client with
gateway tokens made by the real CLI. An operator approves a waiting
destructive call from the CLI, and the audit shows all of it.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator, Iterator

import anyio
import httpx2
import pytest
from conftest import (
    CONVERSATION_TIMEOUT,
    MANIFOLD,
    TIMEOUT,
    Gateway,
    call,
    list_tool_names,
    payload,
    server_block,
    start_gateway,
    text,
)
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

pytestmark = pytest.mark.anyio

READ_ONLY = {"memory__read_graph", "memory__search_nodes", "memory__open_nodes"}

POLICIES = """
[[policies]]
principal = "group:readers"
tier = "write"
effect = "deny"
description = "readers only read"

[[policies]]
principal = "group:readers"
tier = "destructive"
effect = "deny"
description = "readers only read"

[[policies]]
tier = "destructive"
effect = "require_approval"
description = "a person approves every destructive call"
"""


def cli(config: Path, *args: str) -> str:
    done = subprocess.run(
        [str(MANIFOLD), *args, "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert done.returncode == 0, f"manifold {' '.join(args)} failed:\n{done.stderr}"
    return done.stdout


def json_lines(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def governed(binaries: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    work = tmp_path_factory.mktemp("governed")
    memory = server_block(
        "memory",
        "Knowledge graph memory: entities, relations and observations",
        command=str(binaries["memory"]),
        env={"MEMORY_FILE_PATH": str(work / "memory.jsonl")},
    )
    settings = (
        '[auth]\nrequired = true\n\n[governance]\napproval_wait_seconds = 60\n'
        f'\n[store]\ndata_dir = "{work / "data"}"\n'
    )
    direct = work / "direct.toml"
    direct.write_text(f'[gateway]\nmode = "direct"\n\n{settings}{POLICIES}\n{memory}')
    progressive = work / "progressive.toml"
    progressive.write_text(f'[gateway]\nmode = "progressive"\n\n{settings}\n{memory}')
    gateways = {
        "direct": start_gateway(direct, work / "direct.log"),
        "progressive": start_gateway(progressive, work / "progressive.log"),
    }
    tokens = {
        name: json.loads(cli(direct, "token", "create", "--name", name, *extra, "--json"))
        for name, extra in {
            "reader": ["--group", "readers"],
            "agent": [],
        }.items()
    }
    yield {"config": direct, "gateways": gateways, "tokens": tokens}
    for gateway in gateways.values():
        gateway.process.stop()


@asynccontextmanager
async def connect_as(gateway: Gateway, token: str, mode: str = "auto") -> AsyncIterator[Client]:
    headers = {"Authorization": f"Bearer {token}"}
    with anyio.fail_after(CONVERSATION_TIMEOUT):
        async with httpx2.AsyncClient(headers=headers, timeout=TIMEOUT) as http:
            transport = streamable_http_client(gateway.url, http_client=http)
            async with Client(transport, mode=mode, read_timeout_seconds=TIMEOUT) as client:
                yield client


def post(url: str, headers: dict[str, str]) -> tuple[int, Any, str]:
    """One raw JSON-RPC POST; the headers come back case-insensitive."""
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}).encode()
    request = urllib.request.Request(
        url,
        data=body,
        headers={"Content-Type": "application/json", "Accept": "application/json, text/event-stream", **headers},
    )
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
            return response.status, response.headers, response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read().decode()


async def test_requests_without_a_valid_token_get_401(governed: dict[str, Any]) -> None:
    url = governed["gateways"]["direct"].url
    status, headers, _ = post(url, {})
    assert status == 401
    challenge = headers.get("WWW-Authenticate", "")
    assert challenge.startswith("Bearer ") and "resource_metadata=" in challenge, challenge
    metadata_url = challenge.split('resource_metadata="')[1].split('"')[0]
    with urllib.request.urlopen(metadata_url, timeout=TIMEOUT) as response:
        metadata = json.load(response)
    assert metadata["resource"] == url
    assert metadata["bearer_methods_supported"] == ["header"]

    forged = "mfd_" + "0" * 12 + "_" + "A" * 43
    status, headers, body = post(url, {"Authorization": f"Bearer {forged}"})
    assert status == 401
    assert 'error="invalid_token"' in headers.get("WWW-Authenticate", "")
    assert "unknown" in body


async def test_read_only_token_sees_and_calls_only_read_only_tools(governed: dict[str, Any]) -> None:
    reader = governed["tokens"]["reader"]["token"]
    async with connect_as(governed["gateways"]["direct"], reader) as client:
        assert set(await list_tool_names(client)) == READ_ONLY
        graph = await call(client, "memory__read_graph")
        assert not graph.is_error, text(graph)
        refused = await call(
            client,
            "memory__create_entities",
            {"entities": [{"name": "x", "entityType": "t", "observations": []}]},
        )
        assert refused.is_error
        assert refused.structured_content["error"] == "denied", refused.structured_content

    # The meta-tool surface applies the same rules.
    async with connect_as(governed["gateways"]["progressive"], reader) as client:
        found = payload(await call(client, "search_tools", {"query": "entities relations graph", "limit": 50}))
        names = {t["name"] for s in found["servers"] for t in s["tools"]}
        assert names and names <= READ_ONLY, names


async def test_destructive_call_waits_for_an_approval_from_the_cli(governed: dict[str, Any]) -> None:
    config = governed["config"]
    agent = governed["tokens"]["agent"]["token"]
    async with connect_as(governed["gateways"]["direct"], agent) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        assert "memory__delete_entities" in tools and "memory__create_entities" in tools
        marked = tools["memory__delete_entities"].meta or {}
        assert marked.get("manifold/requiresApproval") is True, marked
        created = await call(
            client,
            "memory__create_entities",
            {"entities": [{"name": "doomed", "entityType": "test", "observations": ["temporary"]}]},
        )
        assert not created.is_error, text(created)

        result: dict[str, Any] = {}

        async def delete() -> None:
            result["value"] = await call(client, "memory__delete_entities", {"entityNames": ["doomed"]})

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(delete)
            pending: list[dict[str, Any]] = []
            deadline = time.monotonic() + TIMEOUT
            while not pending and time.monotonic() < deadline:
                await anyio.sleep(0.2)
                pending = json.loads(cli(config, "approvals", "list", "--json"))
            assert len(pending) == 1, pending
            assert pending[0]["tool"] == "memory__delete_entities"
            assert pending[0]["redacted_args"] == {"entityNames": ["doomed"]}
            assert "value" not in result, "the call waits for the operator"
            cli(config, "approvals", "approve", pending[0]["id"], "--by", "test-operator")
        deleted = result["value"]
        assert not deleted.is_error, text(deleted)
        graph = await call(client, "memory__read_graph")
        assert "doomed" not in text(graph)

    # The audit shows it all: who saw what, who was refused, who approved.
    activity = json_lines(cli(config, "audit", "export", "--kind", "activity"))
    by_tool = {(row["tool"], row["decision"], row["outcome"]) for row in activity}
    assert ("memory__create_entities", "denied", "not_forwarded") in by_tool
    assert ("memory__read_graph", "allowed", "success") in by_tool
    approved = [r for r in activity if r["tool"] == "memory__delete_entities"]
    assert approved and approved[-1]["decision"] == "approved", approved
    assert approved[-1]["approval_id"] == pending[0]["id"]
    assert approved[-1]["outcome"] == "success"
    assert all("doomed" not in json.dumps(r) for r in activity), "arguments are not kept"
    discovery = json_lines(cli(config, "audit", "export", "--kind", "discovery"))
    reader_id = governed["tokens"]["reader"]["id"]
    assert any(r["token_id"] == reader_id and r["visible_count"] == len(READ_ONLY) for r in discovery), discovery
    access = json_lines(cli(config, "audit", "export", "--kind", "access"))
    assert any(r["outcome"] == "failure" and r["reason"] == "unknown" for r in access)
    assert any(r["outcome"] == "success" and r["token_id"] == reader_id for r in access)


async def test_revoked_token_is_refused_on_its_next_request(governed: dict[str, Any]) -> None:
    config = governed["config"]
    made = json.loads(cli(config, "token", "create", "--name", "short-lived", "--json"))
    async with connect_as(governed["gateways"]["direct"], made["token"]) as client:
        assert READ_ONLY <= set(await list_tool_names(client))
        assert not (await call(client, "memory__read_graph")).is_error
        cli(config, "token", "revoke", made["id"])
        # The CLI is another process: the gateway hears its change within the
        # governance window (20 ms plus one read on SQLite); wait well past it.
        await anyio.sleep(0.2)
        # The client may reuse its cached tool list; a call is a new request.
        with pytest.raises(Exception):
            await call(client, "memory__read_graph")
    status, headers, body = post(governed["gateways"]["direct"].url, {"Authorization": f"Bearer {made['token']}"})
    assert status == 401 and "revoked" in body, body
    assert 'error="invalid_token"' in headers.get("WWW-Authenticate", "")
    listed = cli(config, "token", "list", "--json")
    assert made["token"] not in listed
    state = {t["id"]: t for t in json.loads(listed)}[made["id"]]
    assert state["state"] == "revoked"


def admin_request(url: str, token: str | None, method: str = "GET", body: dict[str, Any] | None = None) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read().decode() or "null")


async def test_admin_api_denies_a_waiting_call(governed: dict[str, Any]) -> None:
    config = governed["config"]
    gateway = governed["gateways"]["direct"]
    base = gateway.url.removesuffix("/mcp")
    admin = json.loads(cli(config, "token", "create", "--name", "ops", "--action", "admin", "--json"))
    agent = governed["tokens"]["agent"]["token"]

    assert admin_request(f"{base}/admin/approvals", None)[0] == 401
    assert admin_request(f"{base}/admin/approvals", agent)[0] == 403

    async with connect_as(gateway, agent) as client:
        result: dict[str, Any] = {}

        async def delete() -> None:
            result["value"] = await call(client, "memory__delete_entities", {"entityNames": ["ghost"]})

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(delete)
            pending: list[dict[str, Any]] = []
            deadline = time.monotonic() + TIMEOUT
            while not pending and time.monotonic() < deadline:
                await anyio.sleep(0.2)
                status, listed = admin_request(f"{base}/admin/approvals", admin["token"])
                assert status == 200, listed
                pending = listed["approvals"]
            assert [p["tool"] for p in pending] == ["memory__delete_entities"]
            status, decided = admin_request(
                f"{base}/admin/approvals/{pending[0]['id']}/deny", admin["token"], "POST", {"by": "alice"}
            )
            assert status == 200 and decided["status"] == "denied", decided
            assert decided["decided_by"].startswith("alice"), decided
        refused = result["value"]
        assert refused.is_error
        assert refused.structured_content["error"] == "approval_denied"
        assert refused.structured_content["approval_id"] == pending[0]["id"]
    # Deciding again is a conflict, an unknown id is 404.
    again = admin_request(f"{base}/admin/approvals/{pending[0]['id']}/approve", admin["token"], "POST")
    assert again[0] == 409, again
    assert admin_request(f"{base}/admin/approvals/apr_nope/approve", admin["token"], "POST")[0] == 404

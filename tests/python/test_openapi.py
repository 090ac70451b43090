"""An OpenAPI upstream end to end: a real FastAPI service (tests/python/
openapi_service.py) serving its own OpenAPI 3.1 document, one `openapi` server
in front of it behind a real `manifold serve` with auth on, and the real Python
MCP client. Its operations are listed as tools with their input schemas, each
kind of call returns the service's answer, an error status is `isError`, and a
token without the scope cannot call an operation tool.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any, AsyncIterator, Iterator

import anyio
import httpx2
import pytest
from conftest import (
    CONVERSATION_TIMEOUT,
    MANIFOLD,
    START_TIMEOUT,
    TIMEOUT,
    Gateway,
    call,
    free_port,
    server_block,
    spawn,
    text,
)
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

pytestmark = pytest.mark.anyio

SERVICE = Path(__file__).resolve().parent / "openapi_service.py"
PYTHON = Path(__file__).resolve().parents[2] / ".venv" / "bin" / "python"
API_KEY = "k-123-secret"

TOOLS = {
    "shop__get_item",
    "shop__create_item",
    "shop__replace_item",
    "shop__delete_item",
    "shop__read_file_files_name_get",
    "shop__large",
    "shop__echo",
}

ITEM = {
    "name": "lamp",
    "price": 12.5,
    "owner": {"name": "Ada", "address": {"street": "1 Main St", "city": "Springfield"}},
    "tags": [{"label": "light"}],
    "category": {"name": "home", "children": [{"name": "lighting", "children": []}]},
}


def cli(config: Path, *args: str) -> str:
    done = subprocess.run(
        [str(MANIFOLD), *args, "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert done.returncode == 0, f"manifold {' '.join(args)} failed:\n{done.stderr}"
    return done.stdout


@contextmanager
def running_shop(work: Path, settings: str = "", overrides: str = "", **server: Any) -> Iterator[dict[str, Any]]:
    """The service, and a gateway in front of it with an operator and an agent token."""
    port = free_port()
    service = spawn([str(PYTHON), str(SERVICE), str(port)], work / "service.log")
    try:
        service.wait_for_line(rf"Uvicorn running on http://127\.0\.0\.1:{port}", START_TIMEOUT)
        base = f"http://127.0.0.1:{port}"
        block = server_block(
            "shop",
            "A shop's HTTP API: items, files and echoes",
            openapi=f"{base}/openapi.json",
            headers={"X-Api-Key": "${SHOP_KEY}"},
            query={"api_key": "${SHOP_KEY}"},
            # The service's own counter is for the test, not a tool.
            exclude=["ran"],
            **server,
        )
        config = work / "manifold.toml"
        config.write_text(
            '[gateway]\nmode = "direct"\n\n[auth]\nrequired = true\n\n'
            f'[store]\ndata_dir = "{work / "data"}"\n\n{settings}\n{block}\n{overrides}'
        )
        gateway_process = spawn(
            [str(MANIFOLD), "serve", "--config", str(config), "--listen", "127.0.0.1:0"],
            work / "manifold.log",
            env={"SHOP_KEY": API_KEY, "MANIFOLD_LOG": os.environ.get("MANIFOLD_LOG", "info,rmcp=warn")},
        )
        try:
            m = gateway_process.wait_for_line(r"manifold listening on (http://\S+/mcp)", START_TIMEOUT)
            gateway = Gateway(m.group(1), config, gateway_process)
            tokens = {
                name: json.loads(cli(config, "token", "create", "--name", name, *extra, "--json"))["token"]
                for name, extra in {
                    "operator": [],
                    "agent": ["--action", "discover", "--action", "call", "--scope", "shop__get_item"],
                }.items()
            }
            yield {"gateway": gateway, "tokens": tokens, "base": base}
        finally:
            gateway_process.stop()
    finally:
        service.stop()


@pytest.fixture(scope="module")
def shop(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    with running_shop(tmp_path_factory.mktemp("openapi")) as running:
        yield running


@asynccontextmanager
async def connect_as(shop: dict[str, Any], who: str) -> AsyncIterator[Client]:
    headers = {"Authorization": f"Bearer {shop['tokens'][who]}"}
    with anyio.fail_after(CONVERSATION_TIMEOUT):
        async with httpx2.AsyncClient(headers=headers, timeout=TIMEOUT) as http:
            transport = streamable_http_client(shop["gateway"].url, http_client=http)
            async with Client(transport, read_timeout_seconds=TIMEOUT) as client:
                yield client


def ran(shop: dict[str, Any]) -> dict[str, int]:
    """How many times each operation ran, straight from the service."""
    with urllib.request.urlopen(f"{shop['base']}/ran", timeout=TIMEOUT) as response:
        return json.load(response)


async def test_operations_are_listed_as_tools_with_their_input_schemas(shop: dict[str, Any]) -> None:
    async with connect_as(shop, "operator") as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
    assert set(tools) == TOOLS
    get_item = tools["shop__get_item"]
    assert get_item.description == "Read one item"
    assert get_item.input_schema == {
        "type": "object",
        "properties": {
            "item_id": {"type": "integer", "title": "Item Id"},
            "verbose": {"type": "boolean", "default": False, "title": "Verbose"},
            "x-request-id": {"anyOf": [{"type": "string"}, {"type": "null"}], "title": "X-Request-Id"},
        },
        "required": ["item_id"],
        "additionalProperties": False,
    }
    # The body's `$ref`s are expanded in place, the recursive one cut.
    create = tools["shop__create_item"].input_schema
    assert create["required"] == ["body"]
    body = create["properties"]["body"]
    assert "$ref" not in json.dumps(body)
    assert body["properties"]["owner"]["properties"]["address"]["required"] == ["street", "city"]
    category = next(c for c in body["properties"]["category"]["anyOf"] if c.get("type") == "object")
    assert category["properties"]["children"]["items"] == {
        "description": "recursive reference to #/components/schemas/Category-Input, not expanded"
    }
    assert tools["shop__create_item"].output_schema["properties"]["id"] == {"type": "integer", "title": "Id"}
    assert set(tools["shop__replace_item"].input_schema["required"]) == {"item_id", "body"}
    # The method's tier, as annotations.
    assert get_item.annotations.read_only_hint is True
    assert tools["shop__create_item"].annotations.read_only_hint is False
    assert tools["shop__create_item"].annotations.destructive_hint is False
    assert tools["shop__delete_item"].annotations.destructive_hint is True


async def test_each_kind_of_operation_returns_the_services_answer(shop: dict[str, Any]) -> None:
    async with connect_as(shop, "operator") as client:
        read = await call(client, "shop__get_item", {"item_id": 7, "verbose": True, "x-request-id": "r-1"})
        assert not read.is_error, text(read)
        assert read.structured_content == {"id": 7, "verbose": True, "request_id": "r-1"}
        assert json.loads(text(read)) == read.structured_content

        created = await call(client, "shop__create_item", {"body": ITEM})
        assert not created.is_error, text(created)
        item_id = created.structured_content["id"]
        assert created.structured_content == {**ITEM, "id": item_id}

        replaced = await call(
            client, "shop__replace_item", {"item_id": item_id, "body": {**ITEM, "name": "desk lamp"}}
        )
        assert replaced.structured_content["name"] == "desk lamp", text(replaced)

        deleted = await call(client, "shop__delete_item", {"item_id": item_id})
        assert deleted.structured_content == {"deleted": item_id}, text(deleted)

        # An error status is a tool error with the status and the body's start.
        again = await call(client, "shop__delete_item", {"item_id": item_id})
        assert again.is_error
        assert text(again) == f'HTTP 404 Not Found: {{"detail":"no item {item_id}"}}'

        # Text in, text out; a large answer comes whole (no limit is set).
        large = await call(client, "shop__large", {"size": 300_000})
        assert not large.is_error and large.structured_content is None
        assert text(large) == "x" * 300_000

        # A path value stays one segment: `/` and `..` are encoded.
        file = await call(client, "shop__read_file_files_name_get", {"name": "../../admin"})
        assert file.structured_content == {"name": "../../admin", "raw_path": "/files/..%2F..%2Fadmin"}

        # The operator's key goes in its header and query; the caller's
        # bearer and no cookie go upstream.
        echo = await call(client, "shop__echo", {})
        assert echo.structured_content == {
            "query": {"api_key": API_KEY},
            "authorization": None,
            "x_api_key": API_KEY,
            "cookie": None,
        }

        # Arguments are checked against the input schema before any request.
        before = ran(shop).get("get_item", 0)
        invalid = await call(client, "shop__get_item", {"item_id": "seven"})
        assert invalid.is_error
        assert ran(shop).get("get_item", 0) == before


async def test_a_token_without_the_scope_cannot_call_an_operation_tool(shop: dict[str, Any]) -> None:
    before = ran(shop).get("create_item", 0)
    async with connect_as(shop, "agent") as client:
        names = {t.name for t in (await client.list_tools()).tools}
        assert names == {"shop__get_item"}
        allowed = await call(client, "shop__get_item", {"item_id": 1})
        assert allowed.structured_content["id"] == 1, text(allowed)
        refused = await call(client, "shop__create_item", {"body": ITEM})
        assert refused.is_error, text(refused)
    assert ran(shop).get("create_item", 0) == before
    # Both are in the broker's audit, as any MCP server's calls would be
    # (the CLI sees rows once the gateway has committed them).
    config = shop["gateway"].config
    deadline = time.monotonic() + TIMEOUT
    while True:
        activity = [json.loads(line) for line in cli(config, "audit", "export", "--kind", "activity").splitlines()]
        outcomes = {(row["tool"], row["outcome"]) for row in activity if row["decision"] != "allowed"}
        if ("shop__create_item", "not_forwarded") in outcomes:
            break
        assert time.monotonic() < deadline, activity
        time.sleep(0.1)
    assert any(r["tool"] == "shop__get_item" and r["outcome"] == "success" for r in activity), activity


async def test_a_changed_operation_is_quarantined_like_a_changed_mcp_tool(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    work = tmp_path_factory.mktemp("openapi-revised")
    # The document is read again once its listing is older than a second.
    with running_shop(work, default_ttl_ms=1000) as shop:
        config = shop["gateway"].config
        async with connect_as(shop, "operator") as client:
            assert "shop__get_item" in {t.name for t in (await client.list_tools()).tools}
            approve(config, "get_item")
            first = await call(client, "shop__get_item", {"item_id": 1})
            assert not first.is_error, text(first)

            # A new release changes the operation's summary. Calls refresh the
            # catalog's listing (the client's own list is cached for 30 s).
            post(f"{shop['base']}/revise")
            deadline = time.monotonic() + TIMEOUT
            while not (refused := await call(client, "shop__get_item", {"item_id": 1})).is_error:
                assert time.monotonic() < deadline, "the revised operation was never quarantined"
                await anyio.sleep(0.2)
            assert "quarantined (definition_changed)" in text(refused), text(refused)
            before = ran(shop).get("get_item", 0)
            again = await call(client, "shop__get_item", {"item_id": 1})
            assert again.is_error and ran(shop).get("get_item", 0) == before
        async with connect_as(shop, "operator") as client:
            assert "shop__get_item" not in {t.name for t in (await client.list_tools()).tools}

            # Approving the new definition brings it back, as revised.
            approve(config, "get_item")
            deadline = time.monotonic() + TIMEOUT
            while (answer := await call(client, "shop__get_item", {"item_id": 2})).is_error:
                assert time.monotonic() < deadline, f"the approved revision never came back: {text(answer)}"
                await anyio.sleep(0.2)
        async with connect_as(shop, "operator") as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            assert tools["shop__get_item"].description == "Read one item, with its history"


OVERRIDES = """
[[servers.tools]]
name = "get_item"
rename = "find_item"
description = "Find one catalogue item by its numeric id: name, price and owner."

[[servers.tools]]
name = "delete_item"
hidden = true
"""


async def test_overrides_rename_and_hide_an_operation_tool(tmp_path_factory: pytest.TempPathFactory) -> None:
    with running_shop(tmp_path_factory.mktemp("openapi-overrides"), overrides=OVERRIDES) as shop:
        async with connect_as(shop, "operator") as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            assert "shop__find_item" in tools and "shop__get_item" not in tools, sorted(tools)
            assert "shop__delete_item" not in tools, sorted(tools)
            assert tools["shop__find_item"].description.startswith("Find one catalogue item")
            hidden = await call(client, "shop__delete_item", {"item_id": 1})
            assert hidden.is_error and "Unknown tool" in text(hidden), text(hidden)
        # The agent's token is scoped to the upstream's name, shop__get_item.
        async with connect_as(shop, "agent") as client:
            before = ran(shop).get("get_item", 0)
            found = await call(client, "shop__find_item", {"item_id": 1})
            assert not found.is_error, text(found)
            assert ran(shop).get("get_item", 0) == before + 1
        assert ran(shop).get("delete_item", 0) == 0


def approve(config: Path, tool: str) -> None:
    """`manifold tools approve shop TOOL`, once the gateway has recorded the tool."""
    deadline = time.monotonic() + TIMEOUT
    while True:
        done = subprocess.run(
            [str(MANIFOLD), "tools", "approve", "shop", tool, "--config", str(config)],
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
        )
        if done.returncode == 0:
            return
        assert time.monotonic() < deadline, done.stderr
        time.sleep(0.2)


def post(url: str) -> None:
    request = urllib.request.Request(url, data=b"", method="POST")
    with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
        assert response.status == 200

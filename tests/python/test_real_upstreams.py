"""Manifold in front of real MCP servers, driven by the real Python MCP client.

Upstreams: npm `@modelcontextprotocol/server-everything` (stdio, and
Streamable HTTP), npm `@modelcontextprotocol/server-memory` (stdio), PyPI
`mcp-server-time` and `mcp-server-git` (stdio). Downstream: the `mcp` 2.x
`Client` over Streamable HTTP, once negotiating 2026-07-28 (`mode="auto"`) and
once forcing the 2025-11-25 initialize handshake (`mode="legacy"`).
"""

from __future__ import annotations

import json
import subprocess
from datetime import datetime, timedelta, timezone

import pytest
from conftest import (
    EXPECTED_PROTOCOL,
    MANIFOLD,
    TIMEOUT,
    call,
    connect,
    found_names,
    list_tool_names,
    payload,
    text,
    write_config,
)

pytestmark = pytest.mark.anyio

META_TOOLS = [
    "search_tools",
    "get_tool_details",
    "call_tool",
    "search_available_servers",
    "enable_server",
    "disable_server",
    "execute_code",
]

# Upstreams that answer only the 2025-11-25 handshake (TypeScript SDK 1.x).
LEGACY_UPSTREAMS = {"everything", "everything_http", "memory"}
# Upstreams that serve both eras (Python SDK 2.x) and so negotiate 2026-07-28.
MODERN_UPSTREAMS = {"time", "git"}

# --- progressive mode ---------------------------------------------------------


async def test_client_negotiates_its_era_with_the_gateway(progressive_gateway, client_mode):
    async with connect(progressive_gateway.url, client_mode) as client:
        assert client.protocol_version == EXPECTED_PROTOCOL[client_mode]
        assert client.server_info is not None and client.server_info.name == "manifold"


async def test_progressive_mode_lists_exactly_the_meta_tools(progressive_gateway, client_mode):
    async with connect(progressive_gateway.url, client_mode) as client:
        assert await list_tool_names(client) == META_TOOLS
        # Searching and calling do not change the array (prompt caches hold).
        await call(client, "search_tools", {"query": "time"})
        assert await list_tool_names(client) == META_TOOLS


@pytest.mark.parametrize(
    ("query", "server", "expected"),
    [
        ("current time in a timezone", None, "time__get_current_time"),
        ("git working tree status", None, "git__git_status"),
        ("create entities in the knowledge graph", None, "memory__create_entities"),
        ("echo back the input string", "everything", "everything__echo"),
        ("echo back the input string", "everything_http", "everything_http__echo"),
    ],
)
async def test_search_tools_finds_real_upstream_tools(progressive_gateway, client_mode, query, server, expected):
    args = {"query": query, "limit": 5}
    if server:
        args["server"] = server
    async with connect(progressive_gateway.url, client_mode) as client:
        found = payload(await call(client, "search_tools", args))
    names = found_names(found)
    assert names and names[0] == expected, found
    if server:
        assert {s["server"] for s in found["servers"]} == {server}, found


async def test_search_tools_regex_lists_every_tool_of_a_server(progressive_gateway, client_mode):
    async with connect(progressive_gateway.url, client_mode) as client:
        found = payload(
            await call(
                client,
                "search_tools",
                {"query": "^time__", "strategy": "regex", "detail": "name", "limit": 50},
            )
        )
    assert sorted(found_names(found)) == ["time__convert_time", "time__get_current_time"]


async def test_get_tool_details_returns_upstream_schemas(progressive_gateway, client_mode):
    required = {
        "time__get_current_time": ["timezone"],
        "git__git_status": ["repo_path"],
        "memory__create_entities": ["entities"],
        "everything__echo": ["message"],
        "everything_http__echo": ["message"],
    }
    async with connect(progressive_gateway.url, client_mode) as client:
        details = payload(await call(client, "get_tool_details", {"names": list(required)}))
    tools = {t["name"]: t for t in details["tools"]}
    assert set(tools) == set(required), details
    for name, fields in required.items():
        schema = tools[name]["inputSchema"]
        assert schema["type"] == "object", (name, schema)
        assert schema["required"] == fields, (name, schema)
        for field in fields:
            assert field in schema["properties"], (name, schema)
    # The time server declares an output schema; it comes through too.
    assert "datetime" in tools["time__get_current_time"]["outputSchema"]["properties"]
    assert "unknown" not in details


async def test_call_time_get_current_time(progressive_gateway, client_mode):
    async with connect(progressive_gateway.url, client_mode) as client:
        result = await call(
            client, "call_tool", {"name": "time__get_current_time", "arguments": {"timezone": "UTC"}}
        )
    assert not result.is_error, text(result)
    data = result.structured_content or json.loads(text(result))
    assert data["timezone"] == "UTC"
    when = datetime.fromisoformat(data["datetime"])
    assert when.utcoffset() == timedelta(0)
    assert abs(datetime.now(timezone.utc) - when) < timedelta(minutes=5)


async def test_call_git_status_on_the_temp_repo(progressive_gateway, client_mode, git_repo):
    async with connect(progressive_gateway.url, client_mode) as client:
        result = await call(
            client, "call_tool", {"name": "git__git_status", "arguments": {"repo_path": str(git_repo)}}
        )
    assert not result.is_error, text(result)
    status = text(result)
    assert "On branch main" in status, status
    assert "untracked.txt" in status, status


async def test_call_memory_create_entities_then_read_graph(progressive_gateway, client_mode, request):
    entity = f"manifold-it-{client_mode}"
    async with connect(progressive_gateway.url, client_mode) as client:
        created = await call(
            client,
            "call_tool",
            {
                "name": "memory__create_entities",
                "arguments": {
                    "entities": [
                        {"name": entity, "entityType": "test", "observations": [f"created by the {client_mode} client"]}
                    ]
                },
            },
        )
        assert not created.is_error, text(created)
        graph = await call(client, "call_tool", {"name": "memory__read_graph", "arguments": {}})
    assert not graph.is_error, text(graph)
    data = graph.structured_content or json.loads(text(graph))
    entities = {e["name"]: e for e in data["entities"]}
    assert entities[entity]["observations"] == [f"created by the {client_mode} client"], data


@pytest.mark.parametrize("server", ["everything", "everything_http"])
async def test_call_everything_echo(progressive_gateway, client_mode, server, request):
    message = f"hello over {server} from {client_mode}"
    async with connect(progressive_gateway.url, client_mode) as client:
        result = await call(client, "call_tool", {"name": f"{server}__echo", "arguments": {"message": message}})
    assert not result.is_error, text(result)
    assert text(result) == f"Echo: {message}"


@pytest.mark.parametrize(
    ("tool", "arguments", "expected"),
    [
        # mcp-server-time raises ToolError for an unknown zone.
        ("time__get_current_time", {"timezone": "Mars/Olympus"}, "Invalid timezone"),
        # mcp-server-git confines itself to --repository.
        ("git__git_status", {"repo_path": "/definitely/not/the/repo"}, "outside the allowed repository"),
        # server-everything throws for a non-positive id (the schema allows any number).
        ("everything__get-resource-reference", {"resourceId": -1}, "Invalid resourceId"),
        ("everything_http__get-resource-reference", {"resourceId": -1}, "Invalid resourceId"),
    ],
)
async def test_upstream_is_error_passes_through(progressive_gateway, client_mode, tool, arguments, expected, request):
    async with connect(progressive_gateway.url, client_mode) as client:
        result = await call(client, "call_tool", {"name": tool, "arguments": arguments})
    assert result.is_error is True, text(result)
    assert expected in text(result), text(result)


async def test_argument_validation_lists_every_violation(progressive_gateway, client_mode):
    async with connect(progressive_gateway.url, client_mode) as client:
        result = await call(client, "call_tool", {"name": "time__convert_time", "arguments": {"time": 5}})
        nested = await call(
            client,
            "call_tool",
            {"name": "memory__create_entities", "arguments": {"entities": [{"name": 1}]}},
        )
    assert result.is_error is True
    message = text(result)
    for violation in ("source_timezone", "target_timezone", "/time"):
        assert violation in message, message
    assert nested.is_error is True
    message = text(nested)
    for violation in ("entityType", "observations", "/entities/0/name"):
        assert violation in message, message


async def test_unknown_tool_suggests_the_real_name(progressive_gateway, client_mode):
    async with connect(progressive_gateway.url, client_mode) as client:
        result = await call(
            client, "call_tool", {"name": "time__get_curent_time", "arguments": {"timezone": "UTC"}}
        )
    assert result.is_error is True
    assert "Did you mean" in text(result) and "time__get_current_time" in text(result), text(result)


async def test_code_mode_stubs_for_every_real_tool_parse_as_typescript(progressive_gateway, client_mode):
    """Every tool of every real server gets declarations that our own
    TypeScript front end accepts: the script is the declarations alone."""
    async with connect(progressive_gateway.url, client_mode) as client:
        names = []
        for server in ["everything", "everything_http", "memory", "time", "git"]:
            args = {"query": ".", "strategy": "regex", "detail": "name", "limit": 50, "server": server}
            found = found_names(payload(await call(client, "search_tools", args)))
            assert found and len(found) < 50, (server, found)
            names += found
        declarations = []
        for start in range(0, len(names), 20):
            details = payload(
                await call(client, "get_tool_details", {"names": names[start : start + 20], "format": "typescript"})
            )
            declarations.append(details["typescript"])
        for source in declarations:
            result = await call(client, "execute_code", {"code": source + "\nreturn 'parsed';"})
            assert not result.is_error, text(result)
            assert text(result).strip() == 'Returned: "parsed"', text(result)


async def test_code_mode_calls_real_servers_and_returns_only_the_output(progressive_gateway, client_mode):
    script = """
const now = await time.get_current_time({ timezone: "UTC" });
const converted = await time.convert_time({ source_timezone: "UTC", time: "12:00", target_timezone: "Asia/Tokyo" });
const echoed = await everything.echo({ message: "from code mode" });
console.log(typeof now.datetime, converted.target.timezone);
return { echo: (echoed as ToolResult).content[0].text };
"""
    async with connect(progressive_gateway.url, client_mode) as client:
        result = await call(client, "execute_code", {"code": script})
    out = text(result)
    assert not result.is_error, out
    assert out.startswith("string Asia/Tokyo\n"), out
    assert "from code mode" in out, out


async def test_search_available_servers_shows_each_state(progressive_gateway, client_mode):
    async with connect(progressive_gateway.url, client_mode) as client:
        listed = payload(await call(client, "search_available_servers", {}))
        git_only = payload(await call(client, "search_available_servers", {"query": "git repository"}))
    servers = {s["name"]: s for s in listed["servers"]}
    assert set(servers) == MODERN_UPSTREAMS | LEGACY_UPSTREAMS | {"lazy_time", "broken"}, listed
    expected_tools = {"time": 2, "git": 12, "memory": 9}
    for name in MODERN_UPSTREAMS | LEGACY_UPSTREAMS:
        assert servers[name]["state"] == "connected", servers[name]
        assert servers[name]["enabled"] is True, servers[name]
        assert servers[name]["tools"] >= expected_tools.get(name, 10), servers[name]
    assert servers["everything"]["tools"] == servers["everything_http"]["tools"]
    assert servers["lazy_time"]["state"] == "not_connected", servers["lazy_time"]
    assert servers["lazy_time"]["tools"] == 0
    assert servers["broken"]["state"] == "failed", servers["broken"]
    assert "no-such-mcp-server" in servers["broken"]["error"], servers["broken"]
    assert git_only["servers"][0]["name"] == "git", git_only


# --- direct mode --------------------------------------------------------------


async def test_direct_mode_lists_qualified_upstream_tools(direct_gateway, client_mode):
    async with connect(direct_gateway.url, client_mode) as client:
        names = await list_tool_names(client)
    assert not set(META_TOOLS) & set(names), names
    for name in (
        "time__get_current_time",
        "time__convert_time",
        "git__git_status",
        "memory__create_entities",
        "memory__read_graph",
        "everything__echo",
        "everything_http__echo",
    ):
        assert name in names, names
    assert all("__" in n for n in names), names
    assert len(names) == len(set(names))


async def test_direct_mode_calls_a_modern_upstream(direct_gateway, client_mode, git_repo):
    async with connect(direct_gateway.url, client_mode) as client:
        await list_tool_names(client)
        now = await call(client, "time__get_current_time", {"timezone": "UTC"})
        status = await call(client, "git__git_status", {"repo_path": str(git_repo)})
    assert not now.is_error, text(now)
    assert (now.structured_content or json.loads(text(now)))["timezone"] == "UTC"
    assert not status.is_error, text(status)
    assert "untracked.txt" in text(status)


@pytest.mark.parametrize("server", ["everything", "everything_http"])
async def test_direct_mode_calls_a_legacy_upstream(direct_gateway, client_mode, server, request):
    async with connect(direct_gateway.url, client_mode) as client:
        await list_tool_names(client)
        result = await call(client, f"{server}__echo", {"message": "direct"})
    assert not result.is_error, text(result)
    assert text(result) == "Echo: direct"


# --- protocol eras of the upstreams -------------------------------------------


def test_catalog_stats_reports_each_upstreams_era(upstreams, work):
    config = write_config(work / "stats.toml", "auto", upstreams.blocks("stats"))
    out = subprocess.run(
        [str(MANIFOLD), "catalog", "stats", "--json", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=2 * TIMEOUT,
    )
    assert out.returncode == 0, out.stderr
    stats = json.loads(out.stdout)
    eras = {s["name"]: (s["status"]["era"], s["status"]["protocol_version"]) for s in stats["servers"]}
    print("upstream eras:", json.dumps(eras, sort_keys=True))
    for server in stats["servers"]:
        assert server["status"]["state"] == "connected", server
        assert server["tools"] > 0, server
    for name in MODERN_UPSTREAMS:
        assert eras[name] == ("modern", "2026-07-28"), eras
    for name in LEGACY_UPSTREAMS:
        assert eras[name][0] == "legacy", eras
        assert eras[name][1] < "2026-07-28", eras
    assert set(eras) == MODERN_UPSTREAMS | LEGACY_UPSTREAMS


def test_a_bare_config_file_name_resolves_against_the_working_directory(upstreams, work):
    write_config(work / "bare.toml", "auto", upstreams.blocks("bare"))
    out = subprocess.run(
        [str(MANIFOLD), "catalog", "stats", "--json", "--config", "bare.toml"],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=2 * TIMEOUT,
    )
    assert out.returncode == 0, out.stderr
    states = {s["name"]: s["status"]["state"] for s in json.loads(out.stdout)["servers"]}
    assert states == dict.fromkeys(MODERN_UPSTREAMS | LEGACY_UPSTREAMS, "connected"), states

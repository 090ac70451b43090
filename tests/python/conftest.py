"""Fixtures for the integration tests: real upstream MCP servers (npm and PyPI)
behind a real `manifold serve`, driven by the real Python MCP client.

Nothing is built here. `target/debug/manifold` (or `$MANIFOLD_BIN`) must exist
(`cargo build --workspace --bins`) and the upstreams must be installed
(`scripts/install-test-deps.sh`); a missing piece fails the session with a
message that says which command to run.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator, Iterator

import anyio
import pytest
from mcp import Client
from pydantic import ValidationError

if sys.version_info < (3, 11):  # pragma: no cover
    from exceptiongroup import BaseExceptionGroup

ROOT = Path(__file__).resolve().parents[2]
# MANIFOLD_BIN runs the suite against another build (e.g. a release binary).
MANIFOLD = Path(os.environ.get("MANIFOLD_BIN", ROOT / "target" / "debug" / "manifold")).resolve()
VENV_BIN = ROOT / ".venv" / "bin"
NPM_BIN = ROOT / "tests" / "npm" / "node_modules" / ".bin"

# Every await on the network is bounded by this (seconds).
TIMEOUT = 30
# A whole client conversation (one test) is bounded by this.
CONVERSATION_TIMEOUT = 120
# Starting a gateway spawns every upstream (node and Python start-up included).
START_TIMEOUT = 60

# The downstream client modes every client-facing test runs under:
# "auto" negotiates 2026-07-28 via server/discover; "legacy" forces the
# 2025-11-25 initialize handshake.
CLIENT_MODES = ["auto", "legacy"]
EXPECTED_PROTOCOL = {"auto": "2026-07-28", "legacy": "2025-11-25"}


def _require(path: Path, hint: str) -> Path:
    if not path.exists():
        pytest.exit(f"{path} is missing: {hint}", returncode=1)
    return path


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Process:
    """A child process whose stderr goes to a file (never a pipe that can fill)."""

    proc: subprocess.Popen[bytes]
    log: Path

    def log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def wait_for_line(self, pattern: str, timeout: float) -> re.Match[str]:
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.log_text().splitlines():
                if m := regex.search(line):
                    return m
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"process exited with {self.proc.returncode} before printing {pattern!r}:\n{self.tail()}"
                )
            time.sleep(0.05)
        raise TimeoutError(f"no line matching {pattern!r} within {timeout}s:\n{self.tail()}")

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def stop(self) -> None:
        if self.proc.poll() is None:
            # Its own process group: SIGTERM reaches it and anything it forgot to reap.
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)


def spawn(args: list[str], log: Path, env: dict[str, str] | None = None, cwd: Path | None = None) -> Process:
    handle = log.open("wb")
    try:
        proc = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=handle,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            cwd=cwd,
            start_new_session=True,
        )
    finally:
        handle.close()
    return Process(proc, log)


def toml_str(value: str) -> str:
    return json.dumps(value)  # a JSON string is a valid TOML basic string


def server_block(name: str, description: str, **fields: Any) -> str:
    lines = ["[[servers]]", f"name = {toml_str(name)}", f"description = {toml_str(description)}"]
    for key, value in fields.items():
        if isinstance(value, bool):
            lines.append(f"{key} = {'true' if value else 'false'}")
        elif isinstance(value, (int, float)):
            lines.append(f"{key} = {value}")
        elif isinstance(value, str):
            lines.append(f"{key} = {toml_str(value)}")
        elif isinstance(value, list):
            lines.append(f"{key} = [{', '.join(toml_str(v) for v in value)}]")
        elif isinstance(value, dict):
            inner = ", ".join(f"{k} = {toml_str(v)}" for k, v in value.items())
            lines.append(f"{key} = {{ {inner} }}")
        else:  # pragma: no cover
            raise TypeError(f"{key}: {value!r}")
    return "\n".join(lines) + "\n"


# --- upstreams ----------------------------------------------------------------


@pytest.fixture(scope="session")
def binaries() -> dict[str, Path]:
    install = "run scripts/install-test-deps.sh"
    return {
        "manifold": _require(MANIFOLD, "run cargo build --workspace --bins"),
        "time": _require(VENV_BIN / "mcp-server-time", install),
        "git": _require(VENV_BIN / "mcp-server-git", install),
        "everything": _require(NPM_BIN / "mcp-server-everything", install),
        "memory": _require(NPM_BIN / "mcp-server-memory", install),
    }


@pytest.fixture(scope="session")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("manifold-it")


@pytest.fixture(scope="session")
def git_repo(work: Path) -> Path:
    """A repository with one commit and one untracked file, `untracked.txt`."""
    repo = work / "repo"
    repo.mkdir()
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "Manifold Tests",
        "GIT_AUTHOR_EMAIL": "tests@manifold.invalid",
        "GIT_COMMITTER_NAME": "Manifold Tests",
        "GIT_COMMITTER_EMAIL": "tests@manifold.invalid",
    }

    def git(*args: str) -> None:
        subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True, timeout=TIMEOUT)

    git("init", "--quiet", "--initial-branch=main")
    (repo / "README.md").write_text("manifold integration test repository\n")
    git("add", "README.md")
    git("commit", "--quiet", "-m", "initial commit")
    (repo / "untracked.txt").write_text("not yet added\n")
    return repo.resolve()


@pytest.fixture(scope="session")
def everything_http(binaries: dict[str, Path], work: Path) -> Iterator[str]:
    """server-everything over Streamable HTTP on a free loopback port; yields its /mcp URL.

    The server reads its port from PORT (default 3001)."""
    last_error: Exception | None = None
    for attempt in range(3):
        port = free_port()
        server = spawn(
            [str(binaries["everything"]), "streamableHttp"],
            work / f"everything-http-{attempt}.log",
            env={"PORT": str(port)},
        )
        try:
            server.wait_for_line(rf"listening on port {port}\b", START_TIMEOUT)
        except (RuntimeError, TimeoutError) as e:  # e.g. the port was taken meanwhile
            server.stop()
            last_error = e
            continue
        yield f"http://127.0.0.1:{port}/mcp"
        server.stop()
        return
    raise RuntimeError(f"server-everything (HTTP) did not start: {last_error}")


@dataclass
class Upstreams:
    binaries: dict[str, Path]
    git_repo: Path
    everything_url: str
    work: Path

    def blocks(self, tag: str, *, extras: bool = False) -> str:
        """The `[[servers]]` entries. `tag` keeps each gateway's memory file its own.

        With `extras`, two more: one that is configured but not connected at
        start, and one whose command does not exist (it fails to connect)."""
        b = self.binaries
        out = [
            server_block(
                "time",
                "Current time and timezone conversion",
                command=str(b["time"]),
                args=["--local-timezone", "UTC"],
            ),
            server_block(
                "git",
                "Git repository status, diffs, commits and branches",
                command=str(b["git"]),
                args=["--repository", str(self.git_repo)],
            ),
            server_block(
                "memory",
                "Knowledge graph memory: entities, relations and observations",
                command=str(b["memory"]),
                env={"MEMORY_FILE_PATH": str(self.work / f"memory-{tag}.jsonl")},
            ),
            server_block(
                "everything",
                "MCP reference test server over stdio",
                command=str(b["everything"]),
                args=["stdio"],
            ),
            server_block(
                "everything_http",
                "MCP reference test server over Streamable HTTP",
                url=self.everything_url,
            ),
        ]
        if extras:
            out.append(
                server_block(
                    "lazy_time",
                    "Second time server, connected on demand",
                    command=str(b["time"]),
                    args=["--local-timezone", "UTC"],
                    autoconnect=False,
                )
            )
            out.append(
                server_block(
                    "broken",
                    "A server whose program does not exist",
                    command=str(self.work / "no-such-mcp-server"),
                    restart=False,
                    connect_timeout_ms=5000,
                )
            )
        return "\n".join(out)


@pytest.fixture(scope="session")
def upstreams(binaries: dict[str, Path], git_repo: Path, everything_http: str, work: Path) -> Upstreams:
    return Upstreams(binaries, git_repo, everything_http, work)


# --- the gateway --------------------------------------------------------------


@dataclass
class Gateway:
    url: str
    config: Path
    process: Process


def write_config(path: Path, mode: str, servers: str) -> Path:
    path.write_text(f'[gateway]\nmode = "{mode}"\n\n{servers}')
    return path


def start_gateway(config: Path, log: Path, listen: str = "127.0.0.1:0") -> Gateway:
    process = spawn(
        [str(MANIFOLD), "serve", "--config", str(config), "--listen", listen],
        log,
        env={"MANIFOLD_LOG": os.environ.get("MANIFOLD_LOG", "info,rmcp=warn")},
    )
    try:
        m = process.wait_for_line(r"manifold listening on (http://\S+/mcp)", START_TIMEOUT)
    except Exception:
        process.stop()
        raise
    return Gateway(m.group(1), config, process)


@pytest.fixture(scope="session")
def progressive_gateway(upstreams: Upstreams, work: Path) -> Iterator[Gateway]:
    config = write_config(work / "progressive.toml", "progressive", upstreams.blocks("progressive", extras=True))
    gateway = start_gateway(config, work / "manifold-progressive.log")
    yield gateway
    gateway.process.stop()


@pytest.fixture(scope="session")
def direct_gateway(upstreams: Upstreams, work: Path) -> Iterator[Gateway]:
    config = write_config(work / "direct.toml", "direct", upstreams.blocks("direct"))
    gateway = start_gateway(config, work / "manifold-direct.log")
    yield gateway
    gateway.process.stop()


# --- the client ---------------------------------------------------------------


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(params=CLIENT_MODES)
def client_mode(request: pytest.FixtureRequest) -> str:
    return request.param


class MissingResultType(AssertionError):
    """A 2026-07-28 result arrived without its required `resultType`."""


def _leaves(group: BaseExceptionGroup) -> list[BaseException]:
    out: list[BaseException] = []
    for e in group.exceptions:
        out.extend(_leaves(e) if isinstance(e, BaseExceptionGroup) else [e])
    return out


@asynccontextmanager
async def connect(url: str, mode: str) -> AsyncIterator[Client]:
    """A Python MCP client over Streamable HTTP; the whole conversation is bounded.

    An error inside the conversation comes out of the client's task groups
    wrapped in an exception group; a single one is unwrapped so a failure
    reads as itself."""
    with anyio.fail_after(CONVERSATION_TIMEOUT):
        try:
            async with Client(url, mode=mode, read_timeout_seconds=TIMEOUT) as client:
                yield client
        except BaseExceptionGroup as group:
            leaves = _leaves(group)
            if len(leaves) == 1:
                raise leaves[0] from group
            raise


async def call(client: Client, name: str, arguments: dict[str, Any] | None = None):
    with anyio.fail_after(TIMEOUT):
        try:
            return await client.call_tool(name, arguments or {})
        except ValidationError as e:
            if "resultType" in str(e):
                raise MissingResultType(f"{name}: {e}") from e
            raise


async def list_tool_names(client: Client) -> list[str]:
    names: list[str] = []
    cursor = None
    with anyio.fail_after(TIMEOUT):
        for _ in range(100):
            page = await client.list_tools(cursor=cursor)
            names.extend(t.name for t in page.tools)
            cursor = page.next_cursor
            if cursor is None:
                return names
    raise AssertionError("tools/list never ended")


def text(result) -> str:
    return "\n".join(getattr(block, "text", "") for block in result.content)


def payload(result) -> Any:
    """The JSON a meta-tool answers with (a single text block)."""
    assert not result.is_error, text(result)
    return json.loads(text(result))


def found_names(search: dict[str, Any]) -> list[str]:
    return [tool["name"] for server in search["servers"] for tool in server["tools"]]

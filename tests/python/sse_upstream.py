"""A legacy MCP server for the transport tests: the Python `mcp` SDK's own
server run with its HTTP+SSE transport (2024-11-05), or with Streamable HTTP
for the `auto` detection tests.

    python sse_upstream.py --port P [--transport sse|streamable-http]

Tools: `echo` (its text back), `fail` (a tool error), `count` (reports
progress 1..n, then returns n), `wait` (a minute, or until cancelled, which
it writes to the file `marker`) and `grow`, which adds a tool `grown` and
tells the client its tool list changed.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import anyio
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.server import MCPServer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--transport", default="sse", choices=["sse", "streamable-http"])
    args = parser.parse_args()
    server = MCPServer("legacy")

    @server.tool()
    def echo(text: str) -> str:
        """The text back, unchanged."""
        return f"echo: {text}"

    @server.tool()
    def fail() -> str:
        """Always fails."""
        raise ValueError("this tool always fails")

    @server.tool()
    async def count(n: int, ctx: Context) -> int:
        """Reports progress from 1 to n, then returns n."""
        for i in range(1, n + 1):
            await ctx.report_progress(i, n, f"step {i}")
        return n

    @server.tool()
    async def wait(marker: str) -> str:
        """Waits a minute; a cancellation is written to `marker`."""
        try:
            await anyio.sleep(60)
        except anyio.get_cancelled_exc_class():
            Path(marker).write_text("cancelled")
            raise
        return "waited"

    @server.tool()
    async def grow(ctx: Context) -> str:
        """Adds the tool `grown` and announces the change."""

        def grown() -> str:
            """Added at run time."""
            return "grown"

        server.add_tool(grown)
        await ctx.session.send_tool_list_changed()
        return "grew"

    server.run(transport=args.transport, host="127.0.0.1", port=args.port)


if __name__ == "__main__":
    main()

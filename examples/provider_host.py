#!/usr/bin/env python3
"""A reference host: a model loop against the Anthropic Messages API or the
OpenAI Responses API (or anything that speaks them), with Manifold's governed
catalog as deferred tools.

1. `GET /export?format=...` from Manifold: the ready-to-send `tools` array
   (deferred tools, a tool search entry).
2. Send the task to the model with those tools.
3. When the model searches with Manifold's search (the `manifold` search kind),
   ask `POST /search` for the provider-shaped result and hand it back. A
   provider-hosted search needs nothing from the host.
4. When the model calls a tool, pass the call to `POST /call` unchanged: the
   provider-facing name maps back to the qualified tool, and the broker
   authorizes, validates and audits it.
5. Stop at the model's final answer; print a JSON summary.

Standard library only. Example:

    manifold serve --config fixtures/demo/manifold.toml &
    python3 examples/provider_host.py --provider anthropic \\
        --model-url https://api.anthropic.com --api-key "$ANTHROPIC_API_KEY" \\
        --gateway http://127.0.0.1:8080 --task "What time is it in Tokyo?"
"""

import argparse
import json
import sys
import urllib.request

ANTHROPIC_SEARCH_TOOL = "manifold_search_tools"


def post(url, body, headers):
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json", **headers},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.load(response)


def get(url, headers):
    request = urllib.request.Request(url, headers=headers)
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.load(response)


class Gateway:
    def __init__(self, url, token):
        self.url = url.rstrip("/")
        self.headers = {"authorization": f"Bearer {token}"} if token else {}

    def export(self, provider):
        return get(f"{self.url}/export?format={provider}", self.headers)

    def search(self, query, limit, fmt, call_id):
        body = {"query": query, "format": fmt, "call_id": call_id}
        if limit:
            body["limit"] = limit
        return post(f"{self.url}/search", body, self.headers)

    def call(self, name, arguments, namespace=None):
        body = {"name": name, "arguments": arguments}
        if namespace:
            body["namespace"] = namespace
        return post(f"{self.url}/call", body, self.headers)


def result_text(result):
    """The text blocks of an MCP tool result, joined."""
    parts = [c.get("text", "") for c in result.get("content", []) if c.get("type") == "text"]
    return "\n".join(parts) if parts else json.dumps(result.get("structuredContent"))


def run_anthropic(args, gateway, steps):
    tools = gateway.export("anthropic")["tools"]
    headers = {
        "x-api-key": args.api_key or "",
        "anthropic-version": "2023-06-01",
        "anthropic-beta": "advanced-tool-use-2025-11-20",
    }
    messages = [{"role": "user", "content": args.task}]
    for _ in range(args.max_turns):
        response = post(
            f"{args.model_url}/v1/messages",
            {"model": args.model, "max_tokens": 1024, "tools": tools, "messages": messages},
            headers,
        )
        messages.append({"role": "assistant", "content": response["content"]})
        if response["stop_reason"] != "tool_use":
            return "".join(b.get("text", "") for b in response["content"] if b["type"] == "text")
        results = []
        for block in response["content"]:
            if block["type"] != "tool_use":
                continue
            if block["name"] == ANTHROPIC_SEARCH_TOOL:
                result = gateway.search(
                    block["input"]["query"], block["input"].get("limit"),
                    "anthropic_tool_reference", block["id"])
                steps.append({"search": block["input"]["query"],
                              "found": [r["tool_name"] for r in result["content"]]})
                results.append(result)
            else:
                called = gateway.call(block["name"], block["input"])
                steps.append({"call": block["name"], "tool": called["tool"]})
                result = called["result"]
                results.append({
                    "type": "tool_result",
                    "tool_use_id": block["id"],
                    "content": result_text(result),
                    "is_error": bool(result.get("isError")),
                })
        messages.append({"role": "user", "content": results})
    raise SystemExit("the model did not finish within --max-turns")


def run_openai(args, gateway, steps):
    tools = gateway.export("openai")["tools"]
    headers = {"authorization": f"Bearer {args.api_key or ''}"}
    items = [{"role": "user", "content": args.task}]
    for _ in range(args.max_turns):
        response = post(
            f"{args.model_url}/v1/responses",
            {"model": args.model, "tools": tools, "input": items},
            headers,
        )
        pending = False
        final = []
        for item in response["output"]:
            items.append(item)
            if item["type"] == "tool_search_call" and item.get("execution") == "client":
                query = item["arguments"].get("query", "")
                output = gateway.search(query, item["arguments"].get("limit"),
                                        "openai_tool_search_output", item["call_id"])
                steps.append({"search": query, "found": [
                    f"{ns['name']}.{f['name']}" for ns in output["tools"] for f in ns["tools"]]})
                items.append(output)
                pending = True
            elif item["type"] == "function_call":
                called = gateway.call(item["name"], item["arguments"], item.get("namespace"))
                steps.append({"call": item["name"], "namespace": item.get("namespace"),
                              "tool": called["tool"]})
                items.append({"type": "function_call_output", "call_id": item["call_id"],
                              "output": result_text(called["result"])})
                pending = True
            elif item["type"] == "message":
                final.extend(c.get("text", "") for c in item["content"]
                             if c.get("type") == "output_text")
        if not pending:
            return "".join(final)
    raise SystemExit("the model did not finish within --max-turns")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--provider", choices=["anthropic", "openai"], required=True)
    parser.add_argument("--model-url", required=True, help="base URL of the model API")
    parser.add_argument("--api-key")
    parser.add_argument("--model", default="claude-sonnet-4-5")
    parser.add_argument("--gateway", required=True, help="Manifold's base URL")
    parser.add_argument("--token", help="a Manifold gateway token")
    parser.add_argument("--task", required=True)
    parser.add_argument("--max-turns", type=int, default=8)
    args = parser.parse_args()
    args.model_url = args.model_url.rstrip("/")
    gateway = Gateway(args.gateway, args.token)
    steps = []
    run = run_anthropic if args.provider == "anthropic" else run_openai
    final = run(args, gateway, steps)
    json.dump({"final": final, "steps": steps}, sys.stdout)
    print()


if __name__ == "__main__":
    main()

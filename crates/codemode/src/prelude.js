// Called once per run, before the script. `send` and `log` are the only
// ways out of the sandbox; both go to the host, which decides everything.
// A module so that it can be compiled to bytecode once per process.
export default function (send, log, bindingsJson) {
  "use strict";
  const pending = new Map();

  class ToolError extends Error {
    constructor(message, details) {
      super(message);
      this.name = "ToolError";
      this.server = details.server ?? null;
      this.tool = details.tool ?? null;
      this.content = details.content ?? [];
      if (details.code) this.code = details.code;
    }
  }

  const show = (value) => {
    if (typeof value === "string") return value;
    if (value instanceof Error) return value.stack ? `${value.name}: ${value.message}\n${value.stack}` : `${value.name}: ${value.message}`;
    try {
      const json = JSON.stringify(value);
      return json === undefined ? String(value) : json;
    } catch {
      return String(value);
    }
  };
  const writer = (stream) => (...args) => log(stream, args.map(show).join(" "));
  const console = Object.freeze({
    log: writer("out"),
    info: writer("out"),
    debug: writer("out"),
    warn: writer("err"),
    error: writer("err"),
  });

  function callTool(name, args) {
    if (typeof name !== "string") {
      return Promise.reject(new TypeError("callTool: the tool name must be a string such as 'server__tool'"));
    }
    let json;
    try {
      json = JSON.stringify(args ?? {});
    } catch (e) {
      return Promise.reject(new TypeError(`callTool(${name}): the arguments are not JSON: ${e.message}`));
    }
    return new Promise((resolve, reject) => {
      pending.set(send(name, json), { resolve, reject });
    });
  }

  // The result's origin travels with it, out of the way of the script's own
  // enumeration and JSON.
  const tag = (value, server, tool) => {
    if (value !== null && typeof value === "object" && Object.isExtensible(value)) {
      Object.defineProperty(value, "source", { value: Object.freeze({ server, tool }), enumerable: false });
    }
    return value;
  };

  Object.defineProperty(globalThis, "__manifold_settle", {
    value: (id, ok, payload) => {
      const waiter = pending.get(id);
      if (!waiter) return;
      pending.delete(id);
      const value = JSON.parse(payload);
      if (ok) {
        waiter.resolve(tag(value.result, value.server, value.tool));
      } else {
        waiter.reject(new ToolError(value.message ?? "the tool call failed", value));
      }
    },
  });

  const describe = (e) => {
    if (e instanceof Error) {
      const out = { name: e.name, message: e.message, stack: e.stack ?? "" };
      if (e instanceof ToolError) {
        out.toolError = { server: e.server, tool: e.tool, content: e.content, code: e.code ?? null };
      }
      return JSON.stringify(out);
    }
    return JSON.stringify({ name: "Error", message: `Uncaught ${show(e)}` });
  };
  Object.defineProperty(globalThis, "__manifold_describe", { value: describe });

  Object.defineProperty(globalThis, "__manifold_start", {
    value: (body) => {
      const done = (outcome) => {
        Object.defineProperty(globalThis, "__manifold_outcome", { value: JSON.stringify(outcome) });
      };
      body().then(
        (value) => {
          let json;
          try {
            json = value === undefined ? undefined : JSON.stringify(value);
          } catch {
            json = JSON.stringify(String(value));
          }
          done({ ok: true, value: json });
        },
        (e) => done({ ok: false, error: JSON.parse(describe(e)) }),
      );
    },
  });

  for (const { namespace, function: fn, tool, structured } of JSON.parse(bindingsJson)) {
    const target = (globalThis[namespace] ??= {});
    target[fn] = (input) =>
      callTool(tool, input).then((result) => {
        if (!structured) return result;
        return result.structuredContent === undefined ? result : tag(result.structuredContent, result.source?.server, result.source?.tool);
      });
  }

  Object.assign(globalThis, { console, callTool, ToolError });
}

#!/usr/bin/env python3
"""Structure rules that keep the code base readable (ARCHITECTURE.md, "Invariants").

  scripts/check-structure.py [REPO]

1. No two non-root modules of a crate import each other. A file imports
   another when it names a path (`use crate::a::b`, `super::x`, an inline
   `crate::a::f()`) that resolves to an item that file defines; a name a
   module re-exports (`pub use child::Name`) resolves to where it is defined.
   The crate root (lib.rs, main.rs) is exempt: it only declares and re-exports.
2. No source file is over 900 lines, test files and the encoder's kernels
   (`crates/embed/src/encoder.rs`) excepted.
3. The binary's sources (`crates/manifold/src`) stay at most 3,000 lines.
4. The `manifold` binary links neither the test harness nor the benchmarks
   (`cargo tree -p manifold -e normal` names no `manifold-test-postgres` or
   `manifold-bench`), and `manifold-store` has no `testing` feature.

Prints each violation and exits 1 if there is any.
"""

import re
import subprocess
import sys
from pathlib import Path

MAX_FILE_LINES = 900
MAX_BINARY_LINES = 3000
LONG_FILE_EXEMPT = {"crates/embed/src/encoder.rs"}

ITEM = re.compile(
    r"^\s*(?:pub(?:\([^)]*\))?\s+)?(?:unsafe\s+)?(?:async\s+)?(?:const\s+)?"
    r"(?:fn|struct|enum|trait|type|const|static|union|macro_rules!)\s+([A-Za-z_][A-Za-z0-9_]*)",
    re.M,
)
MOD_DECL = re.compile(r"^\s*(?:#\[[^\]]*\]\s*)*(?:pub(?:\([^)]*\))?\s+)?mod\s+([A-Za-z_][A-Za-z0-9_]*)\s*;", re.M)
USE = re.compile(r"^\s*(pub(?:\([^)]*\))?\s+)?use\s+([^;]+);", re.M)
INLINE = re.compile(r"(?<![A-Za-z0-9_:])((?:crate|super|self)(?:::[A-Za-z_][A-Za-z0-9_]*)+)")
CFG_TEST_MOD = re.compile(r"#\[cfg\(test\)\]\s*mod\s+\w+\s*\{")


def strip_comments_and_strings(text):
    """Code with comments removed and string and char literals emptied."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            i = text.find("\n", i)
            i = n if i < 0 else i
        elif text.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if text.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif text.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
        elif c in "rb" and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")) and (
            raw := re.match(r'b?r(#*)"', text[i:])
        ):
            close = '"' + raw.group(1)
            end = text.find(close, i + raw.end())
            i = n if end < 0 else end + len(close)
            out.append('""')
        elif c == '"':
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
            i += 1
            out.append('""')
        elif c == "'" and (char := re.match(r"'(?:\\.[^']*|[^'\\\n])'", text[i:])):
            i += char.end()
            out.append("' '")
        else:
            out.append(c)
            i += 1
    return "".join(out)


def strip_test_modules(text):
    """Drops inline `#[cfg(test)] mod x { ... }` bodies: tests may reach anywhere."""
    out, pos = [], 0
    for match in CFG_TEST_MOD.finditer(text):
        if match.start() < pos:
            continue
        out.append(text[pos : match.start()])
        depth, i = 1, match.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        pos = i
    out.append(text[pos:])
    return "".join(out)


def expand_use(tree):
    """`a::{b, c::{d, e}}` -> [a::b, a::c::d, a::c::e]; `x as y` -> x."""
    tree = re.sub(r"\s+", "", re.sub(r"\s+as\s+\w+", "", tree))
    depth, start = 0, None
    for i, ch in enumerate(tree):
        if ch == "{":
            if depth == 0:
                start = i
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                prefix, inner, rest = tree[:start], tree[start + 1 : i], tree[i + 1 :]
                parts, d, cur = [], 0, ""
                for c in inner:
                    if c == "," and d == 0:
                        parts.append(cur)
                        cur = ""
                        continue
                    d += {"{": 1, "}": -1}.get(c, 0)
                    cur += c
                parts.append(cur)
                paths = []
                for part in parts:
                    if part:
                        paths += expand_use(prefix + part + rest)
                return paths
    return [tree]


class Module:
    def __init__(self, path, file, crate_root):
        self.path = path  # tuple of names below the crate root
        self.file = file
        self.crate_root = crate_root
        self.children = {}
        self.items = set()
        self.reexports = {}  # name -> path segments it names (relative to this module)
        self.refs = []  # (segments, from_module)


def module_file(dir_, name):
    for candidate in (dir_ / f"{name}.rs", dir_ / name / "mod.rs"):
        if candidate.exists():
            return candidate
    return None


def load_crate(root_file):
    modules = {}

    def load(path, file, child_dir):
        module = Module(path, file, crate_root=not path)
        modules[path] = module
        raw = file.read_text(encoding="utf-8", errors="replace")
        text = strip_test_modules(strip_comments_and_strings(raw))
        module.items = set(ITEM.findall(text))
        for name in MOD_DECL.findall(text):
            child = module_file(child_dir, name)
            if child is None:
                continue
            grand_dir = child.parent if child.name == "mod.rs" else child_dir / name
            module.children[name] = load(path + (name,), child, grand_dir)
        for public, tree in USE.findall(text):
            for use in expand_use(tree):
                segments = [s for s in use.split("::") if s]
                if not segments:
                    continue
                if public and segments[-1] != "*":
                    module.reexports[segments[-1]] = segments
                module.refs.append(segments)
        for match in INLINE.findall(text):
            module.refs.append(match.split("::"))
        return module

    base = root_file.parent
    load((), root_file, base)
    return modules


def resolve(modules, start, segments, seen=None):
    """The module whose file defines what `segments` names, seen from `start`."""
    seen = seen or set()
    key = (start.path, tuple(segments))
    if key in seen:
        return None
    seen.add(key)
    head, rest = segments[0], segments[1:]
    if head == "crate":
        current = modules[()]
    elif head == "super":
        current = modules.get(start.path[:-1])
        while rest and rest[0] == "super" and current is not None:
            current = modules.get(current.path[:-1])
            rest = rest[1:]
    elif head == "self":
        current = start
    elif head in start.children:
        current, rest = start.children[head], segments[1:]
    else:
        return None  # another crate, or std
    if current is None:
        return None
    while rest:
        name = rest[0]
        if name in current.children:
            current = current.children[name]
            rest = rest[1:]
            continue
        if name in current.reexports and current.reexports[name] != segments:
            target = resolve(modules, current, current.reexports[name], seen)
            return target or current
        break
    return current


def check_cycles(repo):
    problems = []
    for cargo in sorted(repo.glob("crates/*/Cargo.toml")):
        src = cargo.parent / "src"
        roots = [p for p in (src / "lib.rs", src / "main.rs") if p.exists()]
        roots += sorted((src / "bin").glob("*.rs")) if (src / "bin").exists() else []
        for root in roots:
            modules = load_crate(root)
            edges = set()
            for module in modules.values():
                for segments in module.refs:
                    target = resolve(modules, module, segments)
                    if target is None or target is module:
                        continue
                    edges.add((module.path, target.path))
            for a, b in sorted(edges):
                if a < b and (b, a) in edges and a and b:
                    fa = modules[a].file.relative_to(repo)
                    fb = modules[b].file.relative_to(repo)
                    problems.append(f"import cycle: {fa} <-> {fb}")
    return problems


def is_test_file(rel):
    parts = rel.parts
    return "tests" in parts or rel.name in ("tests.rs",) or "fuzz" == parts[0]


def check_sizes(repo):
    problems = []
    binary = 0
    for file in sorted(repo.glob("crates/**/src/**/*.rs")):
        rel = file.relative_to(repo)
        lines = sum(1 for _ in file.open(encoding="utf-8", errors="replace"))
        if str(rel).startswith("crates/manifold/src/"):
            binary += lines
        if is_test_file(rel) or str(rel) in LONG_FILE_EXEMPT:
            continue
        if lines > MAX_FILE_LINES:
            problems.append(f"file over {MAX_FILE_LINES} lines: {rel} ({lines})")
    if binary > MAX_BINARY_LINES:
        problems.append(f"crates/manifold/src is {binary} lines, over {MAX_BINARY_LINES}")
    return problems


TEST_ONLY_CRATES = ("manifold-test-postgres", "manifold-bench")


def check_binary_links(repo):
    """Rule 4: what the release binary links."""
    problems = []
    tree = subprocess.run(
        ["cargo", "tree", "-p", "manifold", "-e", "normal", "--prefix", "none", "--offline"],
        cwd=repo, capture_output=True, text=True,
    )
    if tree.returncode != 0:
        return [f"cargo tree -p manifold failed: {tree.stderr.strip()[:300]}"]
    for crate in TEST_ONLY_CRATES:
        if re.search(rf"^{re.escape(crate)} ", tree.stdout, re.M):
            problems.append(f"the manifold binary links {crate}")
    store = (repo / "crates/store/Cargo.toml").read_text()
    if re.search(r"^\[features\][^\[]*^testing\s*=", store, re.M | re.S):
        problems.append("manifold-store has a `testing` feature")
    return problems


def main():
    repo = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent)
    problems = check_cycles(repo) + check_sizes(repo) + check_binary_links(repo)
    for problem in problems:
        print(problem)
    if problems:
        sys.exit(1)
    print("structure: no import cycles between modules, no file over the size limits, no test-only crate in the binary")


if __name__ == "__main__":
    main()

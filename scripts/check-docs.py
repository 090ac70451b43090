#!/usr/bin/env python3
"""README.md and ARCHITECTURE.md stay true and short.

  scripts/check-docs.py [REPO]

- Every repository path they name exists: links, and code spans that look like
  paths (`crates/…`, `scripts/…`, `broker/src/lib.rs`, a bare `writer.rs`).
- Every code name they mention (`Broker::call`, `AuditWriter`, `audit_commit`)
  occurs in the sources, so a rename cannot leave the map behind.
- Neither holds a measured figure (µs, ms, ×, p50, MB …) or a before/after:
  figures go to docs/performance.md with their date and command.
- ARCHITECTURE.md is at most 400 lines and README.md at most 350.

Prints each problem and exits 1 if there is any.
"""

import re
import sys
from pathlib import Path

LIMITS = {"ARCHITECTURE.md": 400, "README.md": 350}
EXTENSIONS = (".rs", ".md", ".toml", ".sh", ".py", ".json", ".jsonl", ".mjs", ".yml", ".sql", ".js", ".png", ".txt")
TOP_DIRS = ("crates/", "scripts/", "docs/", "fixtures/", "tests/", "models/", "examples/", "fuzz/", ".ci/")
SOURCE_GLOBS = ("crates/**/*.rs", "fuzz/**/*.rs", "scripts/**/*", "tests/**/*.py", "crates/**/*.toml", "fixtures/**/*.toml")
# A figure: a number with a unit of time, size or ratio, or a percentile.
FIGURE = re.compile(
    r"\d[\d,.]*\s?(?:µs|us|ns|ms|MB|KB|GB|MiB|KiB|GiB)\b|\d[\d.]*\s?×|\bp(?:50|95|99)\b|\bmeasured\b|\bwas\b.*\bnow\b",
    re.I,
)
# Settings and bounds are stated with their key or as a default, not measured.
SETTING = re.compile(r"default|`[a-z_]+_(?:ms|bytes|seconds|mb)`|limit|cap|at most|bound", re.I)
SPAN = re.compile(r"`([^`\n]+)`")
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
RUST_NAME = re.compile(r"^(?:[A-Za-z_][A-Za-z0-9_]*::)*[A-Za-z_][A-Za-z0-9_]*(?:\(\))?$")


def source_words(repo):
    words = set()
    for pattern in SOURCE_GLOBS:
        for file in repo.glob(pattern):
            if file.is_file() and "target" not in file.parts:
                try:
                    words.update(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", file.read_text(errors="replace")))
                except OSError:
                    pass
    return words


def path_exists(repo, text):
    text = re.split(r"[:#]", text.rstrip("/"))[0] if not text.startswith(".ci") else text
    candidates = [text, "crates/" + text]
    if any((repo / c).exists() for c in candidates):
        return True
    if "/" not in text:
        return any(repo.glob(f"crates/**/{text}")) or any(repo.glob(f"**/{text}"))
    return any(repo.glob(f"crates/*/{text}")) or any(repo.glob(f"crates/**/{text}"))


def looks_like_path(span):
    if " " in span or span.startswith(("/", "http", "$", "~", "../")) or any(c in span for c in "*{<"):
        return False
    if span.startswith(TOP_DIRS):
        return True
    base = re.split(r"[:#]", span)[0]
    return base.endswith(EXTENSIONS) and re.fullmatch(r"[\w./-]+", base) is not None


def looks_like_name(span):
    if not RUST_NAME.match(span):
        return False
    bare = span.removesuffix("()")
    return "::" in bare or span.endswith("()") or re.match(r"^[A-Z][a-z]+[A-Z]", bare) or ("_" in bare and bare.islower())


def check(repo, name, words):
    problems = []
    path = repo / name
    text = path.read_text()
    lines = text.split("\n")
    if len(lines) - 1 > LIMITS[name]:
        problems.append(f"{name}: {len(lines) - 1} lines, over {LIMITS[name]}")
    in_code = False
    for number, line in enumerate(lines, 1):
        if line.startswith("```"):
            in_code = not in_code
            continue
        where = f"{name}:{number}"
        for target in LINK.findall(line):
            if not target.startswith(("http", "mailto")) and not (repo / target).exists():
                problems.append(f"{where}: link to a missing path: {target}")
        if in_code:
            continue
        for span in SPAN.findall(line):
            if looks_like_path(span):
                if not path_exists(repo, span):
                    problems.append(f"{where}: no such path: {span}")
            elif looks_like_name(span):
                missing = [w for w in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", span) if w not in words]
                if missing:
                    problems.append(f"{where}: not found in the sources: {span}")
        prose = SPAN.sub("", line)
        if FIGURE.search(prose) and not SETTING.search(prose):
            problems.append(f"{where}: looks like a measured figure or a history: {line.strip()[:100]}")
    return problems


def main():
    repo = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent)
    words = source_words(repo)
    problems = []
    for name in LIMITS:
        problems += check(repo, name, words)
    for problem in problems:
        print(problem)
    if problems:
        sys.exit(1)
    print("docs: README.md and ARCHITECTURE.md name only what exists, hold no figures, and fit their limits")


if __name__ == "__main__":
    main()

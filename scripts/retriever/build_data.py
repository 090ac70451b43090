#!/usr/bin/env python3
"""Builds the training data of the tool-retrieval encoder (issue 21).

    scripts/retriever/fetch-sources.sh          # the source files, pinned
    python3 scripts/retriever/build_data.py     # -> ~/.cache/manifold/retriever/data

Standard library only. Reads the files fetch-sources.sh put in the sources
directory, the evaluation catalogs and dev queries in ../shared/data (only to
keep them out), and writes:

  train.jsonl        {"query", "positive", "negatives", "source", ...} one row
                     per (query, relevant tool); texts are tool texts exactly
                     as the gateway embeds them (tooltext.embedding_text)
  dev.jsonl          the same rows for queries that need a held-out tool
  dev.tools.jsonl    a catalog in ../shared/data/catalogs form (every source
                     tool that survived the filters, held-out ones included)
  dev.queries.jsonl  {"id", "query", "relevant"} against dev.tools.jsonl
  selfsup.jsonl      self-supervised pairs from tool texts only (no queries):
                     a tool's name, or one sentence of its description, paired
                     with the rest of its text
  stats.json         every count printed below

Sources: BFCL v4 (gorilla) single-turn and multi-turn categories, apibench
torchhub_train (gorilla), Seal-Tools dev/test splits, ToolAlpaca's evaluation
sets, RestBench, Azure MCP Server's tool-selection prompts (microsoft/mcp),
MCPVerse's tasks over the servers whose tool descriptions could be had; the
docker MCP registry catalog only for self-supervised pairs. Nothing from LiveMCPBench, MetaTool or ToolLens is
trained on: their tools and queries are only read to drop what overlaps them.
See docs/retriever-data-card.md.

Everything is deterministic for a given --seed.
"""

import argparse
import collections
import hashlib
import json
import math
import os
import random
import re
import sys
import unicodedata
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tooltext import embedding_text, split_identifier  # noqa: E402

GORILLA = "ShishirPatil+gorilla"
SEAL = "fairyshine+Seal-Tools"
BFCL_DIR = "berkeley-function-call-leaderboard/bfcl_eval/data"
BFCL_CATEGORIES = [
    "simple_python",
    "multiple",
    "live_simple",
    "live_multiple",
    "parallel_multiple",
    "live_parallel_multiple",
]
SEAL_SPLITS = ["dev", "test_in_domain", "test_out_domain"]
ALPACA = "tangqiaoyu+ToolAlpaca"
ALPACA_SPLITS = ["eval_real", "eval_simulated"]  # train_data.json is >= 4 MiB: not in the snapshot
RESTGPT = "Yifan-Song793+RestGPT"
RESTBENCH_SETS = {"tmdb": "tmdb_oas.json", "spotify": "spotify_oas.json"}
# BFCL multi-turn: the tool classes of the base category (memory_* and
# web_search belong to other categories), with the server name each gets.
BFCL_MT_DOCS = {
    "gorilla_file_system": "file system",
    "math_api": "math",
    "message_api": "messaging",
    "posting_api": "twitter",
    "ticket_api": "ticketing",
    "trading_bot": "trading bot",
    "travel_booking": "travel booking",
    "vehicle_control": "vehicle control",
}
AZURE = "microsoft+mcp"
AZURE_DIR = "eng/tools/ToolDescriptionEvaluator"
# prompts.json names one tool that tools.json (same commit) calls otherwise.
AZURE_ALIASES = {"storagesync_cloudendpoint_changedetection": "storagesync_cloudendpoint_triggerchangedetection"}
MCPVERSE = "SenseTime-FVG+mcpverse"
MCPVERSE_TASKS = "mcpverse/data/mcpverse_benchmark.csv"
# MCPVerse's repository has the tasks but no tool descriptions. These are the
# servers whose source could be had (three in MCPVerse's own tree, three npm
# packages; fetch-sources.sh pins them): server name as MCPVerse's tasks use
# it -> (file under the sources dir, file inside the tarball or None, form).
MCPVERSE_SERVERS = {
    "amap-maps": ("npm/amap-amap-maps-mcp-server-0.0.8.tgz", "package/build/index.js", "js-object"),
    "appinsightmcp": ("npm/jeromyfu-app-insight-mcp-1.0.8.tgz", "package/src/server.js", "js-tool"),
    "variflight": ("npm/variflight-ai-variflight-mcp-1.0.3.tgz", "package/dist/index.js", "js-tool"),
    "dataset-viewer": (f"{MCPVERSE}/mcpverse/servers/dataset-viewer/src/dataset_viewer/server.py", None, "py-tool"),
    "sqlite": (f"{MCPVERSE}/mcpverse/servers/sqlite/src/mcp_server_sqlite/server.py", None, "py-tool"),
    "world_bank": (f"{MCPVERSE}/mcpverse/servers/world_bank_mcp_server/src/world_bank_mcp_server/server.py", None,
                   "py-tool"),
}
# Gold entries that are no MCP tool: MCPVerse's code interpreter ("code * N")
# and a shell ("终端", terminal).
MCPVERSE_NOT_TOOLS = {"code", "终端"}
SOURCES = ("bfcl", "torchhub", "seal", "bfclmt", "toolalpaca", "restbench", "azure", "mcpverse")

# Source tool names that are also ToolLens tool or API names once split into
# words (ToolLens: quchangle1/COLT datasets/ToolLens/corpus.jsonl at
# bbec292c38ca, read for this comparison only; `--toollens-corpus` recomputes
# it). ToolLens is not in ../shared, so this list stands in for it.
TOOLLENS_NAME_COLLISIONS = {
    "seal": {"getNews", "getAirlineDetails"},
    "bfcl": {"stock_price", "air_quality", "air_quality_forecast", "search_products"},
    "docker": {"autocomplete", "explore", "get_stats", "info", "list", "search", "search_products"},
}

HARD_NEGATIVES = 8  # kept per row; training samples from them
SELFSUP_NEGATIVES = 3

STOPWORDS = set(
    """a about after again all also am an and any are as at be been before being
    both but by can could did do does doing each etc for from further had has
    have having he her here hers him his how i if in into is it its itself just
    let me might more most must my myself no nor not of off on once only or
    other our ours out over own please same shall she should so some such than
    that the their theirs them then there these they this those through to too
    under until up us very via was we were what when where which while who whom
    why will with would you your yours""".split()
)


# --- normalisation and hashing ---------------------------------------------


def norm_name(name):
    return " ".join(split_identifier(name))


def norm_text(text):
    """Lowercase NFKC words of letters and digits, single-spaced."""
    text = unicodedata.normalize("NFKC", text or "").lower()
    return " ".join(re.findall(r"\w+", text))


def squash(s):
    return norm_name(s).replace(" ", "")


def tool_hash(name, description):
    key = norm_name(name) + "\x1f" + norm_text(description)
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def bm25_terms(text):
    return [
        t
        for t in split_identifier(text)
        if t not in STOPWORDS and not t.isdigit() and len(t) > 1
    ]


class Bm25:
    """Plain BM25 (k1 1.2, b 0.75) over tool texts, to mine hard negatives."""

    def __init__(self, docs, k1=1.2, b=0.75):
        self.ids = [i for i, _ in docs]
        self.postings = collections.defaultdict(list)
        lengths = []
        for n, (_, text) in enumerate(docs):
            tf = collections.Counter(bm25_terms(text))
            lengths.append(sum(tf.values()))
            for t, c in tf.items():
                self.postings[t].append((n, c))
        avg = sum(lengths) / max(1, len(lengths))
        self.norm = [k1 * (1 - b + b * ln / max(avg, 1e-9)) for ln in lengths]
        self.k1 = k1
        total = len(docs)
        self.idf = {
            t: math.log(1 + (total - len(p) + 0.5) / (len(p) + 0.5))
            for t, p in self.postings.items()
        }

    def top(self, query, k, skip=lambda tool_id: False):
        scores = collections.defaultdict(float)
        for t in sorted(set(bm25_terms(query))):  # a fixed order: the same float sums every run
            idf = self.idf.get(t)
            if idf is None:
                continue
            for n, c in self.postings[t]:
                scores[n] += idf * c * (self.k1 + 1) / (c + self.norm[n])
        ranked = sorted(scores.items(), key=lambda x: (-x[1], self.ids[x[0]]))
        out = []
        for n, _ in ranked:
            if not skip(self.ids[n]):
                out.append(self.ids[n])
                if len(out) == k:
                    break
        return out


# --- the sources -------------------------------------------------------------


class Tool:
    __slots__ = ("id", "source", "server", "name", "title", "description", "text", "hash")

    def __init__(self, source, server, name, description, title=None):
        self.source = source
        self.server = server
        self.name = name
        self.title = title
        self.description = (description or "").strip()
        self.hash = tool_hash(name, self.description)
        self.id = f"{source}::{norm_name(server).replace(' ', '-')}::{name}::{self.hash[:8]}"
        self.text = embedding_text(server, name, self.description, title)


class Query:
    __slots__ = ("id", "source", "query", "gold", "candidates")

    def __init__(self, qid, source, query, gold, candidates=()):
        self.id = qid
        self.source = source
        self.query = query.strip()
        self.gold = list(dict.fromkeys(gold))  # tool ids, in order, unique
        self.candidates = list(dict.fromkeys(candidates))  # wrong candidates


def read_jsonl(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def add_tool(tools, tool):
    """Keeps the first of identical tools; returns the kept one's id."""
    kept = tools.setdefault(tool.id, tool)
    return kept.id


def load_bfcl(src, tools, queries):
    base = src / GORILLA / BFCL_DIR
    for cat in BFCL_CATEGORIES:
        entries = read_jsonl(base / f"BFCL_v4_{cat}.json")
        answers = {a["id"]: a for a in read_jsonl(base / "possible_answer" / f"BFCL_v4_{cat}.json")}
        for e in entries:
            turn = e["question"][0]
            text = "\n".join(m["content"] for m in turn if m.get("role") == "user")
            by_name = {}
            for f in e["function"]:
                t = Tool("bfcl", "", f["name"], f.get("description", ""))
                by_name.setdefault(f["name"], add_tool(tools, t))
            gold_names = [name for call in answers[e["id"]]["ground_truth"] for name in call]
            gold = [by_name[n] for n in gold_names if n in by_name]
            if len(gold) != len(gold_names):
                continue  # an answer naming no listed function: skip the entry
            wrong = [i for n, i in by_name.items() if n not in gold_names]
            queries.append(Query(f"bfcl::{e['id']}", "bfcl", text, gold, wrong))


def load_torchhub(src, tools, queries):
    rows = read_jsonl(src / GORILLA / "data/apibench/torchhub_train.json")
    call = re.compile(
        r"load\(\s*(?:repo_or_dir\s*=\s*)?['\"]([^'\"]+)['\"]"
        r"(?:\s*,\s*(?:model\s*=\s*)?['\"]([^'\"]+)['\"])?"
    )
    instruction = re.compile(r"'?Instruction'?\s*:\s*(.*?),\s*'Output'", re.S)
    for n, r in enumerate(rows):
        api = r["api_data"]
        m = call.search(api["api_call"])
        repo = m.group(1) if m else ""
        model = m.group(2) if m and m.group(2) else ""
        if not model:
            model = api["api_name"] if api["api_name"] != "torch.hub.load" else api["functionality"]
        server = repo.rsplit("/", 1)[-1]
        t = Tool("torchhub", server, model, api.get("description") or api.get("functionality", ""))
        tid = add_tool(tools, t)
        q = instruction.search(r["code"])
        if q:
            queries.append(Query(f"torchhub::{n}", "torchhub", q.group(1), [tid]))


def load_seal(src, tools, queries, server_mode):
    by_name = {}
    for r in read_jsonl(src / SEAL / "Seal-Tools_Dataset/tool.jsonl"):
        field = r.get("field", "")
        server = field.split("/")[-1] if server_mode == "field" else ""
        t = Tool("seal", server, r["api_name"], r.get("api_description", ""))
        by_name.setdefault(r["api_name"], add_tool(tools, t))
    missing = 0
    for split in SEAL_SPLITS:
        for r in read_jsonl(src / SEAL / f"Seal-Tools_Dataset/{split}.jsonl"):
            names = [c["api"] for c in r["calling"]]
            if not all(n in by_name for n in names):
                missing += 1
                continue
            queries.append(Query(f"seal::{r['id']}", "seal", r["query"], [by_name[n] for n in names]))
    return missing


def load_bfcl_multi_turn(src, tools, queries):
    """BFCL's multi-turn base category: every user turn is a query whose
    gold is the set of functions its ground-truth calls use (often 2-4)."""
    base = src / GORILLA / BFCL_DIR
    by_name = {}
    for stem, server in BFCL_MT_DOCS.items():
        for f in read_jsonl(base / "multi_turn_func_doc" / f"{stem}.json"):
            desc = f.get("description", "")
            desc = desc.split("Tool description:", 1)[-1].strip()
            t = Tool("bfclmt", server, f["name"], desc)
            by_name.setdefault(f["name"], add_tool(tools, t))
    answers = {a["id"]: a["ground_truth"] for a in read_jsonl(base / "possible_answer/BFCL_v4_multi_turn_base.json")}
    call = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*\(")
    for e in read_jsonl(base / "BFCL_v4_multi_turn_base.json"):
        for n, (turn, gt) in enumerate(zip(e["question"], answers.get(e["id"], []))):
            text = "\n".join(m["content"] for m in turn if m.get("role") == "user")
            names = [m.group(1) for c in gt if (m := call.match(c))]
            if not text or not names or not all(x in by_name for x in names):
                continue
            queries.append(Query(f"bfclmt::{e['id']}::{n}", "bfclmt", text, [by_name[x] for x in names]))


def load_toolalpaca(src, tools, queries):
    """ToolAlpaca's evaluation sets (real and simulated public APIs): each
    API is a server, its functions the tools, its instructions the queries;
    the gold is every function the golden action sequence calls."""
    import ast

    for split in ALPACA_SPLITS:
        with open(src / ALPACA / f"data/{split}.json", encoding="utf-8") as f:
            apis = json.load(f)
        for a in apis:
            funcs = a["Function_Description"]
            if isinstance(funcs, str):
                funcs = ast.literal_eval(funcs)
            by_name = {}
            for name, doc in funcs.items():
                desc = doc.split("\nParameters:", 1)[0].strip()
                by_name[name] = add_tool(tools, Tool("toolalpaca", a["Name"], name, desc))
            instructions = a["Instructions"]
            golds = a["Golden_Answers"]
            for n, (text, gold) in enumerate(zip(instructions, golds)):
                names = [step["Action"] for step in gold]
                if not names or not all(x in by_name for x in names):
                    continue
                queries.append(Query(f"toolalpaca::{split}::{a['Name']}::{n}", "toolalpaca", text,
                                     [by_name[x] for x in names]))


def load_restbench(src, tools, queries):
    """RestBench (RestGPT): TMDB and Spotify tasks, each solved by a path of
    REST endpoints; an endpoint (METHOD path) of the OpenAPI spec is a tool."""
    for name, spec_file in RESTBENCH_SETS.items():
        with open(src / RESTGPT / "specs" / spec_file, encoding="utf-8") as f:
            spec = json.load(f)
        by_key = {}
        for path, item in spec["paths"].items():
            for method, op in item.items():
                if method not in ("get", "post", "put", "delete", "patch"):
                    continue
                summary = (op.get("summary") or "").strip()
                desc = (op.get("description") or "").strip()
                text = summary if not desc else desc if desc.startswith(summary) else f"{summary}. {desc}"
                key = f"{method.upper()} {path}"
                by_key[key] = add_tool(tools, Tool("restbench", name, key, text))
        with open(src / RESTGPT / "datasets" / f"{name}.json", encoding="utf-8") as f:
            tasks = json.load(f)
        for n, t in enumerate(tasks):
            keys = [k.strip() for k in t["solution"]]
            if not keys or not all(k in by_key for k in keys):
                continue
            queries.append(Query(f"restbench::{name}::{n}", "restbench", t["query"], [by_key[k] for k in keys]))


def load_azure(src, tools, queries):
    """Azure MCP Server's tool-selection prompts (microsoft/mcp): each prompt
    names one tool; tools.json is the server's tool list at the same commit.
    `<placeholder>` tokens in prompts lose their angle brackets."""
    with open(src / AZURE / AZURE_DIR / "tools.json", encoding="utf-8") as f:
        listed = json.load(f)["results"]
    by_name = {}
    for r in listed:
        name = r["command"].replace(" ", "_")
        by_name[name] = add_tool(tools, Tool("azure", "azure", name, r.get("description", "")))
    with open(src / AZURE / AZURE_DIR / "prompts.json", encoding="utf-8") as f:
        prompts = json.load(f)
    placeholder = re.compile(r"<([^<>\s][^<>]*)>")
    stats = collections.Counter()
    for name, texts in prompts.items():
        tid = by_name.get(AZURE_ALIASES.get(name, name))
        if tid is None:
            stats["prompts naming a tool not in tools.json"] += len(texts)
            continue
        if name in AZURE_ALIASES:
            stats["prompts of an aliased tool name"] += len(texts)
        for n, text in enumerate(texts):
            text, k = placeholder.subn(r"\1", text)
            stats["placeholders unbracketed"] += k
            stats["prompts with a placeholder"] += bool(k)
            queries.append(Query(f"azure::{name}::{n}", "azure", text, [tid]))
    return dict(sorted(stats.items()))


def mcpverse_server_tools(src, server):
    """(name, description) of every tool one MCP server's source declares."""
    import ast
    import tarfile

    path, inner, form = MCPVERSE_SERVERS[server]
    if inner is None:
        code = (src / path).read_text(encoding="utf-8")
    else:
        with tarfile.open(src / path) as tar:
            code = tar.extractfile(inner).read().decode("utf-8")
    lit = r"""(?:"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*')"""
    joined = rf"((?:{lit}\s*\+?\s*)+)"  # "a" + "b" (JS) or "a" "b" (Python)
    if form == "js-object":
        pattern = rf"name:\s*({lit}),\s*description:\s*{joined}"
    elif form == "js-tool":
        pattern = rf"server\.tool\(\s*({lit})\s*,\s*{joined}"
    else:
        pattern = rf"Tool\(\s*name\s*=\s*({lit})\s*,\s*description\s*=\s*{joined}"
    out = []
    for m in re.finditer(pattern, code):
        name = ast.literal_eval(m.group(1))
        desc = "".join(ast.literal_eval(x) for x in re.findall(lit, m.group(2)))
        out.append((name, desc))
    return out


def load_mcpverse(src, tools, queries):
    """MCPVerse's benchmark tasks over real MCP servers (one to several tools
    each), for the servers whose tool descriptions could be had. The gold
    column joins tools with "+", marks repeats "*N" and sometimes prefixes
    "server/"; a task is kept only if every gold tool has a description."""
    import csv

    catalog = {}  # (server, name) -> tool id
    for server in MCPVERSE_SERVERS:
        for name, desc in mcpverse_server_tools(src, server):
            catalog.setdefault((server, name), add_tool(tools, Tool("mcpverse", server, name, desc)))
    servers_of = collections.defaultdict(set)
    for server, name in catalog:
        servers_of[name].add(server)
    with open(src / MCPVERSE / MCPVERSE_TASKS, encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f))
    stats = collections.Counter()
    undescribed = []  # (qid, gold names) of tasks left out for want of descriptions
    for r in rows:
        qid = (r.get("question_id") or "").strip()
        text = (r.get("question") or "").strip()
        if not qid or not text:
            continue
        stats["tasks read"] += 1
        mcps = [m.strip() for m in r["MCP"].split("+") if m.strip()]
        gold, missing, names = [], [], []
        for entry in r["tool"].split("+"):
            entry = re.sub(r"\s*\*\s*(\d+|N)\s*$", "", entry.strip())
            if not entry:
                continue
            prefix, _, name = entry.rpartition("/")
            name = name.strip()
            if name in MCPVERSE_NOT_TOOLS:
                continue
            names.append(name)
            where = [m for m in ([prefix] if prefix else mcps) if (m, name) in catalog]
            if not where and len(servers_of.get(name, ())) == 1:
                where = sorted(servers_of[name])  # a tool listed under another of the task's servers
            if where:
                gold.append(catalog[(where[0], name)])
            else:
                missing.append(name)
        if not names:
            stats["tasks needing only the code interpreter or a shell"] += 1
        elif missing:
            stats["tasks with a gold tool that has no description"] += 1
            undescribed.append((qid, names))
        else:
            queries.append(Query(f"mcpverse::{qid}", "mcpverse", text, gold))
            stats["tasks kept"] += 1
    stats["described servers"] = len(MCPVERSE_SERVERS)
    stats["described tools"] = len(catalog)
    return dict(sorted(stats.items())), undescribed


def load_docker(shared, tools):
    for r in read_jsonl(shared / "data/catalogs/docker_mcp_registry.tools.jsonl"):
        add_tool(tools, Tool("docker", r["server"], r["name"], r.get("description", ""), r.get("title")))


# --- evaluation sets (read only to keep them out) ---------------------------


class EvalSets:
    def __init__(self, shared, toollens_corpus=None):
        self.servers = set()  # squashed server names
        self.names = set()  # names split into words
        self.hashes = set()
        cats = ["livemcpbench", "metatool"]
        for cat in cats:
            for r in read_jsonl(shared / f"data/catalogs/{cat}.tools.jsonl"):
                self.servers.add(squash(r["server"]))
                self.names.add(norm_name(r["name"]))
                self.hashes.add(tool_hash(r["name"], r.get("description", "")))
        self.servers.discard("")
        self.names.discard("")
        self.queries_exact = set()
        self.queries_norm = set()
        for path in sorted((shared / "data/retrieval").glob("*.jsonl")):
            for r in read_jsonl(path):
                self.queries_exact.add(r["query"].strip())
                self.queries_norm.add(norm_text(r["query"]))
        self.upstream = {}
        self.toollens_names = None
        self.toollens_queries = None
        if toollens_corpus:
            self.toollens_names = set()
            pattern = re.compile(r"tool_name:(.*?), api_name:(.*?), api_description:")
            for r in read_jsonl(toollens_corpus):
                m = pattern.search(r["text"])
                if m:
                    self.toollens_names.update(norm_name(x) for x in m.groups())
            qpath = Path(toollens_corpus).with_name("queries.jsonl")
            if qpath.exists():
                self.toollens_queries = {norm_text(r["text"]) for r in read_jsonl(qpath)}

    def add_upstream_queries(self, mirrors):
        """All queries of MetaTool and LiveMCPBench as published, not only the
        dev halves in ../shared (the rest is kept aside for checks), when bare
        mirrors of those repositories are at hand. Counts them per set."""
        import csv
        import io
        import subprocess

        def show(repo, path):
            git_dir = mirrors / repo.replace("/", "+") / "repo"
            if not git_dir.is_dir():
                return None
            r = subprocess.run(["git", "--git-dir", str(git_dir), "show", f"HEAD:{path}"],
                               capture_output=True, text=True)
            return r.stdout if r.returncode == 0 else None

        texts = {}
        raw = show("HowieHwong/MetaTool", "dataset/data/all_clean_data.csv")
        if raw is not None:
            texts["MetaTool all_clean_data.csv"] = [row["Query"] for row in csv.DictReader(io.StringIO(raw))]
        raw = show("HowieHwong/MetaTool", "dataset/data/multi_tool_query_golden.json")
        if raw is not None:
            texts["MetaTool multi_tool_query_golden.json"] = [r["query"] for r in json.loads(raw)]
        raw = show("icip-cas/LiveMCPBench", "annotated_data/all_annotations.json")
        if raw is not None:
            texts["LiveMCPBench all_annotations.json"] = [r["Question"] for r in json.loads(raw)]
        for name, qs in texts.items():
            self.upstream[name] = len(qs)
            for q in qs:
                self.queries_exact.add(q.strip())
                self.queries_norm.add(norm_text(q))

    def tool_overlap(self, tool):
        """Why a tool collides with an evaluation tool, or None."""
        if tool.hash in self.hashes:
            return "name+description hash"
        if norm_name(tool.name) in self.names:
            return "tool name"
        keys = {squash(tool.server)} if tool.server else set()
        if "." in tool.name:  # BFCL's dotted namespaces act as servers
            keys.add(squash(tool.name.rsplit(".", 1)[0]))
        keys.add(squash(tool.name))  # MetaTool's servers are single tools
        if keys & self.servers:
            return "server name"
        if self.toollens_names is not None:
            if norm_name(tool.name) in self.toollens_names:
                return "ToolLens name"
        elif tool.name in TOOLLENS_NAME_COLLISIONS.get(tool.source, ()):
            return "ToolLens name"
        return None

    def query_overlap(self, text):
        if text.strip() in self.queries_exact:
            return "exact"
        n = norm_text(text)
        if n in self.queries_norm:
            return "normalised"
        if self.toollens_queries is not None and n in self.toollens_queries:
            return "ToolLens normalised"
        return None


# --- self-supervised pairs ---------------------------------------------------

SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(`])")


def sentences(text):
    return [s.strip() for s in SENTENCE_END.split(text.strip()) if s.strip()]


def selfsup_pairs(tool, rng):
    """(kind, query, rest-of-text) pairs from one tool's text alone."""
    out = []
    server_words = norm_name(tool.server)
    name_words = norm_name(tool.name)
    desc = tool.description
    if name_words and len(desc.split()) >= 4:
        rest = (server_words + ": " if server_words else "") + desc
        out.append(("name", name_words, rest))
    sents = [s for s in sentences(desc) if len(s.split()) >= 4]
    if sents:
        pick = rng.choice(sents)
        remaining = " ".join(s for s in sentences(desc) if s != pick)
        rest = embedding_text(tool.server, tool.name, remaining, tool.title)
        if len(rest.split()) >= 3:
            out.append(("sentence", pick, rest))
    return out


# --- main ----------------------------------------------------------------------


def main():
    here = Path(__file__).resolve()
    cache = Path(os.environ.get("MANIFOLD_RETRIEVER_CACHE", Path.home() / ".cache/manifold/retriever"))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sources", type=Path, default=Path(os.environ.get("MANIFOLD_RETRIEVER_SOURCES", cache / "sources")))
    ap.add_argument("--shared", type=Path, default=here.parents[2].parent / "shared")
    ap.add_argument("--out", type=Path, default=cache / "data")
    ap.add_argument("--seed", type=int, default=21)
    ap.add_argument("--dev-fraction", type=float, default=0.1, help="of each source's relevant tools, held out whole")
    ap.add_argument("--seal-server", choices=["field", "none"], default="field",
                    help="Seal-Tools tools have no server: use their field's last part, or none")
    ap.add_argument("--mirrors", type=Path, default=Path(os.environ.get("MANIFOLD_MIRROR_DIR", "/work/.mirror")),
                    help="bare mirrors (owner+name/repo) of MetaTool and LiveMCPBench, if any: "
                         "their full query sets are kept out too")
    ap.add_argument("--toollens-corpus", type=Path,
                    help="ToolLens corpus.jsonl (queries.jsonl beside it is used too), to recompute the collisions")
    args = ap.parse_args()
    if not args.shared.is_dir():
        args.shared = Path("/work/shared")
    manifest = args.sources / "MANIFEST.tsv"
    if not manifest.exists():
        sys.exit(f"build_data: no {manifest}; run scripts/retriever/fetch-sources.sh first")
    needed = [f"{GORILLA}/{BFCL_DIR}/{sub}BFCL_v4_{c}.json" for c in BFCL_CATEGORIES for sub in ("", "possible_answer/")]
    needed += [f"{GORILLA}/data/apibench/torchhub_train.json", f"{SEAL}/Seal-Tools_Dataset/tool.jsonl"]
    needed += [f"{SEAL}/Seal-Tools_Dataset/{split}.jsonl" for split in SEAL_SPLITS]
    needed += [f"{GORILLA}/{BFCL_DIR}/{sub}BFCL_v4_multi_turn_base.json" for sub in ("", "possible_answer/")]
    needed += [f"{GORILLA}/{BFCL_DIR}/multi_turn_func_doc/{stem}.json" for stem in BFCL_MT_DOCS]
    needed += [f"{ALPACA}/data/{split}.json" for split in ALPACA_SPLITS]
    needed += [f"{RESTGPT}/{d}/{f}" for n, f in RESTBENCH_SETS.items() for d, f in (("specs", f), ("datasets", f"{n}.json"))]
    needed += [f"{AZURE}/{AZURE_DIR}/{f}" for f in ("prompts.json", "tools.json")]
    needed += [f"{MCPVERSE}/{MCPVERSE_TASKS}"] + [path for path, _, _ in MCPVERSE_SERVERS.values()]
    absent = [n for n in needed if not (args.sources / n).is_file()]
    if absent:
        sys.exit("build_data: source files missing (run fetch-sources.sh; see the data card):\n  " + "\n  ".join(absent))

    stats = collections.OrderedDict()
    tools, queries = {}, []
    load_bfcl(args.sources, tools, queries)
    load_torchhub(args.sources, tools, queries)
    stats["seal_queries_naming_unknown_tools"] = load_seal(args.sources, tools, queries, args.seal_server)
    load_bfcl_multi_turn(args.sources, tools, queries)
    load_toolalpaca(args.sources, tools, queries)
    load_restbench(args.sources, tools, queries)
    stats["azure_read"] = load_azure(args.sources, tools, queries)
    stats["mcpverse_read"], mcpverse_undescribed = load_mcpverse(args.sources, tools, queries)
    source_tool_ids = list(tools)
    load_docker(args.shared, tools)
    per_source = lambda items, key: dict(collections.Counter(key(x) for x in items))  # noqa: E731
    stats["tools_read"] = per_source(tools.values(), lambda t: t.source)
    stats["queries_read"] = per_source(queries, lambda q: q.source)
    stats["pairs_read"] = dict(collections.Counter(q.source for q in queries for _ in q.gold))

    evals = EvalSets(args.shared, args.toollens_corpus)
    evals.add_upstream_queries(args.mirrors)
    stats["upstream_eval_queries_checked"] = evals.upstream
    if args.toollens_corpus:
        found = {}
        for t in tools.values():
            if norm_name(t.name) in evals.toollens_names:
                found.setdefault(t.source, set()).add(t.name)
        stats["toollens_name_collisions"] = {k: sorted(v) for k, v in sorted(found.items())}

    # 1. Tools that overlap an evaluation set go, with every query needing one.
    dropped_tools = {}
    for t in tools.values():
        why = evals.tool_overlap(t)
        if why:
            dropped_tools[t.id] = why
    # MCPVerse runs real MCP servers, as LiveMCPBench does: a server one of
    # whose tools shares an evaluation tool's name is taken to be the same
    # server, and all its tools go.
    hit_servers = {squash(tools[tid].server) for tid, why in dropped_tools.items()
                   if tools[tid].source == "mcpverse" and why in ("tool name", "name+description hash")}
    for t in tools.values():
        if t.source == "mcpverse" and t.id not in dropped_tools and squash(t.server) in hit_servers:
            dropped_tools[t.id] = "server shares a tool name with an evaluation catalog"
    # The MCPVerse tasks left out for want of tool descriptions: how many of
    # them the name filter would have dropped anyway.
    stats["mcpverse_undescribed_tasks"] = {
        "tasks": len(mcpverse_undescribed),
        "of which needing a tool named as an evaluation tool": sum(
            1 for _, names in mcpverse_undescribed if any(norm_name(n) in evals.names for n in names)),
    }
    stats["tools_dropped_eval_overlap"] = {
        src: dict(collections.Counter(why for tid, why in dropped_tools.items() if tools[tid].source == src))
        for src in sorted({tools[tid].source for tid in dropped_tools})
    }
    stats["tools_dropped_examples"] = sorted(
        f"{tools[tid].source}: {tools[tid].server + ' / ' if tools[tid].server else ''}{tools[tid].name} ({why})"
        for tid, why in dropped_tools.items() if tools[tid].source != "docker"
    )
    kept_q, drop_q = [], collections.Counter()
    for q in queries:
        why = evals.query_overlap(q.query)
        if why:
            drop_q[(q.source, f"query equals an evaluation query ({why})")] += 1
            continue
        if any(g in dropped_tools for g in q.gold):
            drop_q[(q.source, "needs an overlapping tool")] += 1
            continue
        if not q.query:
            drop_q[(q.source, "empty query")] += 1
            continue
        q.candidates = [c for c in q.candidates if c not in dropped_tools]
        kept_q.append(q)
    # 2. The same query text for the same tools: keep the first.
    seen = set()
    unique_q = []
    for q in kept_q:
        key = (norm_text(q.query), tuple(sorted(q.gold)))
        if key in seen:
            drop_q[(q.source, "duplicate of another training query")] += 1
            continue
        seen.add(key)
        unique_q.append(q)
    stats["queries_dropped"] = {f"{s}: {why}": n for (s, why), n in sorted(drop_q.items())}
    queries = unique_q

    # 3. Hold out whole tools: a share of each source's relevant tools; the
    # queries that need any of them are the dev split.
    rng = random.Random(args.seed)
    heldout = set()
    for src in SOURCES:
        relevant = sorted({g for q in queries if q.source == src for g in q.gold})
        rng.shuffle(relevant)
        heldout.update(relevant[: round(len(relevant) * args.dev_fraction)])
    train_q = [q for q in queries if not any(g in heldout for g in q.gold)]
    dev_q = [q for q in queries if any(g in heldout for g in q.gold)]
    stats["heldout_tools"] = per_source([tools[t] for t in sorted(heldout)], lambda t: t.source)

    # 4. Rows, with hard negatives: a query's wrong candidates (BFCL), then
    # BM25 over the same source's tools. Never a relevant tool, nor one whose
    # name or text equals the positive's.
    indexes = {}

    def index_for(src, allow_heldout):
        key = (src, allow_heldout)
        if key not in indexes:
            docs = [(tid, tools[tid].text) for tid in source_tool_ids
                    if tools[tid].source == src and tid not in dropped_tools
                    and (allow_heldout or tid not in heldout)]
            indexes[key] = Bm25(docs)
        return indexes[key]

    def rows_for(qs, allow_heldout):
        rows = []
        mined = 0
        for q in qs:
            gold = set(q.gold)
            for g in q.gold:
                pos = tools[g]

                def bad(tid, pos=pos):
                    t = tools[tid]
                    return (tid in gold or t.text == pos.text or norm_name(t.name) == norm_name(pos.name)
                            or norm_text(t.description) == norm_text(pos.description)
                            or (not allow_heldout and tid in heldout))

                negs = [c for c in q.candidates if not bad(c)]
                rng.shuffle(negs)
                negs = negs[:HARD_NEGATIVES]
                mined_ids = set()
                if len(negs) < HARD_NEGATIVES:
                    more = index_for(q.source, allow_heldout).top(
                        q.query, HARD_NEGATIVES - len(negs), skip=lambda tid: bad(tid) or tid in negs)
                    mined += len(more)
                    mined_ids = set(more)
                    negs += more
                if not negs:  # no shared term (other scripts): random ones
                    pool = index_for(q.source, allow_heldout).ids
                    while len(negs) < HARD_NEGATIVES:
                        pick = rng.choice(pool)
                        if not bad(pick) and pick not in negs:
                            negs.append(pick)
                rows.append({
                    "query": q.query,
                    "positive": pos.text,
                    "negatives": [tools[n].text for n in negs],
                    "source": q.source,
                    "qid": q.id,
                    "positive_id": g,
                    "negative_ids": negs,
                    "negative_kinds": [
                        "candidate" if n in q.candidates else "bm25" if n in mined_ids else "random" for n in negs],
                })
        return rows, mined

    train_rows, train_mined = rows_for(train_q, allow_heldout=False)
    dev_rows, _ = rows_for(dev_q, allow_heldout=True)
    rng.shuffle(train_rows)

    # 5. Self-supervised pairs: docker registry and the source tool sets, less
    # overlapping and held-out tools.
    selfsup = []
    ss_dropped = collections.Counter()
    ss_indexes = {}
    for tid in list(source_tool_ids) + [t for t in tools if tools[t].source == "docker"]:
        t = tools[tid]
        if tid in dropped_tools:
            ss_dropped[f"{t.source}: overlaps an evaluation set"] += 1
            continue
        if tid in heldout:
            ss_dropped[f"{t.source}: held-out dev tool"] += 1
            continue
        if t.source not in ss_indexes:
            ss_indexes[t.source] = Bm25([(i, tools[i].text) for i in tools
                                         if tools[i].source == t.source and i not in dropped_tools and i not in heldout])
        for kind, query, rest in selfsup_pairs(t, rng):
            negs = ss_indexes[t.source].top(
                query, SELFSUP_NEGATIVES,
                skip=lambda i, t=t: i == t.id or norm_text(tools[i].description) == norm_text(t.description))
            selfsup.append({
                "query": query,
                "positive": rest,
                "negatives": [tools[n].text for n in negs],
                "source": f"selfsup-{t.source}-{kind}",
                "positive_id": tid,
                "negative_ids": negs,
            })
    rng.shuffle(selfsup)
    stats["selfsup_tools_dropped"] = dict(sorted(ss_dropped.items()))

    # Outputs.
    args.out.mkdir(parents=True, exist_ok=True)

    def write(name, rows):
        with open(args.out / name, "w", encoding="utf-8") as f:
            for r in rows:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")

    write("train.jsonl", train_rows)
    write("dev.jsonl", dev_rows)
    write("selfsup.jsonl", selfsup)
    catalog = [tools[tid] for tid in source_tool_ids if tid not in dropped_tools]
    write("dev.tools.jsonl", [
        {"id": t.id, "server": t.server, "name": t.name, "description": t.description,
         "source": t.source, "heldout": t.id in heldout}
        for t in catalog
    ])
    write("dev.queries.jsonl", [{"id": q.id, "query": q.query, "relevant": q.gold, "source": q.source} for q in dev_q])
    # The multi-positive form (scripts/retriever/teacher.py mines its negatives
    # with the current model and scores them with the teacher): one row per
    # query with all its relevant tools, and every tool a training row may use.
    train_tool_ids = [tid for tid in source_tool_ids if tid not in dropped_tools and tid not in heldout]
    write("train.queries.jsonl", [
        {"qid": q.id, "query": q.query, "source": q.source, "positives": q.gold,
         "candidates": [c for c in q.candidates if c not in heldout]}
        for q in sorted(train_q, key=lambda q: q.id)
    ])
    write("train.tools.jsonl", [
        {"id": tid, "source": tools[tid].source, "text": tools[tid].text, "name": norm_name(tools[tid].name),
         "description": norm_text(tools[tid].description)}
        for tid in train_tool_ids
    ])

    stats["queries_kept"] = per_source(queries, lambda q: q.source)
    stats["train_queries"] = per_source(train_q, lambda q: q.source)
    stats["train_rows"] = per_source(train_rows, lambda r: r["source"])
    stats["train_rows_total"] = len(train_rows)
    stats["train_distinct_positive_tools"] = len({r["positive_id"] for r in train_rows})
    stats["train_negatives"] = dict(collections.Counter(k for r in train_rows for k in r["negative_kinds"]))
    stats["train_rows_without_negative"] = sum(1 for r in train_rows if not r["negatives"])
    stats["dev_queries"] = per_source(dev_q, lambda q: q.source)
    stats["dev_rows"] = per_source(dev_rows, lambda r: r["source"])
    stats["dev_catalog_tools"] = len(catalog)
    stats["selfsup_rows"] = dict(sorted(collections.Counter(r["source"] for r in selfsup).items()))
    stats["selfsup_rows_total"] = len(selfsup)
    stats["seed"] = args.seed
    stats["dev_fraction"] = args.dev_fraction
    stats["seal_server"] = args.seal_server
    stats["manifest_sha256"] = hashlib.sha256(manifest.read_bytes()).hexdigest()
    with open(args.out / "stats.json", "w") as f:
        json.dump(stats, f, indent=1, ensure_ascii=False)
    for k, v in stats.items():
        print(f"{k}: {json.dumps(v, ensure_ascii=False)}")
    print(f"build_data: wrote {args.out}")


if __name__ == "__main__":
    main()

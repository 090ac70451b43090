#!/usr/bin/env python3
"""Try hybrid fusions offline on the three dev sets, from one evaluation run.

A fusion idea costs minutes through the gateway (a build, then every query
embedded again); from dumped rankings it costs a second. Dump each set once:

    manifold-bench eval search --catalog ... --queries ... \
        --strategy bm25,embedding,hybrid --per-query DIR/live.jsonl --dump-depth 200
    (the same for DIR/distractors.jsonl and DIR/metatool.jsonl; docs/search-quality.md)

then `fusion_lab.py DIR` (with numpy: the retriever venv has it). It first checks that its reciprocal rank fusion
gives the gateway's hybrid ranking for every query (crates/search/src/hybrid.rs:
RRF over each ranking's top 100, BM25F weight 0.4, k 20, ties by id), so a
figure here is the figure the gateway would give; then prints the dev-set
mean (LiveMCPBench nDCG@10, with distractors nDCG@10, MetaTool Hit@1) and
Completeness@10 for a grid of fusions. Add a fusion as a function below.
With `--shared ../shared` it first splits LiveMCPBench's figures by whether a
task needs a tool described in Chinese.
"""

import argparse
import collections
import json
import math
import re
import sys
from pathlib import Path

import numpy as np

SETS = {"live": "ndcg", "distractors": "ndcg", "metatool": "hit1"}


def load(path):
    """{strategy: {query id: row}} and the query ids in file order."""
    by, order = collections.defaultdict(dict), []
    with open(path, encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            by[r["strategy"]][r["id"]] = r
            if r["strategy"] == "bm25":
                order.append(r["id"])
    if not all("hits" in r for r in by["bm25"].values()):
        sys.exit(f"{path}: no \"hits\" in its rows; dump it with --dump-depth 200")
    return by, order


def ndcg10(ranked, relevant):
    gain = lambda i: 1 / math.log2(i + 2)
    dcg = sum(gain(i) for i, d in enumerate(ranked[:10]) if d in relevant)
    ideal = sum(gain(i) for i in range(min(len(relevant), 10)))
    return dcg / ideal if ideal else 0.0


def measure(metric, ranked, relevant):
    """A query's figure on its set (nDCG@10 or Hit@1) and its Completeness@10."""
    value = ndcg10(ranked, relevant) if metric == "ndcg" else float(bool(ranked) and ranked[0] in relevant)
    return value, float(relevant <= set(ranked[:10]))


def rrf_scores(lists, k=20.0, depth=100):
    # In f32, added in the gateway's order, so that ties fall as they fall there.
    fused = collections.defaultdict(lambda: np.float32(0))
    k = np.float32(k)
    for hits, weight in lists:
        weight = np.float32(weight)
        for rank, (d, score) in enumerate(hits[:depth]):
            if score > 0:
                fused[d] = np.float32(fused[d] + weight / (k + np.float32(rank) + np.float32(1)))
    return fused


def rrf(lists, k=20.0, depth=100):
    fused = rrf_scores(lists, k, depth)
    return sorted(fused, key=lambda d: (-fused[d], d))


def weighted(lists, depth=100):
    """Each ranking's scores scaled to [0, 1] over its top `depth`, then added."""
    fused = collections.defaultdict(float)
    for hits, weight in lists:
        top = [(d, s) for d, s in hits[:depth] if s > 0]
        if not top:
            continue
        hi, lo = top[0][1], top[-1][1]
        for d, s in top:
            fused[d] += weight * (s - lo) / max(hi - lo, 1e-9)
    return sorted(fused, key=lambda d: (-fused[d], d))


def margin(b, e, threshold, low):
    """RRF with BM25F's weight cut to `low` for a query whose embedding
    ranking is sure of its first tool (clear of the second by `threshold`)."""
    sure = len(e) > 1 and e[0][1] - e[1][1] > threshold
    w = low if sure else 0.4
    return rrf([(b, w), (e, 1 - w)])


def server_best(fused, top=10):
    """{server: its tools' fused scores among the first `top`, best first}."""
    best = collections.defaultdict(list)
    for d in sorted(fused, key=lambda d: (-fused[d], d))[:top]:
        best[d.split("__")[0]].append(float(fused[d]))
    return best


def pull(scores):
    """The mean of a server's best two scores (one tool counts half)."""
    return (scores[0] + (scores[1] if len(scores) > 1 else 0)) / 2 if scores else 0.0


def server_pull(b, e, weight, top=10):
    """RRF, then each tool lifted by `weight` times its server's `pull` among
    the first `top`: tasks often need two tools of one server."""
    fused = rrf_scores([(b, 0.4), (e, 0.6)])
    best = server_best(fused, top)
    lifted = {d: float(v) + weight * pull(best.get(d.split("__")[0], [])) for d, v in fused.items()}
    return sorted(lifted, key=lambda d: (-lifted[d], d))


def grid():
    """name -> fusion(bm25 hits, embedding hits) -> ranked ids."""
    out = {}
    for k in (10, 20, 40):
        for w in (0.2, 0.3, 0.4, 0.5):
            out[f"rrf k={k} bm25={w}"] = lambda b, e, k=k, w=w: rrf([(b, w), (e, 1 - w)], k=k)
    for w in (0.2, 0.3, 0.4):
        out[f"weighted bm25={w}"] = lambda b, e, w=w: weighted([(b, w), (e, 1 - w)])
    for t in (0.05, 0.08, 0.12):
        out[f"margin>{t} bm25=0.1"] = lambda b, e, t=t: margin(b, e, t, 0.1)
    for w in (0.1, 0.25, 0.5):
        out[f"server pull {w}"] = lambda b, e, w=w: server_pull(b, e, w)
    out["bm25 alone"] = lambda b, e: [d for d, _ in b]
    out["embedding alone"] = lambda b, e: [d for d, _ in e]
    return out


def score(data, fusion):
    figures = {}
    for name, metric in SETS.items():
        by, order = data[name]
        values, complete = [], []
        for qid in order:
            b, e = by["bm25"][qid], by["embedding"][qid]
            relevant = set(b["relevant"])
            value, whole = measure(metric, fusion(b["hits"], e["hits"]), relevant)
            values.append(value)
            complete.append(whole)
        figures[name] = (sum(values) / len(values), sum(complete) / len(complete))
    return sum(v for v, _ in figures.values()) / len(figures), figures


def by_description_language(data, shared):
    """Each strategy's LiveMCPBench figures on the tasks that need a tool
    described in Chinese and on the rest (the gateway's model reads English)."""
    cjk = re.compile("[\u4e00-\u9fff]")
    with open(shared / "data/catalogs/livemcpbench.tools.jsonl", encoding="utf-8") as f:
        chinese = {t["id"] for t in map(json.loads, f) if cjk.search(t.get("description") or "")}
    with open(shared / "data/retrieval/livemcpbench.dev.queries.jsonl", encoding="utf-8") as f:
        needs = {q["id"] for q in map(json.loads, f) if chinese & set(q["relevant"])}
    for name in ("live", "distractors"):
        by, order = data[name]
        for strategy in ("bm25", "embedding", "hybrid"):
            groups = {True: [], False: []}
            for qid in order:
                groups[qid in needs].append(by[strategy][qid]["ndcg@10"])
            print(f"{name} {strategy:9s} " + "  ".join(
                f"{label} ({len(v)}) {sum(v) / len(v):.3f}"
                for label, v in (("needs a Chinese-described tool", groups[True]), ("the rest", groups[False]))))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dumps", type=Path, help="directory with live.jsonl, distractors.jsonl, metatool.jsonl")
    ap.add_argument("--shared", type=Path, help="../shared: also split LiveMCPBench by its tools' language")
    args = ap.parse_args()
    data = {name: load(args.dumps / f"{name}.jsonl") for name in SETS}
    if args.shared:
        by_description_language(data, args.shared)

    differ = 0
    for name, (by, order) in data.items():
        for qid in order:
            mine = rrf([(by["bm25"][qid]["hits"], 0.4), (by["embedding"][qid]["hits"], 1 - np.float32(0.4))])[:10]
            differ += mine != by["hybrid"][qid]["top"]
    total = sum(len(order) for _, order in data.values())
    print(f"parity: the gateway's hybrid top 10 reproduced for {total - differ} of {total} queries")
    if differ:
        return 1
    for label, fusion in grid().items():
        mean, figures = score(data, fusion)
        print(f"{label:22s} mean {mean:.4f}  " + "  ".join(
            f"{n} {v:.3f} (C@10 {c:.3f})" for n, (v, c) in figures.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

#!/usr/bin/env python3
"""The dev-set hybrid mean of two runs, its difference and bootstrap intervals.

    dev_mean.py BEFORE_DIR AFTER_DIR [--strategy hybrid]

Each directory holds the `--per-query` files of `manifold-bench eval search` on the
three dev sets, named live.jsonl (LiveMCPBench), distractors.jsonl (the same
with the docker registry) and metatool.jsonl. The mean is that of LiveMCPBench
nDCG@10, the distractor set's nDCG@10 and MetaTool Hit@1 (issue 46). The
interval resamples each set's queries within that set, pairs kept, as
`manifold_search::eval::Bootstrap::mean_of_sets` does (10,000 resamples, 95%,
fixed seed). Also prints Completeness@10 on both LiveMCPBench sets.
"""

import argparse
import json
import random
from pathlib import Path

SETS = [("live.jsonl", "ndcg@10"), ("distractors.jsonl", "ndcg@10"), ("metatool.jsonl", "hit@1")]


def read(path, strategy):
    rows = {}
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            if r["strategy"] == strategy:
                rows[r["id"]] = r
    return rows


def interval(sets, resamples=10_000, seed=46):
    rng = random.Random(seed)
    means = []
    for _ in range(resamples):
        means.append(sum(sum(s[rng.randrange(len(s))] for _ in s) / len(s) for s in sets) / len(sets))
    means.sort()
    return means[round(0.025 * (resamples - 1))], means[round(0.975 * (resamples - 1))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    ap.add_argument("--strategy", default="hybrid")
    args = ap.parse_args()
    per_set = {"before": [], "after": [], "diff": []}
    for name, metric in SETS:
        b, a = read(args.before / name, args.strategy), read(args.after / name, args.strategy)
        ids = sorted(set(b) & set(a))
        vb = [b[i][metric] for i in ids]
        va = [a[i][metric] for i in ids]
        d = [x - y for x, y in zip(va, vb)]
        lo, hi = interval([d])
        print(f"{name:<18} {metric:<8} {len(ids):>6} queries: {sum(vb) / len(vb):.3f} -> {sum(va) / len(va):.3f}, "
              f"{sum(d) / len(d):+.3f} [{lo:+.3f}, {hi:+.3f}]")
        if metric == "ndcg@10":
            cb = [b[i]["completeness"]["10"] for i in ids]
            ca = [a[i]["completeness"]["10"] for i in ids]
            cd = [x - y for x, y in zip(ca, cb)]
            lo, hi = interval([cd])
            print(f"{'':<18} {'C@10':<8} {len(ids):>6} queries: {sum(cb) / len(cb):.3f} -> {sum(ca) / len(ca):.3f}, "
                  f"{sum(cd) / len(cd):+.3f} [{lo:+.3f}, {hi:+.3f}]")
        per_set["before"].append(vb)
        per_set["after"].append(va)
        per_set["diff"].append(d)
    for key in ("before", "after", "diff"):
        sets = per_set[key]
        mean = sum(sum(s) / len(s) for s in sets) / len(sets)
        lo, hi = interval(sets)
        print(f"hybrid mean {key:<6} {mean:+.3f} [{lo:+.3f}, {hi:+.3f}]" if key == "diff"
              else f"hybrid mean {key:<6} {mean:.3f} [{lo:.3f}, {hi:.3f}]")


if __name__ == "__main__":
    main()

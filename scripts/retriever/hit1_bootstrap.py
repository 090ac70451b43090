#!/usr/bin/env python3
"""Hit@1 per query from `manifold-bench eval search --misses N` output, and a paired
bootstrap interval for the difference between two models (issue 21).

`eval search` prints every query whose top hit is wrong (with `--misses` at
least the number of queries), in the order of the queries file, as
`[strategy] QUERY` lines. Walking the queries file in the same order gives each
query's hit or miss, so two runs pair up query by query. Standard library only.

    eval search --catalog C --queries Q --strategy hybrid --misses 100000 > base.txt 2>&1
    eval search ... (the other model) > new.txt 2>&1
    hit1_bootstrap.py Q base.txt new.txt [--strategy hybrid] [--resamples 10000]
"""

import argparse
import json
import random


def hits(queries, misses_file, strategy):
    prefix = f"[{strategy}] "
    lines = open(misses_file, encoding="utf-8").readlines()
    if not any(line.startswith("strategy ") for line in lines):
        raise SystemExit(f"{misses_file}: no results table; is the run finished?")
    missed = [line[len(prefix):].rstrip("\n") for line in lines if line.startswith(prefix)]
    out, m = [], 0
    for q in queries:
        if m < len(missed) and missed[m] == q:
            out.append(0)
            m += 1
        else:
            out.append(1)
    if m != len(missed):
        raise SystemExit(f"{misses_file}: {len(missed) - m} printed misses not matched in order")
    return out


def interval(values, rng, resamples):
    n = len(values)
    means = sorted(sum(rng.choices(values, k=n)) / n for _ in range(resamples))
    return means[int(0.025 * resamples)], means[int(0.975 * resamples) - 1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("queries")
    ap.add_argument("base")
    ap.add_argument("new")
    ap.add_argument("--strategy", default="hybrid")
    ap.add_argument("--resamples", type=int, default=10000)
    ap.add_argument("--seed", type=int, default=21)
    args = ap.parse_args()
    queries = [json.loads(line)["query"] for line in open(args.queries, encoding="utf-8") if line.strip()]
    a = hits(queries, args.base, args.strategy)
    b = hits(queries, args.new, args.strategy)
    rng = random.Random(args.seed)
    diff = [y - x for x, y in zip(a, b)]
    n = len(queries)
    lo_a, hi_a = interval(a, rng, args.resamples)
    lo_b, hi_b = interval(b, rng, args.resamples)
    lo_d, hi_d = interval(diff, rng, args.resamples)
    print(json.dumps({
        "queries": n, "strategy": args.strategy,
        "base_hit1": round(sum(a) / n, 4), "base_95": [round(lo_a, 4), round(hi_a, 4)],
        "new_hit1": round(sum(b) / n, 4), "new_95": [round(lo_b, 4), round(hi_b, 4)],
        "difference": round(sum(diff) / n, 4), "difference_95": [round(lo_d, 4), round(hi_d, 4)],
        "new_only_hits": diff.count(1), "base_only_hits": diff.count(-1),
    }))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Multi-step training tasks made from single-step ones (issue 46).

An agent's query is often a task of two to four steps whose tools come from
different servers ("find the paper, summarise it and save the summary to
/tmp/x.md"). The training sources have few such queries, so this joins two to
four training queries of different servers into one task, the way people
chain requests ("X. Then Y", "X, and then Y", "X; also Y"), with every part's
positives as the task's positives. Each (task, positive) is a row in
train.jsonl's format, its negatives drawn from that part's own row, so a hard
negative always belongs to the step it confuses and never to another step's
positives.

Only training queries are used (never a dev query or a held-out tool), so the
held-out checks stay clean. Deterministic for a seed.

    python3 scripts/retriever/compose.py            # -> DATA/composed.jsonl
"""

import argparse
import collections
import json
import os
import random
from pathlib import Path

CACHE = Path(os.environ.get("MANIFOLD_RETRIEVER_CACHE", Path.home() / ".cache/manifold/retriever"))

# How people chain steps; `{}` is the next step, lower-cased at its start.
JOINERS = [
    ". Then {}", ", then {}", " and then {}", ". After that, {}", ". Also {}", "; {}",
    ", and {}", ". Finally, {}", ". Next, {}", " and {}",
]


def server_of(tool_id: str) -> str:
    # ids are source::server::name::hash; bfcl has no server (its dotted namespace stands in).
    parts = tool_id.split("::")
    return parts[1] or parts[2].split(".")[0]


def step_text(query: str, first: bool) -> str:
    q = query.strip().rstrip(".?!")
    if not first and q[:1].isupper() and not q[1:2].isupper():
        q = q[0].lower() + q[1:]
    return q


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=CACHE / "data")
    ap.add_argument("--tasks", type=int, default=800, help="how many tasks to make")
    ap.add_argument("--max-words", type=int, default=28, help="longest step taken (words)")
    ap.add_argument("--seed", type=int, default=46)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    rng = random.Random(args.seed)

    # Rows of one query, in file order: the query's positives and each one's negatives.
    by_query = collections.OrderedDict()
    with open(args.data / "train.jsonl", encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            if r.get("qid") and len(r["query"].split()) <= args.max_words:
                by_query.setdefault(r["qid"], []).append(r)
    # At most two positives per step: a task of four steps has at most eight.
    steps = [rows for rows in by_query.values() if len(rows) <= 2]
    steps.sort(key=lambda rows: rows[0]["qid"])
    out = args.out or args.data / "composed.jsonl"
    made = collections.Counter()
    with open(out, "w", encoding="utf-8") as f:
        for t in range(args.tasks):
            n = rng.choice([2, 2, 3, 3, 4])
            chosen, servers = [], set()
            while len(chosen) < n:
                rows = rng.choice(steps)
                s = {server_of(r["positive_id"]) for r in rows}
                if s & servers or rows in chosen:
                    continue
                chosen.append(rows)
                servers |= s
            text = step_text(chosen[0][0]["query"], True)
            for rows in chosen[1:]:
                text += rng.choice(JOINERS).format(step_text(rows[0]["query"], False))
            text += "."
            qid = f"composed::{args.seed}::{t}"
            for rows in chosen:
                for r in rows:
                    f.write(json.dumps({
                        "query": text, "positive": r["positive"], "negatives": r["negatives"],
                        "source": "composed", "qid": qid, "positive_id": r["positive_id"],
                        "negative_ids": r["negative_ids"], "negative_kinds": r.get("negative_kinds"),
                        "steps_from": [c[0]["qid"] for c in chosen],
                    }, ensure_ascii=False) + "\n")
                    made["rows"] += 1
            made[f"steps_{n}"] += 1
    print(json.dumps({"tasks": args.tasks, **made, "out": str(out)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

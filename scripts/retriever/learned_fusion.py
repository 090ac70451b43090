#!/usr/bin/env python3
"""A fusion learned from the dev sets' own rankings, scored by 2-fold cross-validation.

Reads the dumps `fusion_lab.py` reads (DIR/live.jsonl, distractors.jsonl,
metatool.jsonl). Each query's candidates are the union of BM25F's and the
embedding's first 50; each candidate gets 17 features from the two rankings
alone (reciprocal ranks, BM25F score over the top score, cosine and its
distance from the top cosine, presence in each list, the query's length and
the embedding's top-two gap with their products with the ranks, the server's
`fusion_lab.pull` and count among hybrid's first 10, the share of the tool
name's words found in the query, and hybrid's own RRF score).

A scorer (linear, or `--hidden N` for one hidden layer) is trained listwise
(softmax over the candidates, every relevant tool a target) on one half of
every set, split by a salted hash of the query id, each set weighted equally;
it is scored on the other half, then the halves swap. A split's figure is the
mean over both halves, beside hybrid's on the same queries, so a fusion that
only fits the queries it saw cannot show up here. LiveMCPBench's halves are
about 21 queries, so the split moves the figure: it is given for `--splits`
salts, with their mean.

    learned_fusion.py DIR [--splits 5] [--hidden 0]   (the retriever venv: torch, numpy)
"""

import argparse
import collections
import hashlib
import math
import random
import re
from pathlib import Path

import numpy as np
import torch

import fusion_lab
from tooltext import split_identifier

DEPTH = 50


def query_words(text):
    return set(re.split(r"[^0-9a-z]+", text.lower())) - {""}


def features(query, b, e):
    """The candidates (ids) and their feature rows."""
    words = query_words(query)
    qlen = math.log(1 + len(query.split()))
    b_rank = {d: r for r, (d, _) in enumerate(b[:DEPTH])}
    e_rank = {d: r for r, (d, _) in enumerate(e[:DEPTH])}
    b_score, cosine = dict(b[:DEPTH]), dict(e)
    b_top = b[0][1] if b else 1.0
    e_top = e[0][1] if e else 0.0
    e_gap = e[0][1] - e[1][1] if len(e) > 1 else 0.0
    e_floor = e[-1][1] if e else 0.0
    fused = fusion_lab.rrf_scores([(b, 0.4), (e, 0.6)])
    best = fusion_lab.server_best(fused)
    ids = list(dict.fromkeys([d for d, _ in b[:DEPTH]] + [d for d, _ in e[:DEPTH]]))
    rows = []
    for d in ids:
        br = 20 / (21 + b_rank[d]) if d in b_rank else 0.0
        er = 20 / (21 + e_rank[d]) if d in e_rank else 0.0
        c = cosine.get(d, e_floor)
        server = best.get(d.split("__")[0], [])
        name = set(split_identifier(d.split("__", 1)[-1]))
        rows.append([
            br, er, b_score.get(d, 0.0) / max(b_top, 1e-6), c, e_top - c,
            float(d in b_rank), float(d in e_rank), qlen, e_gap,
            qlen * br, qlen * er, e_gap * br, e_gap * er,
            20 * fusion_lab.pull(server), len(server) / 10,
            len(name & words) / max(len(name), 1), 20 * float(fused.get(d, 0)),
        ])
    return ids, np.asarray(rows, dtype=np.float32)


def half(qid, salt):
    return int(hashlib.sha256(f"{salt}:{qid}".encode()).hexdigest(), 16) % 2


def scorer(width, hidden):
    if not hidden:
        return torch.nn.Linear(width, 1)
    return torch.nn.Sequential(torch.nn.Linear(width, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1))


def train(queries, part, hidden, epochs=60):
    """A scorer fitted on the queries of one half."""
    torch.manual_seed(46)
    model = scorer(queries["live"][0]["x"].shape[1], hidden)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3, weight_decay=1e-4)
    items = []
    for rows in queries.values():
        mine = [q for q in rows if q["half"] == part and q["target"].any()]
        items += [(q["x"], q["target"], 1.0 / len(mine)) for q in mine]
    order = random.Random(46)
    for _ in range(epochs):
        order.shuffle(items)
        for i in range(0, len(items), 64):
            loss = sum(-w * torch.log_softmax(model(x).squeeze(-1), 0)[t].mean() for x, t, w in items[i:i + 64])
            opt.zero_grad()
            loss.backward()
            opt.step()
    return model


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dumps", type=Path, help="directory with live.jsonl, distractors.jsonl, metatool.jsonl")
    ap.add_argument("--splits", type=int, default=5, help="salts of the two-way split")
    ap.add_argument("--hidden", type=int, default=0, help="hidden units (0: linear)")
    args = ap.parse_args()
    torch.set_num_threads(2)

    queries, hybrid = {}, {}
    for name in fusion_lab.SETS:
        by, order = fusion_lab.load(args.dumps / f"{name}.jsonl")
        queries[name], hybrid[name] = [], []
        for qid in order:
            b, e = by["bm25"][qid], by["embedding"][qid]
            ids, x = features(b["query"], b["hits"], e["hits"])
            relevant = set(b["relevant"])
            queries[name].append({"id": qid, "ids": ids, "x": x, "relevant": relevant,
                                  "target": torch.tensor([d in relevant for d in ids])})
            ranked = fusion_lab.rrf([(b["hits"], 0.4), (e["hits"], 0.6)])
            hybrid[name].append(fusion_lab.measure(fusion_lab.SETS[name], ranked, relevant)[0])
    stacked = np.concatenate([q["x"] for rows in queries.values() for q in rows])
    mean, std = stacked.mean(0), stacked.std(0) + 1e-6
    for rows in queries.values():
        for q in rows:
            q["x"] = torch.from_numpy((q["x"] - mean) / std)

    means = []
    for salt in range(args.splits):
        for rows in queries.values():
            for q in rows:
                q["half"] = half(q["id"], salt)
        learned = collections.defaultdict(list)
        for held in (0, 1):
            model = train(queries, 1 - held, args.hidden)
            with torch.no_grad():
                for name, rows in queries.items():
                    for q in (q for q in rows if q["half"] == held):
                        s = model(q["x"]).squeeze(-1).numpy()
                        ranked = [q["ids"][i] for i in sorted(range(len(q["ids"])), key=lambda i: (-s[i], q["ids"][i]))]
                        learned[name].append(fusion_lab.measure(fusion_lab.SETS[name], ranked, q["relevant"])[0])
        ours = {n: float(np.mean(v)) for n, v in learned.items()}
        means.append(np.mean(list(ours.values())))
        print(f"split {salt}: mean {means[-1]:.4f}  " + "  ".join(f"{n} {v:.3f}" for n, v in ours.items()), flush=True)
    base = {n: float(np.mean(v)) for n, v in hybrid.items()}
    print(f"learned ({'linear' if not args.hidden else f'{args.hidden} hidden'}): mean over splits "
          f"{np.mean(means):.4f} (min {min(means):.4f}, max {max(means):.4f}); hybrid {np.mean(list(base.values())):.4f}  "
          + "  ".join(f"{n} {v:.3f}" for n, v in base.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

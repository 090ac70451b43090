#!/usr/bin/env python3
"""Late interaction as a second stage, tried offline on the three dev sets.

    late_interaction.py DUMPS MODEL_DIR [--depth 20] [--metatool-sample 2000]

DUMPS holds `fusion_lab.py`'s dumps (live.jsonl, distractors.jsonl,
metatool.jsonl). For each query the candidates are the union of the first
`--depth` of hybrid, BM25F and the embedding; each is scored by MaxSim over
the model's last-layer token vectors (unit length, [CLS], [SEP] and
punctuation left out), both ways: every query token's best tool token
("query"), and every tool token's best query token ("tool"). No training:
the question is whether the token vectors of the model that ships order the
candidates better than the pooled vector does. Prints the dev-set figures of
hybrid, of the candidates re-ordered, and of three-way fusions
(docs/search-quality.md).
"""

import argparse
import hashlib
import random
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import fusion_lab as fl  # noqa: E402
from tooltext import embedding_text  # noqa: E402
from train import INFERENCE_MAX_TOKENS, Tok, load_model, pad, read_rows  # noqa: E402

SHARED = Path(__file__).resolve().parents[3] / "shared"
CATALOGS = ("livemcpbench", "docker_mcp_registry", "metatool")
PUNCTUATION = re.compile(r"^[\W_]+$")


def server_name(name):
    """crates/catalog/src/names.rs: `name` in the alphabet of server names."""
    out = ""
    for c in name:
        c = c if (c.isascii() and c.isalnum()) or c == "-" else "_"
        if not (c == "_" and out.endswith("_")):
            out += c
    return out.strip("_") or "server"


def qualify(server, tool):
    """crates/catalog/src/names.rs: `server__tool`, hashed when it would not fit."""
    plain = f"{server}__{tool}"
    valid = lambda c: (c.isascii() and c.isalnum()) or c in "_-"  # noqa: E731
    if len(plain) <= 64 and tool and all(valid(c) for c in tool):
        return plain
    suffix = hashlib.sha256(f"{server}\0{tool}".encode()).hexdigest()[:8]
    head = "".join(c if valid(c) else "_" for c in plain)[:64 - 9]
    return f"{head}_{suffix}"


def tool_texts():
    """The dev catalogs' embedded texts by the id the gateway gives each tool
    (crates/catalog/src/jsonl.rs: the server lower-cased, then named)."""
    shared = SHARED if SHARED.is_dir() else Path("/work/shared")
    out = {}
    for name in CATALOGS:
        for t in read_rows([shared / "data" / "catalogs" / f"{name}.tools.jsonl"]):
            key = qualify(server_name(t["server"].lower()), t["name"])
            out[key] = embedding_text(t["server"], t["name"], t.get("description", ""), t.get("title"))
    return out


def known(texts, ids):
    """`ids`, each of which must have a text: a miss means the id port above
    differs from the gateway's, and a silently shorter candidate list would
    change every figure."""
    missing = [d for d in ids if d not in texts]
    if missing:
        raise SystemExit(f"no tool text for {len(missing)} ids, e.g. {missing[:3]}: the ids differ from the gateway's")
    return ids


@torch.no_grad()
def token_vectors(model, tok, texts):
    out = [None] * len(texts)
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    for s in range(0, len(order), 32):
        idx = order[s:s + 32]
        enc = tok.t.encode_batch([texts[i] for i in idx])
        ids, att = pad([e.ids for e in enc])
        x = model.embeddings(ids)
        mask = att[:, None, None, :].bool()
        for layer in model.encoder.layer:
            x = layer(x, mask)
        for j, e in enumerate(enc):
            keep = [k for k, t in enumerate(e.tokens)
                    if t not in ("[CLS]", "[SEP]") and not PUNCTUATION.match(t)] or list(range(len(e.ids)))
            out[idx[j]] = F.normalize(x[j, keep], dim=-1)
    return out


def rrf(lists):
    """`fusion_lab.rrf` over rankings of ids (each id counts as a hit)."""
    return fl.rrf([([(d, 1.0) for d in ranked], weight) for ranked, weight in lists])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dumps", type=Path)
    ap.add_argument("model_dir", type=Path)
    ap.add_argument("--depth", type=int, default=20)
    ap.add_argument("--metatool-sample", type=int, default=2000, help="0: every query")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model, _ = load_model(args.model_dir)
    model.eval()
    query_tok, tool_tok = Tok(args.model_dir, 128), Tok(args.model_dir, INFERENCE_MAX_TOKENS)
    texts = tool_texts()
    tools = {}

    fusions = {
        "hybrid": lambda r: r["hybrid"],
        "re-ordered by query MaxSim": lambda r: r["by"]("query"),
        "re-ordered by both MaxSims": lambda r: r["by"]("both"),
        "hybrid + query MaxSim (RRF 0.8/0.2)": lambda r: rrf([(r["hybrid"], 0.8), (r["by"]("query"), 0.2)]),
        "BM25F/embedding/both (RRF 0.3/0.3/0.4)": lambda r: rrf([(r["bm25"], 0.3), (r["embedding"], 0.3), (r["by"]("both"), 0.4)]),
        "BM25F/embedding/both (RRF 0.4/0.3/0.3)": lambda r: rrf([(r["bm25"], 0.4), (r["embedding"], 0.3), (r["by"]("both"), 0.3)]),
    }
    figures = {label: {} for label in fusions}
    for name, metric in fl.SETS.items():
        by, order = fl.load(args.dumps / f"{name}.jsonl")
        if name == "metatool" and args.metatool_sample:
            order = random.Random(46).sample(order, args.metatool_sample)
        rows = []
        for qid in order:
            b, e = by["bm25"][qid], by["embedding"][qid]
            hybrid = fl.rrf([(b["hits"], 0.4), (e["hits"], 0.6)])
            bm25, embedding = [d for d, _ in b["hits"]], [d for d, _ in e["hits"]]
            union = known(texts, list(dict.fromkeys(hybrid[:args.depth] + bm25[:args.depth] + embedding[:args.depth])))
            rows.append({"query": b["query"], "relevant": set(b["relevant"]), "hybrid": hybrid,
                         "bm25": bm25, "embedding": embedding, "union": union})
        need = sorted({d for r in rows for d in r["union"]} - tools.keys())
        tools.update(zip(need, token_vectors(model, tool_tok, [texts[d] for d in need])))
        for r, q in zip(rows, token_vectors(model, query_tok, [r["query"] for r in rows])):
            sims = {d: q @ tools[d].T for d in r["union"]}
            late = {"query": {d: s.max(1).values.mean().item() for d, s in sims.items()},
                    "tool": {d: s.max(0).values.mean().item() for d, s in sims.items()}}
            late["both"] = {d: late["query"][d] + late["tool"][d] for d in r["union"]}
            # the union re-ordered, then the rest of hybrid's ranking
            r["by"] = lambda key, r=r, late=late: (sorted(r["union"], key=lambda d: -late[key][d])
                                                   + [d for d in r["hybrid"] if d not in late[key]])
        for label, fusion in fusions.items():
            values, complete = [], []
            for r in rows:
                value, whole = fl.measure(metric, fusion(r), r["relevant"])
                values.append(value)
                complete.append(whole)
            figures[label][name] = (sum(values) / len(values), sum(complete) / len(complete))
    for label, per_set in figures.items():
        mean = sum(v for v, _ in per_set.values()) / len(per_set)
        print(f"{label:40s} mean {mean:.3f}  " + "  ".join(
            f"{n} {v:.3f} (C@10 {c:.3f})" for n, (v, c) in per_set.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

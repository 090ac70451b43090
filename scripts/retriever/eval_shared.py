#!/usr/bin/env python3
"""Embedding-only figures of a model on the shared dev sets, in Python.

    eval_shared.py MODEL_DIR [--mpnet] [--metatool-sample N]

For models the gateway cannot run (the MPNet teacher) and for quick choices
between checkpoints; the figures that count are the gateway's own
(`manifold-bench eval search`, hybrid), docs/search-quality.md. Tool texts are the
gateway's (tooltext.embedding_text), cut at 256 tokens as the gateway cuts
them; vectors are cached per model file under the retriever cache.
Prints LiveMCPBench nDCG@10 and C@10, the same with the docker registry's
distractors, and MetaTool Hit@1 (on every query, or a fixed sample).
"""

import argparse
import hashlib
import json
import math
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch  # noqa: E402

from tooltext import embedding_text  # noqa: E402
from train import CACHE, INFERENCE_MAX_TOKENS, Tok, embed, load_model, read_rows  # noqa: E402

SHARED = Path(__file__).resolve().parents[3] / "shared"


def vectors(model, tok, texts, key):
    path = CACHE / "eval-vectors" / f"{key}.pt"
    if path.exists():
        return torch.load(path)
    v = embed(model, tok, texts)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(v, path)
    return v


def scores(ranked, relevant):
    rel = set(relevant)
    dcg = sum(1 / math.log2(i + 2) for i, t in enumerate(ranked[:10]) if t in rel)
    idcg = sum(1 / math.log2(i + 2) for i in range(min(10, len(rel))))
    return dcg / idcg, float(rel <= set(ranked[:10])), float(ranked[0] in rel)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir", type=Path)
    ap.add_argument("--mpnet", action="store_true", help="the model is MPNet (the teacher)")
    ap.add_argument("--metatool-sample", type=int, default=2000, help="0: every query")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    shared = SHARED if SHARED.is_dir() else Path("/work/shared")
    if args.mpnet:
        from teacher import MpnetTok, load_mpnet

        model, tok = load_mpnet(args.model_dir), MpnetTok(args.model_dir, INFERENCE_MAX_TOKENS)
    else:
        model, _ = load_model(args.model_dir)
        tok = Tok(args.model_dir, INFERENCE_MAX_TOKENS)
    h = hashlib.sha256((args.model_dir / "model.safetensors").read_bytes()).hexdigest()[:16]

    def catalog(name):
        tools = read_rows([shared / f"data/catalogs/{name}.tools.jsonl"])
        texts = [embedding_text(t["server"], t["name"], t.get("description", ""), t.get("title")) for t in tools]
        return [t["id"] for t in tools], vectors(model, tok, texts, f"{h}-{name}")

    out = {"model": str(args.model_dir)}
    live_ids, live_v = catalog("livemcpbench")
    dock_ids, dock_v = catalog("docker_mcp_registry")
    live_q = read_rows([shared / "data/retrieval/livemcpbench.dev.queries.jsonl"])
    qv = embed(model, tok, [q["query"] for q in live_q])
    for name, ids, v in (("livemcpbench", live_ids, live_v),
                         ("distractors", live_ids + dock_ids, torch.cat([live_v, dock_v]))):
        top = (qv @ v.T).topk(10, dim=1).indices.tolist()
        s = [scores([ids[i] for i in t], q["relevant"]) for q, t in zip(live_q, top)]
        out[f"{name} nDCG@10"] = round(sum(x[0] for x in s) / len(s), 4)
        out[f"{name} C@10"] = round(sum(x[1] for x in s) / len(s), 4)
    mt_ids, mt_v = catalog("metatool")
    mt_q = read_rows([shared / "data/retrieval/metatool.dev.queries.jsonl"])
    if args.metatool_sample:
        mt_q = random.Random(46).sample(mt_q, min(args.metatool_sample, len(mt_q)))
    qv = embed(model, tok, [q["query"] for q in mt_q])
    top = (qv @ mt_v.T).topk(10, dim=1).indices.tolist()
    s = [scores([mt_ids[i] for i in t], q["relevant"]) for q, t in zip(mt_q, top)]
    out[f"metatool Hit@1 ({len(mt_q)} queries)"] = round(sum(x[2] for x in s) / len(s), 4)
    print(json.dumps(out))


if __name__ == "__main__":
    main()

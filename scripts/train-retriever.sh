#!/usr/bin/env bash
# Rebuilds the shipped tool-retrieval model, models/tool-minilm-l6 (issue 46),
# from the data card's sources and the cached teacher scores, with fixed seeds:
# sources -> training rows -> a multi-positive, distilled fine-tune of
# all-MiniLM-L6-v2 -> F16 weights in the layout the gateway's encoder reads,
# then compares them with the committed file.
#
#   scripts/retriever-teacher.sh             # once: the teacher's scores (cached)
#   scripts/train-retriever.sh [RUN_DIR]     # default ~/.cache/manifold/retriever/runs/default
#
# Steps (each resumable: a finished step is skipped, a stopped fine-tune
# resumes from its last checkpoint):
#   1. scripts/retriever/setup.sh           pinned sources, training rows, the venv
#   2. the teacher scores, checked against TEACHER_SHA256 below
#   3. scripts/retriever/train.py           the recipe below; RUN_DIR/model-f16 is the result
#   4. cmp with models/tool-minilm-l6, and the dev split's figures
#
# Score a run on the shared dev sets with the gateway itself:
#   MANIFOLD_EMBEDDING_MODEL_DIR=RUN_DIR/model-f16 manifold-bench eval search ...   (docs/search-quality.md)
# MANIFOLD_RETRIEVER_THREADS (default 1) fixes torch's thread count: the same
# count gives the same bytes. Run it under `nice` on a shared machine.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/retriever/setup.sh"

run=${1:-$cache/runs/default}
threads=${MANIFOLD_RETRIEVER_THREADS:-1}
scores=$cache/teacher-scores
# SHA-256 of teacher-scores/SHA256SUMS as scripts/retriever-teacher.sh made it
# for the shipped model.
TEACHER_SHA256=${TEACHER_SHA256:-0e94d95ea801e35deb8c19798dbb751b2bd7a9ae10b40d8340b8b73c7857606f}

if [[ ! -f "$scores/SHA256SUMS" ]]; then
    echo "train-retriever: no teacher scores in $scores; run scripts/retriever-teacher.sh first" >&2
    exit 1
fi

stamp "fine-tune -> $run ($threads threads)"
started=$(date +%s)
resume=()
[[ -d "$run" ]] && resume=(--resume)
"$venv/bin/python" "$root/scripts/retriever/train.py" --out "$run" --threads "$threads" \
    --teacher-scores "$scores" --teacher-sha256 "$TEACHER_SHA256" \
    --train train.queries.jsonl selfsup.jsonl:3200 --epochs 1 --seed 46 --keep-base 0.5 \
    --checkpoint-every 25 "${resume[@]}"
stamp "fine-tune took $(( $(date +%s) - started )) s"

if cmp -s "$run/model-f16/model.safetensors" "$root/models/tool-minilm-l6/model.safetensors"; then
    stamp "model-f16/model.safetensors is byte-identical to models/tool-minilm-l6"
else
    stamp "model-f16/model.safetensors DIFFERS from models/tool-minilm-l6"
fi

stamp "dev split"
"$venv/bin/python" "$root/scripts/retriever/train.py" --out "$run" --eval-only
stamp "done: $run/model-f16 (MANIFOLD_EMBEDDING_MODEL_DIR=$run/model-f16)"

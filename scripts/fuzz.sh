#!/usr/bin/env bash
# Runs every cargo-fuzz target in fuzz/ for SECONDS each (default 30) from
# the committed seed corpus, and prints the executions each one made.
# Needs the nightly toolchain; installs cargo-fuzz if it is missing.
# New corpus entries go to a temporary folder, so the tree stays clean; a
# crash leaves its input in fuzz/artifacts/TARGET/ and fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-30}"
if ! rustup toolchain list | grep -q '^nightly'; then
    rustup toolchain install nightly --profile minimal
fi
if ! command -v cargo-fuzz >/dev/null; then
    cargo install --locked cargo-fuzz@0.13.2
fi
targets=(jsonrpc headers cursors schema_to_typescript strip_types policy_glob config openapi)
# Rust is memory-safe: what we look for is panics, hangs and blow-ups, so no
# sanitizer (faster to build and to run).
(cd fuzz && cargo +nightly fuzz build --sanitizer none)
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
total=0
for target in "${targets[@]}"; do
    mkdir -p "$work/$target"
    log="$work/$target.log"
    if ! (cd fuzz && cargo +nightly fuzz run --sanitizer none "$target" "$work/$target" "corpus/$target" -- \
        -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=65536 >"$log" 2>&1); then
        tail -n 40 "$log"
        echo "fuzz: $target FAILED (input saved under fuzz/artifacts/$target/)" >&2
        exit 1
    fi
    runs="$(grep -oE 'Done [0-9]+ runs' "$log" | grep -oE '[0-9]+' | tail -n 1)"
    echo "fuzz: $target: ${runs:-?} executions in ${seconds}s, no failure"
    total=$((total + ${runs:-0}))
done
echo "fuzz: all ${#targets[@]} targets: $total executions"

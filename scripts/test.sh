#!/usr/bin/env bash
# The whole test suite, as CI runs it on every commit. Installs what the tests
# need first (idempotent), times every stage, and ends with a table of the
# stage times and one closing line that adds up every runner's counts.
#
# Stages: install test dependencies, build, lint (fmt, clippy, the structure
# and docs checks), cargo test
# (unit, end-to-end with real upstreams and PostgreSQL, browser stories, fuzz
# corpus replay), Python integration tests, MCP conformance (two server
# suites, and the client authorization scenarios against the upstream OAuth client), a
# 2-minute soak, the demo catalog.
#
# Longer campaigns are commands of their own (see docs/testing.md):
# scripts/soak.sh 600 and scripts/fuzz.sh 30.
#
# Environment: CARGO_TARGET_DIR (default target/), SOAK_SECONDS (default 120).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/paths.sh

budget_s=$((40 * 60))
logs="$MANIFOLD_TARGET_DIR/test-logs"
mkdir -p "$logs"
names=()
times=()
run_started=$(date +%s)
passed=0
failed=0

table() {
    local total=$(($(date +%s) - run_started)) i
    echo
    echo "== stage times"
    for i in "${!names[@]}"; do
        printf '  %-34s %5d s  %s\n' "${names[$i]}" "${times[$i]}" "$(fmt_min "${times[$i]}")"
    done
    printf '  %-34s %5d s  %s\n' "total" "$total" "$(fmt_min "$total")"
    if ((total > budget_s)); then
        echo "WARNING: the run took $(fmt_min "$total"), over the 40-minute CI budget (ARCHITECTURE.md, Invariants)" >&2
    fi
}
fmt_min() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }

# stage NAME COMMAND...: runs it, records its time, and on failure prints the
# table so far and exits with the command's status.
stage() {
    local name=$1 started status=0
    shift
    echo
    echo "== $name"
    started=$(date +%s)
    "$@" || status=$?
    names+=("$name")
    times+=($(($(date +%s) - started)))
    echo "-- $name: ${times[-1]} s"
    if ((status != 0)); then
        table
        echo "FAILED in stage: $name (exit $status)" >&2
        exit "$status"
    fi
}

# Add the counts in LOG to the closing line's totals. libtest's lines are
# matched anywhere: a child process's stderr can share the line one starts on.
count_libtest() {
    local p
    p=$(grep -oE 'test result: [a-zA-Z]+\. [0-9]+ passed; [0-9]+ failed' "$1" |
        awk '{p += $4; f += $6} END {print p + 0, f + 0}') || true
    read -r a b <<<"$p"
    passed=$((passed + a))
    failed=$((failed + b))
}
# pytest -q's last line: "3 failed, 79 passed in 55.30s" or "82 passed in 55.30s".
count_pytest() {
    local summary n
    summary=$(grep -E '^[0-9]+ (passed|failed).* in [0-9.]+s' "$1" | tail -n 1) || true
    n=$(grep -oE '[0-9]+ passed' <<<"$summary" | grep -oE '[0-9]+') || true
    passed=$((passed + ${n:-0}))
    n=$(grep -oE '[0-9]+ failed' <<<"$summary" | grep -oE '[0-9]+') || true
    failed=$((failed + ${n:-0}))
}

build() {
    cargo build --workspace --bins
    # Every test binary, so the test stage below only runs them.
    cargo test --workspace --no-run
}

lint() {
    cargo fmt --all --check
    cargo clippy --workspace --all-targets -- -D warnings
    # No import cycles or oversized files; the two maps name only what exists.
    python3 scripts/check-structure.py
    python3 scripts/check-docs.py
}

# One throwaway PostgreSQL cluster for the whole run (manifold-test-postgres
# creates a database per test on it); it stops when its stdin closes.
pg_start() {
    coproc PG { exec "$MANIFOLD_BIN_DIR/manifold-fixture" postgres 2>"$logs/postgres.err"; }
    local line
    if ! IFS= read -r -t 120 line <&"${PG[0]}" || [[ "$line" != MANIFOLD_TEST_POSTGRES_URL=* ]]; then
        cat "$logs/postgres.err" >&2
        echo "test: the shared PostgreSQL cluster did not start" >&2
        return 1
    fi
    export "${line?}"
    echo "test: ${line}"
}
pg_stop() {
    if [[ -n "${PG_PID:-}" ]]; then
        eval "exec ${PG[1]}>&-" 2>/dev/null || true
        wait "$PG_PID" 2>/dev/null || true
    fi
}
trap pg_stop EXIT

cargo_tests() {
    local status=0
    cargo test --workspace 2>&1 | tee "$logs/cargo-test.log" || status=$?
    count_libtest "$logs/cargo-test.log"
    return "$status"
}

python_tests() {
    local status=0
    scripts/test-python.sh 2>&1 | tee "$logs/python.log" || status=$?
    count_pytest "$logs/python.log"
    return "$status"
}

soak() {
    scripts/soak.sh "${SOAK_SECONDS:-120}" >"$logs/soak.log" 2>&1 || {
        cat "$logs/soak.log"
        return 1
    }
    tail -n 12 "$logs/soak.log"
}

demo_catalog() {
    "$MANIFOLD_BIN_DIR/manifold" catalog stats --config fixtures/demo/manifold.toml | tail -n 1
}

stage "install test dependencies" scripts/install-test-deps.sh
stage "build" build
stage "lint (fmt, clippy, structure, docs)" lint
stage "start PostgreSQL" pg_start
stage "cargo test" cargo_tests
stage "python integration tests" python_tests
stage "MCP conformance (two suites)" scripts/conformance.sh
stage "MCP conformance, client auth" scripts/conformance-auth.sh
stage "soak (${SOAK_SECONDS:-120} s)" soak
stage "demo catalog" demo_catalog
table
echo
echo "total: $passed passed, $failed failed"

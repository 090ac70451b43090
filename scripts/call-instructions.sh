#!/usr/bin/env bash
# Instructions the gateway executes per sequential `tools/call`, counted by
# callgrind: a figure the host's noise does not move, for comparing two
# builds of the user-space path. Kernel work (sockets, SQLite's writes) is
# not counted; `manifold-bench call` measures time and CPU.
#
#   scripts/call-instructions.sh [--auth] [--calls N] [--bin DIR]
#
# DIR holds `manifold` and `manifold-fixture` (default target/release).
# Needs valgrind and python3.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
bin="$root/target/release"
calls=1000
auth=false
while [ $# -gt 0 ]; do
  case "$1" in
    --auth) auth=true ;;
    --calls) calls=$2; shift ;;
    --bin) bin=$2; shift ;;
    *) echo "usage: $0 [--auth] [--calls N] [--bin DIR]" >&2; exit 2 ;;
  esac
  shift
done
for tool in valgrind callgrind_control callgrind_annotate python3; do
  command -v "$tool" >/dev/null || { echo "$tool is missing (apt-get install valgrind python3)" >&2; exit 1; }
done
[ -x "$bin/manifold" ] && [ -x "$bin/manifold-fixture" ] ||
  { echo "no manifold and manifold-fixture in $bin (cargo build --release --workspace --bins)" >&2; exit 1; }

work=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
cd "$work"

# Waits for a line matching $2 in the file $1; prints what follows it.
listening_on() {
  for _ in $(seq 600); do
    if grep -q "$2" "$1"; then
      grep -m1 -o "$2.*" "$1" | sed "s/$2//"
      return
    fi
    sleep 0.2
  done
  echo "timed out waiting for '$2' in $1" >&2
  cat "$1" >&2
  exit 1
}

echo '{"id":"bench::echo","server":"bench","name":"echo","description":"Echo the message back.","input_schema":{"type":"object","properties":{"message":{"type":"string"}},"required":["message"]}}' > bench.jsonl
"$bin/manifold-fixture" --http 127.0.0.1:0 catalog --file bench.jsonl --server bench 2> fixture.log &
pids+=($!)
upstream=$(listening_on fixture.log "listening on ")

cat > manifold.toml <<EOF
[gateway]
mode = "direct"

[auth]
required = $auth

[code_mode]
enabled = false

[store]
data_dir = "data"

[[servers]]
name = "bench"
url = "$upstream"
EOF
bearer=""
if [ "$auth" = true ]; then
  bearer=$("$bin/manifold" token create --config manifold.toml --name bench --action discover --action call |
    sed -n 's/^token: //p')
fi

MANIFOLD_LOG=warn valgrind --tool=callgrind --instr-atstart=no \
  --callgrind-out-file="$work/callgrind.out" \
  "$bin/manifold" serve --config manifold.toml --listen 127.0.0.1:0 2> gateway.log &
gateway=$!
pids+=($gateway)
url=$(listening_on gateway.log "manifold listening on ")

# Sequential calls on one keep-alive connection; exits non-zero on a failed call.
drive() {
  python3 - "$url" "$1" "$bearer" <<'PY'
import http.client, json, sys, urllib.parse
url, n, bearer = urllib.parse.urlsplit(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
conn = http.client.HTTPConnection(url.hostname, url.port)
headers = {"content-type": "application/json",
           "accept": "application/json, text/event-stream",
           "mcp-protocol-version": "2025-11-25"}
if bearer:
    headers["authorization"] = "Bearer " + bearer
for i in range(n):
    body = json.dumps({"jsonrpc": "2.0", "id": i, "method": "tools/call",
                       "params": {"name": "bench__echo", "arguments": {"message": "hello"}}})
    conn.request("POST", url.path or "/", body, headers)
    reply = conn.getresponse()
    data = reply.read()
    if reply.status != 200 or b'"result"' not in data or b'"isError":true' in data:
        sys.exit(f"call {i} failed: {reply.status} {data[:200]!r}")
PY
}

drive 200 # warm-up, not counted
callgrind_control -i on "$gateway" >/dev/null
drive "$calls"
callgrind_control -i off "$gateway" >/dev/null
callgrind_control -d "$gateway" >/dev/null
sleep 1
profile="$work/callgrind.out.1" # the dump above
callgrind_annotate "$profile" > annotated.txt 2>/dev/null
total=$(sed -n 's/^ *\([0-9,]*\) .*PROGRAM TOTALS.*/\1/p' annotated.txt | tr -d ,)
copies=$(grep -m1 'memcpy\|memmove' annotated.txt | sed -n 's/^ *\([0-9,]*\) .*/\1/p' | tr -d ,)
echo "auth: $auth; calls counted: $calls"
echo "instructions per call: $((total / calls))"
echo "of which memcpy/memmove: $((${copies:-0} / calls))"
mkdir -p "$root/target"
cp "$profile" "$root/target/call-instructions.callgrind"
echo "profile: target/call-instructions.callgrind (read it with callgrind_annotate --inclusive=yes)"

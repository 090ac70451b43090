#!/usr/bin/env bash
# Puts the public source files of the tool-retrieval training data into a
# cache directory (never into git), each pinned by repository, commit and git
# blob id, and checked against that blob id after extraction.
#
#   scripts/retriever/fetch-sources.sh [--check]
#
# Where the files come from, first that works, per file:
#   1. the cache itself, when the file is already there with the right blob id;
#   2. a bare mirror of the repository at $MANIFOLD_MIRROR_DIR/<owner>+<name>/repo
#      (default /work/.mirror). These machines reach no git host: a mirror is
#      brought in by the session tool `fetch` (github:<owner>/<name>), which is
#      not a shell command, so this script can only read one that exists;
#   3. for the BFCL files only: the Python package bfcl-eval==2026.3.23, the
#      leaderboard's own release cut from the same commit, downloaded with
#      `pip download --no-deps` from the ordinary package index. Its files are
#      byte-identical to the pinned blobs (the blob check below enforces it).
#   4. the npm tarballs of three MCP servers MCPVerse uses (tool descriptions):
#      `npm pack` of an exact version, checked against npm's sha1.
# Seal-Tools, ToolAlpaca, RestGPT (RestBench), microsoft/mcp (Azure prompts),
# MCPVerse and the apibench torchhub file exist in no package: on a machine
# without the mirrors, fetch them first (see docs/retriever-data-card.md).
#
# Writes:
#   $SOURCES/<owner>+<name>/<path>   the files
#   $SOURCES/MANIFEST.tsv            repo, commit, path, blob, bytes, origin
#   $SOURCES/SNAPSHOT-GAPS.txt       files the mirror snapshots lack (>= 4 MiB)
# --check only verifies the cache and exits non-zero if anything is missing.
set -euo pipefail

sources="${MANIFOLD_RETRIEVER_SOURCES:-$HOME/.cache/manifold/retriever/sources}"
mirrors="${MANIFOLD_MIRROR_DIR:-/work/.mirror}"
python="${PYTHON:-python3}"
check_only=0
[[ "${1:-}" == "--check" ]] && check_only=1

GORILLA=ShishirPatil/gorilla
GORILLA_COMMIT=6ea57973c7a6097fd7c5915698c54c17c5b1b6c8
SEAL=fairyshine/Seal-Tools
SEAL_COMMIT=ce753ecd60ed08dd376984035de531ab8421f1c6
ALPACA=tangqiaoyu/ToolAlpaca
ALPACA_COMMIT=189069998d64a7baf1b4a1c3c4b2e75eb9d05532
RESTGPT=Yifan-Song793/RestGPT
RESTGPT_COMMIT=d99012860cb45323975bf5780152d7aa44f390f5
AZURE=microsoft/mcp
AZURE_COMMIT=10761c1d70acf2df4967ca3ddb6206428f921723 # 2026-01-07, a side branch: the last prompts.json + tools.json pair
MCPVERSE=SenseTime-FVG/mcpverse
MCPVERSE_COMMIT=8f091c15a343ce37461d3c2fbc4bc3d572a123aa # 2025-10-11: the 282-task benchmark file
MCPVERSE_HEAD=66d20f125bc732091c6e212b5eb729a54925e20a   # 2025-12-26: the sqlite server's source
BFCL_PACKAGE=bfcl-eval==2026.3.23
BFCL_DIR=berkeley-function-call-leaderboard/bfcl_eval/data

# repo commit blob path
files=$(cat <<EOF
$GORILLA $GORILLA_COMMIT 261eeb9e9f8b2b4b0d119366dda99c6fd7d35c64 LICENSE
$GORILLA $GORILLA_COMMIT 356a0db61e54eb1d92d8e10d014463cf2eb513cc $BFCL_DIR/BFCL_v4_simple_python.json
$GORILLA $GORILLA_COMMIT 268c55641a21b51fc15730ce39ce906444a935a1 $BFCL_DIR/possible_answer/BFCL_v4_simple_python.json
$GORILLA $GORILLA_COMMIT 83643fa853e7a29a50e7303b0279284c37dd63c8 $BFCL_DIR/BFCL_v4_multiple.json
$GORILLA $GORILLA_COMMIT 1f2f1fbfd9b7c8859ef5a92d6c18b0a6b2bc2663 $BFCL_DIR/possible_answer/BFCL_v4_multiple.json
$GORILLA $GORILLA_COMMIT e8f4b8d33c07753affc77bfc4a646f94109de5af $BFCL_DIR/BFCL_v4_live_simple.json
$GORILLA $GORILLA_COMMIT 2c4778cee08e5ce7b236861de9a927d3ea7cde1f $BFCL_DIR/possible_answer/BFCL_v4_live_simple.json
$GORILLA $GORILLA_COMMIT b7c108f2edc86563fd3e1363e5f6fd961452d142 $BFCL_DIR/BFCL_v4_live_multiple.json
$GORILLA $GORILLA_COMMIT b2f4c71547d3a534e2e40231db14943bfa81cc74 $BFCL_DIR/possible_answer/BFCL_v4_live_multiple.json
$GORILLA $GORILLA_COMMIT 832039d6758e2569d65342b3fc9524924a03832a $BFCL_DIR/BFCL_v4_parallel_multiple.json
$GORILLA $GORILLA_COMMIT 52b010cb01334c98456cc3ec0886dd85d51ec284 $BFCL_DIR/possible_answer/BFCL_v4_parallel_multiple.json
$GORILLA $GORILLA_COMMIT 54997d2e1fa4061d5701f6f42079c95102f8c09e $BFCL_DIR/BFCL_v4_live_parallel_multiple.json
$GORILLA $GORILLA_COMMIT df36b6020f21ef6f38ebb4a8c6e90206915985af $BFCL_DIR/possible_answer/BFCL_v4_live_parallel_multiple.json
$GORILLA $GORILLA_COMMIT 0cc469122d788c193568ee339211130ccd1453c7 data/apibench/torchhub_train.json
$GORILLA $GORILLA_COMMIT a4bf421f18b1fad3afe7196a350b24e0058770b2 data/api/torchhub_api.jsonl
$SEAL $SEAL_COMMIT 261eeb9e9f8b2b4b0d119366dda99c6fd7d35c64 LICENSE
$SEAL $SEAL_COMMIT f84f2924bb3f6bba4c258836c46a6f9babc7f2d7 Seal-Tools_Dataset/tool.jsonl
$SEAL $SEAL_COMMIT 9b68716e7564d0854456c368c4b7af1d0ca33db3 Seal-Tools_Dataset/dev.jsonl
$SEAL $SEAL_COMMIT 66482d276618155d764b7fd8f7f13dcdf1aeee12 Seal-Tools_Dataset/test_in_domain.jsonl
$SEAL $SEAL_COMMIT ec857c6ab87cf72c600d8a33cd77e52ae109cda1 Seal-Tools_Dataset/test_out_domain.jsonl
$GORILLA $GORILLA_COMMIT 656fbd5e56969373353cd58b880234a6cc4edc99 $BFCL_DIR/BFCL_v4_multi_turn_base.json
$GORILLA $GORILLA_COMMIT 3ee85fcd5e8cccca24e2347e464b58fd1b9f02a1 $BFCL_DIR/possible_answer/BFCL_v4_multi_turn_base.json
$GORILLA $GORILLA_COMMIT b9a6d2d314febe8ccf201887ef87cfe081ffbf4e $BFCL_DIR/multi_turn_func_doc/gorilla_file_system.json
$GORILLA $GORILLA_COMMIT 52a911035a2b71390027e02af70c1abb904c71b3 $BFCL_DIR/multi_turn_func_doc/math_api.json
$GORILLA $GORILLA_COMMIT a178734ad47f269571c877e6e433b26171516024 $BFCL_DIR/multi_turn_func_doc/message_api.json
$GORILLA $GORILLA_COMMIT 2a8737a376640ba304c313d23d63049927f823eb $BFCL_DIR/multi_turn_func_doc/posting_api.json
$GORILLA $GORILLA_COMMIT f8281657b64c4b6410a8590cc82b9584bc39729f $BFCL_DIR/multi_turn_func_doc/ticket_api.json
$GORILLA $GORILLA_COMMIT 7dce37326156f65efc55df30db26064d68e8dc8c $BFCL_DIR/multi_turn_func_doc/trading_bot.json
$GORILLA $GORILLA_COMMIT 95008945fa5a9bc104a77647e4990d1e36ce7ec5 $BFCL_DIR/multi_turn_func_doc/travel_booking.json
$GORILLA $GORILLA_COMMIT 7139dfc3bf2646be8f71ac383760f28899b17f85 $BFCL_DIR/multi_turn_func_doc/vehicle_control.json
$ALPACA $ALPACA_COMMIT 261eeb9e9f8b2b4b0d119366dda99c6fd7d35c64 LICENSE
$ALPACA $ALPACA_COMMIT 8394f883f31735149037a20caf3058b1863edda4 data/eval_real.json
$ALPACA $ALPACA_COMMIT 65b54fb85e9956742c022ce835705e8fb72db118 data/eval_simulated.json
$RESTGPT $RESTGPT_COMMIT 69b3bf667ee69ff88efcae8a0198fcec02326320 LICENSE
$RESTGPT $RESTGPT_COMMIT 96db4f8f07c84f8c19dc4e6e551d85fccfe20fa6 datasets/tmdb.json
$RESTGPT $RESTGPT_COMMIT 316aced3b471820065eb79abfe77d7bd50dc640e datasets/spotify.json
$RESTGPT $RESTGPT_COMMIT 7bd5feefd07959c93046b4100442a1b57819f49d specs/tmdb_oas.json
$RESTGPT $RESTGPT_COMMIT 13302f2b63cf76ae3e31d619f01ce5271b8c4e4d specs/spotify_oas.json
$AZURE $AZURE_COMMIT 356b112bcc4f07e03b6e57569eedf9d79978d2d5 LICENSE
$AZURE $AZURE_COMMIT 7d42964b8f4ca6df7aea29752f7dc0a0aafccffb eng/tools/ToolDescriptionEvaluator/prompts.json
$AZURE $AZURE_COMMIT f8bc7c4be5e688d95d7818086c168c094bd1a0c6 eng/tools/ToolDescriptionEvaluator/tools.json
$MCPVERSE $MCPVERSE_COMMIT d9056118eb57cf418bf993f1b8f17e46d5e71999 LICENSE
$MCPVERSE $MCPVERSE_COMMIT 269b172ecc8182bb2c5e8d87be2279fe0ea38b64 mcpverse/data/mcpverse_benchmark.csv
$MCPVERSE $MCPVERSE_COMMIT f6b7c6e6cf95fa1359f1ca3832032765e5e06788 mcpverse/servers/dataset-viewer/src/dataset_viewer/server.py
$MCPVERSE $MCPVERSE_COMMIT fa99f7d0c6ac77cc805d0bf919cd2f4dad8f8c7d mcpverse/servers/world_bank_mcp_server/src/world_bank_mcp_server/server.py
$MCPVERSE $MCPVERSE_HEAD 44913c817f6456b20db780f7cabba91795637328 mcpverse/servers/sqlite/src/mcp_server_sqlite/server.py
EOF
)

# npm packages of MCP servers that MCPVerse uses, for their tool descriptions
# (MCPVerse's repository has none): spec, sha1 of the tarball (npm's
# dist.shasum), file name under $SOURCES/npm/.
npm_packages=$(cat <<EOF
@amap/amap-maps-mcp-server@0.0.8 d9bd511e66c0a845e0ea8715e70e942329cebf04 amap-amap-maps-mcp-server-0.0.8.tgz
@jeromyfu/app-insight-mcp@1.0.8 49ad3b1e6e6f355adf23d131ac96affce3e2bce8 jeromyfu-app-insight-mcp-1.0.8.tgz
@variflight-ai/variflight-mcp@1.0.3 734ab5d5f606441bf2c0556dc20539c176510cda variflight-ai-variflight-mcp-1.0.3.tgz
EOF
)

# The git blob id of a file (sha1 of "blob <size>\0<bytes>"), without git.
blob_id() {
    "$python" - "$1" <<'PY'
import hashlib, sys
data = open(sys.argv[1], "rb").read()
print(hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest())
PY
}

mirror_of() { echo "$mirrors/${1/\//+}/repo"; }

bfcl_wheel=""
bfcl_from_package() { # path-in-repo dest
    local inner="bfcl_eval/data/${1#"$BFCL_DIR"/}"
    if [[ -z "$bfcl_wheel" ]]; then
        local dl
        dl="$(mktemp -d)"
        echo "fetch-sources: downloading $BFCL_PACKAGE (no dependencies)" >&2
        "$python" -m pip download --quiet --no-deps -d "$dl" "$BFCL_PACKAGE" >&2 || return 1
        bfcl_wheel="$(ls "$dl"/*.whl | head -1)"
    fi
    "$python" - "$bfcl_wheel" "$inner" "$2" <<'PY'
import sys, zipfile
wheel, inner, dest = sys.argv[1:]
with zipfile.ZipFile(wheel) as z, open(dest, "wb") as out:
    out.write(z.read(inner))
PY
}

mkdir -p "$sources"
manifest="$sources/MANIFEST.tsv"
tmp_manifest="$(mktemp)"
printf 'repo\tcommit\tpath\tblob\tbytes\torigin\n' >"$tmp_manifest"
missing=0
while read -r repo commit blob path; do
    dest="$sources/${repo/\//+}/$path"
    origin=""
    if [[ -f "$dest" && "$(blob_id "$dest")" == "$blob" ]]; then
        origin="cache"
    elif ((check_only)); then
        echo "fetch-sources: missing or changed: $repo $path" >&2
        missing=$((missing + 1))
        continue
    else
        mkdir -p "$(dirname "$dest")"
        mirror="$(mirror_of "$repo")"
        if [[ -d "$mirror" ]] && git --git-dir="$mirror" cat-file -e "$blob" 2>/dev/null; then
            git --git-dir="$mirror" show "$commit:$path" >"$dest.part" && origin="mirror:$mirror"
        elif [[ "$repo" == "$GORILLA" && "$path" == "$BFCL_DIR"/* ]]; then
            bfcl_from_package "$path" "$dest.part" && origin="package:$BFCL_PACKAGE"
        fi
        if [[ -n "$origin" && "$(blob_id "$dest.part")" == "$blob" ]]; then
            mv "$dest.part" "$dest"
        else
            rm -f "$dest.part"
            echo "fetch-sources: could not get $repo@$commit:$path (blob $blob);" \
                "bring the repository in with the session tool fetch (github:$repo)" >&2
            missing=$((missing + 1))
            continue
        fi
    fi
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$repo" "$commit" "$path" "$blob" \
        "$(wc -c <"$dest" | tr -d ' ')" "$origin" >>"$tmp_manifest"
done <<<"$files"

sha1_of() { "$python" -c 'import hashlib,sys; print(hashlib.sha1(open(sys.argv[1],"rb").read()).hexdigest())' "$1"; }
while read -r spec sha1 file; do
    dest="$sources/npm/$file"
    origin=""
    if [[ -f "$dest" && "$(sha1_of "$dest")" == "$sha1" ]]; then
        origin="cache"
    elif ((check_only)); then
        echo "fetch-sources: missing or changed: npm $spec" >&2
        missing=$((missing + 1))
        continue
    else
        mkdir -p "$sources/npm"
        dl="$(mktemp -d)"
        echo "fetch-sources: npm pack $spec" >&2
        if (cd "$dl" && npm pack --silent "$spec" >/dev/null 2>&1) && [[ -f "$dl/$file" ]] \
            && [[ "$(sha1_of "$dl/$file")" == "$sha1" ]]; then
            mv "$dl/$file" "$dest"
            origin="package:npm"
        else
            echo "fetch-sources: could not get npm $spec with sha1 $sha1" >&2
            missing=$((missing + 1))
        fi
        rm -rf "$dl"
        [[ -n "$origin" ]] || continue
    fi
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "npm:${spec%@*}" "${spec##*@}" "npm/$file" "sha1:$sha1" \
        "$(wc -c <"$dest" | tr -d ' ')" "$origin" >>"$tmp_manifest"
done <<<"$npm_packages"
mv "$tmp_manifest" "$manifest"

# What the mirror snapshots lack: blobs listed in the tree but absent (the
# snapshots leave out files of 4 MiB or more).
if ((!check_only)); then
    {
        for pair in "$GORILLA $GORILLA_COMMIT" "$SEAL $SEAL_COMMIT" "$ALPACA $ALPACA_COMMIT" "$RESTGPT $RESTGPT_COMMIT" \
            "$AZURE $AZURE_COMMIT" "$MCPVERSE $MCPVERSE_COMMIT"; do
            set -- $pair
            mirror="$(mirror_of "$1")"
            if [[ ! -d "$mirror" ]]; then
                echo "$1@$2: no mirror at $mirror"
                continue
            fi
            total=0
            absent=()
            while IFS=$'\t' read -r meta p; do
                read -r _mode kind b <<<"$meta"
                [[ "$kind" == blob ]] || continue
                total=$((total + 1))
                git --git-dir="$mirror" cat-file -e "$b" 2>/dev/null || absent+=("$p")
            done < <(git --git-dir="$mirror" ls-tree -r "$2")
            echo "$1@$2: $total files in the tree, ${#absent[@]} absent from the snapshot"
            for p in "${absent[@]}"; do echo "  $p"; done
        done
    } >"$sources/SNAPSHOT-GAPS.txt"
    cat "$sources/SNAPSHOT-GAPS.txt"
fi

echo "fetch-sources: $(($(wc -l <"$manifest") - 1)) files in $sources ($missing missing)"
((missing == 0))

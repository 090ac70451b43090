#!/usr/bin/env bash
# Smoke test of the loopback OpenID provider (provider.mjs), with curl and node only.
#   tests/npm/oidc/smoke.sh        (after `npm ci` in tests/npm, or scripts/install-test-deps.sh)
# It starts the provider, runs client_credentials, dynamic registration + authorization code
# with PKCE (following the redirects with curl, no person), refresh (with rotation and reuse
# detection), checks the JWT access tokens' header, signature and claims, the runtime settings
# (short TTL, backdated tokens), rotates the signing key, and stops the provider with SIGTERM.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
[[ -d "$here/../node_modules/oidc-provider" ]] \
    || { echo "smoke: tests/npm/node_modules/oidc-provider is missing (npm ci in tests/npm)" >&2; exit 1; }

work="$(mktemp -d)"
pid=""
cleanup() {
    if [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null; then kill -TERM "$pid" 2>/dev/null || true; fi
    rm -rf "$work"
}
trap cleanup EXIT

pass=0
ok() { pass=$((pass + 1)); echo "ok   $*"; }
die() {
    echo "FAIL $*" >&2
    echo "--- provider stderr ---" >&2
    cat "$work/provider.err" >&2 || true
    exit 1
}

# json FILE_OR_- EXPR: evaluate a JS expression over the parsed JSON `j`; prints strings raw
# and everything else as JSON.
json() {
    local src="$1" expr="$2"
    node -e '
        const fs = require("fs");
        const j = JSON.parse(fs.readFileSync(process.argv[1] === "-" ? 0 : process.argv[1], "utf8"));
        const v = eval(process.argv[2]);
        process.stdout.write(typeof v === "string" ? v : JSON.stringify(v));
    ' "$src" "$expr"
}

# jwt_part TOKEN 0|1: the decoded header (0) or payload (1) of a compact JWS, as JSON.
jwt_part() {
    node -e 'process.stdout.write(Buffer.from(process.argv[1].split(".")[+process.argv[2]], "base64url").toString())' "$1" "$2"
}

# jwt_verify TOKEN JWKS_FILE: prints "valid" if the RS256 signature verifies with the key of the
# token's kid in the JWKS, "no-key" if the kid is not there, "bad-signature" otherwise.
jwt_verify() {
    node -e '
        const crypto = require("crypto"), fs = require("fs");
        const [h, p, s] = process.argv[1].split(".");
        const header = JSON.parse(Buffer.from(h, "base64url"));
        const jwks = JSON.parse(fs.readFileSync(process.argv[2], "utf8"));
        const jwk = jwks.keys.find((k) => k.kid === header.kid);
        if (!jwk) { process.stdout.write("no-key"); process.exit(0); }
        const key = crypto.createPublicKey({ key: jwk, format: "jwk" });
        const good = header.alg === "RS256" && crypto.verify("RSA-SHA256", Buffer.from(`${h}.${p}`), key, Buffer.from(s, "base64url"));
        process.stdout.write(good ? "valid" : "bad-signature");
    ' "$1" "$2"
}

# check_claims TOKEN AUD SCOPE SUB GROUPS_JSON TTL: the access token's header and claims.
check_claims() {
    local token="$1" aud="$2" scope="$3" sub="$4" groups="$5" ttl="$6"
    jwt_part "$token" 0 > "$work/h.json"
    jwt_part "$token" 1 > "$work/p.json"
    [[ "$(json "$work/h.json" 'j.alg + " " + j.typ')" == "RS256 at+jwt" ]] || die "header: $(cat "$work/h.json")"
    local got
    got="$(json "$work/p.json" '[j.iss, j.aud, j.scope, j.sub, JSON.stringify(j.groups ?? null), j.exp - j.iat].join("|")')"
    [[ "$got" == "$issuer|$aud|$scope|$sub|$groups|$ttl" ]] \
        || die "claims: got $got, want $issuer|$aud|$scope|$sub|$groups|$ttl; payload $(cat "$work/p.json")"
    local now exp
    now="$(date +%s)"; exp="$(json "$work/p.json" 'j.exp')"
    (( exp > now && exp <= now + ttl + 5 )) || die "exp $exp not within (now, now+$ttl] (now $now)"
}

# --- start -----------------------------------------------------------------------------------
resource="http://127.0.0.1:18080/mcp"
other="http://127.0.0.1:18081/mcp"
cat > "$work/accounts.json" <<'JSON'
{
  "alice": { "groups": ["engineering"] },
  "bob": { "groups": ["sales"] },
  "carol": { "groups": ["contractors", "engineering"], "scopes": ["manifold:discover"], "claims": { "department": "ops" } }
}
JSON
node "$here/provider.mjs" --port 0 --resource "$resource" --resource "$other" --access-ttl 300 \
    --accounts "$work/accounts.json" --login alice > "$work/provider.out" 2> "$work/provider.err" &
pid=$!
for _ in $(seq 1 100); do
    [[ -s "$work/provider.out" ]] && break
    kill -0 "$pid" 2>/dev/null || die "provider exited before it was ready"
    sleep 0.1
done
[[ -s "$work/provider.out" ]] || die "provider printed no ready line within 10s"
head -n1 "$work/provider.out" > "$work/ready.json"
issuer="$(json "$work/ready.json" 'j.issuer')"
token_endpoint="$(json "$work/ready.json" 'j.token_endpoint')"
jwks_uri="$(json "$work/ready.json" 'j.jwks_uri')"
registration_endpoint="$(json "$work/ready.json" 'j.registration_endpoint')"
authorization_endpoint="$(json "$work/ready.json" 'j.authorization_endpoint')"
echo "provider $issuer (pid $pid)"
ok "ready line: $(cat "$work/ready.json")"

curl -sf "$issuer/.well-known/openid-configuration" > "$work/discovery.json" || die "discovery"
[[ "$(json "$work/discovery.json" 'j.issuer')" == "$issuer" && "$(json "$work/discovery.json" 'j.jwks_uri')" == "$jwks_uri" ]] \
    || die "discovery issuer/jwks_uri: $(cat "$work/discovery.json")"
[[ "$(json "$work/discovery.json" 'j.code_challenge_methods_supported.join(" ")')" == "S256" ]] || die "PKCE methods"
[[ "$(json "$work/discovery.json" 'j.authorization_response_iss_parameter_supported')" == "true" ]] || die "RFC 9207 iss"
curl -sf "$issuer/.well-known/oauth-authorization-server" > "$work/rfc8414.json" || die "RFC 8414 metadata"
ok "discovery (OIDC and RFC 8414) names issuer, jwks_uri, S256 PKCE, iss in authorization responses"

curl -sf "$jwks_uri" > "$work/jwks1.json" || die "jwks"
kid1="$(json "$work/jwks1.json" 'j.keys.map((k) => k.kid).join(" ")')"
[[ "$(json "$work/jwks1.json" 'j.keys.length + " " + j.keys[0].kty + " " + j.keys[0].alg + " " + ("d" in j.keys[0])')" == "1 RSA RS256 false" ]] \
    || die "jwks: $(cat "$work/jwks1.json")"
ok "JWKS has one public RS256 key ($kid1)"

# --- client_credentials ------------------------------------------------------------------------
curl -sf -u manifold-test:manifold-test-secret "$token_endpoint" \
    -d grant_type=client_credentials --data-urlencode "scope=manifold:discover manifold:call" \
    --data-urlencode "resource=$resource" > "$work/cc.json" || die "client_credentials"
cc_token="$(json "$work/cc.json" 'j.access_token')"
[[ "$(json "$work/cc.json" 'j.token_type + " " + j.expires_in')" == "Bearer 300" ]] || die "cc response: $(cat "$work/cc.json")"
check_claims "$cc_token" "$resource" "manifold:discover manifold:call" manifold-test null 300
[[ "$(jwt_verify "$cc_token" "$work/jwks1.json")" == valid ]] || die "cc token signature"
ok "client_credentials: JWT aud=$resource scope='manifold:discover manifold:call' sub=manifold-test, signature valid"

# No resource: the first --resource is the default. Another resource: its own aud.
curl -sf -u manifold-test:manifold-test-secret "$token_endpoint" -d grant_type=client_credentials \
    -d scope=manifold:call > "$work/cc2.json" || die "client_credentials without resource"
[[ "$(jwt_part "$(json "$work/cc2.json" 'j.access_token')" 1 | json - 'j.aud')" == "$resource" ]] || die "default resource"
curl -sf -u manifold-test:manifold-test-secret "$token_endpoint" -d grant_type=client_credentials \
    -d scope=manifold:call --data-urlencode "resource=$other" > "$work/cc3.json" || die "client_credentials other resource"
[[ "$(jwt_part "$(json "$work/cc3.json" 'j.access_token')" 1 | json - 'j.aud')" == "$other" ]] || die "other aud"
code="$(curl -s -o "$work/cc4.json" -w '%{http_code}' -u manifold-test:manifold-test-secret "$token_endpoint" \
    -d grant_type=client_credentials -d scope=manifold:call --data-urlencode "resource=http://127.0.0.1:1/unknown")"
[[ "$code" == 400 && "$(json "$work/cc4.json" 'j.error')" == invalid_target ]] || die "unknown resource: $code $(cat "$work/cc4.json")"
ok "resource: omitted -> first --resource; second --resource -> its own aud; unknown -> 400 invalid_target"

late="http://127.0.0.1:18082/mcp"
curl -sf -X POST "$issuer/test/resources?add=$(node -e 'process.stdout.write(encodeURIComponent(process.argv[1]))' "$late")" \
    > "$work/res.json" || die "POST /test/resources"
curl -sf -u manifold-test:manifold-test-secret "$token_endpoint" -d grant_type=client_credentials \
    -d scope=manifold:call --data-urlencode "resource=$late" > "$work/cc5.json" || die "client_credentials late resource"
[[ "$(jwt_part "$(json "$work/cc5.json" 'j.access_token')" 1 | json - 'j.aud')" == "$late" ]] || die "late aud"
ok "POST /test/resources?add=URL: a resource added at runtime gets tokens"

# --- dynamic registration + authorization code + PKCE, following redirects ------------------
redirect_uri="http://127.0.0.1:9/callback"   # never contacted: we stop at the redirect
curl -sf -H 'Content-Type: application/json' "$registration_endpoint" -d "{
    \"redirect_uris\": [\"$redirect_uri\"], \"application_type\": \"native\",
    \"grant_types\": [\"authorization_code\", \"refresh_token\"], \"response_types\": [\"code\"],
    \"client_name\": \"smoke\", \"scope\": \"openid offline_access manifold:discover manifold:call\"
}" > "$work/reg.json" || die "registration"
client_id="$(json "$work/reg.json" 'j.client_id')"
client_secret="$(json "$work/reg.json" 'j.client_secret')"
[[ "$(json "$work/reg.json" 'j.token_endpoint_auth_method')" == client_secret_basic ]] || die "reg: $(cat "$work/reg.json")"
ok "dynamic registration: client $client_id (client_secret_basic)"

# authorize ACCOUNT_HINT SCOPE [JAR]: runs the code flow with a cookie jar (a new one unless JAR
# names one, which keeps the provider's session and grant); sets $code_value and $verifier.
authorize() {
    local hint="$1" scope="$2" jar="$work/jar-${3:-$RANDOM}" state url status location
    verifier="$(node -e 'process.stdout.write(require("crypto").randomBytes(48).toString("base64url"))')"
    local challenge
    challenge="$(node -e 'process.stdout.write(require("crypto").createHash("sha256").update(process.argv[1]).digest("base64url"))' "$verifier")"
    state="st-$RANDOM"
    url="$(node -e '
        const [ep, cid, ru, scope, res, st, ch, hint] = process.argv.slice(1);
        const u = new URL(ep);
        const p = { response_type: "code", client_id: cid, redirect_uri: ru, scope, resource: res, state: st,
                    code_challenge: ch, code_challenge_method: "S256", prompt: "consent" };
        if (hint) p.login_hint = hint;
        for (const [k, v] of Object.entries(p)) u.searchParams.set(k, v);
        process.stdout.write(u.href);
    ' "$authorization_endpoint" "$client_id" "$redirect_uri" "$scope" "$resource" "$state" "$challenge" "$hint")"
    for hop in $(seq 1 10); do
        read -r status location < <(curl -s -o /dev/null -b "$jar" -c "$jar" -w '%{http_code} %{redirect_url}\n' "$url")
        [[ "$status" == 302 || "$status" == 303 ]] || die "authorize hop $hop: HTTP $status at $url"
        if [[ "$location" == "$redirect_uri"* ]]; then
            echo "     $hop redirects; callback: $location"
            code_value="$(node -e '
                const u = new URL(process.argv[1]);
                if (u.searchParams.get("state") !== process.argv[2]) throw new Error("state mismatch");
                if (u.searchParams.get("iss") !== process.argv[3]) throw new Error("iss mismatch");
                if (!u.searchParams.get("code")) throw new Error("no code: " + u.search);
                process.stdout.write(u.searchParams.get("code"));
            ' "$location" "$state" "$issuer")" || die "callback $location"
            return 0
        fi
        url="$location"
    done
    die "authorize: no callback after 10 redirects"
}

authorize "" "openid offline_access manifold:discover manifold:call" alice
curl -sf -u "$client_id:$client_secret" "$token_endpoint" -d grant_type=authorization_code \
    --data-urlencode "code=$code_value" --data-urlencode "redirect_uri=$redirect_uri" \
    --data-urlencode "code_verifier=$verifier" --data-urlencode "resource=$resource" > "$work/ac.json" \
    || die "authorization_code exchange"
ac_token="$(json "$work/ac.json" 'j.access_token')"
refresh="$(json "$work/ac.json" 'j.refresh_token')"
[[ -n "$refresh" && "$(json "$work/ac.json" 'typeof j.id_token')" == string ]] || die "ac response: $(cat "$work/ac.json")"
check_claims "$ac_token" "$resource" "manifold:discover manifold:call" alice '["engineering"]' 300
[[ "$(json "$work/p.json" 'j.client_id')" == "$client_id" ]] || die "client_id claim"
[[ "$(jwt_verify "$ac_token" "$work/jwks1.json")" == valid ]] || die "ac token signature"
ok "authorization_code+PKCE: sub=alice groups=[engineering] aud=$resource scope='manifold:discover manifold:call', refresh and id tokens"
echo "     access token payload: $(cat "$work/p.json")"

# A wrong PKCE verifier is refused.
authorize "" "manifold:call"
code="$(curl -s -o "$work/bad.json" -w '%{http_code}' -u "$client_id:$client_secret" "$token_endpoint" \
    -d grant_type=authorization_code --data-urlencode "code=$code_value" --data-urlencode "redirect_uri=$redirect_uri" \
    --data-urlencode "code_verifier=${verifier}x" --data-urlencode "resource=$resource")"
[[ "$code" == 400 && "$(json "$work/bad.json" 'j.error')" == invalid_grant ]] || die "bad verifier: $code $(cat "$work/bad.json")"
ok "a wrong code_verifier -> 400 invalid_grant"

# bob through login_hint, without offline_access, with one scope
authorize bob "manifold:discover"
curl -sf -u "$client_id:$client_secret" "$token_endpoint" -d grant_type=authorization_code \
    --data-urlencode "code=$code_value" --data-urlencode "redirect_uri=$redirect_uri" \
    --data-urlencode "code_verifier=$verifier" > "$work/bob.json" || die "bob exchange"
check_claims "$(json "$work/bob.json" 'j.access_token')" "$resource" "manifold:discover" bob '["sales"]' 300
ok "login_hint=bob: sub=bob groups=[sales] scope=manifold:discover (token request without resource uses the granted one)"

# carol's account caps her resource scopes and adds a claim.
authorize carol "manifold:discover manifold:call"
curl -sf -u "$client_id:$client_secret" "$token_endpoint" -d grant_type=authorization_code \
    --data-urlencode "code=$code_value" --data-urlencode "redirect_uri=$redirect_uri" \
    --data-urlencode "code_verifier=$verifier" > "$work/carol.json" || die "carol exchange"
check_claims "$(json "$work/carol.json" 'j.access_token')" "$resource" "manifold:discover" carol '["contractors","engineering"]' 300
[[ "$(json "$work/p.json" 'j.department')" == ops ]] || die "carol's extra claim: $(cat "$work/p.json")"
ok "account scopes cap: carol asked for discover+call, got manifold:discover; account claims (department=ops) in the token"

# Step-up in alice's session: a scope beyond the one the client registered with.
authorize "" "manifold:call manifold:admin" alice
curl -sf -u "$client_id:$client_secret" "$token_endpoint" -d grant_type=authorization_code \
    --data-urlencode "code=$code_value" --data-urlencode "redirect_uri=$redirect_uri" \
    --data-urlencode "code_verifier=$verifier" --data-urlencode "resource=$resource" > "$work/up.json" || die "step-up exchange"
check_claims "$(json "$work/up.json" 'j.access_token')" "$resource" "manifold:call manifold:admin" alice '["engineering"]' 300
ok "step-up in the same session to manifold:admin (not in the registered scope): granted"

# --- refresh: new access token, rotation, reuse detection ---------------------------------------
curl -sf -u "$client_id:$client_secret" "$token_endpoint" -d grant_type=refresh_token \
    --data-urlencode "refresh_token=$refresh" --data-urlencode "resource=$resource" > "$work/rt.json" || die "refresh"
rt_token="$(json "$work/rt.json" 'j.access_token')"
refresh2="$(json "$work/rt.json" 'j.refresh_token')"
[[ "$rt_token" != "$ac_token" && "$refresh2" != "$refresh" ]] || die "refresh did not rotate: $(cat "$work/rt.json")"
check_claims "$rt_token" "$resource" "manifold:discover manifold:call" alice '["engineering"]' 300
code="$(curl -s -o "$work/reuse.json" -w '%{http_code}' -u "$client_id:$client_secret" "$token_endpoint" \
    -d grant_type=refresh_token --data-urlencode "refresh_token=$refresh")"
[[ "$code" == 400 && "$(json "$work/reuse.json" 'j.error')" == invalid_grant ]] || die "reuse: $code $(cat "$work/reuse.json")"
code="$(curl -s -o "$work/reuse2.json" -w '%{http_code}' -u "$client_id:$client_secret" "$token_endpoint" \
    -d grant_type=refresh_token --data-urlencode "refresh_token=$refresh2")"
[[ "$code" == 400 ]] || die "the grant survived a refresh token reuse: $code $(cat "$work/reuse2.json")"
ok "refresh: new JWT, rotated refresh token; reusing the old one -> invalid_grant and the whole grant is revoked"

# --- runtime settings: short TTL, backdated (expired) tokens, nbf --------------------------------
curl -sf -X POST "$issuer/test/settings?access_ttl=5" > /dev/null || die "settings"
curl -sf -u manifold-test:manifold-test-secret "$token_endpoint" -d grant_type=client_credentials \
    -d scope=manifold:call > "$work/short.json" || die "short token"
check_claims "$(json "$work/short.json" 'j.access_token')" "$resource" manifold:call manifold-test null 5
ok "POST /test/settings?access_ttl=5 -> expires_in $(json "$work/short.json" 'j.expires_in'), exp-iat=5"
curl -sf -X POST "$issuer/test/settings?access_ttl=300&backdate=3600&nbf_offset=0" > /dev/null || die "settings"
curl -sf -u manifold-test:manifold-test-secret "$token_endpoint" -d grant_type=client_credentials \
    -d scope=manifold:call > "$work/old.json" || die "backdated token"
jwt_part "$(json "$work/old.json" 'j.access_token')" 1 > "$work/old-p.json"
now="$(date +%s)"
exp="$(json "$work/old-p.json" 'j.exp')"
(( exp < now - 3000 )) || die "backdated exp $exp, now $now"
[[ "$(json "$work/old-p.json" 'j.nbf === j.iat')" == true ]] || die "nbf: $(cat "$work/old-p.json")"
[[ "$(jwt_verify "$(json "$work/old.json" 'j.access_token')" "$work/jwks1.json")" == valid ]] || die "backdated signature"
curl -sf -X POST "$issuer/test/settings?backdate=0&nbf_offset=none" > /dev/null || die "settings reset"
ok "backdate=3600: a correctly signed token that expired $((now - exp))s ago (and nbf when nbf_offset is set)"

# --- a tampered token fails verification ---------------------------------------------------------
tampered="$(node -e '
    const [h, p, s] = process.argv[1].split(".");
    const payload = JSON.parse(Buffer.from(p, "base64url"));
    payload.groups = ["admins"];
    process.stdout.write([h, Buffer.from(JSON.stringify(payload)).toString("base64url"), s].join("."));
' "$ac_token")"
[[ "$(jwt_verify "$tampered" "$work/jwks1.json")" == bad-signature ]] || die "tampered token verified"
ok "a tampered payload fails signature verification"

# --- key rotation -------------------------------------------------------------------------------
curl -sf -X POST "$issuer/test/rotate" > "$work/rotate.json" || die "rotate"
curl -sf "$jwks_uri" > "$work/jwks2.json" || die "jwks after rotation"
kid2="$(json "$work/jwks2.json" 'j.keys.map((k) => k.kid).join(" ")')"
[[ "$kid2" == "$(json "$work/rotate.json" 'j.kid')" && "$kid2" != "$kid1" ]] || die "jwks after rotation: $(cat "$work/jwks2.json")"
[[ "$(jwt_verify "$ac_token" "$work/jwks2.json")" == no-key ]] || die "old token's key still published"
curl -sf -u manifold-test:manifold-test-secret "$token_endpoint" -d grant_type=client_credentials \
    -d scope=manifold:call > "$work/new.json" || die "token after rotation"
new_token="$(json "$work/new.json" 'j.access_token')"
[[ "$(jwt_part "$new_token" 0 | json - 'j.kid')" == "$kid2" && "$(jwt_verify "$new_token" "$work/jwks2.json")" == valid ]] \
    || die "new token after rotation"
ok "POST /test/rotate: JWKS $kid1 -> $kid2; old tokens' kid is gone, new tokens signed with $kid2"

curl -sf -X POST "$issuer/test/rotate?keep=1" > "$work/rotate2.json" || die "rotate keep"
curl -sf "$jwks_uri" > "$work/jwks3.json" || die "jwks after rotation with keep"
kid3="$(json "$work/rotate2.json" 'j.kid')"
[[ "$(json "$work/jwks3.json" 'j.keys.map((k) => k.kid).join(" ")')" == "$kid3 $kid2" ]] || die "keep=1: $(cat "$work/jwks3.json")"
curl -sf -u manifold-test:manifold-test-secret "$token_endpoint" -d grant_type=client_credentials \
    -d scope=manifold:call > "$work/new3.json" || die "token after rotation with keep"
[[ "$(jwt_part "$(json "$work/new3.json" 'j.access_token')" 0 | json - 'j.kid')" == "$kid3" ]] || die "signing key after keep=1"
[[ "$(jwt_verify "$new_token" "$work/jwks3.json")" == valid ]] || die "keep=1 dropped the previous key"
ok "POST /test/rotate?keep=1: JWKS [$kid3, $kid2]; signs with $kid3, $kid2 still verifies"

# --- SIGTERM --------------------------------------------------------------------------------------
kill -TERM "$pid"
rc=0
wait "$pid" || rc=$?
pid=""
[[ "$rc" == 0 ]] || die "provider exit code after SIGTERM: $rc"
ok "SIGTERM: exit code 0"

echo "smoke: all $pass checks passed"

#!/usr/bin/env node
// A real OpenID provider (npm `oidc-provider`) on loopback, for Manifold's identity tests.
//
// It issues RS256 JWT access tokens (RFC 9068) for the resource indicators given with
// --resource (RFC 8707), logs in and consents without a person, and has a few /test/ admin
// routes (key rotation, runtime settings). Everything lives in memory: keys are generated at
// start, so nothing here is a secret. See NOTES.md next to this file.
//
//   node tests/npm/oidc/provider.mjs --port 0 --resource http://127.0.0.1:8080/mcp [--login alice]
//
// Once listening it prints exactly one JSON line on stdout (issuer, endpoints, the static client);
// diagnostics go to stderr. SIGTERM or SIGINT closes it with exit code 0.

import * as crypto from 'node:crypto';
import * as fs from 'node:fs';
import * as http from 'node:http';
import { parseArgs } from 'node:util';

import Provider, { errors } from 'oidc-provider';
// Not part of the package's documented API: the function the Provider constructor uses to load
// its `jwks` configuration. Calling it again swaps the signing keys at runtime (/test/rotate).
// The package has no "exports" map, so the deep import resolves; the version is pinned.
import initializeKeystore from 'oidc-provider/lib/helpers/initialize_keystore.js';

const USAGE = `usage: provider.mjs --resource URL [--resource URL ...] [options]
  --port N              port on --host (default 0: any free port)
  --host ADDR           listen address (default 127.0.0.1)
  --resource URL        a resource indicator (the gateway's /mcp URL) tokens may be issued for;
                        repeat for more; the first is the default when a request names none
  --scopes "A B"        the resource scopes (default "manifold:discover manifold:call manifold:code manifold:admin")
  --accounts FILE       JSON {"alice": {"groups": ["engineering"], "scopes": [...], "claims": {...}}, ...}
  --account ID=G1,G2    an account and its groups (repeatable; replaces the built-in alice/bob)
  --login ID            the account the interaction signs in (default alice; login_hint overrides)
  --access-ttl SECONDS  access token lifetime (default 3600)
  --refresh-ttl SECONDS refresh token lifetime (default 86400)
  --rotate-refresh MODE always | never | default (oidc-provider's own rule) (default always)
  --client-id ID        the static confidential client (default manifold-test)
  --client-secret S     its secret (default manifold-test-secret)
  --client-groups G1,G2 groups claim for its client_credentials tokens (default none)
  --client-auth METHOD  its token_endpoint_auth_method (default client_secret_basic)
  --registered-scope M  ignore | enforce: what a dynamically registered client's "scope" does
                        (default ignore: dropped at registration, so a later request may step up
                        to any scope; enforce: oidc-provider's rule, it caps what the client may ask)
`;

function fail(message) {
  process.stderr.write(`oidc-provider: ${message}\n${USAGE}`);
  process.exit(2);
}

let args;
try {
  ({ values: args } = parseArgs({
    options: {
      port: { type: 'string', default: '0' },
      host: { type: 'string', default: '127.0.0.1' },
      resource: { type: 'string', multiple: true, default: [] },
      scopes: { type: 'string', default: 'manifold:discover manifold:call manifold:code manifold:admin' },
      accounts: { type: 'string' },
      account: { type: 'string', multiple: true, default: [] },
      login: { type: 'string', default: 'alice' },
      'access-ttl': { type: 'string', default: '3600' },
      'refresh-ttl': { type: 'string', default: '86400' },
      'rotate-refresh': { type: 'string', default: 'always' },
      'client-id': { type: 'string', default: 'manifold-test' },
      'client-secret': { type: 'string', default: 'manifold-test-secret' },
      'client-groups': { type: 'string', default: '' },
      'client-auth': { type: 'string', default: 'client_secret_basic' },
      'registered-scope': { type: 'string', default: 'ignore' },
      help: { type: 'boolean', short: 'h' },
    },
    strict: true,
  }));
} catch (err) {
  fail(err.message);
}
if (args.help) {
  process.stdout.write(USAGE);
  process.exit(0);
}

const positiveInt = (name) => {
  const n = Number(args[name]);
  if (!Number.isInteger(n) || n <= 0) fail(`--${name} must be a positive integer`);
  return n;
};
const splitList = (s) => s.split(/[\s,]+/).filter(Boolean);

const port = Number(args.port);
if (!Number.isInteger(port) || port < 0 || port > 65535) fail('--port must be 0..65535');
if (args.resource.length === 0) fail('at least one --resource is required');
for (const r of args.resource) {
  const u = URL.parse(r);
  if (!u || !['http:', 'https:'].includes(u.protocol) || u.hash) fail(`--resource ${r}: not an absolute http(s) URL without fragment`);
}
if (!['always', 'never', 'default'].includes(args['rotate-refresh'])) fail('--rotate-refresh must be always, never or default');
if (!['ignore', 'enforce'].includes(args['registered-scope'])) fail('--registered-scope must be ignore or enforce');
const resourceScopes = splitList(args.scopes);

// --- accounts ---------------------------------------------------------------------------
let accounts = {
  alice: { groups: ['engineering'] },
  bob: { groups: ['sales'] },
};
if (args.accounts) {
  accounts = JSON.parse(fs.readFileSync(args.accounts, 'utf8'));
}
if (args.account.length) {
  if (!args.accounts) accounts = {};
  for (const spec of args.account) {
    const [id, groups = ''] = spec.split('=', 2);
    if (!id) fail(`--account ${spec}: expected ID=GROUP1,GROUP2`);
    accounts[id] = { ...accounts[id], groups: splitList(groups) };
  }
}
for (const [id, a] of Object.entries(accounts)) {
  if (!Array.isArray(a.groups ?? [])) fail(`account ${id}: groups must be an array`);
}

// Runtime settings, changed by POST /test/settings.
const settings = {
  login: args.login,
  access_ttl: positiveInt('access-ttl'),
  refresh_ttl: positiveInt('refresh-ttl'),
  // Seconds subtracted from iat and exp of every JWT access token issued from now on: with
  // backdate > access_ttl the provider hands out a correctly signed, already expired token.
  backdate: 0,
  // When set, JWT access tokens carry nbf = iat + nbf_offset (e.g. 600: not yet valid).
  nbf_offset: null,
};
if (!accounts[settings.login]) fail(`--login ${settings.login}: no such account`);

const clientGroups = splitList(args['client-groups']);

function log(message) {
  process.stderr.write(`oidc-provider: ${message}\n`);
}

// --- signing keys -----------------------------------------------------------------------
let keyCounter = 0;
function newSigningKey() {
  keyCounter += 1;
  const { privateKey } = crypto.generateKeyPairSync('rsa', { modulusLength: 2048 });
  const jwk = privateKey.export({ format: 'jwk' });
  return { ...jwk, kid: `test-key-${keyCounter}-${crypto.randomBytes(4).toString('hex')}`, alg: 'RS256', use: 'sig' };
}
let signingKeys = [newSigningKey()];

// --- the provider -----------------------------------------------------------------------
const server = http.createServer();
await new Promise((resolve, reject) => {
  server.once('error', reject);
  server.listen(port, args.host, resolve);
});
const { port: boundPort } = server.address();
const hostForUrl = args.host.includes(':') ? `[${args.host}]` : args.host;
const issuer = `http://${hostForUrl}:${boundPort}`;

const staticClient = {
  client_id: args['client-id'],
  client_secret: args['client-secret'],
  client_name: 'Manifold test client',
  application_type: 'native',
  // A native client's loopback redirect URI matches on any port (RFC 8252 section 7.3).
  redirect_uris: ['http://127.0.0.1/callback', 'http://localhost/callback'],
  grant_types: ['authorization_code', 'refresh_token', 'client_credentials'],
  response_types: ['code'],
  token_endpoint_auth_method: args['client-auth'],
};

const configuration = {
  clients: [staticClient],
  jwks: { keys: signingKeys },
  cookies: { keys: [crypto.randomBytes(32).toString('base64url')] },
  // OIDC scopes of the authorization server. The resource scopes are listed too, because
  // dynamic registration only accepts a `scope` made of these (the Python mcp SDK registers
  // with the scope it is about to request).
  scopes: ['openid', 'offline_access', 'profile', 'email', ...resourceScopes],
  claims: {
    openid: ['sub'],
    profile: ['name', 'preferred_username', 'groups'],
    email: ['email'],
  },
  features: {
    devInteractions: { enabled: false }, // interactions are answered by autoInteraction below
    clientCredentials: { enabled: true },
    introspection: { enabled: true },
    revocation: { enabled: true },
    registration: { enabled: true, initialAccessToken: false },
    resourceIndicators: {
      enabled: true,
      defaultResource: async (_ctx, _client, oneOf) => oneOf ?? args.resource[0],
      // The token endpoint may omit `resource`: use the one granted at authorization.
      useGrantedResource: async () => true,
      getResourceServerInfo: async (_ctx, resourceIndicator) => {
        if (!args.resource.includes(resourceIndicator)) {
          throw new errors.InvalidTarget(`unknown resource indicator ${resourceIndicator}`);
        }
        return {
          scope: resourceScopes.join(' '),
          audience: resourceIndicator,
          accessTokenTTL: settings.access_ttl,
          accessTokenFormat: 'jwt',
          jwt: { sign: { alg: 'RS256' } },
        };
      },
    },
  },
  pkce: { required: () => true }, // OAuth 2.1: every authorization code flow uses S256 PKCE
  responseTypes: ['code'],
  // Refresh tokens for every code flow of a client allowed the refresh_token grant, not only
  // when offline_access was requested.
  issueRefreshToken: async (_ctx, client, code) => client.grantTypeAllowed('refresh_token')
    && ['AuthorizationCode', 'RefreshToken'].includes(code.kind),
  expiresWithSession: async () => false,
  rotateRefreshToken: args['rotate-refresh'] === 'always' ? true
    : args['rotate-refresh'] === 'never' ? false : undefined,
  ttl: {
    AccessToken: (_ctx, token) => token.resourceServer?.accessTokenTTL ?? settings.access_ttl,
    ClientCredentials: (_ctx, token) => token.resourceServer?.accessTokenTTL ?? settings.access_ttl,
    AuthorizationCode: 60,
    IdToken: 3600,
    RefreshToken: () => settings.refresh_ttl,
    Interaction: 600,
    Session: 86400,
    Grant: 86400,
  },
  findAccount: async (_ctx, sub) => {
    const account = accounts[sub];
    if (!account) return undefined;
    return {
      accountId: sub,
      claims: async () => ({
        sub,
        name: account.name ?? sub,
        preferred_username: sub,
        email: account.email ?? `${sub}@example.test`,
        groups: account.groups ?? [],
      }),
    };
  },
  // Claims added to every access token (JWT payload), beside iss, sub, aud, scope, client_id,
  // jti, iat, exp.
  extraTokenClaims: async (_ctx, token) => {
    if (token.kind !== 'AccessToken' && token.kind !== 'ClientCredentials') return undefined;
    if (token.accountId) {
      const account = accounts[token.accountId];
      return { ...account?.claims, groups: account?.groups ?? [] };
    }
    return clientGroups.length ? { groups: clientGroups } : undefined;
  },
  formats: {
    customizers: {
      jwt: async (_ctx, _token, jwt) => {
        if (settings.backdate) {
          jwt.payload.iat -= settings.backdate;
          jwt.payload.exp -= settings.backdate;
        }
        if (settings.nbf_offset !== null) {
          jwt.payload.nbf = jwt.payload.iat + settings.nbf_offset;
        }
      },
    },
  },
  interactions: { url: async (_ctx, interaction) => `/interaction/${interaction.uid}` },
  clientBasedCORS: () => true,
  renderError: async (ctx, out) => {
    ctx.type = 'json';
    ctx.body = out;
  },
};
if (configuration.rotateRefreshToken === undefined) delete configuration.rotateRefreshToken;

const provider = new Provider(issuer, configuration);

// Answers the login and consent prompts the way a person clicking "yes" would.
async function autoInteraction(ctx) {
  const details = await provider.interactionDetails(ctx.req, ctx.res);
  const { prompt, params, session } = details;
  let result;
  let merge = false;
  if (prompt.name === 'login') {
    const hinted = typeof params.login_hint === 'string' && accounts[params.login_hint] ? params.login_hint : undefined;
    const accountId = hinted ?? settings.login;
    result = { login: { accountId } };
    log(`interaction ${details.uid}: login as ${accountId} for client ${params.client_id}`);
  } else if (prompt.name === 'consent') {
    const accountId = session.accountId;
    const grant = details.grantId
      ? await provider.Grant.find(details.grantId)
      : new provider.Grant({ accountId, clientId: params.client_id });
    const { missingOIDCScope, missingOIDCClaims, missingResourceScopes } = prompt.details;
    if (missingOIDCScope) grant.addOIDCScope(missingOIDCScope.join(' '));
    if (missingOIDCClaims) grant.addOIDCClaims(missingOIDCClaims);
    const allowed = accounts[accountId]?.scopes; // optional per-account cap on resource scopes
    for (const [indicator, scopes] of Object.entries(missingResourceScopes ?? {})) {
      const granted = allowed ? scopes.filter((s) => allowed.includes(s)) : scopes;
      const rejected = scopes.filter((s) => !granted.includes(s));
      if (granted.length) grant.addResourceScope(indicator, granted.join(' '));
      if (rejected.length) grant.rejectResourceScope(indicator, rejected.join(' '));
    }
    const grantId = await grant.save();
    result = { consent: details.grantId ? {} : { grantId } };
    merge = true;
    log(`interaction ${details.uid}: consent for ${accountId} to client ${params.client_id}`
      + ` (resource scopes ${JSON.stringify(missingResourceScopes ?? {})})`);
  } else {
    result = { error: 'access_denied', error_description: `no automatic answer to prompt ${prompt.name}` };
  }
  const returnTo = await provider.interactionResult(ctx.req, ctx.res, result, { mergeWithLastSubmission: merge });
  ctx.status = 303;
  ctx.redirect(returnTo);
}

function publicJwks() {
  return { keys: signingKeys.map(({ kty, n, e, kid, alg, use }) => ({ kty, n, e, kid, alg, use })) };
}

// Test-only admin routes. The provider listens on loopback only.
async function testRoute(ctx) {
  const q = ctx.query;
  switch (`${ctx.method} ${ctx.path}`) {
    case 'POST /test/rotate': {
      // A new signing key; the old one leaves the JWKS unless ?keep=1 (then it stays second,
      // still verifying, no longer signing).
      const previous = signingKeys.map((k) => k.kid);
      const next = newSigningKey();
      signingKeys = q.keep === '1' ? [next, ...signingKeys] : [next];
      initializeKeystore.call(provider, { keys: signingKeys });
      log(`rotated signing key: ${previous.join(',')} -> ${signingKeys.map((k) => k.kid).join(',')}`);
      ctx.body = { kid: next.kid, previous_kids: previous, jwks: publicJwks() };
      return;
    }
    case 'GET /test/settings':
      ctx.body = settings;
      return;
    case 'POST /test/settings': {
      // ?login=bob&access_ttl=5&backdate=7200&nbf_offset=600 (nbf_offset= or none clears it)
      if (q.login !== undefined) {
        if (!accounts[q.login]) ctx.throw(400, `no such account ${q.login}`);
        settings.login = q.login;
      }
      for (const key of ['access_ttl', 'refresh_ttl']) {
        if (q[key] !== undefined) {
          const n = Number(q[key]);
          if (!Number.isInteger(n) || n <= 0) ctx.throw(400, `${key} must be a positive integer`);
          settings[key] = n;
        }
      }
      if (q.backdate !== undefined) {
        const n = Number(q.backdate);
        if (!Number.isInteger(n) || n < 0) ctx.throw(400, 'backdate must be an integer >= 0');
        settings.backdate = n;
      }
      if (q.nbf_offset !== undefined) {
        const n = Number(q.nbf_offset);
        if (q.nbf_offset === '' || q.nbf_offset === 'none') settings.nbf_offset = null;
        else if (!Number.isInteger(n)) ctx.throw(400, 'nbf_offset must be an integer');
        else settings.nbf_offset = n;
      }
      log(`settings ${JSON.stringify(settings)}`);
      ctx.body = settings;
      return;
    }
    case 'GET /test/accounts':
      ctx.body = accounts;
      return;
    case 'GET /test/resources':
      ctx.body = { resources: args.resource, default: args.resource[0] };
      return;
    case 'POST /test/resources': {
      // ?add=URL[&default=1]: accept another resource indicator (e.g. the gateway's /mcp URL once
      // its port is known); default=1 also makes it the one used when a request names none.
      const url = typeof q.add === 'string' ? URL.parse(q.add) : null;
      if (!url || !['http:', 'https:'].includes(url.protocol) || url.hash) ctx.throw(400, 'add must be an absolute http(s) URL without fragment');
      if (!args.resource.includes(q.add)) args.resource.push(q.add);
      if (q.default === '1') args.resource = [q.add, ...args.resource.filter((r) => r !== q.add)];
      log(`resources ${JSON.stringify(args.resource)}`);
      ctx.body = { resources: args.resource, default: args.resource[0] };
      return;
    }
    default:
      ctx.throw(404, `no test route ${ctx.method} ${ctx.path}`);
  }
}

provider.use(async (ctx, next) => {
  if (ctx.path.startsWith('/test/')) {
    try {
      await testRoute(ctx);
    } catch (err) {
      ctx.status = err.status ?? 500;
      ctx.body = { error: err.message };
    }
    return;
  }
  if (args['registered-scope'] === 'ignore' && ctx.method === 'POST' && ctx.path === '/reg' && ctx.is('application/json')) {
    // oidc-provider treats a registered "scope" as the most the client may ever request, which
    // breaks a step-up (the Python mcp SDK registers with the scope of its first request). Drop
    // it before the provider reads the body; it then takes the parsed body from ctx.request.body.
    const chunks = [];
    for await (const chunk of ctx.req) chunks.push(chunk);
    let body;
    try {
      body = JSON.parse(Buffer.concat(chunks).toString('utf8'));
    } catch {
      ctx.status = 400;
      ctx.body = { error: 'invalid_request', error_description: 'failed to parse the request body' };
      return;
    }
    if (body && typeof body === 'object') delete body.scope;
    ctx.request.body = body;
  }
  if (ctx.method === 'GET' && /^\/interaction\/[^/]+$/.test(ctx.path)) {
    await autoInteraction(ctx);
    return;
  }
  await next();
});

for (const event of ['server_error', 'grant.error', 'authorization.error', 'registration_create.error',
  'introspection.error', 'revocation.error', 'jwks.error', 'discovery.error', 'userinfo.error']) {
  provider.on(event, (_ctx, err) => log(`${event}: ${err?.error ?? ''} ${err?.error_description ?? err?.message ?? err}`));
}
provider.on('grant.success', (ctx) => {
  const { AccessToken: at, ClientCredentials: cc, Client: client } = ctx.oidc.entities;
  const token = at ?? cc;
  log(`token issued: grant_type=${ctx.oidc.params.grant_type} client=${client?.clientId}`
    + ` sub=${token?.accountId ?? client?.clientId} aud=${token?.resourceServer?.audience ?? '-'} scope=${token?.scope ?? ''}`);
});
provider.on('registration_create.success', (_ctx, client) => log(`client registered: ${client.clientId}`));

server.on('request', provider.callback());

const ready = {
  issuer,
  openid_configuration: `${issuer}/.well-known/openid-configuration`,
  jwks_uri: provider.urlFor('jwks'),
  token_endpoint: provider.urlFor('token'),
  authorization_endpoint: provider.urlFor('authorization'),
  registration_endpoint: provider.urlFor('registration'),
  introspection_endpoint: provider.urlFor('introspection'),
  revocation_endpoint: provider.urlFor('revocation'),
  userinfo_endpoint: provider.urlFor('userinfo'),
  resources: args.resource,
  scopes: resourceScopes,
  login: settings.login,
  client: { client_id: staticClient.client_id, client_secret: staticClient.client_secret,
    token_endpoint_auth_method: staticClient.token_endpoint_auth_method },
  test_endpoints: { rotate: `${issuer}/test/rotate`, settings: `${issuer}/test/settings` },
  pid: process.pid,
};
process.stdout.write(`${JSON.stringify(ready)}\n`);

function shutdown(signal) {
  log(`${signal}: closing`);
  server.close(() => process.exit(0));
  server.closeAllConnections();
  setTimeout(() => process.exit(0), 2000).unref();
}
process.on('SIGTERM', () => shutdown('SIGTERM'));
process.on('SIGINT', () => shutdown('SIGINT'));

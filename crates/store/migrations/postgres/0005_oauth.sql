-- What the gateway keeps as an OAuth client of its upstreams, so every
-- replica sees it and a restart does not need a new sign-in. Secrets are
-- sealed (AES-256-GCM, bound to their row) with the gateway's secret key;
-- the database never holds them in clear.

-- Tokens (rmcp's StoredCredentials, sealed) per server and principal ('' for
-- the server's shared credentials). `version` grows with every save; the
-- lease columns make one replica at a time refresh.
CREATE TABLE oauth_credentials (
    server      TEXT NOT NULL,
    principal   TEXT NOT NULL,
    sealed      TEXT NOT NULL,
    version     BIGINT NOT NULL,
    updated_at  BIGINT NOT NULL,
    lease_owner TEXT,
    lease_until BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (server, principal)
);

-- Client registrations (dynamic or pre-registered), sealed, per server.
CREATE TABLE oauth_clients (
    server     TEXT PRIMARY KEY,
    sealed     TEXT NOT NULL,
    updated_at BIGINT NOT NULL
);

-- Sign-ins under way: PKCE verifier and CSRF state, sealed, until the
-- callback or expiry.
CREATE TABLE oauth_pending (
    state      TEXT PRIMARY KEY,
    server     TEXT NOT NULL,
    principal  TEXT NOT NULL,
    sealed     TEXT NOT NULL,
    created_at BIGINT NOT NULL
);

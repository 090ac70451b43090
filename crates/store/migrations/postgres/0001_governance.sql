-- Manifold governance store, PostgreSQL dialect.
-- Timestamps are unix milliseconds (BIGINT); JSON is TEXT.
-- Keep in step with ../sqlite/0001_governance.sql.

CREATE TABLE tokens (
    id          TEXT PRIMARY KEY,
    name        TEXT NOT NULL,
    secret_hash TEXT NOT NULL,              -- hex SHA-256 of the secret part
    actions     TEXT NOT NULL,              -- JSON array of discover|call|code|admin
    scopes      TEXT NOT NULL,              -- JSON array of server/tool globs
    created_at  BIGINT NOT NULL,
    expires_at  BIGINT,                    -- NULL: never expires
    revoked_at  BIGINT
);
-- The sweep deletes the oldest expired tokens first, in batches.
CREATE INDEX tokens_expires_at ON tokens (expires_at);

CREATE TABLE token_groups (
    token_id   TEXT NOT NULL REFERENCES tokens (id) ON DELETE CASCADE,
    group_name TEXT NOT NULL,
    PRIMARY KEY (token_id, group_name)
);

CREATE TABLE policies (
    id                  TEXT PRIMARY KEY,
    principal           TEXT NOT NULL,      -- '*', 'token:<id>' or 'group:<name>'
    server_glob         TEXT NOT NULL,
    tool_glob           TEXT NOT NULL,
    tier                TEXT NOT NULL CHECK (tier IN ('any', 'read_only', 'write', 'destructive')),
    effect              TEXT NOT NULL CHECK (effect IN ('allow', 'deny', 'require_approval', 'rate_limit')),
    rate_limit          BIGINT,
    rate_window_seconds BIGINT,
    description         TEXT NOT NULL DEFAULT '',
    created_at          BIGINT NOT NULL,
    CHECK (effect <> 'rate_limit' OR (rate_limit IS NOT NULL AND rate_window_seconds IS NOT NULL))
);

CREATE TABLE tool_classifications (
    server          TEXT NOT NULL,
    tool            TEXT NOT NULL,
    definition_hash TEXT NOT NULL,          -- the definition as last seen
    tier            TEXT CHECK (tier IN ('read_only', 'write', 'destructive')), -- set by an operator
    status          TEXT NOT NULL CHECK (status IN ('approved', 'quarantined')),
    approved_hash   TEXT,                   -- the definition an operator approved
    first_seen_at   BIGINT NOT NULL,
    updated_at      BIGINT NOT NULL,
    PRIMARY KEY (server, tool)
);

CREATE TABLE approvals (
    id            TEXT PRIMARY KEY,
    principal     TEXT NOT NULL,
    tool          TEXT NOT NULL,
    args_hash     TEXT NOT NULL,
    redacted_args TEXT NOT NULL,            -- JSON
    status        TEXT NOT NULL CHECK (status IN ('pending', 'approved', 'denied')),
    created_at    BIGINT NOT NULL,
    expires_at    BIGINT NOT NULL,
    decided_at    BIGINT,
    decided_by    TEXT,
    consumed_at   BIGINT
);
CREATE INDEX approvals_status_expires_at ON approvals (status, expires_at);

CREATE TABLE rate_limit_windows (
    bucket_key   TEXT NOT NULL,
    window_ms    BIGINT NOT NULL,
    window_start BIGINT NOT NULL,
    hits         BIGINT NOT NULL,
    expires_at   BIGINT NOT NULL,
    PRIMARY KEY (bucket_key, window_ms, window_start)
);
CREATE INDEX rate_limit_windows_expires_at ON rate_limit_windows (expires_at);

-- Audit rows outlive tokens: token_id is set to NULL when the token goes, and
-- the original id stays in details.
CREATE TABLE discovery_audit (
    id             BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    created_at     BIGINT NOT NULL,
    principal      TEXT NOT NULL,
    token_id       TEXT REFERENCES tokens (id) ON DELETE SET NULL,
    visible_count  BIGINT NOT NULL,
    visible_digest TEXT NOT NULL,           -- SHA-256 of the sorted visible names, never the names
    details        TEXT NOT NULL            -- JSON object
);
CREATE INDEX discovery_audit_created_at ON discovery_audit (created_at);
CREATE INDEX discovery_audit_token_id ON discovery_audit (token_id);

CREATE TABLE access_audit (
    id         BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    created_at BIGINT NOT NULL,
    principal  TEXT,
    token_id   TEXT REFERENCES tokens (id) ON DELETE SET NULL,
    outcome    TEXT NOT NULL CHECK (outcome IN ('success', 'failure')),
    reason     TEXT,
    details    TEXT NOT NULL
);
CREATE INDEX access_audit_created_at ON access_audit (created_at);
CREATE INDEX access_audit_token_id ON access_audit (token_id);

CREATE TABLE activity_audit (
    id          BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    created_at  BIGINT NOT NULL,
    principal   TEXT NOT NULL,
    token_id    TEXT REFERENCES tokens (id) ON DELETE SET NULL,
    tool        TEXT NOT NULL,
    args_hash   TEXT NOT NULL,
    decision    TEXT NOT NULL,
    approval_id TEXT,
    outcome     TEXT NOT NULL,
    latency_ms  BIGINT NOT NULL,
    bytes_in    BIGINT NOT NULL,
    bytes_out   BIGINT NOT NULL,
    details     TEXT NOT NULL
);
CREATE INDEX activity_audit_created_at ON activity_audit (created_at);
CREATE INDEX activity_audit_token_id ON activity_audit (token_id);

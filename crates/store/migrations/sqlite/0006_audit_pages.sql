-- Fewer pages written per audit commit. AUTOINCREMENT kept a row in
-- sqlite_sequence, a fourth page rewritten by every commit; without it an
-- id is the largest one plus one, so ids still only grow while a trail holds
-- a row (exports page by created_at, not by id). A row without a token (no
-- auth) no longer touches the token_id index at all: the index is partial,
-- and `token_id = ?` lookups (the foreign key's ON DELETE SET NULL among
-- them) still use it.

CREATE TABLE discovery_audit_next (
    id             INTEGER PRIMARY KEY,
    created_at     INTEGER NOT NULL,
    principal      TEXT NOT NULL,
    token_id       TEXT REFERENCES tokens (id) ON DELETE SET NULL,
    visible_count  INTEGER NOT NULL,
    visible_digest TEXT NOT NULL,
    details        TEXT NOT NULL
);
INSERT INTO discovery_audit_next
    SELECT id, created_at, principal, token_id, visible_count, visible_digest, details
    FROM discovery_audit;
DROP TABLE discovery_audit;
ALTER TABLE discovery_audit_next RENAME TO discovery_audit;
CREATE INDEX discovery_audit_created_at ON discovery_audit (created_at);
CREATE INDEX discovery_audit_token_id ON discovery_audit (token_id) WHERE token_id IS NOT NULL;

CREATE TABLE access_audit_next (
    id         INTEGER PRIMARY KEY,
    created_at INTEGER NOT NULL,
    principal  TEXT,
    token_id   TEXT REFERENCES tokens (id) ON DELETE SET NULL,
    outcome    TEXT NOT NULL CHECK (outcome IN ('success', 'failure')),
    reason     TEXT,
    details    TEXT NOT NULL
);
INSERT INTO access_audit_next
    SELECT id, created_at, principal, token_id, outcome, reason, details
    FROM access_audit;
DROP TABLE access_audit;
ALTER TABLE access_audit_next RENAME TO access_audit;
CREATE INDEX access_audit_created_at ON access_audit (created_at);
CREATE INDEX access_audit_token_id ON access_audit (token_id) WHERE token_id IS NOT NULL;

CREATE TABLE activity_audit_next (
    id          INTEGER PRIMARY KEY,
    created_at  INTEGER NOT NULL,
    principal   TEXT NOT NULL,
    token_id    TEXT REFERENCES tokens (id) ON DELETE SET NULL,
    tool        TEXT NOT NULL,
    args_hash   TEXT NOT NULL,
    decision    TEXT NOT NULL,
    approval_id TEXT,
    outcome     TEXT NOT NULL,
    latency_ms  INTEGER NOT NULL,
    bytes_in    INTEGER NOT NULL,
    bytes_out   INTEGER NOT NULL,
    details     TEXT NOT NULL
);
INSERT INTO activity_audit_next
    SELECT id, created_at, principal, token_id, tool, args_hash, decision, approval_id,
           outcome, latency_ms, bytes_in, bytes_out, details
    FROM activity_audit;
DROP TABLE activity_audit;
ALTER TABLE activity_audit_next RENAME TO activity_audit;
CREATE INDEX activity_audit_created_at ON activity_audit (created_at);
CREATE INDEX activity_audit_token_id ON activity_audit (token_id) WHERE token_id IS NOT NULL;

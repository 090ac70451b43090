-- Console sign-ins, kept server-side so that every replica honours them and
-- sign-out or a token's revocation ends them. The cookie holds a random id;
-- only its SHA-256 is stored.
CREATE TABLE console_sessions (
    id_hash      TEXT PRIMARY KEY NOT NULL,
    token_id     TEXT NOT NULL REFERENCES tokens (id) ON DELETE CASCADE,
    created_at   INTEGER NOT NULL,
    last_seen_at INTEGER NOT NULL,
    expires_at   INTEGER NOT NULL
);
CREATE INDEX console_sessions_token_id ON console_sessions (token_id);
CREATE INDEX console_sessions_expires_at ON console_sessions (expires_at);

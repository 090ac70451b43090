-- As on SQLite: a row without a token (no auth) no longer touches the
-- token_id index; `token_id = $1` lookups, the foreign key's among them,
-- still use it. (Identity columns have no per-row bookkeeping to drop.)
DROP INDEX discovery_audit_token_id;
CREATE INDEX discovery_audit_token_id ON discovery_audit (token_id) WHERE token_id IS NOT NULL;
DROP INDEX access_audit_token_id;
CREATE INDEX access_audit_token_id ON access_audit (token_id) WHERE token_id IS NOT NULL;
DROP INDEX activity_audit_token_id;
CREATE INDEX activity_audit_token_id ON activity_audit (token_id) WHERE token_id IS NOT NULL;

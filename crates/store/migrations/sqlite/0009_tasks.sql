-- Tasks (the io.modelcontextprotocol/tasks extension) as the gateway hands
-- them out: a random id the caller sees, the principal that made it, and
-- where it lives. A passed-through task names its server and the upstream's
-- own task id; every replica resolves it here.
CREATE TABLE tasks (
    id          TEXT PRIMARY KEY NOT NULL,
    owner       TEXT NOT NULL,
    server      TEXT NOT NULL,
    upstream_id TEXT NOT NULL,
    created_at  INTEGER NOT NULL,
    expires_at  INTEGER NOT NULL
);
CREATE INDEX tasks_owner ON tasks (owner);
CREATE INDEX tasks_expires_at ON tasks (expires_at);

-- Tasks the gateway makes itself, for a call to an upstream without tasks
-- that runs long. The replica running the call (`replica`, its store
-- instance) writes the end; `payload` is the result or error as JSON,
-- sealed with the store's secret key. A cancel is asked for by setting
-- `cancel_requested_at`; the running replica hears of it.
CREATE TABLE gateway_tasks (
    id                  TEXT PRIMARY KEY NOT NULL,
    owner               TEXT NOT NULL,
    server              TEXT NOT NULL,
    tool                TEXT NOT NULL,
    replica             TEXT NOT NULL,
    status              TEXT NOT NULL,
    message             TEXT,
    payload             TEXT,
    cancel_requested_at INTEGER,
    created_at          INTEGER NOT NULL,
    updated_at          INTEGER NOT NULL,
    expires_at          INTEGER NOT NULL
);
CREATE INDEX gateway_tasks_owner_status ON gateway_tasks (owner, status);
CREATE INDEX gateway_tasks_replica_status ON gateway_tasks (replica, status);
CREATE INDEX gateway_tasks_expires_at ON gateway_tasks (expires_at);

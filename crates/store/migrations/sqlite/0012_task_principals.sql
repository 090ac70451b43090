-- Who made a passed-through task, as its activity rows name them: a task
-- whose end nobody polled gets its end row from the sweep that deletes it.
ALTER TABLE tasks ADD COLUMN principal TEXT NOT NULL DEFAULT '';
ALTER TABLE tasks ADD COLUMN token_id TEXT;

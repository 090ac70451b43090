-- A passed-through task's tool, and when the gateway first saw it end: its
-- end is written to the activity audit once, whichever replica saw it.
ALTER TABLE tasks ADD COLUMN tool TEXT NOT NULL DEFAULT '';
ALTER TABLE tasks ADD COLUMN ended_at INTEGER;

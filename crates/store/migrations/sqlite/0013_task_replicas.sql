-- The replica through which a passed-through task was made: a stdio
-- upstream's task lives in that replica's own child process, and another
-- replica says so instead of asking a child that never heard of it.
ALTER TABLE tasks ADD COLUMN replica TEXT;

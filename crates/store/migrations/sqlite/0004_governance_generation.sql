-- A counter that only governance writes bump, so a process can tell in one
-- cheap read whether what it keeps in memory (tokens, groups, policies,
-- classifications) is still current. Audit and rate-limit writes never touch
-- it, unlike PRAGMA data_version. Triggers bump it, so every writer (the
-- gateway, the CLI, a hand-run statement) is covered.
CREATE TABLE governance_generation (
    id    INTEGER PRIMARY KEY CHECK (id = 1),
    value INTEGER NOT NULL
);
INSERT INTO governance_generation (id, value) VALUES (1, 0);

CREATE TRIGGER tokens_insert_generation AFTER INSERT ON tokens
BEGIN UPDATE governance_generation SET value = value + 1 WHERE id = 1; END;
CREATE TRIGGER tokens_update_generation AFTER UPDATE ON tokens
BEGIN UPDATE governance_generation SET value = value + 1 WHERE id = 1; END;
CREATE TRIGGER tokens_delete_generation AFTER DELETE ON tokens
BEGIN UPDATE governance_generation SET value = value + 1 WHERE id = 1; END;

CREATE TRIGGER token_groups_insert_generation AFTER INSERT ON token_groups
BEGIN UPDATE governance_generation SET value = value + 1 WHERE id = 1; END;
CREATE TRIGGER token_groups_update_generation AFTER UPDATE ON token_groups
BEGIN UPDATE governance_generation SET value = value + 1 WHERE id = 1; END;
CREATE TRIGGER token_groups_delete_generation AFTER DELETE ON token_groups
BEGIN UPDATE governance_generation SET value = value + 1 WHERE id = 1; END;

CREATE TRIGGER policies_insert_generation AFTER INSERT ON policies
BEGIN UPDATE governance_generation SET value = value + 1 WHERE id = 1; END;
CREATE TRIGGER policies_update_generation AFTER UPDATE ON policies
BEGIN UPDATE governance_generation SET value = value + 1 WHERE id = 1; END;
CREATE TRIGGER policies_delete_generation AFTER DELETE ON policies
BEGIN UPDATE governance_generation SET value = value + 1 WHERE id = 1; END;

CREATE TRIGGER tool_classifications_insert_generation AFTER INSERT ON tool_classifications
BEGIN UPDATE governance_generation SET value = value + 1 WHERE id = 1; END;
CREATE TRIGGER tool_classifications_update_generation AFTER UPDATE ON tool_classifications
BEGIN UPDATE governance_generation SET value = value + 1 WHERE id = 1; END;
CREATE TRIGGER tool_classifications_delete_generation AFTER DELETE ON tool_classifications
BEGIN UPDATE governance_generation SET value = value + 1 WHERE id = 1; END;

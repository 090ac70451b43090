-- A counter that only governance writes bump (see ../sqlite/0004). Here it
-- is a sequence, so concurrent governance writes never wait on one counter
-- row; the trigger also notifies every listening process at commit, so
-- replicas drop what they keep in memory at once. Row triggers, so a
-- statement that changes nothing (an empty sweep) bumps nothing; PostgreSQL
-- folds identical notifications of one transaction into one.
CREATE SEQUENCE governance_generation;

CREATE FUNCTION manifold_governance_changed() RETURNS trigger AS $$
BEGIN
    PERFORM nextval('governance_generation');
    PERFORM pg_notify('manifold_events', '{"from":"database","kind":"governance_changed"}');
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER tokens_generation AFTER INSERT OR UPDATE OR DELETE ON tokens
    FOR EACH ROW EXECUTE FUNCTION manifold_governance_changed();
CREATE TRIGGER token_groups_generation AFTER INSERT OR UPDATE OR DELETE ON token_groups
    FOR EACH ROW EXECUTE FUNCTION manifold_governance_changed();
CREATE TRIGGER policies_generation AFTER INSERT OR UPDATE OR DELETE ON policies
    FOR EACH ROW EXECUTE FUNCTION manifold_governance_changed();
CREATE TRIGGER tool_classifications_generation AFTER INSERT OR UPDATE OR DELETE ON tool_classifications
    FOR EACH ROW EXECUTE FUNCTION manifold_governance_changed();

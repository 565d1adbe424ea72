-- Token Status Lists: each agent gets a place (a list and an index in it) at registration,
-- for all its tokens; the list's bit at that place is set once the agent is revoked.
CREATE TABLE status_lists (
    id         TEXT PRIMARY KEY,
    size       BIGINT NOT NULL CHECK (size > 0),
    allocated  BIGINT NOT NULL DEFAULT 0,
    created_at BIGINT NOT NULL
);
ALTER TABLE agents ADD COLUMN status_list TEXT REFERENCES status_lists (id);
ALTER TABLE agents ADD COLUMN status_idx BIGINT;
CREATE UNIQUE INDEX agents_status_place ON agents (status_list, status_idx) WHERE status_list IS NOT NULL;

-- A place, once given, never moves: a revoked agent moved to another index would leave its
-- tokens' bit 0. (An agent registered before lists gets one at its next token.)
CREATE FUNCTION agents_status_place_is_fixed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.status_list IS NOT NULL
       AND (NEW.status_list IS DISTINCT FROM OLD.status_list OR NEW.status_idx IS DISTINCT FROM OLD.status_idx) THEN
        RAISE EXCEPTION 'an agent''s status place never changes';
    END IF;
    RETURN NEW;
END;
$$;
CREATE TRIGGER agents_status_place_is_fixed BEFORE UPDATE ON agents
    FOR EACH ROW EXECUTE FUNCTION agents_status_place_is_fixed();

CREATE FUNCTION status_lists_are_kept() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP IN ('DELETE', 'TRUNCATE') OR NEW.id IS DISTINCT FROM OLD.id OR NEW.size IS DISTINCT FROM OLD.size
       OR NEW.allocated < OLD.allocated THEN
        RAISE EXCEPTION 'a status list is kept as it is';
    END IF;
    RETURN NEW;
END;
$$;
CREATE TRIGGER status_lists_are_kept BEFORE UPDATE OR DELETE ON status_lists
    FOR EACH ROW EXECUTE FUNCTION status_lists_are_kept();
CREATE TRIGGER status_lists_no_truncate BEFORE TRUNCATE ON status_lists
    FOR EACH STATEMENT EXECUTE FUNCTION status_lists_are_kept();

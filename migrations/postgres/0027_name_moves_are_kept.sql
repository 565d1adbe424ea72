-- A moved name's note stays until the revocations it owes are done: deleting it early (or
-- rewriting it) would leave the former holder's agents under the name unrevoked. The batch
-- that revokes the last of them deletes it, under the same test.
CREATE FUNCTION name_moves_are_kept() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' THEN
        RAISE EXCEPTION 'a moved name''s note never changes';
    END IF;
    -- A statement's trigger has no row to look at: a TRUNCATE is refused outright.
    IF TG_OP = 'TRUNCATE' THEN
        RAISE EXCEPTION 'a moved name''s note is kept while it owes revocations';
    END IF;
    IF EXISTS (
        SELECT 1 FROM agents WHERE org_id <> OLD.org_id AND revoked_at IS NULL
          AND (issuer_domain = OLD.domain OR (OLD.below AND issuer_domain LIKE '%.' || OLD.domain))
    ) THEN
        RAISE EXCEPTION 'a moved name''s note is kept while it owes revocations';
    END IF;
    RETURN OLD;
END;
$$;
CREATE TRIGGER name_moves_are_kept BEFORE UPDATE OR DELETE ON name_moves
    FOR EACH ROW EXECUTE FUNCTION name_moves_are_kept();
CREATE TRIGGER name_moves_no_truncate BEFORE TRUNCATE ON name_moves
    FOR EACH STATEMENT EXECUTE FUNCTION name_moves_are_kept();

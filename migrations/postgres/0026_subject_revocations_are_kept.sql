-- A person's revocation goes one way, as an agent's does: its row is kept, names the same
-- person, and its time only moves forward (a time moved back would let the tokens issued
-- in between pass again).
CREATE FUNCTION subject_revocations_are_kept() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP IN ('DELETE', 'TRUNCATE') THEN
        RAISE EXCEPTION 'a person''s revocation is kept';
    END IF;
    IF NEW.org_id IS DISTINCT FROM OLD.org_id OR NEW.iss IS DISTINCT FROM OLD.iss
       OR NEW.sub IS DISTINCT FROM OLD.sub OR NEW.revoked_at < OLD.revoked_at THEN
        RAISE EXCEPTION 'a person''s revocation is kept: it only moves forward';
    END IF;
    RETURN NEW;
END;
$$;
CREATE TRIGGER subject_revocations_are_kept BEFORE UPDATE OR DELETE ON subject_revocations
    FOR EACH ROW EXECUTE FUNCTION subject_revocations_are_kept();
CREATE TRIGGER subject_revocations_no_truncate BEFORE TRUNCATE ON subject_revocations
    FOR EACH STATEMENT EXECUTE FUNCTION subject_revocations_are_kept();

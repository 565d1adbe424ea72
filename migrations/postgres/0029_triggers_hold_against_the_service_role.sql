-- What the service's own role could still do around its triggers, closed:
-- - A trigger function named its tables without a schema: a temporary table of the same name
--   (any role may make one) stood in for the real one in that session, so a moved name's note
--   could be deleted while it owed revocations, or a removed identity provider put back.
--   Every trigger function now finds tables in its own schema, never a temporary one first.
-- - A revoked agent's epoch could be set back under what other instances had read, hiding the
--   revocation from them: it is stamped with the revocation and never changes after (and is
--   never set on an agent not revoked).
-- - An agent's issuer domain could be changed, so that a name's move owed it no revocation.
-- - The revocation epoch could jump to its maximum, failing every revocation after: each
--   revocation moves it by one, and nothing else moves it.
-- - A disabled API key could be enabled again, or its row given another hash (or id,
--   organization, kind, mode) so that a fresh row could take its place.
-- - Each of these rows could be deleted and written again as wanted: the service deletes no
--   agent and no disabled key, so neither is deleted.
CREATE OR REPLACE FUNCTION agents_identity_is_fixed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.id IS DISTINCT FROM OLD.id OR NEW.org_id IS DISTINCT FROM OLD.org_id
       OR NEW.mode IS DISTINCT FROM OLD.mode OR NEW.created_at IS DISTINCT FROM OLD.created_at
       OR NEW.issuer_domain IS DISTINCT FROM OLD.issuer_domain THEN
        RAISE EXCEPTION 'an agent''s identity never changes';
    END IF;
    RETURN NEW;
END;
$$;

CREATE OR REPLACE FUNCTION revocation_epoch_only_grows() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP IN ('DELETE', 'TRUNCATE') OR NEW.id IS DISTINCT FROM OLD.id OR NEW.epoch <> OLD.epoch + 1 THEN
        RAISE EXCEPTION 'the revocation epoch only grows, one revocation at a time';
    END IF;
    RETURN NEW;
END;
$$;

CREATE FUNCTION agents_revocation_epoch_is_final() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF (OLD.revoked_epoch IS NOT NULL AND NEW.revoked_epoch IS DISTINCT FROM OLD.revoked_epoch)
       OR (OLD.revoked_at IS NULL AND NEW.revoked_at IS NULL AND NEW.revoked_epoch IS NOT NULL) THEN
        RAISE EXCEPTION 'a revocation''s epoch never changes';
    END IF;
    RETURN NEW;
END;
$$;
-- After `agents_revocation_epoch` (triggers of a kind run by name), which stamps it.
CREATE TRIGGER agents_revocation_epoch_is_final BEFORE UPDATE ON agents
    FOR EACH ROW EXECUTE FUNCTION agents_revocation_epoch_is_final();

CREATE FUNCTION api_keys_disabled_for_good() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'a disabled key stays disabled';
END;
$$;
CREATE TRIGGER api_keys_disabled_for_good BEFORE UPDATE ON api_keys
    FOR EACH ROW WHEN (OLD.disabled_at IS NOT NULL AND NEW.disabled_at IS DISTINCT FROM OLD.disabled_at)
    EXECUTE FUNCTION api_keys_disabled_for_good();
CREATE FUNCTION api_keys_identity_is_fixed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'a key''s identity never changes';
END;
$$;
CREATE TRIGGER api_keys_identity_is_fixed BEFORE UPDATE ON api_keys
    FOR EACH ROW WHEN (NEW.key_hash IS DISTINCT FROM OLD.key_hash OR NEW.id IS DISTINCT FROM OLD.id
                       OR NEW.org_id IS DISTINCT FROM OLD.org_id OR NEW.kind IS DISTINCT FROM OLD.kind
                       OR NEW.mode IS DISTINCT FROM OLD.mode)
    EXECUTE FUNCTION api_keys_identity_is_fixed();
CREATE TRIGGER api_keys_disabled_are_kept BEFORE DELETE ON api_keys
    FOR EACH ROW WHEN (OLD.disabled_at IS NOT NULL)
    EXECUTE FUNCTION api_keys_disabled_for_good();

-- A revoked agent's row is kept by `agents_revoked_are_kept`; any other by this one.
CREATE FUNCTION agents_rows_are_kept() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'an agent''s identity never changes: its row is kept';
END;
$$;
CREATE TRIGGER agents_rows_are_kept BEFORE DELETE ON agents
    FOR EACH ROW WHEN (OLD.revoked_at IS NULL)
    EXECUTE FUNCTION agents_rows_are_kept();

DO $$
DECLARE
    f record;
BEGIN
    FOR f IN
        SELECT p.oid::regprocedure AS signature FROM pg_proc p
        JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = current_schema() AND p.prorettype = 'trigger'::regtype
    LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = pg_catalog, %I, pg_temp',
                       f.signature, current_schema());
    END LOOP;
END;
$$;

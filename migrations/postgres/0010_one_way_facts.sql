-- What the service's own role must not be able to change, whoever holds it. Each of these
-- would otherwise undo something that is meant to go one way:
-- - an agent's identity: renaming a revoked agent frees its id for a fresh, unrevoked row;
-- - the revocation epoch: it only grows (instances learn of revocations by it);
-- - a signing key's record: a retirement is final, and a key's kid, public key, private half,
--   activation and creation never change (the key file vouches for them, see `keys::vouch`).
CREATE FUNCTION agents_identity_is_fixed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.id IS DISTINCT FROM OLD.id OR NEW.org_id IS DISTINCT FROM OLD.org_id
       OR NEW.mode IS DISTINCT FROM OLD.mode OR NEW.created_at IS DISTINCT FROM OLD.created_at THEN
        RAISE EXCEPTION 'an agent''s identity never changes';
    END IF;
    RETURN NEW;
END;
$$;
CREATE TRIGGER agents_identity_is_fixed BEFORE UPDATE ON agents
    FOR EACH ROW EXECUTE FUNCTION agents_identity_is_fixed();

CREATE FUNCTION revocation_epoch_only_grows() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP IN ('DELETE', 'TRUNCATE') OR NEW.id IS DISTINCT FROM OLD.id OR NEW.epoch < OLD.epoch THEN
        RAISE EXCEPTION 'the revocation epoch only grows';
    END IF;
    RETURN NEW;
END;
$$;
CREATE TRIGGER revocation_epoch_only_grows BEFORE UPDATE OR DELETE ON revocation_epoch
    FOR EACH ROW EXECUTE FUNCTION revocation_epoch_only_grows();
CREATE TRIGGER revocation_epoch_no_truncate BEFORE TRUNCATE ON revocation_epoch
    FOR EACH STATEMENT EXECUTE FUNCTION revocation_epoch_only_grows();

CREATE FUNCTION signing_keys_are_kept() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP IN ('DELETE', 'TRUNCATE') THEN
        RAISE EXCEPTION 'a signing key''s record is kept';
    END IF;
    IF NEW.kid IS DISTINCT FROM OLD.kid OR NEW.public_key IS DISTINCT FROM OLD.public_key
       OR NEW.private_key IS DISTINCT FROM OLD.private_key
       OR NEW.activates_at IS DISTINCT FROM OLD.activates_at
       OR NEW.created_at IS DISTINCT FROM OLD.created_at THEN
        RAISE EXCEPTION 'a signing key''s record never changes';
    END IF;
    IF OLD.retired_at IS NOT NULL AND NEW.retired_at IS DISTINCT FROM OLD.retired_at THEN
        RAISE EXCEPTION 'a retirement is final';
    END IF;
    RETURN NEW;
END;
$$;
CREATE TRIGGER signing_keys_are_kept BEFORE UPDATE OR DELETE ON signing_keys
    FOR EACH ROW EXECUTE FUNCTION signing_keys_are_kept();
CREATE TRIGGER signing_keys_no_truncate BEFORE TRUNCATE ON signing_keys
    FOR EACH STATEMENT EXECUTE FUNCTION signing_keys_are_kept();

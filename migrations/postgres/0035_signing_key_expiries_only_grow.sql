-- The latest expiry of a token a key signed only grows: the service raises it before it hands
-- out each token. Lowered (to 0, or NULL) with database access, it had a replaced key count
-- as retired on the next instance to start, which then refused that key's tokens still in
-- their lifetime.
CREATE FUNCTION signing_keys_expiry_only_grows() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.last_expires_at IS NOT NULL
       AND (NEW.last_expires_at IS NULL OR NEW.last_expires_at < OLD.last_expires_at) THEN
        RAISE EXCEPTION 'a signing key''s last expiry only grows';
    END IF;
    RETURN NEW;
END;
$$;
CREATE TRIGGER signing_keys_expiry_only_grows BEFORE UPDATE OF last_expires_at ON signing_keys
    FOR EACH ROW EXECUTE FUNCTION signing_keys_expiry_only_grows();
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION signing_keys_expiry_only_grows() SET search_path = pg_catalog, %I, pg_temp',
                   current_schema());
END;
$$;

-- The latest expiry of a token a key signed only grows: the service raises it before it hands
-- out each token. Lowered (to 0, or NULL) with database access, it had a replaced key count
-- as retired on the next instance to start, which then refused that key's tokens still in
-- their lifetime.
CREATE TRIGGER signing_keys_expiry_only_grows BEFORE UPDATE OF last_expires_at ON signing_keys
WHEN OLD.last_expires_at IS NOT NULL
  AND (NEW.last_expires_at IS NULL OR NEW.last_expires_at < OLD.last_expires_at)
BEGIN
    SELECT RAISE(ABORT, 'a signing key''s last expiry only grows');
END;

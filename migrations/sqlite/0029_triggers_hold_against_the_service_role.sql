-- What a writer of rows could still do around the triggers, closed (see the PostgreSQL
-- migration of the same number; SQLite's triggers find tables in their own schema already):
-- an agent's issuer domain changed, a revoked agent's epoch set back, the revocation epoch
-- moved by more than one, a disabled API key enabled again or given another identity; and an
-- agent's row or a disabled key's deleted to be written anew, or a disabled key's replaced
-- (REPLACE deletes without firing delete triggers). Whoever can write the file can drop
-- triggers, so these hold the service's own writes and a careless hand, not an attacker.
DROP TRIGGER agents_identity_is_fixed;
CREATE TRIGGER agents_identity_is_fixed BEFORE UPDATE OF id, org_id, mode, created_at, issuer_domain ON agents
WHEN NEW.id IS NOT OLD.id OR NEW.org_id IS NOT OLD.org_id OR NEW.mode IS NOT OLD.mode
  OR NEW.created_at IS NOT OLD.created_at OR NEW.issuer_domain IS NOT OLD.issuer_domain
BEGIN
    SELECT RAISE(ABORT, 'an agent''s identity never changes');
END;

DROP TRIGGER revocation_epoch_only_grows;
CREATE TRIGGER revocation_epoch_only_grows BEFORE UPDATE ON revocation_epoch
WHEN NEW.id IS NOT OLD.id OR NEW.epoch IS NOT OLD.epoch + 1
BEGIN
    SELECT RAISE(ABORT, 'the revocation epoch only grows, one revocation at a time');
END;

CREATE TRIGGER agents_revocation_epoch_is_final BEFORE UPDATE OF revoked_epoch ON agents
WHEN (OLD.revoked_epoch IS NOT NULL AND NEW.revoked_epoch IS NOT OLD.revoked_epoch)
  OR (OLD.revoked_at IS NULL AND NEW.revoked_at IS NULL AND NEW.revoked_epoch IS NOT NULL)
BEGIN
    SELECT RAISE(ABORT, 'a revocation''s epoch never changes');
END;

CREATE TRIGGER api_keys_disabled_for_good BEFORE UPDATE OF disabled_at ON api_keys
WHEN OLD.disabled_at IS NOT NULL AND NEW.disabled_at IS NOT OLD.disabled_at
BEGIN
    SELECT RAISE(ABORT, 'a disabled key stays disabled');
END;
CREATE TRIGGER api_keys_disabled_are_kept BEFORE DELETE ON api_keys
WHEN OLD.disabled_at IS NOT NULL
BEGIN
    SELECT RAISE(ABORT, 'a disabled key stays disabled');
END;
CREATE TRIGGER api_keys_disabled_no_replace BEFORE INSERT ON api_keys
WHEN EXISTS (SELECT 1 FROM api_keys WHERE (key_hash = NEW.key_hash OR id = NEW.id) AND disabled_at IS NOT NULL)
BEGIN
    SELECT RAISE(ABORT, 'a disabled key stays disabled');
END;

-- A revoked agent's row is kept by the triggers of migration 8; any other by this one.
CREATE TRIGGER agents_rows_are_kept BEFORE DELETE ON agents
WHEN OLD.revoked_at IS NULL
BEGIN
    SELECT RAISE(ABORT, 'an agent''s identity never changes: its row is kept');
END;
CREATE TRIGGER api_keys_identity_is_fixed BEFORE UPDATE OF key_hash, id, org_id, kind, mode ON api_keys
WHEN NEW.key_hash IS NOT OLD.key_hash OR NEW.id IS NOT OLD.id OR NEW.org_id IS NOT OLD.org_id
  OR NEW.kind IS NOT OLD.kind OR NEW.mode IS NOT OLD.mode
BEGIN
    SELECT RAISE(ABORT, 'a key''s identity never changes');
END;

-- What must go one way (see the PostgreSQL migration of the same number): an agent's
-- identity never changes, the revocation epoch only grows, and a signing key's record is
-- kept, its facts unchanged and its retirement final. REPLACE deletes the row it conflicts
-- with without firing delete triggers, so an insert over a stored key is refused first.
CREATE TRIGGER agents_identity_is_fixed BEFORE UPDATE OF id, org_id, mode, created_at ON agents
WHEN NEW.id IS NOT OLD.id OR NEW.org_id IS NOT OLD.org_id OR NEW.mode IS NOT OLD.mode
  OR NEW.created_at IS NOT OLD.created_at
BEGIN
    SELECT RAISE(ABORT, 'an agent''s identity never changes');
END;

CREATE TRIGGER revocation_epoch_only_grows BEFORE UPDATE ON revocation_epoch
WHEN NEW.id IS NOT OLD.id OR NEW.epoch < OLD.epoch
BEGIN
    SELECT RAISE(ABORT, 'the revocation epoch only grows');
END;
CREATE TRIGGER revocation_epoch_is_kept BEFORE DELETE ON revocation_epoch
BEGIN
    SELECT RAISE(ABORT, 'the revocation epoch only grows');
END;
CREATE TRIGGER revocation_epoch_no_replace BEFORE INSERT ON revocation_epoch
WHEN EXISTS (SELECT 1 FROM revocation_epoch WHERE id = NEW.id)
BEGIN
    SELECT RAISE(ABORT, 'the revocation epoch only grows');
END;

CREATE TRIGGER signing_keys_facts_are_fixed
BEFORE UPDATE OF kid, public_key, private_key, activates_at, created_at ON signing_keys
WHEN NEW.kid IS NOT OLD.kid OR NEW.public_key IS NOT OLD.public_key
  OR NEW.private_key IS NOT OLD.private_key OR NEW.activates_at IS NOT OLD.activates_at
  OR NEW.created_at IS NOT OLD.created_at
BEGIN
    SELECT RAISE(ABORT, 'a signing key''s record never changes');
END;
CREATE TRIGGER signing_keys_retirement_is_final BEFORE UPDATE OF retired_at ON signing_keys
WHEN OLD.retired_at IS NOT NULL AND NEW.retired_at IS NOT OLD.retired_at
BEGIN
    SELECT RAISE(ABORT, 'a retirement is final');
END;
CREATE TRIGGER signing_keys_are_kept BEFORE DELETE ON signing_keys
BEGIN
    SELECT RAISE(ABORT, 'a signing key''s record is kept');
END;
CREATE TRIGGER signing_keys_no_replace BEFORE INSERT ON signing_keys
WHEN EXISTS (SELECT 1 FROM signing_keys WHERE kid = NEW.kid)
BEGIN
    SELECT RAISE(ABORT, 'a signing key''s record is kept');
END;

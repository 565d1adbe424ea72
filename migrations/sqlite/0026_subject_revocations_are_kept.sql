-- A person's revocation goes one way (see the PostgreSQL migration of the same number): its
-- row is kept, names the same person, and its time only moves forward. REPLACE deletes the
-- row it conflicts with without firing delete triggers, so an insert that would move a
-- stored time back is refused first.
CREATE TRIGGER subject_revocations_are_fixed BEFORE UPDATE ON subject_revocations
WHEN NEW.org_id IS NOT OLD.org_id OR NEW.iss IS NOT OLD.iss OR NEW.sub IS NOT OLD.sub
  OR NEW.revoked_at < OLD.revoked_at
BEGIN
    SELECT RAISE(ABORT, 'a person''s revocation is kept: it only moves forward');
END;
CREATE TRIGGER subject_revocations_are_kept BEFORE DELETE ON subject_revocations
BEGIN
    SELECT RAISE(ABORT, 'a person''s revocation is kept');
END;
CREATE TRIGGER subject_revocations_no_replace BEFORE INSERT ON subject_revocations
WHEN EXISTS (SELECT 1 FROM subject_revocations WHERE org_id = NEW.org_id AND iss = NEW.iss
             AND sub = NEW.sub AND revoked_at > NEW.revoked_at)
BEGIN
    SELECT RAISE(ABORT, 'a person''s revocation is kept: it only moves forward');
END;

-- A moved name's note stays until the revocations it owes are done (see the PostgreSQL
-- migration of the same number). REPLACE deletes the row it conflicts with without firing
-- delete triggers, so an insert at a stored note's place is refused first.
CREATE TRIGGER name_moves_are_fixed BEFORE UPDATE ON name_moves
BEGIN
    SELECT RAISE(ABORT, 'a moved name''s note never changes');
END;
CREATE TRIGGER name_moves_are_kept BEFORE DELETE ON name_moves
WHEN EXISTS (
    SELECT 1 FROM agents WHERE org_id <> OLD.org_id AND revoked_at IS NULL
      AND (issuer_domain = OLD.domain OR (OLD.below AND issuer_domain LIKE '%.' || OLD.domain))
)
BEGIN
    SELECT RAISE(ABORT, 'a moved name''s note is kept while it owes revocations');
END;
CREATE TRIGGER name_moves_no_replace BEFORE INSERT ON name_moves
WHEN EXISTS (SELECT 1 FROM name_moves WHERE seq = NEW.seq)
BEGIN
    SELECT RAISE(ABORT, 'a moved name''s note never changes');
END;

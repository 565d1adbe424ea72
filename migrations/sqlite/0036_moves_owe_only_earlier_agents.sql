-- A name's move owes the revocation of the agents registered under it before the move, not of
-- those registered after (see the PostgreSQL migration of the same number): each agent keeps
-- the last issuer-domain event its registration saw, part of its identity.
ALTER TABLE agents ADD COLUMN domain_events_seen INTEGER;

DROP TRIGGER agents_identity_is_fixed;
CREATE TRIGGER agents_identity_is_fixed
BEFORE UPDATE OF id, org_id, mode, created_at, issuer_domain, domain_events_seen ON agents
WHEN NEW.id IS NOT OLD.id OR NEW.org_id IS NOT OLD.org_id OR NEW.mode IS NOT OLD.mode
  OR NEW.created_at IS NOT OLD.created_at OR NEW.issuer_domain IS NOT OLD.issuer_domain
  OR NEW.domain_events_seen IS NOT OLD.domain_events_seen
BEGIN
    SELECT RAISE(ABORT, 'an agent''s identity never changes');
END;

DROP TRIGGER name_moves_are_kept;
CREATE TRIGGER name_moves_are_kept BEFORE DELETE ON name_moves
WHEN EXISTS (
    SELECT 1 FROM agents WHERE org_id <> OLD.org_id AND revoked_at IS NULL
      AND COALESCE(domain_events_seen, 0) < OLD.seq
      AND (issuer_domain = OLD.domain OR (OLD.below AND issuer_domain LIKE '%.' || OLD.domain))
)
BEGIN
    SELECT RAISE(ABORT, 'a moved name''s note is kept while it owes revocations');
END;

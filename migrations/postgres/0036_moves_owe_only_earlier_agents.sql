-- A name's move owes the revocation of the agents registered under it before the move, not of
-- those registered after: while a large move's revocations ran, the name could change hands
-- again (back to its former holder, or on to a third), and the first move's note went on
-- revoking what the name's new rightful holder registered. Each agent keeps the last
-- issuer-domain event its registration saw (both run under the lock every change of who holds
-- what takes); a move owes the agents that saw none of its own event. Agents from before this
-- migration saw none. The column is part of the agent's identity: it never changes.
ALTER TABLE agents ADD COLUMN domain_events_seen BIGINT;

CREATE OR REPLACE FUNCTION agents_identity_is_fixed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.id IS DISTINCT FROM OLD.id OR NEW.org_id IS DISTINCT FROM OLD.org_id
       OR NEW.mode IS DISTINCT FROM OLD.mode OR NEW.created_at IS DISTINCT FROM OLD.created_at
       OR NEW.issuer_domain IS DISTINCT FROM OLD.issuer_domain
       OR NEW.domain_events_seen IS DISTINCT FROM OLD.domain_events_seen THEN
        RAISE EXCEPTION 'an agent''s identity never changes';
    END IF;
    RETURN NEW;
END;
$$;

CREATE OR REPLACE FUNCTION name_moves_are_kept() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' THEN
        RAISE EXCEPTION 'a moved name''s note never changes';
    END IF;
    -- A statement's trigger has no row to look at: a TRUNCATE is refused outright.
    IF TG_OP = 'TRUNCATE' THEN
        RAISE EXCEPTION 'a moved name''s note is kept while it owes revocations';
    END IF;
    IF EXISTS (
        SELECT 1 FROM agents WHERE org_id <> OLD.org_id AND revoked_at IS NULL
          AND COALESCE(domain_events_seen, 0) < OLD.seq
          AND (issuer_domain = OLD.domain OR (OLD.below AND issuer_domain LIKE '%.' || OLD.domain))
    ) THEN
        RAISE EXCEPTION 'a moved name''s note is kept while it owes revocations';
    END IF;
    RETURN OLD;
END;
$$;

DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION agents_identity_is_fixed() SET search_path = pg_catalog, %I, pg_temp',
                   current_schema());
    EXECUTE format('ALTER FUNCTION name_moves_are_kept() SET search_path = pg_catalog, %I, pg_temp',
                   current_schema());
END;
$$;

-- A checkpoint covers records its ledger holds. Rows written with database access alone at
-- every size after the latest checkpoint (one statement of a million rows) left the
-- checkpointer no size to sign at, for good: it passes over one taken size a tick and never
-- below the latest + 1. Refused past the ledger's records, such rows are as many as the
-- records not yet covered, and the next record frees a size.
CREATE FUNCTION audit_checkpoints_within_their_ledger() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.tree_size > COALESCE((SELECT last_seq FROM audit_blocks WHERE org_id = NEW.org_id
                                 AND mode = NEW.mode ORDER BY first_seq DESC LIMIT 1), 0) THEN
        RAISE EXCEPTION 'a checkpoint covers records its ledger holds';
    END IF;
    RETURN NEW;
END;
$$;
CREATE TRIGGER audit_checkpoints_within_their_ledger BEFORE INSERT ON audit_checkpoints
    FOR EACH ROW EXECUTE FUNCTION audit_checkpoints_within_their_ledger();
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION audit_checkpoints_within_their_ledger() SET search_path = pg_catalog, %I, pg_temp',
                   current_schema());
END;
$$;

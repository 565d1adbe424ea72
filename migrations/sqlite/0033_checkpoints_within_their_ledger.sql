-- A checkpoint covers records its ledger holds. Rows written with database access alone at
-- every size after the latest checkpoint (one statement of a million rows) left the
-- checkpointer no size to sign at, for good: it passes over one taken size a tick and never
-- below the latest + 1. Refused past the ledger's records, such rows are as many as the
-- records not yet covered, and the next record frees a size.
CREATE TRIGGER audit_checkpoints_within_their_ledger BEFORE INSERT ON audit_checkpoints
WHEN NEW.tree_size > IFNULL((SELECT last_seq FROM audit_blocks WHERE org_id = NEW.org_id
                             AND mode = NEW.mode ORDER BY first_seq DESC LIMIT 1), 0)
BEGIN
    SELECT RAISE(ABORT, 'a checkpoint covers records its ledger holds');
END;

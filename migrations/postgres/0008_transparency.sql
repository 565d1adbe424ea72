-- The audit log's Merkle trees and signed checkpoints (src/domain/merkle.rs,
-- src/engine/transparency.rs), and rules that keep the log and revocations as written.
--
-- audit_tree_nodes: the hash of every complete subtree of a ledger's tree whose height is a
-- multiple of 4, up to the ledger's latest checkpoint (written with it), so that a proof reads
-- a few small ranges. audit_checkpoints: every signed checkpoint (a C2SP signed note).
CREATE TABLE audit_tree_nodes (
    org_id TEXT NOT NULL,
    mode   TEXT NOT NULL,
    height BIGINT NOT NULL,
    idx    BIGINT NOT NULL,
    hash   BYTEA NOT NULL,
    PRIMARY KEY (org_id, mode, height, idx)
);

CREATE TABLE audit_checkpoints (
    org_id     TEXT NOT NULL,
    mode       TEXT NOT NULL,
    tree_size  BIGINT NOT NULL,
    root       BYTEA NOT NULL,
    note       TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (org_id, mode, tree_size)
);

-- An upsert's DO UPDATE fires the update triggers, so these cover it too.
CREATE TRIGGER audit_tree_nodes_no_update BEFORE UPDATE ON audit_tree_nodes
    FOR EACH ROW EXECUTE FUNCTION audit_append_only();
CREATE TRIGGER audit_tree_nodes_no_delete BEFORE DELETE ON audit_tree_nodes
    FOR EACH ROW EXECUTE FUNCTION audit_append_only();
CREATE TRIGGER audit_tree_nodes_no_truncate BEFORE TRUNCATE ON audit_tree_nodes
    FOR EACH STATEMENT EXECUTE FUNCTION audit_append_only();
CREATE TRIGGER audit_checkpoints_no_update BEFORE UPDATE ON audit_checkpoints
    FOR EACH ROW EXECUTE FUNCTION audit_append_only();
CREATE TRIGGER audit_checkpoints_no_delete BEFORE DELETE ON audit_checkpoints
    FOR EACH ROW EXECUTE FUNCTION audit_append_only();
CREATE TRIGGER audit_checkpoints_no_truncate BEFORE TRUNCATE ON audit_checkpoints
    FOR EACH STATEMENT EXECUTE FUNCTION audit_append_only();

-- A revocation is final: once revoked_at is set, neither it nor the reason changes, and the
-- agent's row is not deleted (a new row under its id would bring a revoked token back).
CREATE FUNCTION agents_revocation_is_final() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP IN ('DELETE', 'TRUNCATE') THEN
        RAISE EXCEPTION 'a revocation is final';
    END IF;
    IF NEW.revoked_at IS DISTINCT FROM OLD.revoked_at
       OR NEW.revocation_reason IS DISTINCT FROM OLD.revocation_reason THEN
        RAISE EXCEPTION 'a revocation is final';
    END IF;
    RETURN NEW;
END;
$$;
CREATE TRIGGER agents_revocation_is_final BEFORE UPDATE ON agents
    FOR EACH ROW WHEN (OLD.revoked_at IS NOT NULL)
    EXECUTE FUNCTION agents_revocation_is_final();
CREATE TRIGGER agents_revoked_are_kept BEFORE DELETE ON agents
    FOR EACH ROW WHEN (OLD.revoked_at IS NOT NULL)
    EXECUTE FUNCTION agents_revocation_is_final();
CREATE TRIGGER agents_no_truncate BEFORE TRUNCATE ON agents
    FOR EACH STATEMENT EXECUTE FUNCTION agents_revocation_is_final();

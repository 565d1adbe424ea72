-- The audit log's Merkle trees and signed checkpoints (src/domain/merkle.rs,
-- src/engine/transparency.rs), and rules that keep the log and revocations as written.
--
-- audit_tree_nodes: the hash of every complete subtree of a ledger's tree whose height is a
-- multiple of 4, up to the ledger's latest checkpoint (written with it), so that a proof reads
-- a few small ranges. audit_checkpoints: every signed checkpoint (a C2SP signed note).
CREATE TABLE audit_tree_nodes (
    org_id TEXT NOT NULL,
    mode   TEXT NOT NULL,
    height INTEGER NOT NULL,
    idx    INTEGER NOT NULL,
    hash   BLOB NOT NULL,
    PRIMARY KEY (org_id, mode, height, idx)
) WITHOUT ROWID;

CREATE TABLE audit_checkpoints (
    org_id     TEXT NOT NULL,
    mode       TEXT NOT NULL,
    tree_size  INTEGER NOT NULL,
    root       BLOB NOT NULL,
    note       TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (org_id, mode, tree_size)
);

CREATE TRIGGER audit_tree_nodes_no_update BEFORE UPDATE ON audit_tree_nodes
BEGIN
    SELECT RAISE(ABORT, 'the audit log is append-only');
END;
CREATE TRIGGER audit_tree_nodes_no_delete BEFORE DELETE ON audit_tree_nodes
BEGIN
    SELECT RAISE(ABORT, 'the audit log is append-only');
END;
CREATE TRIGGER audit_checkpoints_no_update BEFORE UPDATE ON audit_checkpoints
BEGIN
    SELECT RAISE(ABORT, 'the audit log is append-only');
END;
CREATE TRIGGER audit_checkpoints_no_delete BEFORE DELETE ON audit_checkpoints
BEGIN
    SELECT RAISE(ABORT, 'the audit log is append-only');
END;

-- REPLACE (INSERT OR REPLACE, REPLACE INTO) deletes the row it conflicts with without firing
-- delete triggers, and an upsert updates it: an insert over a stored key is refused before
-- either can happen. Every unique key of these tables is its primary key.
CREATE TRIGGER audit_blocks_no_replace BEFORE INSERT ON audit_blocks
WHEN EXISTS (SELECT 1 FROM audit_blocks
             WHERE org_id = NEW.org_id AND mode = NEW.mode AND first_seq = NEW.first_seq)
BEGIN
    SELECT RAISE(ABORT, 'the audit log is append-only');
END;
CREATE TRIGGER audit_block_agents_no_replace BEFORE INSERT ON audit_block_agents
WHEN EXISTS (SELECT 1 FROM audit_block_agents
             WHERE agent_id = NEW.agent_id AND org_id = NEW.org_id AND mode = NEW.mode
               AND first_seq = NEW.first_seq)
BEGIN
    SELECT RAISE(ABORT, 'the audit log is append-only');
END;
CREATE TRIGGER audit_tree_nodes_no_replace BEFORE INSERT ON audit_tree_nodes
WHEN EXISTS (SELECT 1 FROM audit_tree_nodes
             WHERE org_id = NEW.org_id AND mode = NEW.mode AND height = NEW.height AND idx = NEW.idx)
BEGIN
    SELECT RAISE(ABORT, 'the audit log is append-only');
END;
CREATE TRIGGER audit_checkpoints_no_replace BEFORE INSERT ON audit_checkpoints
WHEN EXISTS (SELECT 1 FROM audit_checkpoints
             WHERE org_id = NEW.org_id AND mode = NEW.mode AND tree_size = NEW.tree_size)
BEGIN
    SELECT RAISE(ABORT, 'the audit log is append-only');
END;

-- A revocation is final: once revoked_at is set, neither it nor the reason changes, and the
-- agent's row is neither deleted nor replaced (which would bring a revoked token back).
CREATE TRIGGER agents_revocation_is_final BEFORE UPDATE OF revoked_at, revocation_reason ON agents
WHEN OLD.revoked_at IS NOT NULL
 AND (NEW.revoked_at IS NOT OLD.revoked_at OR NEW.revocation_reason IS NOT OLD.revocation_reason)
BEGIN
    SELECT RAISE(ABORT, 'a revocation is final');
END;
CREATE TRIGGER agents_revoked_are_kept BEFORE DELETE ON agents
WHEN OLD.revoked_at IS NOT NULL
BEGIN
    SELECT RAISE(ABORT, 'a revocation is final');
END;
CREATE TRIGGER agents_no_replace_of_revoked BEFORE INSERT ON agents
WHEN EXISTS (SELECT 1 FROM agents WHERE id = NEW.id AND revoked_at IS NOT NULL)
BEGIN
    SELECT RAISE(ABORT, 'a revocation is final');
END;

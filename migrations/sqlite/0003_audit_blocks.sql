-- The audit log is stored as blocks: one row per (batch, ledger) holding up to 128 sealed
-- records (format in src/store/block.rs), plus one row per distinct agent of the block. The
-- old per-record table is converted by the service right after this migration (it needs the
-- block encoding) and then dropped, with audit_counts, in the same transaction.
-- results: the set of results in the block, bits valid 1, invalid 2, expired 4, revoked 8;
-- n_*: running totals of the ledger (or of the agent in it) up to and including the block.
-- (A rowid table: its rows are large.)
CREATE TABLE audit_blocks (
    org_id    TEXT NOT NULL,
    mode      TEXT NOT NULL,
    first_seq INTEGER NOT NULL,
    last_seq  INTEGER NOT NULL,
    prev_hash BLOB NOT NULL,
    last_hash BLOB NOT NULL,
    results   INTEGER NOT NULL,
    n_valid   INTEGER NOT NULL,
    n_invalid INTEGER NOT NULL,
    n_expired INTEGER NOT NULL,
    n_revoked INTEGER NOT NULL,
    records   BLOB NOT NULL,
    PRIMARY KEY (org_id, mode, first_seq),
    CHECK (last_seq >= first_seq)
);
-- Pages filtered by a failure result walk only the blocks holding that result: one partial
-- index per failure (bits 2, 4, 8), which a block holding no failure, the bulk of the
-- traffic, does not enter. A page of valid records walks the primary key.
CREATE INDEX audit_blocks_invalid ON audit_blocks (org_id, mode, first_seq) WHERE (results & 2) <> 0;
CREATE INDEX audit_blocks_expired ON audit_blocks (org_id, mode, first_seq) WHERE (results & 4) <> 0;
CREATE INDEX audit_blocks_revoked ON audit_blocks (org_id, mode, first_seq) WHERE (results & 8) <> 0;

CREATE TABLE audit_block_agents (
    org_id    TEXT NOT NULL,
    mode      TEXT NOT NULL,
    agent_id  TEXT NOT NULL,
    first_seq INTEGER NOT NULL,
    results   INTEGER NOT NULL,
    n_valid   INTEGER NOT NULL,
    n_invalid INTEGER NOT NULL,
    n_expired INTEGER NOT NULL,
    n_revoked INTEGER NOT NULL,
    -- agent_id first, as on PostgreSQL (its migration says why).
    PRIMARY KEY (agent_id, org_id, mode, first_seq)
) WITHOUT ROWID;
CREATE INDEX audit_block_agents_invalid ON audit_block_agents (agent_id, org_id, mode, first_seq)
    WHERE (results & 2) <> 0;
CREATE INDEX audit_block_agents_expired ON audit_block_agents (agent_id, org_id, mode, first_seq)
    WHERE (results & 4) <> 0;
CREATE INDEX audit_block_agents_revoked ON audit_block_agents (agent_id, org_id, mode, first_seq)
    WHERE (results & 8) <> 0;

CREATE TRIGGER audit_blocks_no_update BEFORE UPDATE ON audit_blocks
BEGIN
    SELECT RAISE(ABORT, 'the audit log is append-only');
END;
CREATE TRIGGER audit_blocks_no_delete BEFORE DELETE ON audit_blocks
BEGIN
    SELECT RAISE(ABORT, 'the audit log is append-only');
END;
CREATE TRIGGER audit_block_agents_no_update BEFORE UPDATE ON audit_block_agents
BEGIN
    SELECT RAISE(ABORT, 'the audit log is append-only');
END;
CREATE TRIGGER audit_block_agents_no_delete BEFORE DELETE ON audit_block_agents
BEGIN
    SELECT RAISE(ABORT, 'the audit log is append-only');
END;

//! The audit ledgers: appending batches, reading pages, and what `audit verify` reads.

use agentid_core::domain::AgentId;
use futures_util::future::BoxFuture;

use super::block::{AgentBlockRow, BlockSealer, Head};
use super::sql::{hash32, LogPlan};
use super::{Appended, BlockSeal, DecodedBlock, LogPage, LogQuery, StoreError, StoreFuture};
use agentid_core::domain::audit::AuditEntry;
use agentid_core::domain::{Ledger, Totals, VerifyResult};

/// The audit ledgers, one per organization and mode.
pub trait AuditStore {
    /// Appends a batch in one transaction: re-checks revocation of `valid` entries inside it
    /// (agent by agent only when a revocation was committed with a higher epoch than the
    /// lowest `revocations_seen` of those entries), chains each ledger, updates the counters.
    /// Returns the records in entry order, as committed. When the batch is refused for
    /// another reason than an unreachable store, each of its ledgers is tried alone, so that
    /// one ledger's trouble does not fail the others' records.
    /// Each block is sealed with `sealer` (the key file's MAC).
    fn append_audit(&self, entries: Vec<AuditEntry>, sealer: BlockSealer) -> BoxFuture<'_, Appended>;
    /// A page of a ledger, newest first, with the exact total of matching records.
    fn read_log<'a>(&'a self, q: LogQuery<'a>) -> StoreFuture<'a, LogPage>;
    /// Every ledger that holds records or checkpoints.
    fn ledgers(&self) -> StoreFuture<'_, Vec<Ledger>>;
    /// The number of records of a ledger: its newest block's last `seq`.
    fn ledger_size<'a>(&'a self, ledger: &'a Ledger) -> StoreFuture<'a, u64>;
    /// How many stored blocks start before record 1 (none the service writes: read by nothing
    /// that walks the chain, yet listed by the log).
    fn blocks_before_first<'a>(&'a self, ledger: &'a Ledger) -> StoreFuture<'a, u64>;
    /// Stored blocks with `first_seq > after`, ascending, decoded, with what their rows
    /// claim of them (for `audit verify`).
    fn read_blocks<'a>(
        &'a self,
        ledger: &'a Ledger,
        after: i64,
        limit: u32,
    ) -> StoreFuture<'a, Vec<DecodedBlock>>;
    /// The seals of the blocks that hold records `from..=to`, and of those before them back to
    /// the latest sealed one, ascending.
    fn block_seals<'a>(&'a self, ledger: &'a Ledger, from: i64, to: i64) -> StoreFuture<'a, Vec<BlockSeal>>;
    /// An agent's `audit_block_agents` rows in a ledger, ascending.
    fn agent_rows<'a>(
        &'a self,
        ledger: &'a Ledger,
        agent_id: &'a AgentId,
    ) -> StoreFuture<'a, Vec<AgentBlockRow>>;
    /// How many `audit_block_agents` rows each (ledger, agent) has.
    fn agent_row_counts(&self) -> StoreFuture<'_, Vec<(Ledger, String, i64)>>;
    /// Sets what befalls the next write; false where the backend cannot fail so (SQLite
    /// runs in the process: no connection to lose).
    #[cfg(feature = "test-hooks")]
    fn inject_write_fault(&self, fault: crate::WriteFault) -> bool;
}

/// The newest block of a ledger; binds org, mode. Read as a [`HeadRow`].
pub(crate) const LEDGER_HEAD_SQL: &str =
    "SELECT last_seq, last_hash, n_valid, n_invalid, n_expired, n_revoked \
    FROM audit_blocks WHERE org_id = $1 AND mode = $2 ORDER BY first_seq DESC LIMIT 1";

row! {
    pub(crate) struct HeadRow {
        #[flatten]
        totals: TotalsRow, last_seq: i64, last_hash: Vec<u8>,
    }
}

/// Where the next record of a ledger goes: after its newest block, or at genesis.
pub(crate) fn ledger_head(row: Option<HeadRow>) -> Result<Head, StoreError> {
    match row {
        Some(h) => Ok(Head {
            seq: h.last_seq,
            hash: hash32(h.last_hash)?,
            totals: h.totals.into(),
        }),
        None => Ok(Head::default()),
    }
}

row! {
    /// Running totals of a ledger or an agent, as stored.
    pub(crate) struct TotalsRow {
        n_valid: i64, n_invalid: i64, n_expired: i64, n_revoked: i64,
    }
}

impl From<TotalsRow> for Totals {
    fn from(t: TotalsRow) -> Self {
        [t.n_valid, t.n_invalid, t.n_expired, t.n_revoked]
    }
}

/// Running totals of the newest block row of a ledger, or of an agent in it; binds org,
/// mode, [agent].
pub(crate) fn totals_sql(by_agent: bool) -> &'static str {
    if by_agent {
        "SELECT n_valid, n_invalid, n_expired, n_revoked FROM audit_block_agents \
         WHERE org_id = $1 AND mode = $2 AND agent_id = $3 ORDER BY first_seq DESC LIMIT 1"
    } else {
        "SELECT n_valid, n_invalid, n_expired, n_revoked FROM audit_blocks \
         WHERE org_id = $1 AND mode = $2 ORDER BY first_seq DESC LIMIT 1"
    }
}

/// The blocks a page of `GET /v1/log` reads, newest first; binds in order: org, mode,
/// [agent], [before], number of blocks. Every block it returns holds at least one matching
/// record (the agent's rows and the result bits say so exactly), except that the block
/// holding `before` may hold none below it: `limit + 2` blocks always fill a page and tell
/// whether more follow. The result test is written into the SQL as a literal (one of four
/// fixed bits) in exactly the form of the partial index of that failure's blocks, so both
/// planners use it, generic plans included.
pub(crate) fn log_blocks_sql(q: &LogQuery<'_>, plan: &LogPlan) -> String {
    use std::fmt::Write;
    let indexed_by = |table: &str| match q.result {
        Some(r) if plan.name_index && r != VerifyResult::Valid => {
            format!(" INDEXED BY {table}_{}", r.as_str())
        }
        _ => String::new(),
    };
    let mut sql = String::from("SELECT b.first_seq, b.last_seq, b.prev_hash, b.records FROM ");
    let mut n = 2;
    let t = if q.agent_id.is_some() {
        n += 1;
        // Each block by its primary key. PostgreSQL, on tables not analyzed yet, joined with a
        // scan of every block of the ledger per agent row (a page of 200 took 100 ms on 170k
        // records); the LATERAL, fenced by OFFSET 0, leaves it only the key look-up.
        let join = if !plan.lateral_join {
            "JOIN audit_blocks b ON b.org_id = t.org_id AND b.mode = t.mode AND b.first_seq = t.first_seq"
        } else {
            "CROSS JOIN LATERAL (SELECT x.first_seq, x.last_seq, x.prev_hash, x.records FROM audit_blocks x \
             WHERE x.org_id = t.org_id AND x.mode = t.mode AND x.first_seq = t.first_seq OFFSET 0) b"
        };
        let _ = write!(
            sql,
            "audit_block_agents t{} {join} WHERE t.org_id = $1 AND t.mode = $2 AND t.agent_id = $3",
            indexed_by("audit_block_agents")
        );
        "t"
    } else {
        let _ = write!(
            sql,
            "audit_blocks b{} WHERE b.org_id = $1 AND b.mode = $2",
            indexed_by("audit_blocks")
        );
        "b"
    };
    if let Some(r) = q.result {
        let _ = write!(sql, " AND ({t}.results & {}) <> 0", r.bit());
    }
    if q.before_seq.is_some() {
        n += 1;
        let _ = write!(sql, " AND {t}.first_seq < ${n}");
    }
    let _ = write!(sql, " ORDER BY {t}.first_seq DESC LIMIT ${}", n + 1);
    sql
}

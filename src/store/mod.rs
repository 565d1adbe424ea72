//! Persistence boundary: the `Store` trait, its records and errors, and the two backends
//! (SQLite, the embedded default; PostgreSQL, for production), chosen by the URL scheme.

/// The batch and block encodings are the store's own; the benchmarks reach them through the
/// test hooks.
#[cfg(feature = "test-hooks")]
pub mod batch;
#[cfg(not(feature = "test-hooks"))]
mod batch;
#[cfg(feature = "test-hooks")]
pub mod block;
#[cfg(not(feature = "test-hooks"))]
mod block;
/// Migrations embedded in the binary; the tests build older schemas with them.
#[cfg(feature = "test-hooks")]
pub mod migrate;
#[cfg(not(feature = "test-hooks"))]
mod migrate;
mod postgres;
mod sql;
mod sqlite;

use std::fmt;
use std::sync::Arc;

use futures_util::future::BoxFuture;

use crate::domain::audit::{AuditEntry, AuditRecord};
use crate::domain::{ApiKeyKind, KeyMode, Ledger, Millis, OrgLimits, Plan, Totals, VerifyResult};
use crate::tlog::tree::{Hash, Subtree};

pub use crate::keys::SigningKeyRecord;
pub use block::AgentBlockRow;
pub use migrate::valid_role;
pub use postgres::PgStore;
pub use sqlite::SqliteStore;

pub type StoreFuture<'a, T> = BoxFuture<'a, Result<T, StoreError>>;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database cannot be reached (connection refused, pool timeout, I/O).
    #[error("store unavailable: {0}")]
    Unavailable(#[source] sqlx::Error),
    /// A uniqueness rule was broken.
    #[error("store conflict: {0}")]
    Conflict(#[source] sqlx::Error),
    #[error("store error: {0}")]
    Database(#[source] sqlx::Error),
    /// A stored value is not one the service writes.
    #[error("corrupt stored value: {0}")]
    Corrupt(String),
    #[error("migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error(
        "the database needs migrations that this role may not run ({0}): run `agentid migrate` \
         as the database owner, then start the service again"
    )]
    NotOwner(String),
    #[error("unsupported database URL (use sqlite://… or postgres://…)")]
    UnsupportedUrl,
}

impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        use sqlx::Error as E;
        match &e {
            E::Io(_) | E::PoolTimedOut | E::PoolClosed | E::Tls(_) | E::WorkerCrashed => {
                StoreError::Unavailable(e)
            }
            E::Protocol(_) => StoreError::Unavailable(e),
            E::Database(db) => {
                if db.is_unique_violation() {
                    StoreError::Conflict(e)
                } else if db.code().is_some_and(|c| is_outage_code(&c)) {
                    StoreError::Unavailable(e)
                } else {
                    StoreError::Database(e)
                }
            }
            _ => StoreError::Database(e),
        }
    }
}

/// PostgreSQL admin shutdown / cannot connect now / insufficient resources (too many
/// connections, out of memory or disk), SQLite busy or locked: retry later, not a fault.
fn is_outage_code(code: &str) -> bool {
    code.starts_with("57P") || code.starts_with("08") || code.starts_with("53") || code == "5" || code == "6"
}

impl StoreError {
    pub fn is_unavailable(&self) -> bool {
        matches!(self, StoreError::Unavailable(_))
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrgRecord {
    pub id: String,
    pub name: String,
    pub plan: Plan,
    pub limits: OrgLimits,
    pub created_at: Millis,
}

/// An API key as stored: only its SHA-256 and a display hint.
#[derive(Clone)]
pub struct NewApiKey {
    pub key_hash: [u8; 32],
    pub org_id: String,
    pub kind: ApiKeyKind,
    pub mode: KeyMode,
    pub hint: String,
    pub created_at: Millis,
}

impl fmt::Debug for NewApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NewApiKey")
            .field("org_id", &self.org_id)
            .field("hint", &self.hint)
            .finish_non_exhaustive()
    }
}

/// What a presented key resolves to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyRecord {
    pub org: OrgRecord,
    pub kind: ApiKeyKind,
    pub mode: KeyMode,
    pub disabled: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentRecord {
    pub id: String,
    pub org_id: String,
    pub mode: KeyMode,
    pub name: String,
    pub issuer_domain: String,
    pub description: String,
    pub scopes: Vec<String>,
    pub created_at: Millis,
    pub issued_at: Millis,
    pub expires_at: Millis,
    pub revoked_at: Option<Millis>,
    pub revocation_reason: Option<String>,
    pub verification_count: i64,
}

impl AgentRecord {
    pub fn ledger(&self) -> Ledger {
        Ledger {
            org_id: self.org_id.clone(),
            mode: self.mode,
        }
    }
}

#[derive(Debug, Clone)]
pub struct LogQuery<'a> {
    pub ledger: &'a Ledger,
    pub agent_id: Option<&'a str>,
    pub result: Option<VerifyResult>,
    /// Only records with a smaller sequence number (the cursor).
    pub before_seq: Option<i64>,
    pub limit: u32,
}

#[derive(Debug, Clone)]
pub struct LogPage {
    pub records: Vec<AuditRecord>,
    pub has_more: bool,
    pub total: i64,
}

/// Connections of one pool: `main` serves the API, `writer` (PostgreSQL) the audit writer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolStats {
    pub pool: &'static str,
    pub open: u32,
    pub idle: u32,
    pub max: u32,
}

impl PoolStats {
    pub fn of<DB: sqlx::Database>(pool: &'static str, p: &sqlx::Pool<DB>) -> Self {
        PoolStats {
            pool,
            open: p.size(),
            idle: p.num_idle() as u32,
            max: p.options().get_max_connections(),
        }
    }
}

/// The persistence boundary. Each method is one short transaction at most.
pub trait Store: Send + Sync + fmt::Debug + 'static {
    fn backend(&self) -> &'static str;
    /// Connections of each of the store's pools.
    fn pool_stats(&self) -> Vec<PoolStats>;
    fn ping(&self) -> StoreFuture<'_, ()>;
    /// Closes the pool; pending work finishes first.
    fn close(&self) -> BoxFuture<'_, ()>;
    /// The rate-limit buckets the store keeps for every instance that uses it, when it is
    /// one a fleet shares (PostgreSQL); `None` for one that serves one instance (SQLite).
    fn shared_buckets(&self) -> Option<&dyn SharedBuckets>;
    /// Drops the empty per-record audit log tables that migration 1 creates (blocks replaced
    /// them), and refuses a database whose per-record log holds records (a pre-release
    /// version's); `connect` calls it.
    fn upgrade(&self) -> StoreFuture<'_, ()>;

    /// The signing keys the fleet has recorded (one until keys rotate), oldest first.
    fn signing_keys(&self) -> StoreFuture<'_, Vec<SigningKeyRecord>>;
    /// Records `key` as the fleet's signing key unless one is recorded already (an exclusive
    /// transaction, so instances starting at once agree). Returns what is recorded after.
    fn record_first_signing_key<'a>(
        &'a self,
        key: &'a SigningKeyRecord,
    ) -> StoreFuture<'a, Vec<SigningKeyRecord>>;

    /// Records one more signing key (a rotation).
    fn add_signing_key<'a>(&'a self, key: &'a SigningKeyRecord) -> StoreFuture<'a, ()>;
    /// Retires a key by hand; false when no such key is recorded or it was retired already.
    fn retire_signing_key<'a>(&'a self, kid: &'a str, at: Millis) -> StoreFuture<'a, bool>;
    /// Notes that `kid` signed a token expiring at `expires_at` (kept when later).
    fn note_token_expiry<'a>(&'a self, kid: &'a str, expires_at: Millis) -> StoreFuture<'a, ()>;

    fn count_orgs(&self) -> StoreFuture<'_, i64>;
    /// Creates the organization with its keys if the store has none yet (an exclusive
    /// transaction, so of instances starting at once on an empty store exactly one does).
    /// Returns whether it did.
    fn create_first_org<'a>(&'a self, org: &'a OrgRecord, keys: &'a [NewApiKey]) -> StoreFuture<'a, bool>;
    /// Creates an organization together with its first keys (one transaction).
    fn create_org<'a>(&'a self, org: &'a OrgRecord, keys: &'a [NewApiKey]) -> StoreFuture<'a, ()>;
    /// Changes plan and limits; false when no such organization exists.
    fn update_org<'a>(&'a self, org: &'a OrgRecord) -> StoreFuture<'a, bool>;
    fn get_org<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Option<OrgRecord>>;

    fn insert_key<'a>(&'a self, key: &'a NewApiKey) -> StoreFuture<'a, ()>;
    fn find_key<'a>(&'a self, key_hash: &'a [u8; 32]) -> StoreFuture<'a, Option<KeyRecord>>;
    /// Disables a key for good; false when no such key exists.
    fn disable_key<'a>(&'a self, key_hash: &'a [u8; 32], at: Millis) -> StoreFuture<'a, bool>;

    fn insert_agent<'a>(&'a self, agent: &'a AgentRecord) -> StoreFuture<'a, ()>;
    /// Any organization's agent: callers check ownership.
    fn get_agent<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Option<AgentRecord>>;
    /// An organization's agents in one mode, newest first.
    fn list_agents<'a>(&'a self, org_id: &'a str, mode: KeyMode) -> StoreFuture<'a, Vec<AgentRecord>>;
    /// All agents with an id greater than `after_id`, in id order (for loading the registry).
    fn scan_agents<'a>(&'a self, after_id: &'a str, limit: u32) -> StoreFuture<'a, Vec<AgentRecord>>;
    /// Records a newly issued token; false (and no change) when the agent is revoked or missing.
    fn renew_token<'a>(&'a self, id: &'a str, issued_at: Millis, expires_at: Millis)
        -> StoreFuture<'a, bool>;
    /// Revokes once; a second call changes nothing. Returns the agent as stored afterwards,
    /// with the revocation epoch its revocation was stamped with (none for an agent revoked
    /// before the store had epochs).
    fn revoke_agent<'a>(
        &'a self,
        id: &'a str,
        at: Millis,
        reason: Option<&'a str>,
    ) -> StoreFuture<'a, Option<(AgentRecord, Option<i64>)>>;

    /// The committed revocation epoch and every agent revoked with a higher epoch than
    /// `after`, read in one snapshot (for instances to learn each other's revocations).
    fn revocations_after(&self, after: i64) -> StoreFuture<'_, Revocations>;

    /// Appends a batch in one transaction: re-checks revocation of `valid` entries inside it
    /// (agent by agent only when a revocation was committed with a higher epoch than the
    /// lowest `revocations_seen` of those entries), chains each ledger, updates the counters.
    /// Returns the records in entry order, as committed. When the batch is refused for
    /// another reason than an unreachable store, each of its ledgers is tried alone, so that
    /// one ledger's trouble does not fail the others' records.
    fn append_audit(&self, entries: Vec<AuditEntry>) -> BoxFuture<'_, Appended>;
    /// A page of a ledger, newest first, with the exact total of matching records.
    fn read_log<'a>(&'a self, q: LogQuery<'a>) -> StoreFuture<'a, LogPage>;
    /// Records of a ledger with `seq > after_seq`, ascending (tests' chain verification).
    #[cfg(feature = "test-hooks")]
    fn read_chain<'a>(
        &'a self,
        ledger: &'a Ledger,
        after_seq: i64,
        limit: u32,
    ) -> StoreFuture<'a, Vec<AuditRecord>>;
    /// Every ledger that holds records or checkpoints.
    fn ledgers(&self) -> StoreFuture<'_, Vec<Ledger>>;

    /// The number of records of a ledger: its newest block's last `seq`.
    fn ledger_size<'a>(&'a self, ledger: &'a Ledger) -> StoreFuture<'a, u64>;
    /// The record hashes of `seq` `first..=last` of a ledger, in order: the leaves of its
    /// Merkle tree. Fewer when the ledger ends before `last`; `Corrupt` at a gap.
    fn record_hashes<'a>(&'a self, ledger: &'a Ledger, first: u64, last: u64) -> StoreFuture<'a, Vec<Hash>>;
    /// Stored subtree hashes of one height with an index in `indices`, in order.
    fn tree_nodes<'a>(
        &'a self,
        ledger: &'a Ledger,
        height: u32,
        indices: std::ops::Range<u64>,
    ) -> StoreFuture<'a, Vec<(u64, Hash)>>;
    /// The checkpoint of the largest tree of a ledger.
    fn latest_checkpoint<'a>(&'a self, ledger: &'a Ledger) -> StoreFuture<'a, Option<StoredCheckpoint>>;
    /// Every checkpoint of a ledger, smallest tree first.
    fn checkpoints<'a>(&'a self, ledger: &'a Ledger) -> StoreFuture<'a, Vec<StoredCheckpoint>>;
    /// Stores a checkpoint and the subtree hashes its tree completed since the tree of
    /// `after` leaves, in one transaction, if that tree's checkpoint is still the latest (0:
    /// none yet). False, and nothing written, when another instance got there first.
    fn add_checkpoint<'a>(
        &'a self,
        checkpoint: &'a StoredCheckpoint,
        after: u64,
        nodes: &'a [(Subtree, Hash)],
    ) -> StoreFuture<'a, bool>;
    /// Stored blocks with `first_seq > after`, ascending, decoded, with what their rows
    /// claim of them (for `audit verify`).
    fn read_blocks<'a>(
        &'a self,
        ledger: &'a Ledger,
        after: i64,
        limit: u32,
    ) -> StoreFuture<'a, Vec<CheckedBlock>>;
    /// An agent's `audit_block_agents` rows in a ledger, ascending.
    fn agent_rows<'a>(&'a self, ledger: &'a Ledger, agent_id: &'a str)
        -> StoreFuture<'a, Vec<AgentBlockRow>>;
    /// How many `audit_block_agents` rows each (ledger, agent) has.
    fn agent_row_counts(&self) -> StoreFuture<'_, Vec<(Ledger, String, i64)>>;
}

pub type SharedStore = Arc<dyn Store>;

/// A stored block of a ledger's records (one batch's), decoded, and what its row claims of
/// them, for `audit verify` to recompute.
#[derive(Debug)]
pub struct CheckedBlock {
    pub first_seq: i64,
    pub last_seq: i64,
    /// The records, or why they cannot be read.
    pub records: Result<Vec<AuditRecord>, StoreError>,
    /// The hash the row says its last record has.
    pub last_hash: Vec<u8>,
    /// The results the row says its records hold (`VerifyResult::bit`s).
    pub results: i32,
    /// The ledger's running totals the row says hold after it.
    pub totals: Totals,
}

/// A signed checkpoint of a ledger, as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredCheckpoint {
    pub ledger: Ledger,
    pub size: u64,
    pub root: Hash,
    /// The C2SP signed note.
    pub note: String,
    pub created_at: Millis,
}

/// GCRA buckets a fleet shares, leased out in cells (see `engine::ratelimit`). A bucket of
/// `limit` cells a minute is created full.
pub trait SharedBuckets: Send + Sync {
    /// Takes up to `want` cells of the bucket, as many as it holds.
    fn take_cells<'a>(&'a self, bucket: &'a str, limit: u32, want: u32) -> StoreFuture<'a, Taken>;
    /// Gives back cells that were taken and not used.
    fn return_cells<'a>(&'a self, bucket: &'a str, limit: u32, cells: u32) -> StoreFuture<'a, ()>;
}

/// What taking cells from a shared bucket gave, and what it says of the bucket after.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Taken {
    pub granted: u32,
    /// Cells the bucket still holds.
    pub remaining: u32,
    /// Until the bucket is full again.
    pub full_in: std::time::Duration,
    /// Until the bucket holds a cell again (zero when it holds one).
    pub retry_in: std::time::Duration,
}

/// What an audit append committed.
#[derive(Debug)]
pub struct Appended {
    /// Per entry, in order: its committed record, or `None` when its ledger's part failed.
    pub records: Vec<Option<AuditRecord>>,
    /// Why a part failed, when one did.
    pub failure: Option<StoreError>,
}

impl Appended {
    pub fn all(records: Vec<AuditRecord>) -> Self {
        Appended {
            records: records.into_iter().map(Some).collect(),
            failure: None,
        }
    }

    pub fn none(n: usize, failure: StoreError) -> Self {
        Appended {
            records: (0..n).map(|_| None).collect(),
            failure: Some(failure),
        }
    }

    /// Every record, or the failure.
    pub fn into_result(self) -> Result<Vec<AuditRecord>, StoreError> {
        match self.failure {
            Some(e) => Err(e),
            None => Ok(self.records.into_iter().flatten().collect()),
        }
    }
}

/// What the store knows of revocations after a given epoch. Every revocation moves the
/// store's revocation epoch by one in its own transaction and is stamped with the new value
/// (a trigger does both, migration 0004), so an instance that holds every revocation up to
/// epoch K in memory knows that nothing was revoked since while the epoch is still K.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Revocations {
    /// The committed epoch: no revocation has a higher one.
    pub epoch: i64,
    /// Agents revoked with an epoch above the one asked about, with their reasons.
    pub revoked: Vec<(String, Option<String>)>,
}

/// Tuning that is the operator's to set.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    pub max_connections: u32,
    pub acquire_timeout: std::time::Duration,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            max_connections: 16,
            acquire_timeout: std::time::Duration::from_secs(3),
        }
    }
}

/// Connects to the database the URL names and applies its migrations.
pub async fn connect(url: &str, opts: &StoreOptions) -> Result<SharedStore, StoreError> {
    if url.starts_with("sqlite:") {
        Ok(Arc::new(SqliteStore::connect(url, opts).await?))
    } else if url.starts_with("postgres:") || url.starts_with("postgresql:") {
        Ok(Arc::new(PgStore::connect(url, opts).await?))
    } else {
        Err(StoreError::UnsupportedUrl)
    }
}

#[cfg(test)]
mod tests {
    use super::is_outage_code;

    /// Outages answer 503 (retry later); everything else is a fault (500).
    #[test]
    fn outage_codes_are_the_ones_worth_a_retry() {
        for code in ["57P01", "57P03", "08006", "53300", "53200", "5", "6"] {
            assert!(is_outage_code(code), "{code}");
        }
        for code in ["23505", "42P01", "22P02", "XX000", "1", "19"] {
            assert!(!is_outage_code(code), "{code}");
        }
    }
}

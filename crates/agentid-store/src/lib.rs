//! Persistence boundary: the `Store` trait, its records and errors, and the two backends
//! (SQLite, the embedded default; PostgreSQL, for production), chosen by the URL scheme.
#![forbid(unsafe_code)]

#[macro_use]
mod row;

mod agent_rows;
mod agents;
mod audit;
/// The batch and block encodings are the store's own; the benchmarks reach them.
#[doc(hidden)]
pub mod batch;
#[doc(hidden)]
pub mod block;
mod domains;
mod holdings;
mod identity_providers;
/// Migrations embedded in the binary; the tests build older schemas with them.
#[doc(hidden)]
pub mod migrate;
mod orgs;
mod places;
mod postgres;
mod revoke;
mod signing;
mod sql;
mod sqlite;
mod ssf;
mod tree;

// The store's queries (`queries/`), written once and compiled for each backend, as `DB`.
#[allow(clippy::duplicate_mod)]
mod for_postgres;
#[allow(clippy::duplicate_mod)]
mod for_sqlite;

use std::fmt;
use std::sync::Arc;

use futures_util::future::BoxFuture;

use agentid_core::domain::audit::AuditRecord;
use agentid_core::domain::Totals;

pub use agentid_core::keys::SigningKeyRecord;
pub use agentid_core::records::{
    AgentRecord, Attempt, Claimed, DomainClaim, Held, IdentityProviderRecord, KeyRecord, LogPage, LogQuery,
    Moved, NameMove, NewApiKey, OrgRecord, Revocation, RevokedSince, SsfEvent, StoredCheckpoint,
    StreamRecord,
};
pub use agents::{AgentStore, KeyBinding, NewBinding};
pub use audit::AuditStore;
pub use block::{AgentBlockRow, BlockSealer};
pub use domains::{DomainListSize, DomainRules, DomainStore, RELEASED_REASON, REPLACED_REASON};
pub use identity_providers::{IdentityProviderStore, IdpAdded, Standing};
pub use migrate::valid_role;
pub use orgs::{KeyListing, OrgStore, Seals, Unsealed};
pub use places::PlaceDraw;
use postgres::PgStore;
pub use signing::SigningKeyStore;
use sqlite::SqliteStore;
pub use ssf::{SsfStore, MAX_PENDING};
pub use tree::{Added, TreeStore};

pub(crate) type StoreFuture<'a, T> = BoxFuture<'a, Result<T, StoreError>>;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database cannot be reached (connection refused, pool timeout, I/O).
    #[error("store unavailable: {0}")]
    Unavailable(#[source] sqlx::Error),
    /// A write sent before the connection broke, whose outcome could not be found out in
    /// time: it may or may not have taken effect. An outage, as far as callers go.
    #[error("store outcome unknown: {0}")]
    OutcomeUnknown(String),
    /// Every connection of the pool is in use and none came free in time: too many callers
    /// at once, not an outage (nothing waits out an outage or retries for it).
    #[error("store busy: every database connection is in use")]
    Busy,
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
    /// A PostgreSQL URL parameter the driver does not know (it would be ignored, and its
    /// value logged): named, its value never shown.
    #[error(
        "the database URL has a parameter the service does not know: {0:?} (check its spelling; \
         a password goes in the user part or as password=…)"
    )]
    UnknownUrlParameter(String),
    /// A SQLite database that this command may not create.
    #[error("no database at {path}: {why}")]
    NoDatabase { path: String, why: String },
    /// Another `serve` holds this SQLite database.
    #[error(
        "{holder} is serving this database already (it holds {lock}): SQLite serves one instance. \
         Stop that one, give this one another database, or run a fleet on PostgreSQL"
    )]
    Locked { lock: String, holder: String },
    /// The database could not be reached at start: where, and why.
    #[error("cannot reach the database at {target}: {cause}")]
    Unreachable { target: String, cause: String },
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
/// connections, out of memory or disk) / a read-only transaction (a primary demoted by a
/// failover, or a standby a balancer still routes to) / a statement cancelled at its
/// timeout, or a lock not had in time (nothing of it was written), SQLite busy or locked:
/// retry later, not a fault.
fn is_outage_code(code: &str) -> bool {
    code.starts_with("57P")
        || code == "57014"
        || code == "55P03"
        || code.starts_with("08")
        || code.starts_with("53")
        || code == "25006"
        || code == "5"
        || code == "6"
}

impl StoreError {
    /// Whether a caller may try again shortly (503): an outage, or every connection busy.
    pub fn is_transient(&self) -> bool {
        self.is_unavailable() || matches!(self, StoreError::Busy)
    }

    /// An outage: the database cannot be reached, or a write's outcome is unknown.
    pub fn is_unavailable(&self) -> bool {
        matches!(
            self,
            StoreError::Unavailable(_) | StoreError::Unreachable { .. } | StoreError::OutcomeUnknown(_)
        )
    }
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

/// The persistence boundary, one trait per concern; each method is one short transaction
/// at most. `Store` is all of them, with what concerns the database as a whole.
pub trait Store:
    OrgStore
    + AgentStore
    + SigningKeyStore
    + AuditStore
    + TreeStore
    + SsfStore
    + DomainStore
    + IdentityProviderStore
    + Send
    + Sync
    + fmt::Debug
    + 'static
{
    fn backend(&self) -> &'static str;
    /// Connections of each of the store's pools.
    fn pool_stats(&self) -> Vec<PoolStats>;
    fn ping(&self) -> StoreFuture<'_, ()>;
    /// Closes the pool; pending work finishes first.
    fn close(&self) -> BoxFuture<'_, ()>;
    /// The rate-limit buckets the store keeps for every instance that uses it, when it is
    /// one a fleet shares (PostgreSQL); `None` for one that serves one instance (SQLite).
    fn shared_buckets(&self) -> Option<&dyn SharedBuckets>;
}

pub type SharedStore = Arc<dyn Store>;

/// A stored block of a ledger's records (one batch's), decoded, and what its row claims of
/// them, for `audit verify` to recompute.
#[derive(Debug)]
pub struct DecodedBlock {
    /// Its place (`first_seq`, `last_seq`), the hashes the row says its chain has at its ends
    /// (`prev_hash`, `last_hash`), and its seal.
    pub seal: BlockSeal,
    /// The records, or why they cannot be read.
    pub records: Result<Vec<AuditRecord>, StoreError>,
    /// The results the row says its records hold (`VerifyResult::bit`s).
    pub results: i32,
    /// The ledger's running totals the row says hold after it.
    pub totals: Totals,
}

row! {
    /// A block's place, the chain's hashes at its ends and its seal (`mac`: the key file's
    /// MAC of `domain::audit::block_seal_input`; none on blocks written before seals).
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct BlockSeal {
        first_seq: i64, last_seq: i64, prev_hash: Vec<u8>, last_hash: Vec<u8>, mac: Option<Vec<u8>>,
    }
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
    pub(crate) fn all(records: Vec<AuditRecord>) -> Self {
        Appended {
            records: records.into_iter().map(Some).collect(),
            failure: None,
        }
    }

    pub(crate) fn none(n: usize, failure: StoreError) -> Self {
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

/// What befalls a write (fault injection, `AuditStore::inject_write_fault`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteFault {
    /// The batch commits, and then its connection breaks before the answer arrives.
    LostAck,
    /// The connection breaks before the batch reaches the server.
    LostWrite,
    /// Not the audit writer's: the next registration or revocation commits, then its
    /// connection breaks before the answer arrives.
    LostCommitAck,
    /// The store call of the audit writer's next batch panics (any backend).
    Panic,
}

impl WriteFault {
    pub const ALL: [WriteFault; 4] = [
        WriteFault::LostAck,
        WriteFault::LostWrite,
        WriteFault::LostCommitAck,
        WriteFault::Panic,
    ];
}

/// Tuning that is the operator's to set.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    pub max_connections: u32,
    pub acquire_timeout: std::time::Duration,
    /// How long a write waits for the database to take writes again (a failover, a
    /// switchover) before it fails with [`StoreError::Unavailable`]: transactions of the API
    /// and batches of the audit writer try again until then. Zero: they fail at once.
    pub outage_wait: std::time::Duration,
    /// What opening a SQLite database that does not exist may create.
    pub create: Create,
    /// Hold the SQLite database for this process alone (`serve`): a second store opened so
    /// fails with [`StoreError::Locked`]. PostgreSQL ignores it.
    pub serve_lock: bool,
    /// The longest a statement runs on PostgreSQL (its `statement_timeout`), waits for a lock
    /// included, before the database cancels it: the call is then answered 503 and its
    /// connection serves again, where a lock held elsewhere would otherwise hold the request,
    /// and one connection more with each, for as long as it is held. Migrations run without
    /// it. Zero: none. SQLite ignores it (its own wait for a lock is bounded).
    pub statement_timeout: std::time::Duration,
}

/// What opening a SQLite database may create, so that a command run from the wrong folder,
/// or given a mistyped path, does not quietly work on a new, empty database.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Create {
    /// Nothing: the database must exist (every command but `serve` and `migrate`).
    Nothing,
    /// The file, in a folder that exists (`serve` and `migrate` given a path).
    File,
    /// The file and its folder (the default database, `./data/agentid.db`).
    FileAndFolder,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            max_connections: 16,
            acquire_timeout: std::time::Duration::from_secs(3),
            outage_wait: std::time::Duration::from_secs(8),
            create: Create::FileAndFolder,
            serve_lock: false,
            statement_timeout: std::time::Duration::from_secs(30),
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

/// Runs the migrations of the PostgreSQL database `url` names and gives `grant_to` what the
/// service needs (`agentid migrate`).
pub async fn migrate_postgres(url: &str, grant_to: Option<&str>) -> Result<(), StoreError> {
    PgStore::migrate(url, grant_to).await
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

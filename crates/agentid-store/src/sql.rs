//! What both backends share: [`SqlStore`], on any [`Backend`]. Each concern's SQL (both
//! SQLite and PostgreSQL accept it) and typed rows live in its own file (`orgs.rs`,
//! `agents.rs`, `signing.rs`, `audit.rs`, `tree.rs`), each implemented once for every
//! backend. A backend (`sqlite.rs`, `postgres.rs`) supplies only what differs, as the items
//! of [`Backend`]: connecting, appending an audit batch, locks, planner hints, its pools.
//!
//! The bounds of those generic impls name only what sqlx must do with column types
//! (`i64`, `String`, byte strings and their `Option`s); rows decode through them, so a new
//! row type adds no bound.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use futures_util::future::BoxFuture;

use crate::block::BlockSealer;
use sqlx::{Database, Pool};

use super::{PoolStats, SharedBuckets, StoreError, WriteFault};
use agentid_core::domain::audit::{AuditEntry, AuditRecord};
use agentid_core::domain::KeyMode;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

/// What a backend does its own way. Implemented by the database types themselves
/// (`sqlx::Sqlite`, `sqlx::Postgres`).
pub(crate) trait Backend: Database {
    /// As `Store::backend` names it.
    const BACKEND: &'static str;
    /// What the backend keeps beside its main pool.
    type Extra: Send + Sync + fmt::Debug + 'static;
    /// A transaction that no other such transaction runs beside, on any instance: the
    /// store's one-time work (recording the fleet's signing key, the first organization)
    /// takes it.
    const EXCLUSIVE: Exclusive;
    /// Inside the exclusive transaction's `begin`, binding org and mode: waits for any other
    /// instance checkpointing the same ledger (none needed where `begin` already serializes).
    const CHECKPOINT_LOCK: Option<&'static str>;
    /// The checkpoint rows a read takes: those that decode. One that does not (written into
    /// the database past its triggers) is no checkpoint the log key signed, and failed every
    /// read of its ledger's checkpoints.
    const READABLE_CHECKPOINT: &'static str;
    /// How a page of the log must be written for this backend's planner to use the indexes
    /// (see `log_blocks_sql`).
    const LOG_PLAN: LogPlan;
    /// Appended to the query that picks streams to deliver, so that instances delivering at
    /// once pass over each other's (PostgreSQL: `FOR UPDATE … SKIP LOCKED`).
    const SKIP_LOCKED: &'static str;
    /// Appended to a query of one table's rows to be updated, so that transactions taking
    /// batches of them at once take different ones.
    const SKIP_LOCKED_ROWS: &'static str;

    /// Appends a batch as one unit: every record, or nothing and the entries back.
    fn append(store: &SqlStore<Self>, entries: Vec<AuditEntry>, sealer: BlockSealer) -> Appending<'_>;
    /// The store's shared rate-limit buckets, if a fleet shares them.
    fn shared_buckets(store: &SqlStore<Self>) -> Option<&dyn SharedBuckets>;
    /// Whether its audit writes go over a connection that can break (the faults of losing
    /// one can be injected).
    #[allow(dead_code)] // read by the tests' fault injection alone
    const LOSES_CONNECTIONS: bool;
    /// Rows an `UPDATE` changed (sqlx has no trait for it).
    fn rows_affected(done: &Self::QueryResult) -> u64;
    /// Connections of each pool.
    fn pools(store: &SqlStore<Self>) -> Vec<PoolStats>;
    /// Closes every pool; pending work finishes first.
    fn close(store: &SqlStore<Self>) -> BoxFuture<'_, ()>;
}

/// How a log page's SQL is written for a backend's planner.
pub(crate) struct LogPlan {
    /// Name the failure's partial index (`INDEXED BY`): SQLite, without statistics, prefers
    /// the primary key to an equally long partial index.
    pub(crate) name_index: bool,
    /// Look each block of an agent's rows up through a fenced `LATERAL` (PostgreSQL, on tables
    /// not analyzed yet, joined with a scan of every block of the ledger per agent row).
    pub(crate) lateral_join: bool,
}

/// A batch the store did not take: why, and its entries as they were handed in.
pub(crate) type Refused = (StoreError, Vec<AuditEntry>);
/// A batch's append: its records as committed, or the error and the entries back.
pub(crate) type Appending<'a> = BoxFuture<'a, Result<Vec<AuditRecord>, Refused>>;

/// How a backend opens an exclusive transaction: `begin`, then `lock`, which waits for any
/// other exclusive transaction to end.
pub(crate) struct Exclusive {
    pub(crate) begin: &'static str,
    pub(crate) lock: &'static str,
}

/// A store on a SQL database: its main pool, and what its backend keeps beside it.
#[derive(Debug)]
pub(crate) struct SqlStore<DB: Backend> {
    pub(super) pool: Pool<DB>,
    /// The outage the store is in, if any, and how long calls wait it out.
    pub(super) outage: Outage,
    pub(super) extra: DB::Extra,
}

/// A database outage as the store sees it: since when it lasts, so that every wait for it ends
/// `wait` after it began ([`StoreOptions::outage_wait`](super::StoreOptions::outage_wait)). A
/// request that makes several calls thus waits about `wait` in all, not `wait` per call, and
/// once an outage is older than `wait`, calls try once and fail at once until one succeeds.
#[derive(Debug)]
pub(crate) struct Outage {
    wait: Duration,
    since: parking_lot::Mutex<Option<Instant>>,
    /// What the tests made befall the next writes.
    pub(crate) faults: Faults,
}

/// Faults the tests inject, each into the next write of its kind, once. Only
/// `AuditStore::inject_write_fault` sets one, and it exists with the `test-hooks` feature
/// alone: otherwise every check here finds none.
#[derive(Debug, Default)]
pub(crate) struct Faults {
    /// The next audit batch's write: a [`WriteFault`]'s place in [`WriteFault::ALL`] plus
    /// one, 0 for none.
    batch: AtomicU8,
    /// The next [`Outage::commit`] commits, then reports a broken connection.
    commit_ack: AtomicBool,
}

impl Faults {
    #[allow(dead_code)] // called by the tests' fault injection alone
    pub(crate) fn set(&self, fault: WriteFault) {
        match fault {
            WriteFault::LostCommitAck => self.commit_ack.store(true, Ordering::SeqCst),
            f => {
                let at = WriteFault::ALL.iter().position(|a| *a == f).unwrap_or(0);
                self.batch.store(at as u8 + 1, Ordering::SeqCst);
            }
        }
    }

    /// The fault of the next audit batch, if one was set (it is then cleared).
    pub(crate) fn take_batch(&self) -> Option<WriteFault> {
        match self.batch.swap(0, Ordering::SeqCst) {
            0 => None,
            n => WriteFault::ALL.get(n as usize - 1).copied(),
        }
    }

    /// Whether the next audit batch's store call is to panic (it is then cleared).
    pub(crate) fn take_panic(&self) -> bool {
        let panic = WriteFault::ALL.len() as u8; // `Panic` is the last
        self.batch
            .compare_exchange(panic, 0, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    }

    fn take_commit_ack(&self) -> bool {
        self.commit_ack.swap(false, Ordering::SeqCst)
    }
}

impl Outage {
    pub(crate) fn new(wait: Duration) -> Self {
        Outage {
            wait,
            since: parking_lot::Mutex::new(None),
            faults: Faults::default(),
        }
    }

    /// [`commit`], where a test may lose the answer.
    pub(crate) async fn commit<DB: Database>(&self, tx: sqlx::Transaction<'_, DB>) -> Result<(), StoreError> {
        commit(tx).await?;
        if self.faults.take_commit_ack() {
            return Err(StoreError::OutcomeUnknown(
                "injected: the COMMIT's answer was lost".into(),
            ));
        }
        Ok(())
    }

    /// When a wait that starts now ends.
    pub(crate) fn deadline(&self) -> Instant {
        let by_now = Instant::now() + self.wait;
        match *self.since.lock() {
            Some(began) => by_now.min(began + self.wait),
            None => by_now,
        }
    }

    /// A call failed for an outage.
    pub(crate) fn seen(&self) {
        self.since.lock().get_or_insert_with(Instant::now);
    }

    /// A call succeeded: no outage (any more).
    pub(crate) fn over(&self) {
        let mut since = self.since.lock();
        if since.is_some() {
            *since = None;
        }
    }

    /// Runs `attempt` again, after a pause, while it fails with an outage
    /// ([`StoreError::is_unavailable`]), until the wait ends; later attempts are cut off then.
    /// Only for attempts that leave nothing written when they fail. An attempt cut off at the
    /// deadline may have been anywhere, its COMMIT in flight included: that is
    /// [`StoreError::OutcomeUnknown`] (which callers find out, as a broken COMMIT), never the
    /// earlier error, which would say that nothing was written.
    pub(crate) async fn ride_out<T, F, Fut>(&self, mut attempt: F) -> Result<T, StoreError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, StoreError>>,
    {
        let deadline = self.deadline();
        let mut pause = FIRST_PAUSE;
        let mut result = attempt().await;
        loop {
            match result {
                Ok(t) => {
                    self.over();
                    return Ok(t);
                }
                // An outcome unknown is never tried again: it may have taken effect.
                Err(e) if e.is_unavailable() && !matches!(e, StoreError::OutcomeUnknown(_)) => {
                    self.seen();
                    if Instant::now() + pause >= deadline {
                        return Err(e);
                    }
                    metrics::counter!("agentid_store_outage_retries_total").increment(1);
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(MAX_PAUSE);
                    result = match tokio::time::timeout_at(deadline, attempt()).await {
                        Ok(r) => r,
                        Err(_) => {
                            return Err(StoreError::OutcomeUnknown(format!(
                                "an attempt cut off at the end of the outage's wait (after: {e})"
                            )))
                        }
                    };
                }
                Err(e) => return Err(e),
            }
        }
    }
}

/// Whether a write that failed with `e` may have committed all the same: the connection
/// broke, or its server ended the session (a shutdown, a crash), after the statement was
/// sent. An error the server answered for the statement itself (a conflict, a read-only
/// node) means that it did not.
pub(crate) fn may_have_committed(e: &StoreError) -> bool {
    let (StoreError::Unavailable(e) | StoreError::Database(e)) = e else {
        return false;
    };
    match e {
        sqlx::Error::Io(_) | sqlx::Error::Protocol(_) | sqlx::Error::Tls(_) | sqlx::Error::WorkerCrashed => {
            true
        }
        sqlx::Error::Database(db) => db
            .code()
            .is_some_and(|c| c.starts_with("57P") || c.starts_with("08")),
        _ => false,
    }
}

/// Commits `tx`. A COMMIT whose connection broke may have committed: that is
/// [`StoreError::OutcomeUnknown`], which no one tries again.
pub(crate) async fn commit<DB: Database>(tx: sqlx::Transaction<'_, DB>) -> Result<(), StoreError> {
    tx.commit().await.map_err(|e| {
        let e = StoreError::from(e);
        if may_have_committed(&e) {
            StoreError::OutcomeUnknown(e.to_string())
        } else {
            e
        }
    })
}

/// The pauses between attempts during an outage: doubling from the first to the most.
pub(crate) const FIRST_PAUSE: Duration = Duration::from_millis(50);
pub(crate) const MAX_PAUSE: Duration = Duration::from_millis(400);

pub(crate) fn hash32(v: Vec<u8>) -> Result<[u8; 32], StoreError> {
    v.try_into()
        .map_err(|_| StoreError::Corrupt("audit hash length".into()))
}

pub(crate) fn parse_mode(s: &str) -> Result<KeyMode, StoreError> {
    KeyMode::parse(s).ok_or_else(|| StoreError::Corrupt(format!("mode {s}")))
}

/// A stored value decoded once, at the store's edge: a column that does not read as what the
/// service writes there is `Corrupt`.
pub(crate) fn decode<T>(what: &str, s: &str, read: impl FnOnce(&str) -> Option<T>) -> Result<T, StoreError> {
    read(s).ok_or_else(|| StoreError::Corrupt(format!("{what} {s:?}")))
}

pub(crate) fn seq_i64(n: u64) -> Result<i64, StoreError> {
    i64::try_from(n).map_err(|_| StoreError::Corrupt(format!("sequence number {n} out of range")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A retry still running when the outage's wait ends (its COMMIT may be in flight) is an
    /// outcome unknown, not the first attempt's error, which says that nothing was written:
    /// a registration answered so could be stored, and the client's retry make a second one.
    #[tokio::test]
    async fn an_attempt_cut_at_the_deadline_is_an_outcome_unknown() {
        let outage = Outage::new(Duration::from_millis(300));
        let tries = std::sync::atomic::AtomicU32::new(0);
        let result: Result<(), StoreError> = outage
            .ride_out(|| async {
                if tries.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 {
                    return Err(StoreError::Unavailable(sqlx::Error::PoolTimedOut));
                }
                // The retry's COMMIT, sent and not yet answered when the wait ends.
                tokio::time::sleep(Duration::from_secs(5)).await;
                Ok(())
            })
            .await;
        assert!(matches!(result, Err(StoreError::OutcomeUnknown(_))), "{result:?}");
        assert_eq!(tries.into_inner(), 2);
    }

    /// Every connection in use (callers waiting on one another) is not an outage: the call
    /// fails once the pool's own timeout passes, as busy, without waiting out an outage or
    /// starting one (which would cut every later call's wait short).
    #[tokio::test]
    async fn a_pool_with_every_connection_in_use_is_busy_not_an_outage() {
        let pool = sqlx::sqlite::SqlitePoolOptions::new()
            .max_connections(1)
            .acquire_timeout(Duration::from_millis(100))
            .connect("sqlite::memory:")
            .await
            .unwrap();
        let store = SqlStore::<sqlx::Sqlite> {
            pool,
            outage: Outage::new(Duration::from_secs(5)),
            extra: None,
        };
        let held = store.pool.acquire().await.unwrap();
        let started = Instant::now();
        let result = store.begin().await.map(drop);
        assert!(matches!(result, Err(StoreError::Busy)), "{result:?}");
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
        assert!(store.outage.since.lock().is_none(), "an outage began");
        drop(held);
        assert!(store.conn().await.is_ok());
    }
}

//! PostgreSQL backend, for production and several instances. A batch of audit records is
//! appended as blocks by one statement (one round trip) built on `UNNEST` arrays; chain heads
//! are cached and the primary key `(org_id, mode, first_seq)` stops two instances from forking
//! a chain.

use std::str::FromStr;

use futures_util::future::BoxFuture;
use parking_lot::Mutex;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{PgConnection, PgPool, Postgres};

use super::block;
use super::sql::{Backend, Exclusive, LogPlan, Refused, SqlStore};
use super::{audit, batch, migrate, PoolStats, SharedBuckets, StoreError, StoreOptions};
use agentid_core::domain::audit::{AuditEntry, AuditRecord};
use agentid_core::domain::Ledger;

mod append;
mod buckets;

use append::{seal_and_write, Sealed, WriterCache, LOCK_LEDGERS};

pub(crate) type PgStore = SqlStore<Postgres>;

/// The audit writer's side of the store.
#[derive(Debug)]
pub(crate) struct Writer {
    /// Its connections (generic plans, see `connect`), opened on the writer's thread at its
    /// first batch.
    pool: PgPool,
    /// The head of each ledger as this instance last wrote it (only the writer touches it).
    cache: Mutex<WriterCache>,
}

/// Opens one connection first, so that a database that cannot be reached is named, with why,
/// rather than reported as a pool that timed out.
async fn reachable(connect: &PgConnectOptions, within: std::time::Duration) -> Result<(), StoreError> {
    use sqlx::{ConnectOptions, Connection};
    let target = format!(
        "{}:{}/{}",
        connect.get_host(),
        connect.get_port(),
        connect.get_database().unwrap_or("(default)")
    );
    let cause = match tokio::time::timeout(within, connect.connect()).await {
        Ok(Ok(conn)) => {
            let _ = conn.close().await;
            return Ok(());
        }
        Err(_) => format!("no answer within {} s (timed out)", within.as_secs_f32()),
        Ok(Err(sqlx::Error::Io(e))) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
            "connection refused (is PostgreSQL running there, and listening on that port?)".to_owned()
        }
        Ok(Err(sqlx::Error::Database(e))) => match e.code().as_deref() {
            Some("28P01") | Some("28000") => format!(
                "authentication failed for user {:?} ({})",
                connect.get_username(),
                e.message()
            ),
            Some("3D000") => format!("no such database ({})", e.message()),
            _ => e.message().to_owned(),
        },
        Ok(Err(e)) => e.to_string(),
    };
    Err(StoreError::Unreachable { target, cause })
}

impl SqlStore<Postgres> {
    pub async fn connect(url: &str, opts: &StoreOptions) -> Result<Self, StoreError> {
        let connect = PgConnectOptions::from_str(url)?.application_name("agentid");
        reachable(&connect, opts.acquire_timeout).await?;
        // API calls and reads ping a connection before using it (the default), so a
        // connection broken by an outage is replaced instead of failing the next call.
        let pool = PgPoolOptions::new()
            .max_connections(opts.max_connections.max(2))
            .acquire_timeout(opts.acquire_timeout)
            .connect_with(connect.clone())
            .await?;
        if migrate::pending_pg(&pool).await? {
            migrate::migrator(migrate::POSTGRES)
                .await?
                .run(&pool)
                .await
                .map_err(not_owner)?;
        }
        // The audit writer's own connections, with generic plans: its statement is planned
        // once per connection instead of at every batch. PostgreSQL kept choosing a custom
        // plan for it (UNNEST arrays), and planning was ~40 % of its CPU per batch (perf).
        // Only here: a generic plan is made with the statistics of its
        // first execution, and on tables never analyzed yet the log pages' join chose a plan
        // that walked every block per match (an agent page 25-80 ms on 180k records); the
        // writer's statement is written so that every plan looks rows up by primary key.
        let writer = PgPoolOptions::new()
            .max_connections(2)
            // No ping before each batch (a round trip per batch): a broken connection fails
            // its batch, which the writer retries.
            .test_before_acquire(false)
            .acquire_timeout(opts.acquire_timeout)
            // Lazy: connections open at the writer's first batch, on the writer's thread.
            .connect_lazy_with(connect.options([("plan_cache_mode", "force_generic_plan")]));
        let store = SqlStore {
            pool,
            extra: Writer {
                pool: writer,
                cache: Mutex::default(),
            },
        };
        Ok(store)
    }

    /// Runs the migrations and gives `role` what the service needs (`agentid migrate`).
    pub async fn migrate(url: &str, grant_to: Option<&str>) -> Result<(), StoreError> {
        let store = PgStore::connect(url, &StoreOptions::default()).await?;
        if let Some(role) = grant_to {
            for sql in migrate::grants_pg(role) {
                sqlx::query(&sql).execute(&store.pool).await?;
            }
        }
        store.pool.close().await;
        Ok(())
    }

    /// Appends a batch. First as this instance last left its ledgers (the cached heads): one
    /// statement, which takes the ledgers' locks itself and fails with a conflict when
    /// another instance has appended to one of them since. Then, after a conflict, in a
    /// transaction that takes the locks first and reads the heads under them: no other
    /// writer can move them before it commits, so it waits for the chain instead of failing.
    async fn append(&self, entries: Vec<AuditEntry>) -> Result<Vec<AuditRecord>, Refused> {
        let ledgers = batch::ledgers(&entries);
        let heads = match self.heads_for(&ledgers).await {
            Ok(heads) => heads,
            Err(e) => return Err((e, entries)),
        };
        let mut conn = match self.extra.pool.acquire().await {
            Ok(conn) => conn,
            Err(e) => return Err((e.into(), entries)),
        };
        let entries = match seal_and_write(&mut conn, entries, heads, &self.extra.cache).await {
            Ok(Sealed { records, learned }) => {
                self.extra.cache.lock().wrote(learned);
                return Ok(records);
            }
            Err((StoreError::Conflict(_), entries)) => {
                metrics::counter!("agentid_audit_chain_conflicts_total").increment(1);
                entries
            }
            Err(refused) => {
                self.extra.cache.lock().forget(&ledgers);
                return Err(refused);
            }
        };
        self.extra.cache.lock().forget(&ledgers);
        self.append_locked(&mut conn, entries, ledgers).await
    }

    /// `append` under the ledgers' locks, taken first and held to the commit.
    async fn append_locked(
        &self,
        conn: &mut PgConnection,
        entries: Vec<AuditEntry>,
        ledgers: Vec<Ledger>,
    ) -> Result<Vec<AuditRecord>, Refused> {
        let seen_by_entry: Vec<i64> = entries.iter().map(|e| e.revocations_seen).collect();
        let (mut tx, heads) = match self.lock_heads(conn, ledgers).await {
            Ok(locked) => locked,
            Err(e) => return Err((e, entries)),
        };
        let Sealed { records, learned } = seal_and_write(&mut tx, entries, heads, &self.extra.cache).await?;
        if let Err(e) = tx.commit().await {
            return Err((e.into(), batch::unseal(records, &seen_by_entry)));
        }
        self.extra.cache.lock().wrote(learned);
        Ok(records)
    }

    /// Opens a transaction on `conn`, takes the ledgers' locks and reads their heads.
    async fn lock_heads<'c>(
        &self,
        conn: &'c mut PgConnection,
        ledgers: Vec<Ledger>,
    ) -> Result<(sqlx::Transaction<'c, Postgres>, block::Heads), StoreError> {
        let mut tx = sqlx::Connection::begin(conn).await?;
        let waiting = std::time::Instant::now();
        let (orgs, modes): (Vec<&str>, Vec<&str>) = ledgers
            .iter()
            .map(|l| (l.org_id.as_str(), l.mode.as_str()))
            .unzip();
        sqlx::query(LOCK_LEDGERS)
            .bind(orgs)
            .bind(modes)
            .execute(&mut *tx)
            .await?;
        metrics::histogram!("agentid_audit_chain_lock_wait_seconds").record(waiting.elapsed().as_secs_f64());
        let mut heads = block::Heads::new();
        for ledger in ledgers {
            let head = sqlx::query_as(audit::LEDGER_HEAD_SQL)
                .bind(&ledger.org_id)
                .bind(ledger.mode.as_str())
                .fetch_optional(&mut *tx)
                .await?;
            heads.insert(ledger, audit::ledger_head(head)?);
        }
        Ok((tx, heads))
    }

    /// Where each ledger's next record goes: from the cache, else the store.
    async fn heads_for(&self, ledgers: &[Ledger]) -> Result<block::Heads, StoreError> {
        let mut heads = block::Heads::new();
        let missing: Vec<Ledger> = {
            let cache = self.extra.cache.lock();
            ledgers
                .iter()
                .filter(|l| match cache.heads.get(*l) {
                    Some(h) => {
                        heads.insert((*l).clone(), *h);
                        false
                    }
                    None => true,
                })
                .cloned()
                .collect()
        };
        for ledger in missing {
            let head = sqlx::query_as(audit::LEDGER_HEAD_SQL)
                .bind(&ledger.org_id)
                .bind(ledger.mode.as_str())
                .fetch_optional(&self.extra.pool)
                .await?;
            heads.insert(ledger, audit::ledger_head(head)?);
        }
        Ok(heads)
    }
}

impl Backend for Postgres {
    const BACKEND: &'static str = "postgres";
    type Extra = Writer;
    const EXCLUSIVE: Exclusive = Exclusive {
        begin: "BEGIN",
        lock: "SELECT pg_advisory_xact_lock(7431003)",
    };
    // Not the ledger's append lock: checkpointing never holds up an append.
    const CHECKPOINT_LOCK: Option<&'static str> =
        Some("SELECT pg_advisory_xact_lock(hashtextextended($1 || '/' || $2 || '/checkpoint', 7431004))");
    const LOG_PLAN: LogPlan = LogPlan {
        name_index: false,
        lateral_join: true,
    };
    const SKIP_LOCKED: &'static str = " FOR UPDATE OF s SKIP LOCKED";

    fn append(store: &PgStore, entries: Vec<AuditEntry>) -> BoxFuture<'_, Result<Vec<AuditRecord>, Refused>> {
        Box::pin(store.append(entries))
    }

    fn shared_buckets(store: &PgStore) -> Option<&dyn SharedBuckets> {
        Some(store)
    }

    fn rows_affected(done: &sqlx::postgres::PgQueryResult) -> u64 {
        done.rows_affected()
    }

    fn pools(store: &PgStore) -> Vec<PoolStats> {
        vec![
            PoolStats::of("main", &store.pool),
            PoolStats::of("writer", &store.extra.pool),
        ]
    }

    fn close(store: &PgStore) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            store.extra.pool.close().await;
            store.pool.close().await;
        })
    }
}

/// A migration refused for want of privileges says what to do about it.
fn not_owner(e: sqlx::migrate::MigrateError) -> StoreError {
    let denied = match &e {
        sqlx::migrate::MigrateError::Execute(sqlx::Error::Database(db))
        | sqlx::migrate::MigrateError::ExecuteMigration(sqlx::Error::Database(db), _) => {
            db.code().as_deref() == Some("42501")
        }
        _ => false,
    };
    if denied {
        StoreError::NotOwner(e.to_string())
    } else {
        StoreError::Migrate(e)
    }
}

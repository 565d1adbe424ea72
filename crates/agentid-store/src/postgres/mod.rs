//! PostgreSQL backend, for production and several instances. A batch of audit records is
//! appended as blocks by one statement (one round trip) built on `UNNEST` arrays; chain heads
//! are cached and the primary key `(org_id, mode, first_seq)` stops two instances from forking
//! a chain.

use std::str::FromStr;

use futures_util::future::BoxFuture;
use parking_lot::Mutex;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{PgConnection, PgPool, Postgres};

use super::block::{self, BlockSealer};
use super::sql::{self, Appending, Backend, Exclusive, LogPlan, Refused, SqlStore};
use super::{batch, migrate, PoolStats, SharedBuckets, StoreError, StoreOptions};
use agentid_core::domain::audit::{AuditEntry, AuditRecord};
use agentid_core::domain::Ledger;

mod append;
mod buckets;

use super::for_postgres::queries::audit::ledger_heads;
use super::sql::may_have_committed;
use append::{look_up, seal_and_write, Found, Sealed, Sent, Unsealed, WriterCache, LOCK_LEDGERS};

/// How an attempt at a batch failed.
enum Attempt {
    /// Nothing written: why, and the entries.
    Failed(Refused),
    /// Sent, with an unknown outcome: the batch and the heads it was sealed after.
    Unknown(Unsealed, block::Heads),
    /// What was sent with an unknown outcome never committed (another block holds its keys).
    Superseded(Vec<AuditEntry>),
}

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

/// The query parameters the PostgreSQL driver reads. It logs any other one, value and all,
/// and goes on without it: a misspelt or unsupported password parameter (`sslpassword`,
/// `Password`) would print the password.
const URL_PARAMETERS: &[&str] = &[
    "sslmode",
    "ssl-mode",
    "sslrootcert",
    "ssl-root-cert",
    "ssl-ca",
    "sslcert",
    "ssl-cert",
    "sslkey",
    "ssl-key",
    "statement-cache-capacity",
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "password",
    "application_name",
    "options",
];

/// Refuses a URL with a parameter outside [`URL_PARAMETERS`] (or `options[…]`), by name.
fn known_parameters(url: &str) -> Result<(), StoreError> {
    let Some((_, query)) = url.split_once('?') else {
        return Ok(());
    };
    let query = query.split_once('#').map_or(query, |(q, _)| q);
    for (key, _) in form_urlencoded::parse(query.as_bytes()) {
        let known = URL_PARAMETERS.contains(&&*key) || (key.starts_with("options[") && key.ends_with(']'));
        if !known {
            return Err(StoreError::UnknownUrlParameter(key.into_owned()));
        }
    }
    Ok(())
}

/// The service's connection options with its statement timeout (`StoreOptions`), given after
/// the URL's own `options`, so that it is the one in force.
fn bounded(connect: PgConnectOptions, timeout: std::time::Duration) -> PgConnectOptions {
    if timeout.is_zero() {
        return connect;
    }
    connect.options([("statement_timeout", format!("{}ms", timeout.as_millis()))])
}

impl SqlStore<Postgres> {
    pub async fn connect(url: &str, opts: &StoreOptions) -> Result<Self, StoreError> {
        known_parameters(url)?;
        let unbounded = PgConnectOptions::from_str(url)?.application_name("agentid");
        reachable(&unbounded, opts.acquire_timeout).await?;
        let connect = bounded(unbounded.clone(), opts.statement_timeout);
        // API calls and reads ping a connection before using it (the default), so a
        // connection broken by an outage is replaced instead of failing the next call.
        let pool = PgPoolOptions::new()
            .max_connections(opts.max_connections.max(2))
            .acquire_timeout(opts.acquire_timeout)
            .connect_with(connect.clone())
            .await?;
        if migrate::pending_pg(&pool).await? {
            // On a connection of their own, without the statement timeout: a migration may
            // rewrite a large table.
            use sqlx::{ConnectOptions, Connection};
            let mut conn = tokio::time::timeout(opts.acquire_timeout, unbounded.connect())
                .await
                .map_err(|_| StoreError::Unavailable(sqlx::Error::PoolTimedOut))??;
            migrate::migrator(migrate::POSTGRES)
                .await?
                .run(&mut conn)
                .await
                .map_err(not_owner)?;
            conn.close().await?;
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
            outage: sql::Outage::new(opts.outage_wait),
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

    /// Appends a batch, riding out an outage (a failover, a switchover) until the store's
    /// wait for it ends (`Outage`): a batch that was not written is tried again, after a
    /// pause, until then.
    /// A batch whose outcome is unknown (the connection broke after it was sent, during its
    /// statement or its COMMIT) is found out, never simply written again: the writer looks
    /// its first blocks up (`look_up`). Stored with its hashes, it committed, and is answered
    /// as written. Another block at those keys means it never will, and the entries are
    /// appended anew. Nothing there yet: they are written again at the same keys, which the
    /// primary key lets only one of the two writes hold. An outcome still unknown when the
    /// wait ends fails the batch.
    async fn append(
        &self,
        mut entries: Vec<AuditEntry>,
        sealer: BlockSealer,
    ) -> Result<Vec<AuditRecord>, Refused> {
        let ledgers = batch::ledgers(&entries);
        let deadline = self.outage.deadline();
        let mut pause = sql::FIRST_PAUSE;
        // Batches sent with an unknown outcome, all after `pinned`.
        let mut sent: Vec<Sent> = Vec::new();
        let mut pinned: Option<block::Heads> = None;
        loop {
            let attempt = match &pinned {
                None => self.append_once(entries, &ledgers, &sealer).await,
                Some(heads) => self.settle(entries, heads, &mut sent, &sealer).await,
            };
            let (error, back) = match attempt {
                Ok(records) => {
                    self.outage.over();
                    return Ok(records);
                }
                Err(Attempt::Failed(refused)) => refused,
                Err(Attempt::Unknown(u, heads)) => {
                    tracing::warn!(error = %u.error, "audit batch of unknown outcome; finding out");
                    metrics::counter!("agentid_audit_unknown_outcomes_total").increment(1);
                    sent.extend(u.sent);
                    pinned = Some(heads);
                    (u.error, u.entries)
                }
                Err(Attempt::Superseded(back)) => {
                    sent.clear();
                    pinned = None;
                    entries = back;
                    continue;
                }
            };
            self.extra.cache.lock().forget(&ledgers);
            if error.is_unavailable() {
                self.outage.seen();
            }
            let now = tokio::time::Instant::now();
            if !sent.is_empty() && now + pause >= deadline {
                // Never handed back as a plain failure: the caller must not write it again.
                return Err((StoreError::OutcomeUnknown(error.to_string()), back));
            }
            if sent.is_empty() && (!error.is_unavailable() || now + pause >= deadline) {
                return Err((error, back));
            }
            entries = back;
            metrics::counter!("agentid_store_outage_retries_total").increment(1);
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(sql::MAX_PAUSE);
        }
    }

    /// One attempt. First as this instance last left its ledgers (the cached heads): one
    /// statement, which takes the ledgers' locks itself and fails with a conflict when
    /// another instance has appended to one of them since. Then, after a conflict, in a
    /// transaction that takes the locks first and reads the heads under them: no other
    /// writer can move them before it commits, so it waits for the chain instead of failing.
    async fn append_once(
        &self,
        entries: Vec<AuditEntry>,
        ledgers: &[Ledger],
        sealer: &BlockSealer,
    ) -> Result<Vec<AuditRecord>, Attempt> {
        let heads = match self.heads_for(ledgers).await {
            Ok(heads) => heads,
            Err(e) => return Err(Attempt::Failed((e, entries))),
        };
        let mut conn = match self.extra.pool.acquire().await {
            Ok(conn) => conn,
            Err(e) => return Err(Attempt::Failed((e.into(), entries))),
        };
        // Faults injected by the tests (none, otherwise).
        let fault = self.outage.faults.take_batch();
        if fault == Some(crate::WriteFault::LostWrite) {
            return Err(Attempt::Unknown(append::unsent(entries, &heads, sealer), heads));
        }
        let seen: Vec<i64> = entries.iter().map(|e| e.revocations_seen).collect();
        let written = seal_and_write(&mut conn, entries, heads.clone(), &self.extra.cache, sealer).await;
        let written = match written {
            Ok(sealed) if fault == Some(crate::WriteFault::LostAck) => Err(Unsealed {
                error: append::lost_connection(),
                sent: Some(sealed.sent()),
                entries: batch::unseal(sealed.records, &seen),
            }),
            other => other,
        };
        let entries = match written {
            Ok(Sealed { records, learned }) => {
                self.extra.cache.lock().wrote(learned);
                return Ok(records);
            }
            Err(u) if u.sent.is_some() => return Err(Attempt::Unknown(u, heads)),
            Err(Unsealed {
                error: StoreError::Conflict(_),
                entries,
                ..
            }) => {
                metrics::counter!("agentid_audit_chain_conflicts_total").increment(1);
                entries
            }
            Err(u) => return Err(Attempt::Failed(u.into())),
        };
        self.extra.cache.lock().forget(ledgers);
        self.append_locked(&mut conn, entries, ledgers.to_vec(), sealer)
            .await
    }

    /// `append` under the ledgers' locks, taken first and held to the commit. An error before
    /// the COMMIT leaves nothing written (the transaction ends with it); one during the
    /// COMMIT leaves the outcome unknown.
    async fn append_locked(
        &self,
        conn: &mut PgConnection,
        entries: Vec<AuditEntry>,
        ledgers: Vec<Ledger>,
        sealer: &BlockSealer,
    ) -> Result<Vec<AuditRecord>, Attempt> {
        let seen_by_entry: Vec<i64> = entries.iter().map(|e| e.revocations_seen).collect();
        let (mut tx, heads) = match self.lock_heads(conn, ledgers).await {
            Ok(locked) => locked,
            Err(e) => return Err(Attempt::Failed((e, entries))),
        };
        let sealed = seal_and_write(&mut tx, entries, heads.clone(), &self.extra.cache, sealer)
            .await
            .map_err(|u| Attempt::Failed(u.into()))?;
        if let Err(e) = tx.commit().await {
            let error = StoreError::from(e);
            let sent = may_have_committed(&error).then(|| sealed.sent());
            let u = Unsealed {
                error,
                entries: batch::unseal(sealed.records, &seen_by_entry),
                sent,
            };
            return Err(match u.sent {
                Some(_) => Attempt::Unknown(u, heads),
                None => Attempt::Failed(u.into()),
            });
        }
        self.extra.cache.lock().wrote(sealed.learned);
        Ok(sealed.records)
    }

    /// Finds out what became of the batches in `sent` (all after `heads`), writing the
    /// entries again at the same keys while nothing is there.
    async fn settle(
        &self,
        mut entries: Vec<AuditEntry>,
        heads: &block::Heads,
        sent: &mut Vec<Sent>,
        sealer: &BlockSealer,
    ) -> Result<Vec<AuditRecord>, Attempt> {
        let mut conn = match self.extra.pool.acquire().await {
            Ok(conn) => conn,
            Err(e) => return Err(Attempt::Failed((e.into(), entries))),
        };
        // A conflict means a block is there now: look again (twice at most).
        for _ in 0..2 {
            match look_up(&mut conn, sent).await {
                Err(e) => return Err(Attempt::Failed((e, entries))),
                Ok(Found::Committed(i)) => {
                    tracing::info!("audit batch of unknown outcome had committed");
                    return Ok(sent.swap_remove(i).records);
                }
                Ok(Found::Superseded) => return Err(Attempt::Superseded(entries)),
                Ok(Found::Nothing) => {}
            }
            match seal_and_write(&mut conn, entries, heads.clone(), &self.extra.cache, sealer).await {
                Ok(Sealed { records, learned }) => {
                    self.extra.cache.lock().wrote(learned);
                    return Ok(records);
                }
                Err(Unsealed {
                    error: StoreError::Conflict(_),
                    entries: back,
                    ..
                }) => entries = back,
                Err(u) if u.sent.is_some() => return Err(Attempt::Unknown(u, heads.clone())),
                Err(u) => return Err(Attempt::Failed(u.into())),
            }
        }
        Err(Attempt::Failed((
            StoreError::Corrupt("audit blocks conflict at keys that hold none".into()),
            entries,
        )))
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
        let heads = ledger_heads(&mut tx, ledgers).await?;
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
        if !missing.is_empty() {
            let mut conn = self.extra.pool.acquire().await?;
            heads.extend(ledger_heads(&mut conn, missing).await?);
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
    const READABLE_CHECKPOINT: &'static str = "tree_size >= 0 AND length(root) = 32";
    const LOG_PLAN: LogPlan = LogPlan {
        name_index: false,
        lateral_join: true,
    };
    const SKIP_LOCKED: &'static str = " FOR UPDATE OF s SKIP LOCKED";
    const SKIP_LOCKED_ROWS: &'static str = " FOR UPDATE SKIP LOCKED";
    const LOSES_CONNECTIONS: bool = true;

    fn append(store: &PgStore, entries: Vec<AuditEntry>, sealer: BlockSealer) -> Appending<'_> {
        Box::pin(store.append(entries, sealer))
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

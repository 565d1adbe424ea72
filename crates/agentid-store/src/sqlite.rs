//! SQLite backend: the embedded default. WAL journal, `synchronous = FULL` (an answered
//! verification survives a power cut, not only a crash), one writer at a time.

use std::collections::HashMap;
use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use futures_util::future::BoxFuture;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Sqlite, SqliteConnection};

use super::block::{self, Block, BlockSealer};
use super::for_sqlite::queries::audit::ledger_heads;
use super::sql::{self, Appending, Backend, Exclusive, LogPlan, Refused, SqlStore};
use super::{batch, migrate, Create, PoolStats, SharedBuckets, StoreError, StoreOptions};
use agentid_core::domain::audit::{AuditEntry, AuditRecord};

/// SQLite allows 32766 bound parameters; stay far below it.
const IN_CHUNK: usize = 500;

pub(crate) type SqliteStore = SqlStore<Sqlite>;

impl SqlStore<Sqlite> {
    pub async fn connect(url: &str, opts: &StoreOptions) -> Result<Self, StoreError> {
        let connect = SqliteConnectOptions::from_str(url)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(Duration::from_secs(5))
            .foreign_keys(true);
        let file = connect.get_filename();
        let io = |e| StoreError::Unavailable(sqlx::Error::Io(e));
        if file != Path::new(":memory:") && !file.exists() {
            let missing = |why: String| StoreError::NoDatabase {
                path: file.display().to_string(),
                why,
            };
            let dir = file.parent().filter(|d| !d.as_os_str().is_empty());
            match opts.create {
                Create::Nothing => {
                    return Err(missing(format!(
                        "the file does not exist (from {url}). Point DATABASE_URL or --database-url at the \
                         service's database, or create this one with `agentid migrate` or `agentid serve`"
                    )))
                }
                Create::File => {
                    if let Some(dir) = dir.filter(|d| !d.exists()) {
                        return Err(missing(format!(
                            "its folder {} does not exist; create it, or give another path",
                            dir.display()
                        )));
                    }
                }
                Create::FileAndFolder => {
                    if let Some(dir) = dir.filter(|d| !d.exists()) {
                        std::fs::create_dir_all(dir).map_err(io)?;
                    }
                }
            }
        }
        // One server a database: taken before anything is written, so that a second `serve`
        // creates nothing (say, a default organization whose keys no one would see).
        let lock = if opts.serve_lock && file != Path::new(":memory:") {
            Some(ServeLock::take(file)?)
        } else {
            None
        };
        // A new database is created readable by its owner only; SQLite gives its WAL and
        // shared-memory files the database file's permissions.
        if file != Path::new(":memory:") && !file.exists() {
            let mut new = std::fs::OpenOptions::new();
            new.write(true).create_new(true);
            #[cfg(unix)]
            std::os::unix::fs::OpenOptionsExt::mode(&mut new, 0o600);
            match new.open(file) {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(io(e)),
            }
        }
        let pool = SqlitePoolOptions::new()
            .max_connections(opts.max_connections.clamp(1, 8))
            .acquire_timeout(opts.acquire_timeout)
            .connect_with(connect)
            .await?;
        migrate::migrator(migrate::SQLITE).await?.run(&pool).await?;
        let store = SqlStore {
            pool,
            outage: sql::Outage::new(opts.outage_wait),
            extra: lock,
        };
        Ok(store)
    }

    /// Appends a batch in one transaction. On an error nothing was written, and the entries
    /// come back.
    async fn append(
        &self,
        mut entries: Vec<AuditEntry>,
        sealer: BlockSealer,
    ) -> Result<Vec<AuditRecord>, Refused> {
        let seen_by_entry: Vec<i64> = entries.iter().map(|e| e.revocations_seen).collect();
        let (mut tx, mut heads) = match self.prepare(&mut entries).await {
            Ok(prepared) => prepared,
            Err(e) => return Err((e, entries)),
        };
        let records = batch::seal(entries, &mut heads);
        let mut blocks = block::plan(&records, &mut heads);
        block::seal(&mut blocks, &sealer);
        let written = async {
            write_blocks(&mut tx, &blocks).await?;
            tx.commit().await?;
            Ok::<_, StoreError>(())
        };
        match written.await {
            Ok(()) => Ok(records),
            Err(e) => Err((e, batch::unseal(records, &seen_by_entry))),
        }
    }

    /// Opens the batch's transaction, re-checks revocation of its `valid` entries and reads
    /// the heads of its ledgers.
    async fn prepare(
        &self,
        entries: &mut [AuditEntry],
    ) -> Result<(sqlx::Transaction<'static, Sqlite>, block::Heads), StoreError> {
        // IMMEDIATE takes the write lock up front, so the heads read below cannot go stale.
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;

        // Entries whose checks had seen every revocation committed so far need no look-up.
        let (epoch,): (i64,) = sqlx::query_as("SELECT epoch FROM revocation_epoch WHERE id = 1")
            .fetch_one(&mut *tx)
            .await?;
        let recheck = if epoch > batch::revocations_seen(entries) {
            batch::valid_agent_ids(entries)
        } else {
            Vec::new()
        };
        let mut revoked = HashMap::new();
        for chunk in recheck.chunks(IN_CHUNK) {
            let params = (1..=chunk.len())
                .map(|i| format!("${i}"))
                .collect::<Vec<_>>()
                .join(", ");
            let sql = format!(
                "SELECT id, revocation_reason FROM agents WHERE revoked_at IS NOT NULL AND id IN ({params})"
            );
            let mut q = sqlx::query_as::<_, (String, Option<String>)>(&sql);
            for id in chunk {
                q = q.bind(id);
            }
            revoked.extend(q.fetch_all(&mut *tx).await?);
        }
        batch::apply_revocations(entries, &revoked);

        let heads = ledger_heads(&mut tx, batch::ledgers(entries)).await?;
        Ok((tx, heads))
    }
}

/// `serve`'s hold on a SQLite database: an advisory lock on `<database>.lock`, which holds
/// the server's process id. Released when the store is dropped, or the process ends however
/// it ends. Commands other than `serve` do not take it, so they keep working beside a server.
#[derive(Debug)]
pub(crate) struct ServeLock {
    _file: std::fs::File,
}

impl ServeLock {
    fn take(database: &Path) -> Result<ServeLock, StoreError> {
        use std::io::{Read, Seek, Write};
        let mut path = database.as_os_str().to_owned();
        path.push(".lock");
        let path = std::path::PathBuf::from(path);
        let io = |e| StoreError::Unavailable(sqlx::Error::Io(e));
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                let mut holder = String::new();
                let _ = file.read_to_string(&mut holder);
                let holder = holder.trim();
                return Err(StoreError::Locked {
                    lock: path.display().to_string(),
                    holder: if holder.is_empty() {
                        "another process".into()
                    } else {
                        format!("process {holder}")
                    },
                });
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(io(e)),
        }
        file.set_len(0).map_err(io)?;
        file.rewind().map_err(io)?;
        writeln!(file, "{}", std::process::id()).map_err(io)?;
        Ok(ServeLock { _file: file })
    }
}

impl Backend for Sqlite {
    const BACKEND: &'static str = "sqlite";
    type Extra = Option<ServeLock>;
    // BEGIN IMMEDIATE takes the database's write lock first.
    const EXCLUSIVE: Exclusive = Exclusive {
        begin: "BEGIN IMMEDIATE",
        lock: "SELECT 1",
    };
    // `BEGIN IMMEDIATE` already serializes every writer.
    const CHECKPOINT_LOCK: Option<&'static str> = None;
    // A column holds a value of any type here: one of another type does not decode.
    const READABLE_CHECKPOINT: &'static str = "typeof(tree_size) = 'integer' AND tree_size >= 0 \
        AND typeof(root) = 'blob' AND length(root) = 32 AND typeof(note) = 'text' \
        AND typeof(created_at) = 'integer'";
    const LOG_PLAN: LogPlan = LogPlan {
        name_index: true,
        lateral_join: false,
    };
    const SKIP_LOCKED: &'static str = "";
    const SKIP_LOCKED_ROWS: &'static str = "";
    const LOSES_CONNECTIONS: bool = false;

    fn append(store: &SqliteStore, entries: Vec<AuditEntry>, sealer: BlockSealer) -> Appending<'_> {
        Box::pin(store.append(entries, sealer))
    }

    /// One instance: its rate-limit buckets stay in its memory.
    fn shared_buckets(_: &SqliteStore) -> Option<&dyn SharedBuckets> {
        None
    }

    fn rows_affected(done: &sqlx::sqlite::SqliteQueryResult) -> u64 {
        done.rows_affected()
    }

    /// One pool: the audit writer shares it (SQLite has one writer at a time anyway).
    fn pools(store: &SqliteStore) -> Vec<PoolStats> {
        vec![PoolStats::of("main", &store.pool)]
    }

    fn close(store: &SqliteStore) -> BoxFuture<'_, ()> {
        Box::pin(store.pool.close())
    }
}

/// Writes planned blocks with prepared inserts; the caller holds the transaction (and has
/// re-checked revocations). Each agent row adds its block's records to the agent's newest
/// row, which may be one this transaction just wrote.
async fn write_blocks(conn: &mut SqliteConnection, blocks: &[Block]) -> Result<(), StoreError> {
    for b in blocks {
        sqlx::query(
            "INSERT INTO audit_blocks (org_id, mode, first_seq, last_seq, prev_hash, last_hash, results, \
             n_valid, n_invalid, n_expired, n_revoked, records, mac) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)",
        )
        .bind(&b.ledger.org_id)
        .bind(b.ledger.mode.as_str())
        .bind(b.first_seq)
        .bind(b.last_seq)
        .bind(&b.prev_hash[..])
        .bind(&b.last_hash[..])
        .bind(b.results)
        .bind(b.totals[0])
        .bind(b.totals[1])
        .bind(b.totals[2])
        .bind(b.totals[3])
        .bind(&b.records)
        .bind(&b.mac[..])
        .execute(&mut *conn)
        .await?;
        for a in &b.agents {
            sqlx::query(
                "INSERT INTO audit_block_agents (org_id, mode, agent_id, first_seq, results, \
                 n_valid, n_invalid, n_expired, n_revoked) \
                 SELECT $1, $2, $3, $4, $5, COALESCE(p.n_valid, 0) + $6, COALESCE(p.n_invalid, 0) + $7, \
                 COALESCE(p.n_expired, 0) + $8, COALESCE(p.n_revoked, 0) + $9 \
                 FROM (SELECT 1) LEFT JOIN (SELECT n_valid, n_invalid, n_expired, n_revoked \
                 FROM audit_block_agents WHERE org_id = $1 AND mode = $2 AND agent_id = $3 \
                 ORDER BY first_seq DESC LIMIT 1) p ON 1",
            )
            .bind(&b.ledger.org_id)
            .bind(b.ledger.mode.as_str())
            .bind(&a.agent_id)
            .bind(b.first_seq)
            .bind(a.results)
            .bind(a.delta[0])
            .bind(a.delta[1])
            .bind(a.delta[2])
            .bind(a.delta[3])
            .execute(&mut *conn)
            .await?;
        }
    }
    Ok(())
}

//! PostgreSQL backend, for production and several instances. A batch of audit records is
//! appended as blocks by one statement (one round trip) built on `UNNEST` arrays; chain heads
//! are cached and the primary key `(org_id, mode, first_seq)` stops two instances from forking
//! a chain.

use std::collections::HashMap;
use std::str::FromStr;
use std::time::Duration;

use futures_util::future::BoxFuture;
use parking_lot::Mutex;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{FromRow, PgConnection, PgPool, Postgres};

use super::block::{self, Block, BlockAgent};
use super::sql::{self, Backend, Exclusive, LogPlan, Refused, SqlStore};
use super::{audit, batch, migrate, PoolStats, SharedBuckets, StoreError, StoreFuture, StoreOptions, Taken};
use agentid_core::domain::audit::{AuditEntry, AuditRecord};
use agentid_core::domain::{Gcra, Ledger, Totals};

pub type PgStore = SqlStore<Postgres>;

/// The audit writer's side of the store.
#[derive(Debug)]
pub struct Writer {
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

/// A batch as written: its records, and what the writer's cache learns from it.
struct Sealed {
    records: Vec<AuditRecord>,
    learned: Learned,
}

/// What a written batch tells the writer's cache: the heads after it, its blocks, and the
/// agents' running totals it used (`known`) and that the statement returned (`returned`).
struct Learned {
    heads: block::Heads,
    blocks: Vec<Block>,
    known: AgentTotals,
    returned: AgentTotals,
}

/// Seals `entries` after `heads` and writes them with one statement on `conn` (inside its
/// transaction if it is in one). A revocation the statement finds turns those entries into
/// `revoked` ones and writes again after the same heads. On an error nothing was written, and
/// the entries come back as they were handed in.
async fn seal_and_write(
    conn: &mut PgConnection,
    mut entries: Vec<AuditEntry>,
    heads: block::Heads,
    cache: &Mutex<WriterCache>,
) -> Result<Sealed, Refused> {
    // What each entry's check had seen: the records do not keep it (see `batch::unseal`).
    let seen_by_entry: Vec<i64> = entries.iter().map(|e| e.revocations_seen).collect();
    loop {
        let mut after = heads.clone();
        let seen = batch::revocations_seen(&entries);
        // Sealed by value: a round that does not write turns the records back into entries,
        // so no round clones the batch's strings.
        let records = batch::seal(std::mem::take(&mut entries), &mut after);
        let blocks = block::plan(&records, &mut after);
        let known = cache.lock().known_agents(&blocks);
        let written = write_blocks_with(conn, &blocks, seen, &known).await;
        entries = match written {
            Ok(Written::Done(returned)) => {
                return Ok(Sealed {
                    records,
                    learned: Learned {
                        heads: after,
                        blocks,
                        known,
                        returned,
                    },
                })
            }
            Ok(Written::Revoked(revoked)) => {
                let mut entries = batch::unseal(records, &seen_by_entry);
                batch::apply_revocations(&mut entries, &revoked.into_iter().collect());
                entries
            }
            Err(e) => return Err((e, batch::unseal(records, &seen_by_entry))),
        };
    }
}

/// Writes planned blocks in one statement (one round trip; its own transaction unless
/// `conn` is in one), unless an agent with `valid` records in the blocks was revoked in the
/// store and the store's revocation epoch is above `revocations_seen` (the lowest epoch the
/// checks of those records had seen; `i64::MAX`: no re-check), in which case nothing is
/// written and the revoked agents are returned. Two writers can never fork a
/// chain: a block starts right after the head its writer saw and `(org_id, mode,
/// first_seq)` is the primary key, so the second one to extend a head fails with a
/// conflict. Agents in `known` have their running totals computed here; the others are
/// read from their newest row by the statement, which returns what it wrote for them.
async fn write_blocks_with(
    conn: &mut PgConnection,
    blocks: &[Block],
    revocations_seen: i64,
    known: &AgentTotals,
) -> Result<Written, StoreError> {
    let mut b = BlockColumns::default();
    let mut a = AgentColumns::default();
    let mut unknown = Vec::new();
    for blk in blocks {
        b.push(blk);
        for agent in &blk.agents {
            let prior = totals_of(known, &blk.ledger, &agent.agent_id);
            if prior.is_none() {
                unknown.push(agent.agent_id.clone());
            }
            a.push(blk, agent, prior);
        }
    }
    unknown.sort_unstable();
    unknown.dedup();
    let rows: Vec<ReturnedRow> = sqlx::query_as(APPEND)
        .bind(revocations_seen)
        .bind(b.org_id)
        .bind(b.mode)
        .bind(b.first_seq)
        .bind(b.last_seq)
        .bind(b.prev_hash)
        .bind(b.last_hash)
        .bind(b.results)
        .bind(b.totals[0].as_slice())
        .bind(b.totals[1].as_slice())
        .bind(b.totals[2].as_slice())
        .bind(b.totals[3].as_slice())
        .bind(b.records)
        .bind(a.org_id)
        .bind(a.mode)
        .bind(a.agent_id)
        .bind(a.first_seq)
        .bind(a.results)
        .bind(a.delta[0].as_slice())
        .bind(a.delta[1].as_slice())
        .bind(a.delta[2].as_slice())
        .bind(a.delta[3].as_slice())
        .bind(a.known)
        .bind(unknown)
        .fetch_all(&mut *conn)
        .await?;
    let mut revoked = Vec::new();
    let mut learned: HashMap<Ledger, HashMap<String, (i64, Totals)>> = HashMap::new();
    for row in rows {
        match row.ledger {
            None => revoked.push((row.agent_id, row.reason)),
            Some((org_id, mode)) => {
                let ledger = Ledger {
                    org_id,
                    mode: sql::parse_mode(&mode)?,
                };
                // An agent's last block of the batch has its totals after it.
                let slot = learned
                    .entry(ledger)
                    .or_default()
                    .entry(row.agent_id)
                    .or_insert((0, [0; 4]));
                if row.first_seq >= slot.0 {
                    let totals = [row.n_valid, row.n_invalid, row.n_expired, row.n_revoked];
                    *slot = (row.first_seq, totals);
                }
            }
        }
    }
    Ok(if revoked.is_empty() {
        let learned = learned
            .into_iter()
            .map(|(l, agents)| (l, agents.into_iter().map(|(a, (_, t))| (a, t)).collect()))
            .collect();
        Written::Done(learned)
    } else {
        Written::Revoked(revoked)
    })
}

/// Takes up to $3 cells from the bucket $1 of $2 cells a minute ($4 nanoseconds a cell), on
/// the database's clock, so that every instance runs on the same one. A bucket is created
/// full. All of `SET` reads the row as it was: `granted` is what `tat` moves by.
const TAKE_CELLS: &str = "
INSERT INTO rate_buckets AS b (bucket, tat, granted, at)
SELECT $1, n + LEAST($3, $2) * $4, LEAST($3, $2), n
FROM (SELECT (EXTRACT(EPOCH FROM clock_timestamp()) * 1000000000)::bigint AS n) c
ON CONFLICT (bucket) DO UPDATE SET
    granted = GREATEST(0, LEAST($3, (EXCLUDED.at + $2 * $4 - GREATEST(b.tat, EXCLUDED.at)) / $4)),
    tat = GREATEST(b.tat, EXCLUDED.at)
        + GREATEST(0, LEAST($3, (EXCLUDED.at + $2 * $4 - GREATEST(b.tat, EXCLUDED.at)) / $4)) * $4,
    at = EXCLUDED.at
RETURNING granted, tat, at";

#[derive(FromRow)]
struct TakenRow {
    granted: i64,
    tat: i64,
    at: i64,
}

impl SharedBuckets for PgStore {
    fn take_cells<'a>(&'a self, bucket: &'a str, limit: u32, want: u32) -> StoreFuture<'a, Taken> {
        Box::pin(async move {
            let g = Gcra { limit };
            let row: TakenRow = sqlx::query_as(TAKE_CELLS)
                .bind(bucket)
                .bind(i64::from(limit))
                .bind(i64::from(want))
                .bind(g.interval() as i64)
                .fetch_one(&self.pool)
                .await?;
            let (tat, at) = (row.tat.max(0) as u64, row.at.max(0) as u64);
            let granted = u32::try_from(row.granted).unwrap_or(0);
            Ok(Taken {
                granted,
                remaining: g.available(tat, at),
                full_in: Duration::from_nanos(tat.saturating_sub(at)),
                retry_in: Duration::from_nanos(if granted == 0 { g.wait(tat, at) } else { 0 }),
            })
        })
    }

    fn return_cells<'a>(&'a self, bucket: &'a str, limit: u32, cells: u32) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let back = i64::from(cells) * Gcra { limit }.interval() as i64;
            sqlx::query("UPDATE rate_buckets SET tat = tat - $2 WHERE bucket = $1")
                .bind(bucket)
                .bind(back)
                .execute(&self.pool)
                .await?;
            Ok(())
        })
    }
}

/// Takes the locks of the ledgers $1 (org ids) × $2 (modes), in one order so that writers
/// locking several never wait for each other in a circle; they are held to the end of the
/// transaction. The same keys as in `APPEND`.
const LOCK_LEDGERS: &str = "
SELECT pg_advisory_xact_lock(k) FROM (
    SELECT DISTINCT hashtextextended(o || '/' || m, 7431004) AS k FROM UNNEST($1::text[], $2::text[]) AS l(o, m)
) keys ORDER BY k";

/// The whole batch append. Data-modifying CTEs all run in one snapshot, taken when the
/// statement starts, which is after every entry of the batch was handed in: a revocation
/// committed before that is seen by `rev`. While the revocation epoch is not above $1 (the
/// lowest epoch the `valid` entries' checks had seen), every committed revocation was in the
/// index those checks read, and `rev` is empty without a look-up: its test of the epoch is a
/// one-time filter above the join (EXPLAIN: an InitPlan; a cold batch names ~100 agents,
/// and their look-ups were ~15 % of PostgreSQL's CPU per record). Otherwise it looks up, by
/// primary key, each agent that has the `valid` bit in its block's agent row ($16, $18: the
/// agents of the batch are sent once, for those rows, not again as a list of ids):
/// written as `id = ANY(…) AND revoked_at IS NOT NULL`, the generic plan was a sequential
/// scan of `agents` per batch while the table had no statistics, and with statistics that
/// show few revocations a walk of every revoked agent (`agents_revoked`); the `OFFSET 0`
/// keeps the revocation test out of the per-id look-up. An agent's running totals are its newest row
/// committed before the statement plus its records in this batch up to the block; for an
/// agent the writer already knows (`known`), the totals come computed and the look-up is
/// skipped. Returns the revoked agents (ledger NULL) or, for the agents in $24, the rows
/// written.
///
/// Before it inserts, the statement takes the locks of the blocks' ledgers (`lk`, as
/// `LOCK_LEDGERS` does; the inserts depend on it), so it waits for a writer that holds them
/// in a transaction. Its snapshot is older than the wait, but its blocks start right after
/// the heads its writer saw: a block another writer committed meanwhile holds the same key,
/// and the insert fails with a conflict instead of forking the chain.
const APPEND: &str = "
WITH lk AS (
    SELECT count(*) AS n FROM (
        SELECT pg_advisory_xact_lock(k) FROM (
            SELECT DISTINCT hashtextextended(o || '/' || m, 7431004) AS k
            FROM UNNEST($2::text[], $3::text[]) AS l(o, m)
        ) keys ORDER BY k
    ) locked
), rev AS (
    SELECT a.id, a.revocation_reason FROM UNNEST($16::text[], $18::int[]) AS v(id, results)
    CROSS JOIN LATERAL (
        SELECT id, revocation_reason, revoked_at FROM agents WHERE agents.id = v.id OFFSET 0
    ) a
    WHERE v.results & 1 <> 0 AND a.revoked_at IS NOT NULL  -- 1: VerifyResult::Valid.bit()
      AND (SELECT epoch FROM revocation_epoch WHERE id = 1) > $1::bigint
), blk AS (
    INSERT INTO audit_blocks (org_id, mode, first_seq, last_seq, prev_hash, last_hash, results,
                              n_valid, n_invalid, n_expired, n_revoked, records)
    SELECT * FROM UNNEST($2::text[], $3::text[], $4::bigint[], $5::bigint[], $6::bytea[], $7::bytea[],
                         $8::int[], $9::bigint[], $10::bigint[], $11::bigint[], $12::bigint[], $13::bytea[])
    WHERE NOT EXISTS (SELECT 1 FROM rev) AND (SELECT n FROM lk) >= 0
), agt AS (
    INSERT INTO audit_block_agents (org_id, mode, agent_id, first_seq, results,
                                    n_valid, n_invalid, n_expired, n_revoked)
    SELECT d.org_id, d.mode, d.agent_id, d.first_seq, d.results,
           COALESCE(p.n_valid, 0) + d.v, COALESCE(p.n_invalid, 0) + d.i,
           COALESCE(p.n_expired, 0) + d.e, COALESCE(p.n_revoked, 0) + d.r
    FROM UNNEST($14::text[], $15::text[], $16::text[], $17::bigint[], $18::int[],
                $19::bigint[], $20::bigint[], $21::bigint[], $22::bigint[], $23::bool[])
         AS d(org_id, mode, agent_id, first_seq, results, v, i, e, r, known)
    LEFT JOIN LATERAL (
        SELECT n_valid, n_invalid, n_expired, n_revoked FROM audit_block_agents a
        WHERE NOT d.known AND a.agent_id = d.agent_id AND a.org_id = d.org_id AND a.mode = d.mode
        ORDER BY a.first_seq DESC LIMIT 1
    ) p ON true
    WHERE NOT EXISTS (SELECT 1 FROM rev) AND (SELECT n FROM lk) >= 0
    RETURNING agent_id, org_id, mode, first_seq, n_valid, n_invalid, n_expired, n_revoked
)
SELECT id AS agent_id, revocation_reason AS reason, NULL AS ledger, 0::bigint AS first_seq,
       0::bigint AS n_valid, 0::bigint AS n_invalid, 0::bigint AS n_expired, 0::bigint AS n_revoked FROM rev
UNION ALL
SELECT agent_id, NULL, ROW(org_id, mode), first_seq, n_valid, n_invalid, n_expired, n_revoked
FROM agt WHERE agent_id = ANY($24::text[])";

/// Column arrays of `audit_blocks` rows for one `UNNEST` insert.
#[derive(Default)]
struct BlockColumns {
    org_id: Vec<String>,
    mode: Vec<&'static str>,
    first_seq: Vec<i64>,
    last_seq: Vec<i64>,
    prev_hash: Vec<Vec<u8>>,
    last_hash: Vec<Vec<u8>>,
    results: Vec<i32>,
    totals: [Vec<i64>; 4],
    records: Vec<Vec<u8>>,
}

impl BlockColumns {
    fn push(&mut self, b: &Block) {
        self.org_id.push(b.ledger.org_id.clone());
        self.mode.push(b.ledger.mode.as_str());
        self.first_seq.push(b.first_seq);
        self.last_seq.push(b.last_seq);
        self.prev_hash.push(b.prev_hash.to_vec());
        self.last_hash.push(b.last_hash.to_vec());
        self.results.push(b.results);
        for (col, n) in self.totals.iter_mut().zip(b.totals) {
            col.push(n);
        }
        self.records.push(b.records.clone());
    }
}

/// Column arrays of `audit_block_agents` rows: each agent's batch delta, or its running
/// totals when its totals before the batch are known.
#[derive(Default)]
struct AgentColumns {
    org_id: Vec<String>,
    mode: Vec<&'static str>,
    agent_id: Vec<String>,
    first_seq: Vec<i64>,
    results: Vec<i32>,
    delta: [Vec<i64>; 4],
    known: Vec<bool>,
}

impl AgentColumns {
    fn push(&mut self, b: &Block, a: &BlockAgent, prior: Option<&Totals>) {
        self.org_id.push(b.ledger.org_id.clone());
        self.mode.push(b.ledger.mode.as_str());
        self.agent_id.push(a.agent_id.clone());
        self.first_seq.push(b.first_seq);
        self.results.push(a.results);
        let base = prior.copied().unwrap_or_default();
        for ((col, n), p) in self.delta.iter_mut().zip(a.batch_delta).zip(base) {
            col.push(n + p);
        }
        self.known.push(prior.is_some());
    }
}

/// A row `APPEND` returns: a revoked agent (no ledger), or an agent row it wrote.
#[derive(FromRow)]
struct ReturnedRow {
    agent_id: String,
    reason: Option<String>,
    /// `(org_id, mode)` of the agent row written.
    ledger: Option<(String, String)>,
    first_seq: i64,
    n_valid: i64,
    n_invalid: i64,
    n_expired: i64,
    n_revoked: i64,
}

/// Running totals per agent, per ledger.
type AgentTotals = HashMap<Ledger, HashMap<String, Totals>>;

fn totals_of<'a>(t: &'a AgentTotals, ledger: &Ledger, agent: &str) -> Option<&'a Totals> {
    t.get(ledger)?.get(agent)
}

enum Written {
    /// Committed; the running totals of the agents that were not known.
    Done(AgentTotals),
    /// Nothing written: these agents are revoked in the store.
    Revoked(Vec<(String, Option<String>)>),
}

/// At most this many agents' totals are kept per ledger (a full ledger map is emptied).
const AGENTS_PER_LEDGER: usize = 100_000;

/// What the writer knows of the ledgers it writes, valid while no other instance writes
/// them: each ledger's head, and the running totals of the agents it wrote for since it
/// learned the head. Another instance's write to a ledger makes the next write here
/// conflict (its head is stale), which forgets the ledger, head and agents together.
#[derive(Debug, Default)]
struct WriterCache {
    heads: block::Heads,
    agents: AgentTotals,
}

impl WriterCache {
    fn known_agents(&self, blocks: &[Block]) -> AgentTotals {
        let mut known = AgentTotals::new();
        for b in blocks {
            for a in &b.agents {
                if let Some(t) = totals_of(&self.agents, &b.ledger, &a.agent_id) {
                    known
                        .entry(b.ledger.clone())
                        .or_default()
                        .insert(a.agent_id.clone(), *t);
                }
            }
        }
        known
    }

    /// After a committed batch: the new heads, and every agent's totals after its last block
    /// (known ones advanced by the batch, the others as the statement returned them).
    fn wrote(&mut self, learned: Learned) {
        let Learned {
            heads,
            blocks,
            known,
            returned,
        } = learned;
        let mut after = returned;
        for b in &blocks {
            for a in &b.agents {
                if let Some(prior) = totals_of(&known, &b.ledger, &a.agent_id) {
                    let total = std::array::from_fn(|i| prior[i] + a.batch_delta[i]);
                    after
                        .entry(b.ledger.clone())
                        .or_default()
                        .insert(a.agent_id.clone(), total);
                }
            }
        }
        for (ledger, agents) in after {
            let cached = self.agents.entry(ledger).or_default();
            if cached.len() + agents.len() > AGENTS_PER_LEDGER {
                cached.clear();
            }
            cached.extend(agents);
        }
        self.heads.extend(heads);
    }

    fn forget(&mut self, ledgers: &[Ledger]) {
        for l in ledgers {
            self.heads.remove(l);
            self.agents.remove(l);
        }
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

//! PostgreSQL backend, for production and several instances. A batch of audit records is
//! appended as blocks by one statement (one round trip) built on `UNNEST` arrays; chain heads
//! are cached and the primary key `(org_id, mode, first_seq)` stops two instances from forking
//! a chain.

use std::sync::Arc;

use parking_lot::Mutex;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{PgConnection, PgPool, Postgres};
use std::str::FromStr;

use super::block::{self, Block, BlockAgent};
use super::common::{self, convert_legacy_log, insert_key_fn, shared_store_methods};
use super::{
    batch, migrate, AgentRecord, KeyRecord, LogPage, LogQuery, NewApiKey, OrgRecord, Store, StoreError,
    StoreFuture, StoreOptions,
};
use crate::domain::audit::{AuditEntry, AuditRecord};
use crate::domain::{ApiKeyKind, KeyMode, Ledger, Millis};

#[derive(Debug, Clone)]
pub struct PgStore {
    pool: PgPool,
    /// The head of each ledger as this instance last wrote it (only the writer touches it).
    heads: Arc<Mutex<block::Heads>>,
}

impl PgStore {
    pub async fn connect(url: &str, opts: &StoreOptions) -> Result<Self, StoreError> {
        // Generic plans for every prepared statement: each query here is planned once per
        // connection instead of at every execution. The planner did not settle on its own for
        // the audit batch (UNNEST arrays), where planning was ~40 % of PostgreSQL's CPU per
        // batch (perf, load/README.md); the other queries are key look-ups and log pages
        // written to use their indexes under a generic plan.
        let connect = PgConnectOptions::from_str(url)?
            .application_name("agentid")
            .options([("plan_cache_mode", "force_generic_plan")]);
        let pool = PgPoolOptions::new()
            .max_connections(opts.max_connections.max(2))
            // No ping before each use: a broken connection fails its query, which is retried
            // (API calls answer 503, audit batches are retried by the writer). Saves a round
            // trip per audit batch.
            .test_before_acquire(false)
            .acquire_timeout(opts.acquire_timeout)
            .connect_with(connect)
            .await?;
        migrate::migrator(migrate::POSTGRES).await?.run(&pool).await?;
        let store = PgStore {
            pool,
            heads: Arc::default(),
        };
        store.convert_legacy_log().await?;
        Ok(store)
    }

    async fn append_audit_impl(&self, mut entries: Vec<AuditEntry>) -> Result<Vec<AuditRecord>, StoreError> {
        let ledgers = batch::ledgers(&entries);
        // A stale head (another instance appended) or a revocation found by the statement
        // sends the batch round again; both converge within a few rounds.
        for _ in 0..8 {
            let mut heads = self.heads_for(&ledgers).await?;
            let records = batch::seal(entries.clone(), &mut heads);
            let blocks = block::plan(&records, &mut heads);
            let mut conn = self.pool.acquire().await?;
            match Self::write_blocks(&mut conn, &blocks, &batch::valid_agent_ids(&entries)).await {
                Ok(revoked) if revoked.is_empty() => {
                    let mut cache = self.heads.lock();
                    for (ledger, head) in heads {
                        cache.insert(ledger, head);
                    }
                    return Ok(records);
                }
                Ok(revoked) => batch::apply_revocations(&mut entries, &revoked.into_iter().collect()),
                Err(e) => {
                    // Whatever happened, the cached heads may be wrong now.
                    let mut cache = self.heads.lock();
                    for l in &ledgers {
                        cache.remove(l);
                    }
                    if !matches!(e, StoreError::Conflict(_)) {
                        return Err(e);
                    }
                }
            }
        }
        Err(StoreError::Corrupt(
            "audit batch kept conflicting with another writer".into(),
        ))
    }

    /// Where each ledger's next record goes: from the cache, else the store.
    async fn heads_for(&self, ledgers: &[Ledger]) -> Result<block::Heads, StoreError> {
        let mut heads = block::Heads::new();
        let missing: Vec<Ledger> = {
            let cache = self.heads.lock();
            ledgers
                .iter()
                .filter(|l| match cache.get(*l) {
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
            let head = sqlx::query_as(common::LEDGER_HEAD_SQL)
                .bind(&ledger.org_id)
                .bind(ledger.mode.as_str())
                .fetch_optional(&self.pool)
                .await?;
            heads.insert(ledger, common::ledger_head(head)?);
        }
        Ok(heads)
    }

    /// Writes planned blocks in one statement (one round trip; its own transaction unless
    /// `conn` is in one), unless one of `valid_ids` is revoked in the store, in which case
    /// nothing is written and the revoked agents are returned. Two writers can never fork a
    /// chain: a block starts right after the head its writer saw and `(org_id, mode,
    /// first_seq)` is the primary key, so the second one to extend a head fails with a
    /// conflict.
    async fn write_blocks(
        conn: &mut PgConnection,
        blocks: &[Block],
        valid_ids: &[String],
    ) -> Result<Vec<(String, Option<String>)>, StoreError> {
        let mut b = BlockColumns::default();
        let mut a = AgentColumns::default();
        for blk in blocks {
            b.push(blk);
            for agent in &blk.agents {
                a.push(blk, agent);
            }
        }
        let revoked: Vec<(String, Option<String>)> = sqlx::query_as(APPEND)
            .bind(valid_ids)
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
            .fetch_all(&mut *conn)
            .await?;
        Ok(revoked)
    }

    convert_legacy_log!(
        lock: "SELECT pg_advisory_xact_lock(7431003)",
        exists: "SELECT to_regclass('audit_log') IS NOT NULL"
    );
}

/// The whole batch append. Data-modifying CTEs all run in one snapshot, taken when the
/// statement starts, which is after every entry of the batch was handed in: a revocation
/// committed before that is seen by `rev`. An agent's running totals are its newest row
/// committed before the statement plus its records in this batch up to the block.
const APPEND: &str = "
WITH rev AS (
    SELECT id, revocation_reason FROM agents WHERE id = ANY($1::text[]) AND revoked_at IS NOT NULL
), blk AS (
    INSERT INTO audit_blocks (org_id, mode, first_seq, last_seq, prev_hash, last_hash, results,
                              n_valid, n_invalid, n_expired, n_revoked, records)
    SELECT * FROM UNNEST($2::text[], $3::text[], $4::bigint[], $5::bigint[], $6::bytea[], $7::bytea[],
                         $8::int[], $9::bigint[], $10::bigint[], $11::bigint[], $12::bigint[], $13::bytea[])
    WHERE NOT EXISTS (SELECT 1 FROM rev)
), agt AS (
    INSERT INTO audit_block_agents (org_id, mode, agent_id, first_seq, results,
                                    n_valid, n_invalid, n_expired, n_revoked)
    SELECT d.org_id, d.mode, d.agent_id, d.first_seq, d.results,
           COALESCE(p.n_valid, 0) + d.v, COALESCE(p.n_invalid, 0) + d.i,
           COALESCE(p.n_expired, 0) + d.e, COALESCE(p.n_revoked, 0) + d.r
    FROM UNNEST($14::text[], $15::text[], $16::text[], $17::bigint[], $18::int[],
                $19::bigint[], $20::bigint[], $21::bigint[], $22::bigint[])
         AS d(org_id, mode, agent_id, first_seq, results, v, i, e, r)
    LEFT JOIN LATERAL (
        SELECT n_valid, n_invalid, n_expired, n_revoked FROM audit_block_agents a
        WHERE a.org_id = d.org_id AND a.mode = d.mode AND a.agent_id = d.agent_id
        ORDER BY a.first_seq DESC LIMIT 1
    ) p ON true
    WHERE NOT EXISTS (SELECT 1 FROM rev)
)
SELECT id, revocation_reason FROM rev";

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

/// Column arrays of `audit_block_agents` rows (with each agent's batch delta).
#[derive(Default)]
struct AgentColumns {
    org_id: Vec<String>,
    mode: Vec<&'static str>,
    agent_id: Vec<String>,
    first_seq: Vec<i64>,
    results: Vec<i32>,
    delta: [Vec<i64>; 4],
}

impl AgentColumns {
    fn push(&mut self, b: &Block, a: &BlockAgent) {
        self.org_id.push(b.ledger.org_id.clone());
        self.mode.push(b.ledger.mode.as_str());
        self.agent_id.push(a.agent_id.clone());
        self.first_seq.push(b.first_seq);
        self.results.push(a.results);
        for (col, n) in self.delta.iter_mut().zip(a.batch_delta) {
            col.push(n);
        }
    }
}

insert_key_fn!(Postgres);

impl Store for PgStore {
    shared_store_methods!("postgres");
}

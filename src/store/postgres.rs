//! PostgreSQL backend, for production and several instances. A batch of audit records is
//! appended by one statement (one round trip) built on `UNNEST` arrays; chain heads are cached
//! and the primary key `(org_id, mode, seq)` stops two instances from forking a chain.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{PgPool, Postgres};
use std::str::FromStr;

use super::common::{self, insert_key_fn, shared_store_methods};
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
    heads: Arc<Mutex<batch::Heads>>,
}

impl PgStore {
    pub async fn connect(url: &str, opts: &StoreOptions) -> Result<Self, StoreError> {
        let connect = PgConnectOptions::from_str(url)?.application_name("agentid");
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
        Ok(PgStore {
            pool,
            heads: Arc::default(),
        })
    }

    async fn append_audit_impl(&self, mut entries: Vec<AuditEntry>) -> Result<Vec<AuditRecord>, StoreError> {
        let ledgers = batch::ledgers(&entries);
        // A stale head (another instance appended) or a revocation found by the statement
        // sends the batch round again; both converge within a few rounds.
        for _ in 0..8 {
            let mut heads = self.heads_for(&ledgers).await?;
            let records = batch::seal(entries.clone(), &mut heads);
            match self
                .append_once(&records, &batch::valid_agent_ids(&entries))
                .await
            {
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

    /// The `(seq, hash)` each ledger's next record follows: from the cache, else the store.
    async fn heads_for(&self, ledgers: &[Ledger]) -> Result<batch::Heads, StoreError> {
        let mut heads = HashMap::new();
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

    /// Writes a sealed batch in one statement (one round trip, its own transaction): records
    /// and counters, unless one of `valid_ids` is revoked in the store,
    /// in which case nothing is written and the revoked agents are returned. Two writers can
    /// never fork a chain: `(org_id, mode, seq)` is the primary key, so the second one to
    /// claim a sequence number fails with a conflict.
    async fn append_once(
        &self,
        records: &[AuditRecord],
        valid_ids: &[String],
    ) -> Result<Vec<(String, Option<String>)>, StoreError> {
        let mut cols = RecordColumns::with_capacity(records.len());
        for r in records {
            cols.push(r);
        }
        let (mut org, mut mode, mut agent, mut result, mut count) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for d in batch::count_deltas(records) {
            org.push(d.org_id);
            mode.push(d.mode);
            agent.push(d.agent_id);
            result.push(d.result);
            count.push(d.n);
        }
        let revoked: Vec<(String, Option<String>)> = sqlx::query_as(APPEND)
            .bind(cols.org_id)
            .bind(cols.mode)
            .bind(cols.seq)
            .bind(cols.id)
            .bind(cols.agent_id)
            .bind(cols.result)
            .bind(cols.failure_reason)
            .bind(cols.latency_us)
            .bind(cols.requested_at)
            .bind(cols.prev_hash)
            .bind(cols.hash)
            .bind(valid_ids)
            .bind(org)
            .bind(mode)
            .bind(agent)
            .bind(result)
            .bind(count)
            .fetch_all(&self.pool)
            .await?;
        Ok(revoked)
    }
}

/// The whole batch append. Data-modifying CTEs all run, in one snapshot taken when the
/// statement starts, which is after every entry of the batch was handed in: a revocation
/// committed before that is seen by `rev`.
const APPEND: &str = "
WITH rev AS (
    SELECT id, revocation_reason FROM agents WHERE id = ANY($12::text[]) AND revoked_at IS NOT NULL
), ins AS (
    INSERT INTO audit_log (org_id, mode, seq, id, agent_id, result, failure_reason,
                           latency_us, requested_at, prev_hash, hash)
    SELECT * FROM UNNEST($1::text[], $2::text[], $3::bigint[], $4::text[], $5::text[], $6::text[],
                         $7::text[], $8::bigint[], $9::bigint[], $10::bytea[], $11::bytea[])
    WHERE NOT EXISTS (SELECT 1 FROM rev)
), cnt AS (
    INSERT INTO audit_counts (org_id, mode, agent_id, result, n)
    SELECT * FROM UNNEST($13::text[], $14::text[], $15::text[], $16::text[], $17::bigint[])
    WHERE NOT EXISTS (SELECT 1 FROM rev)
    ON CONFLICT (org_id, mode, agent_id, result) DO UPDATE SET n = audit_counts.n + EXCLUDED.n
)
SELECT id, revocation_reason FROM rev";

/// Column arrays for one `UNNEST` insert.
struct RecordColumns {
    org_id: Vec<String>,
    mode: Vec<&'static str>,
    seq: Vec<i64>,
    id: Vec<String>,
    agent_id: Vec<String>,
    result: Vec<&'static str>,
    failure_reason: Vec<Option<String>>,
    latency_us: Vec<i64>,
    requested_at: Vec<i64>,
    prev_hash: Vec<Vec<u8>>,
    hash: Vec<Vec<u8>>,
}

impl RecordColumns {
    fn with_capacity(n: usize) -> Self {
        RecordColumns {
            org_id: Vec::with_capacity(n),
            mode: Vec::with_capacity(n),
            seq: Vec::with_capacity(n),
            id: Vec::with_capacity(n),
            agent_id: Vec::with_capacity(n),
            result: Vec::with_capacity(n),
            failure_reason: Vec::with_capacity(n),
            latency_us: Vec::with_capacity(n),
            requested_at: Vec::with_capacity(n),
            prev_hash: Vec::with_capacity(n),
            hash: Vec::with_capacity(n),
        }
    }

    fn push(&mut self, r: &AuditRecord) {
        self.org_id.push(r.ledger.org_id.clone());
        self.mode.push(r.ledger.mode.as_str());
        self.seq.push(r.seq);
        self.id.push(r.id.clone());
        self.agent_id.push(r.agent_id.clone());
        self.result.push(r.result.as_str());
        self.failure_reason.push(r.failure_reason.clone());
        self.latency_us.push(r.latency_us);
        self.requested_at.push(r.requested_at.0);
        self.prev_hash.push(r.prev_hash.to_vec());
        self.hash.push(r.hash.to_vec());
    }
}

insert_key_fn!(Postgres);

impl Store for PgStore {
    shared_store_methods!("postgres");
}

//! PostgreSQL backend, for production and several instances. Batches are appended with
//! `UNNEST` arrays; each ledger's chain is serialized across instances by a transaction-scoped
//! advisory lock, so two instances never fork a chain.

use std::collections::HashMap;

use sha2::{Digest, Sha256};
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
}

impl PgStore {
    pub async fn connect(url: &str, opts: &StoreOptions) -> Result<Self, StoreError> {
        let connect = PgConnectOptions::from_str(url)?.application_name("agentid");
        let pool = PgPoolOptions::new()
            .max_connections(opts.max_connections.max(2))
            .acquire_timeout(opts.acquire_timeout)
            .connect_with(connect)
            .await?;
        migrate::migrator(migrate::POSTGRES).await?.run(&pool).await?;
        Ok(PgStore { pool })
    }

    async fn append_audit_impl(&self, mut entries: Vec<AuditEntry>) -> Result<Vec<AuditRecord>, StoreError> {
        let mut tx = self.pool.begin().await?;
        let ledgers = batch::ledgers(&entries);
        for ledger in &ledgers {
            sqlx::query("SELECT pg_advisory_xact_lock($1)")
                .bind(ledger_lock_key(ledger))
                .execute(&mut *tx)
                .await?;
        }

        let ids = batch::valid_agent_ids(&entries);
        if !ids.is_empty() {
            let revoked: Vec<(String, Option<String>)> = sqlx::query_as(
                "SELECT id, revocation_reason FROM agents WHERE id = ANY($1) AND revoked_at IS NOT NULL",
            )
            .bind(&ids)
            .fetch_all(&mut *tx)
            .await?;
            batch::apply_revocations(&mut entries, &revoked.into_iter().collect());
        }

        let mut heads = HashMap::new();
        for ledger in ledgers {
            let head: Option<(i64, Vec<u8>)> = sqlx::query_as(
                "SELECT seq, hash FROM audit_log WHERE org_id = $1 AND mode = $2 ORDER BY seq DESC LIMIT 1",
            )
            .bind(&ledger.org_id)
            .bind(ledger.mode.as_str())
            .fetch_optional(&mut *tx)
            .await?;
            if let Some((seq, hash)) = head {
                let hash = hash
                    .try_into()
                    .map_err(|_| StoreError::Corrupt("audit hash length".into()))?;
                heads.insert(ledger, (seq, hash));
            }
        }
        let records = batch::seal(entries, &mut heads);

        let n = records.len();
        let mut cols = RecordColumns::with_capacity(n);
        for r in &records {
            cols.push(r);
        }
        sqlx::query(&format!(
            "INSERT INTO audit_log ({}) SELECT * FROM UNNEST($1::text[], $2::text[], $3::bigint[], \
             $4::text[], $5::text[], $6::text[], $7::text[], $8::bigint[], $9::bigint[], $10::bytea[], $11::bytea[])",
            common::RECORD_COLUMNS
        ))
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
        .execute(&mut *tx)
        .await?;

        let deltas = batch::count_deltas(&records);
        let (mut org, mut mode, mut agent, mut result, mut count) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for d in deltas {
            org.push(d.org_id);
            mode.push(d.mode);
            agent.push(d.agent_id);
            result.push(d.result);
            count.push(d.n);
        }
        sqlx::query(
            "INSERT INTO audit_counts (org_id, mode, agent_id, result, n) \
             SELECT * FROM UNNEST($1::text[], $2::text[], $3::text[], $4::text[], $5::bigint[]) \
             ON CONFLICT (org_id, mode, agent_id, result) DO UPDATE SET n = audit_counts.n + EXCLUDED.n",
        )
        .bind(org)
        .bind(mode)
        .bind(agent)
        .bind(result)
        .bind(count)
        .execute(&mut *tx)
        .await?;

        let (ids, counts): (Vec<String>, Vec<i64>) = batch::agent_deltas(&records).into_iter().unzip();
        if !ids.is_empty() {
            sqlx::query(
                "UPDATE agents AS a SET verification_count = a.verification_count + d.n \
                 FROM UNNEST($1::text[], $2::bigint[]) AS d(id, n) WHERE a.id = d.id",
            )
            .bind(ids)
            .bind(counts)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(records)
    }
}

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

/// A stable 64-bit advisory-lock key per ledger.
fn ledger_lock_key(ledger: &Ledger) -> i64 {
    let d = Sha256::new()
        .chain_update(b"agentid ledger\0")
        .chain_update(ledger.org_id.as_bytes())
        .chain_update([0])
        .chain_update(ledger.mode.as_str())
        .finalize();
    i64::from_be_bytes(d[..8].try_into().expect("8 bytes"))
}

insert_key_fn!(Postgres);

impl Store for PgStore {
    shared_store_methods!("postgres");
}

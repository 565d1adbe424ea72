//! SQLite backend: the embedded default. WAL journal, `synchronous = FULL` (an answered
//! verification survives a power cut, not only a crash), one writer at a time.

use std::collections::HashMap;
use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Sqlite, SqlitePool};

use super::common::{self, insert_key_fn, shared_store_methods};
use super::{
    batch, migrate, AgentRecord, KeyRecord, LogPage, LogQuery, NewApiKey, OrgRecord, Store, StoreError,
    StoreFuture, StoreOptions,
};
use crate::domain::audit::{AuditEntry, AuditRecord};
use crate::domain::{ApiKeyKind, KeyMode, Ledger, Millis};

/// SQLite allows 32766 bound parameters; stay far below it.
const IN_CHUNK: usize = 500;

#[derive(Debug, Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
}

impl SqliteStore {
    pub async fn connect(url: &str, opts: &StoreOptions) -> Result<Self, StoreError> {
        let connect = SqliteConnectOptions::from_str(url)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(Duration::from_secs(5))
            .foreign_keys(true);
        let file = connect.get_filename();
        if let Some(dir) = file.parent().filter(|d| !d.as_os_str().is_empty()) {
            if !Path::new(dir).exists() {
                std::fs::create_dir_all(dir).map_err(|e| StoreError::Unavailable(sqlx::Error::Io(e)))?;
            }
        }
        let pool = SqlitePoolOptions::new()
            .max_connections(opts.max_connections.clamp(1, 8))
            .acquire_timeout(opts.acquire_timeout)
            .connect_with(connect)
            .await?;
        migrate::migrator(migrate::SQLITE).await?.run(&pool).await?;
        Ok(SqliteStore { pool })
    }

    async fn append_audit_impl(&self, mut entries: Vec<AuditEntry>) -> Result<Vec<AuditRecord>, StoreError> {
        // IMMEDIATE takes the write lock up front, so the heads read below cannot go stale.
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;

        let mut revoked = HashMap::new();
        for chunk in batch::valid_agent_ids(&entries).chunks(IN_CHUNK) {
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
        batch::apply_revocations(&mut entries, &revoked);

        let mut heads = HashMap::new();
        for ledger in batch::ledgers(&entries) {
            let head = sqlx::query_as(common::LEDGER_HEAD_SQL)
                .bind(&ledger.org_id)
                .bind(ledger.mode.as_str())
                .fetch_optional(&mut *tx)
                .await?;
            heads.insert(ledger, common::ledger_head(head)?);
        }
        let records = batch::seal(entries, &mut heads);

        for r in &records {
            sqlx::query(&format!(
                "INSERT INTO audit_log ({}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
                common::RECORD_COLUMNS
            ))
            .bind(&r.ledger.org_id)
            .bind(r.ledger.mode.as_str())
            .bind(r.seq)
            .bind(&r.id)
            .bind(&r.agent_id)
            .bind(r.result.as_str())
            .bind(r.failure_reason.as_deref())
            .bind(r.latency_us)
            .bind(r.requested_at.0)
            .bind(&r.prev_hash[..])
            .bind(&r.hash[..])
            .execute(&mut *tx)
            .await?;
        }
        for d in batch::count_deltas(&records) {
            sqlx::query(
                "INSERT INTO audit_counts (org_id, mode, agent_id, result, n) VALUES ($1, $2, $3, $4, $5) \
                 ON CONFLICT (org_id, mode, agent_id, result) DO UPDATE SET n = n + excluded.n",
            )
            .bind(&d.org_id)
            .bind(d.mode)
            .bind(&d.agent_id)
            .bind(d.result)
            .bind(d.n)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(records)
    }
}

insert_key_fn!(Sqlite);

impl Store for SqliteStore {
    shared_store_methods!("sqlite");
}

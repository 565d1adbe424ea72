//! What both backends share: SQL text (written so SQLite and PostgreSQL both accept it),
//! row tuples and their conversion, and a macro that implements the shared trait methods.

use crate::domain::audit::AuditRecord;
use crate::domain::{KeyMode, Ledger, Millis, OrgLimits, Plan, VerifyResult};

use super::block::{result_bit, Head};

use super::{AgentRecord, LogQuery, OrgRecord, StoreError};

/// The stored columns of `agents`, in insert order.
pub const AGENT_INSERT_COLUMNS: &str = "id, org_id, mode, name, issuer_domain, description, scopes, \
    created_at, issued_at, expires_at, revoked_at, revocation_reason";

/// What an agent read selects (`FROM agents`, not aliased): the stored columns, then
/// `verification_count`: the running totals of the agent's newest block row in each mode's
/// ledger (records are counted where they were written), two look-ups on a primary key. The
/// audit batch writes those rows anyway, so counting needs no write to the agent row.
pub const AGENT_COLUMNS: &str = "id, org_id, mode, name, issuer_domain, description, scopes, \
    created_at, issued_at, expires_at, revoked_at, revocation_reason, \
    COALESCE((SELECT c.n_valid + c.n_invalid + c.n_expired + c.n_revoked FROM audit_block_agents c \
     WHERE c.org_id = agents.org_id AND c.mode = 'live' AND c.agent_id = agents.id \
     ORDER BY c.first_seq DESC LIMIT 1), 0) + \
    COALESCE((SELECT c.n_valid + c.n_invalid + c.n_expired + c.n_revoked FROM audit_block_agents c \
     WHERE c.org_id = agents.org_id AND c.mode = 'test' AND c.agent_id = agents.id \
     ORDER BY c.first_seq DESC LIMIT 1), 0) \
    AS verification_count";

/// How many columns `AGENT_COLUMNS` selects (the length of `AgentRow`).
pub const AGENT_COLUMN_COUNT: usize = 13;

pub type AgentRow = (
    String,
    String,
    String,
    String,
    String,
    String,
    String,
    i64,
    i64,
    i64,
    Option<i64>,
    Option<String>,
    i64,
);

pub fn agent_from_row(r: AgentRow) -> Result<AgentRecord, StoreError> {
    let scopes: Vec<String> =
        serde_json::from_str(&r.6).map_err(|_| StoreError::Corrupt(format!("scopes of {}", r.0)))?;
    Ok(AgentRecord {
        mode: parse_mode(&r.2)?,
        id: r.0,
        org_id: r.1,
        name: r.3,
        issuer_domain: r.4,
        description: r.5,
        scopes,
        created_at: Millis(r.7),
        issued_at: Millis(r.8),
        expires_at: Millis(r.9),
        revoked_at: r.10.map(Millis),
        revocation_reason: r.11,
        verification_count: r.12,
    })
}

pub const ORG_COLUMNS: &str = "id, name, plan, verify_limit, other_limit, max_expiry_seconds, created_at";

pub type OrgRow = (String, String, String, i64, i64, i64, i64);

/// An organization as stored, with the limits it runs under: the spec's table on every plan
/// but enterprise, and never a token maximum over the plan's (rows written before custom
/// limits became enterprise-only may hold other values; they are not enforced).
pub fn org_from_row(r: OrgRow) -> Result<OrgRecord, StoreError> {
    let corrupt = || StoreError::Corrupt(format!("limits of organization {}", r.0));
    let plan = Plan::parse(&r.2).ok_or_else(|| StoreError::Corrupt(format!("plan {}", r.2)))?;
    let stored = OrgLimits {
        verify_per_minute: u32::try_from(r.3).map_err(|_| corrupt())?,
        other_per_minute: u32::try_from(r.4).map_err(|_| corrupt())?,
        max_expiry_seconds: u64::try_from(r.5).map_err(|_| corrupt())?,
    };
    Ok(OrgRecord {
        plan,
        limits: plan.default_limits().unwrap_or(OrgLimits {
            max_expiry_seconds: stored.max_expiry_seconds.min(plan.max_expiry_seconds()),
            ..stored
        }),
        id: r.0,
        name: r.1,
        created_at: Millis(r.6),
    })
}

/// A row of the per-record `audit_log` table of schema versions 1 and 2 (see
/// `LEGACY_PAGE_SQL`), read once to convert it to blocks.
pub type RecordRow = (
    String,
    String,
    i64,
    String,
    String,
    String,
    Option<String>,
    i64,
    i64,
    Vec<u8>,
    Vec<u8>,
);

pub fn record_from_row(r: RecordRow) -> Result<AuditRecord, StoreError> {
    Ok(AuditRecord {
        ledger: Ledger {
            org_id: r.0,
            mode: parse_mode(&r.1)?,
        },
        seq: r.2,
        id: r.3,
        agent_id: r.4,
        result: VerifyResult::parse(&r.5)
            .ok_or_else(|| StoreError::Corrupt(format!("audit result {}", r.5)))?,
        failure_reason: r.6,
        latency_us: r.7,
        requested_at: Millis(r.8),
        prev_hash: hash32(r.9)?,
        hash: hash32(r.10)?,
    })
}

pub fn hash32(v: Vec<u8>) -> Result<[u8; 32], StoreError> {
    v.try_into()
        .map_err(|_| StoreError::Corrupt("audit hash length".into()))
}

/// The newest block of a ledger; binds org, mode. Read with `ledger_head`.
pub const LEDGER_HEAD_SQL: &str = "SELECT last_seq, last_hash, n_valid, n_invalid, n_expired, n_revoked \
    FROM audit_blocks WHERE org_id = $1 AND mode = $2 ORDER BY first_seq DESC LIMIT 1";

pub type HeadRow = (i64, Vec<u8>, i64, i64, i64, i64);

/// Where the next record of a ledger goes: after its newest block, or at genesis.
pub fn ledger_head(row: Option<HeadRow>) -> Result<Head, StoreError> {
    match row {
        Some((seq, hash, v, i, e, r)) => Ok(Head {
            seq,
            hash: hash32(hash)?,
            totals: [v, i, e, r],
        }),
        None => Ok(Head::default()),
    }
}

/// Running totals of the newest block row of a ledger, or of an agent in it; binds org,
/// mode, [agent].
pub fn totals_sql(by_agent: bool) -> &'static str {
    if by_agent {
        "SELECT n_valid, n_invalid, n_expired, n_revoked FROM audit_block_agents \
         WHERE org_id = $1 AND mode = $2 AND agent_id = $3 ORDER BY first_seq DESC LIMIT 1"
    } else {
        "SELECT n_valid, n_invalid, n_expired, n_revoked FROM audit_blocks \
         WHERE org_id = $1 AND mode = $2 ORDER BY first_seq DESC LIMIT 1"
    }
}

pub fn parse_mode(s: &str) -> Result<KeyMode, StoreError> {
    KeyMode::parse(s).ok_or_else(|| StoreError::Corrupt(format!("mode {s}")))
}

pub fn scopes_json(scopes: &[String]) -> String {
    serde_json::to_string(scopes).expect("strings serialize")
}

/// The blocks a page of `GET /v1/log` reads, newest first; binds in order: org, mode,
/// [agent], [before], number of blocks. Every block it returns holds at least one matching
/// record (the agent's rows and the result bits say so exactly), except that the block
/// holding `before` may hold none below it: `limit + 2` blocks always fill a page and tell
/// whether more follow. The result test is written into the SQL as a literal (one of four
/// fixed bits) in exactly the form of the partial index of that failure's blocks, so both
/// planners use it, generic plans included.
pub fn log_blocks_sql(q: &LogQuery<'_>, sqlite: bool) -> String {
    use std::fmt::Write;
    // SQLite, without statistics, prefers the primary key to an equally long partial index:
    // name the failure's index.
    let indexed_by = |table: &str| match q.result {
        Some(r) if sqlite && r != VerifyResult::Valid => format!(" INDEXED BY {table}_{}", r.as_str()),
        _ => String::new(),
    };
    let mut sql = String::from("SELECT b.first_seq, b.last_seq, b.prev_hash, b.records FROM ");
    let mut n = 2;
    let t = if q.agent_id.is_some() {
        n += 1;
        // Each block by its primary key. PostgreSQL, on tables not analyzed yet, joined with a
        // scan of every block of the ledger per agent row (a page of 200 took 100 ms on 170k
        // records); the LATERAL, fenced by OFFSET 0, leaves it only the key look-up.
        let join = if sqlite {
            "JOIN audit_blocks b ON b.org_id = t.org_id AND b.mode = t.mode AND b.first_seq = t.first_seq"
        } else {
            "CROSS JOIN LATERAL (SELECT x.first_seq, x.last_seq, x.prev_hash, x.records FROM audit_blocks x \
             WHERE x.org_id = t.org_id AND x.mode = t.mode AND x.first_seq = t.first_seq OFFSET 0) b"
        };
        let _ = write!(
            sql,
            "audit_block_agents t{} {join} WHERE t.org_id = $1 AND t.mode = $2 AND t.agent_id = $3",
            indexed_by("audit_block_agents")
        );
        "t"
    } else {
        let _ = write!(
            sql,
            "audit_blocks b{} WHERE b.org_id = $1 AND b.mode = $2",
            indexed_by("audit_blocks")
        );
        "b"
    };
    if let Some(r) = q.result {
        let _ = write!(sql, " AND ({t}.results & {}) <> 0", result_bit(r));
    }
    if q.before_seq.is_some() {
        n += 1;
        let _ = write!(sql, " AND {t}.first_seq < ${n}");
    }
    let _ = write!(sql, " ORDER BY {t}.first_seq DESC LIMIT ${}", n + 1);
    sql
}

/// The blocks holding the records after `after_seq`, oldest first; binds org, mode,
/// after_seq, number of blocks. Starts at the block holding `after_seq + 1`, found on the
/// primary key, so reading a long chain page by page costs the same at its end.
pub const CHAIN_BLOCKS_SQL: &str = "SELECT first_seq, last_seq, prev_hash, records FROM audit_blocks \
    WHERE org_id = $1 AND mode = $2 AND first_seq >= COALESCE((SELECT MAX(first_seq) FROM audit_blocks \
    WHERE org_id = $1 AND mode = $2 AND first_seq <= $3 + 1), 0) ORDER BY first_seq LIMIT $4";

/// Implements the `Store` methods whose SQL is the same on both backends.
/// Expects `self.pool` and inherent `append_audit_impl`, `close_pools`, `pools`.
macro_rules! shared_store_methods {
    ($backend:literal) => {
        fn backend(&self) -> &'static str {
            $backend
        }

        fn pool_stats(&self) -> Vec<super::PoolStats> {
            self.pools()
        }

        fn ping(&self) -> StoreFuture<'_, ()> {
            Box::pin(async move {
                sqlx::query("SELECT 1").execute(&self.pool).await?;
                Ok(())
            })
        }

        fn close(&self) -> futures_util::future::BoxFuture<'_, ()> {
            Box::pin(self.close_pools())
        }

        fn count_orgs(&self) -> StoreFuture<'_, i64> {
            Box::pin(async move {
                let (n,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM orgs")
                    .fetch_one(&self.pool)
                    .await?;
                Ok(n)
            })
        }

        fn create_org<'a>(&'a self, org: &'a OrgRecord, keys: &'a [NewApiKey]) -> StoreFuture<'a, ()> {
            Box::pin(async move {
                let mut tx = self.pool.begin().await?;
                sqlx::query(&format!(
                    "INSERT INTO orgs ({}) VALUES ($1, $2, $3, $4, $5, $6, $7)",
                    common::ORG_COLUMNS
                ))
                .bind(&org.id)
                .bind(&org.name)
                .bind(org.plan.as_str())
                .bind(i64::from(org.limits.verify_per_minute))
                .bind(i64::from(org.limits.other_per_minute))
                .bind(org.limits.max_expiry_seconds as i64)
                .bind(org.created_at.0)
                .execute(&mut *tx)
                .await?;
                for key in keys {
                    insert_key_query(key).execute(&mut *tx).await?;
                }
                tx.commit().await?;
                Ok(())
            })
        }

        fn update_org<'a>(&'a self, org: &'a OrgRecord) -> StoreFuture<'a, bool> {
            Box::pin(async move {
                let done = sqlx::query(
                    "UPDATE orgs SET plan = $2, verify_limit = $3, other_limit = $4, \
                     max_expiry_seconds = $5 WHERE id = $1",
                )
                .bind(&org.id)
                .bind(org.plan.as_str())
                .bind(i64::from(org.limits.verify_per_minute))
                .bind(i64::from(org.limits.other_per_minute))
                .bind(org.limits.max_expiry_seconds as i64)
                .execute(&self.pool)
                .await?;
                Ok(done.rows_affected() == 1)
            })
        }

        fn get_org<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Option<OrgRecord>> {
            Box::pin(async move {
                let row: Option<common::OrgRow> =
                    sqlx::query_as(&format!("SELECT {} FROM orgs WHERE id = $1", common::ORG_COLUMNS))
                        .bind(id)
                        .fetch_optional(&self.pool)
                        .await?;
                row.map(common::org_from_row).transpose()
            })
        }

        fn insert_key<'a>(&'a self, key: &'a NewApiKey) -> StoreFuture<'a, ()> {
            Box::pin(async move {
                insert_key_query(key).execute(&self.pool).await?;
                Ok(())
            })
        }

        fn find_key<'a>(&'a self, key_hash: &'a [u8; 32]) -> StoreFuture<'a, Option<KeyRecord>> {
            Box::pin(async move {
                let row: Option<(String, String, Option<i64>, String)> = sqlx::query_as(
                    "SELECT kind, mode, disabled_at, org_id FROM api_keys WHERE key_hash = $1",
                )
                .bind(&key_hash[..])
                .fetch_optional(&self.pool)
                .await?;
                let Some((kind, mode, disabled_at, org_id)) = row else {
                    return Ok(None);
                };
                let org = self
                    .get_org(&org_id)
                    .await?
                    .ok_or_else(|| StoreError::Corrupt(format!("key of missing organization {org_id}")))?;
                Ok(Some(KeyRecord {
                    org,
                    kind: ApiKeyKind::parse(&kind)
                        .ok_or_else(|| StoreError::Corrupt(format!("key kind {kind}")))?,
                    mode: common::parse_mode(&mode)?,
                    disabled: disabled_at.is_some(),
                }))
            })
        }

        fn disable_key<'a>(&'a self, key_hash: &'a [u8; 32], at: Millis) -> StoreFuture<'a, bool> {
            Box::pin(async move {
                let done = sqlx::query(
                    "UPDATE api_keys SET disabled_at = COALESCE(disabled_at, $2) WHERE key_hash = $1",
                )
                .bind(&key_hash[..])
                .bind(at.0)
                .execute(&self.pool)
                .await?;
                Ok(done.rows_affected() == 1)
            })
        }

        fn insert_agent<'a>(&'a self, a: &'a AgentRecord) -> StoreFuture<'a, ()> {
            Box::pin(async move {
                sqlx::query(&format!(
                    "INSERT INTO agents ({}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
                    common::AGENT_INSERT_COLUMNS
                ))
                .bind(&a.id)
                .bind(&a.org_id)
                .bind(a.mode.as_str())
                .bind(&a.name)
                .bind(&a.issuer_domain)
                .bind(&a.description)
                .bind(common::scopes_json(&a.scopes))
                .bind(a.created_at.0)
                .bind(a.issued_at.0)
                .bind(a.expires_at.0)
                .bind(a.revoked_at.map(|m| m.0))
                .bind(a.revocation_reason.as_deref())
                .execute(&self.pool)
                .await?;
                Ok(())
            })
        }

        fn get_agent<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Option<AgentRecord>> {
            Box::pin(async move {
                let row: Option<common::AgentRow> =
                    sqlx::query_as(&format!("SELECT {} FROM agents WHERE id = $1", common::AGENT_COLUMNS))
                        .bind(id)
                        .fetch_optional(&self.pool)
                        .await?;
                row.map(common::agent_from_row).transpose()
            })
        }

        fn list_agents<'a>(&'a self, org_id: &'a str, mode: KeyMode) -> StoreFuture<'a, Vec<AgentRecord>> {
            Box::pin(async move {
                let rows: Vec<common::AgentRow> = sqlx::query_as(&format!(
                    "SELECT {} FROM agents WHERE org_id = $1 AND mode = $2 ORDER BY id DESC",
                    common::AGENT_COLUMNS
                ))
                .bind(org_id)
                .bind(mode.as_str())
                .fetch_all(&self.pool)
                .await?;
                rows.into_iter().map(common::agent_from_row).collect()
            })
        }

        fn scan_agents<'a>(&'a self, after_id: &'a str, limit: u32) -> StoreFuture<'a, Vec<AgentRecord>> {
            Box::pin(async move {
                let rows: Vec<common::AgentRow> = sqlx::query_as(&format!(
                    "SELECT {} FROM agents WHERE id > $1 ORDER BY id LIMIT $2",
                    common::AGENT_COLUMNS
                ))
                .bind(after_id)
                .bind(i64::from(limit))
                .fetch_all(&self.pool)
                .await?;
                rows.into_iter().map(common::agent_from_row).collect()
            })
        }

        fn renew_token<'a>(&'a self, id: &'a str, issued_at: Millis, expires_at: Millis) -> StoreFuture<'a, bool> {
            Box::pin(async move {
                let done = sqlx::query(
                    "UPDATE agents SET issued_at = $2, expires_at = $3 WHERE id = $1 AND revoked_at IS NULL",
                )
                .bind(id)
                .bind(issued_at.0)
                .bind(expires_at.0)
                .execute(&self.pool)
                .await?;
                Ok(done.rows_affected() == 1)
            })
        }

        fn revoke_agent<'a>(
            &'a self,
            id: &'a str,
            at: Millis,
            reason: Option<&'a str>,
        ) -> StoreFuture<'a, Option<(AgentRecord, Option<i64>)>> {
            Box::pin(async move {
                // The trigger of migration 0004 moves the revocation epoch and stamps it.
                sqlx::query(
                    "UPDATE agents SET revoked_at = $2, revocation_reason = $3 \
                     WHERE id = $1 AND revoked_at IS NULL",
                )
                .bind(id)
                .bind(at.0)
                .bind(reason)
                .execute(&self.pool)
                .await?;
                use sqlx::{FromRow, Row};
                let row = sqlx::query(&format!(
                    "SELECT {}, revoked_epoch FROM agents WHERE id = $1",
                    common::AGENT_COLUMNS
                ))
                .bind(id)
                .fetch_optional(&self.pool)
                .await?;
                let Some(row) = row else { return Ok(None) };
                // The agent's columns come first, as `get_agent` reads them; the stamp last.
                let epoch: Option<i64> = row.try_get(common::AGENT_COLUMN_COUNT)?;
                let agent = common::agent_from_row(common::AgentRow::from_row(&row)?)?;
                Ok(Some((agent, epoch)))
            })
        }

        fn revocations_after(&self, after: i64) -> StoreFuture<'_, crate::store::Revocations> {
            Box::pin(async move {
                // One statement, so the epoch and the list come from the same snapshot; the
                // epoch's row is the one without an agent id.
                let rows: Vec<(Option<String>, Option<String>, i64)> = sqlx::query_as(
                    "SELECT CAST(NULL AS TEXT), CAST(NULL AS TEXT), epoch FROM revocation_epoch WHERE id = 1 \
                     UNION ALL \
                     SELECT id, revocation_reason, revoked_epoch FROM agents WHERE revoked_epoch > $1",
                )
                .bind(after)
                .fetch_all(&self.pool)
                .await?;
                let mut out = crate::store::Revocations::default();
                for (id, reason, epoch) in rows {
                    match id {
                        Some(id) => out.revoked.push((id, reason)),
                        None => out.epoch = epoch,
                    }
                }
                Ok(out)
            })
        }

        fn append_audit(&self, entries: Vec<AuditEntry>) -> StoreFuture<'_, Vec<AuditRecord>> {
            Box::pin(self.append_audit_impl(entries))
        }

        fn read_log<'a>(&'a self, q: LogQuery<'a>) -> StoreFuture<'a, LogPage> {
            Box::pin(async move {
                let sql = common::log_blocks_sql(&q, $backend == "sqlite");
                let mut query = sqlx::query_as::<_, block::StoredBlockRow>(&sql)
                    .bind(&q.ledger.org_id)
                    .bind(q.ledger.mode.as_str());
                if let Some(agent) = q.agent_id {
                    query = query.bind(agent);
                }
                if let Some(before) = q.before_seq {
                    query = query.bind(before);
                }
                let blocks = query.bind(i64::from(q.limit) + 2).fetch_all(&self.pool).await?;
                let want = q.limit as usize + 1;
                let mut records = Vec::with_capacity(want);
                for b in blocks.into_iter().map(block::StoredBlock::from) {
                    let mut found = block::decode(q.ledger, &b, |p| {
                        q.before_seq.map_or(true, |before| p.seq < before)
                            && q.agent_id.map_or(true, |a| p.agent_id == a)
                            && q.result.map_or(true, |r| p.result == r)
                    })?;
                    found.reverse();
                    records.extend(found);
                    if records.len() >= want {
                        break;
                    }
                }
                let has_more = records.len() > q.limit as usize;
                records.truncate(q.limit as usize);
                let totals: Option<(i64, i64, i64, i64)> = {
                    let query = sqlx::query_as(common::totals_sql(q.agent_id.is_some()))
                        .bind(&q.ledger.org_id)
                        .bind(q.ledger.mode.as_str());
                    match q.agent_id {
                        Some(agent) => query.bind(agent),
                        None => query,
                    }
                    .fetch_optional(&self.pool)
                    .await?
                };
                let totals = totals.map_or([0; 4], |t| [t.0, t.1, t.2, t.3]);
                Ok(LogPage {
                    records,
                    has_more,
                    total: match q.result {
                        Some(r) => totals[block::result_index(r)],
                        None => totals.iter().sum(),
                    },
                })
            })
        }

        fn read_chain<'a>(
            &'a self,
            ledger: &'a Ledger,
            after_seq: i64,
            limit: u32,
        ) -> StoreFuture<'a, Vec<AuditRecord>> {
            Box::pin(async move {
                // Every block holds at least one record: `limit + 1` blocks hold `limit`
                // records after `after_seq` if there are that many.
                let blocks: Vec<block::StoredBlockRow> = sqlx::query_as(common::CHAIN_BLOCKS_SQL)
                    .bind(&ledger.org_id)
                    .bind(ledger.mode.as_str())
                    .bind(after_seq)
                    .bind(i64::from(limit) + 1)
                    .fetch_all(&self.pool)
                    .await?;
                let mut records = Vec::new();
                for b in blocks.into_iter().map(block::StoredBlock::from) {
                    records.extend(block::decode(ledger, &b, |p| p.seq > after_seq)?);
                    if records.len() >= limit as usize {
                        break;
                    }
                }
                records.truncate(limit as usize);
                Ok(records)
            })
        }

        fn ledgers(&self) -> StoreFuture<'_, Vec<Ledger>> {
            Box::pin(async move {
                let rows: Vec<(String, String)> =
                    sqlx::query_as("SELECT DISTINCT org_id, mode FROM audit_blocks ORDER BY org_id, mode")
                        .fetch_all(&self.pool)
                        .await?;
                rows.into_iter()
                    .map(|(org_id, mode)| Ok(Ledger { org_id, mode: common::parse_mode(&mode)? }))
                    .collect()
            })
        }
    };
}

pub(crate) use shared_store_methods;

/// Rows of the legacy `audit_log` after a position, in ledger and sequence order; binds org,
/// mode, seq, limit.
pub const LEGACY_PAGE_SQL: &str = "SELECT org_id, mode, seq, id, agent_id, result, failure_reason, \
    latency_us, requested_at, prev_hash, hash FROM audit_log WHERE (org_id, mode, seq) > ($1, $2, $3) \
    ORDER BY org_id, mode, seq LIMIT $4";

/// Implements `convert_legacy_log`: if the database still has the per-record `audit_log` of
/// schema versions 1 and 2, its records become blocks (cut wherever the stored chain does
/// not link, so a break stays visible) and it is dropped with `audit_counts`, all in one
/// transaction: a crash leaves either the old tables or the new blocks. Running totals are
/// recounted from the records. Expects an inherent `write_blocks(conn, blocks)`.
macro_rules! convert_legacy_log {
    (begin: $begin:literal, lock: $lock:literal, exists: $exists:literal, freeze: $freeze:literal) => {
        async fn convert_legacy_log(&self) -> Result<(), StoreError> {
            let mut tx = self.pool.begin_with($begin).await?;
            sqlx::query($lock).execute(&mut *tx).await?;
            let (exists,): (bool,) = sqlx::query_as($exists).fetch_one(&mut *tx).await?;
            if !exists {
                return Ok(());
            }
            // An instance of the old version still running must not commit records the scan
            // has passed: it waits, then fails on the dropped table.
            sqlx::query($freeze).execute(&mut *tx).await?;
            let mut heads = block::Heads::new();
            let mut after = (String::new(), String::new(), 0i64);
            let mut converted = 0usize;
            loop {
                let rows: Vec<common::RecordRow> = sqlx::query_as(common::LEGACY_PAGE_SQL)
                    .bind(&after.0)
                    .bind(&after.1)
                    .bind(after.2)
                    .bind(10_000i64)
                    .fetch_all(&mut *tx)
                    .await?;
                let Some(last) = rows.last() else { break };
                after = (last.0.clone(), last.1.clone(), last.2);
                converted += rows.len();
                let records = rows
                    .into_iter()
                    .map(|r| {
                        let at = format!("{}/{} seq {}", r.0, r.1, r.2);
                        common::record_from_row(r).map_err(|e| {
                            StoreError::Corrupt(format!(
                                "converting audit_log to blocks, record {at}: {e}; the old tables \
                                 are unchanged (repair or remove that row, then start again)"
                            ))
                        })
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                let blocks = block::plan(&records, &mut heads);
                Self::write_blocks(&mut *tx, &blocks).await?;
            }
            sqlx::query("DROP TABLE audit_counts")
                .execute(&mut *tx)
                .await?;
            sqlx::query("DROP TABLE audit_log")
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            // A new database has the table too (migration 1 creates it): say nothing then.
            if converted > 0 {
                tracing::info!(
                    records = converted,
                    ledgers = heads.len(),
                    "converted the audit log to blocks"
                );
            }
            Ok(())
        }
    };
}

pub(crate) use convert_legacy_log;

/// The `INSERT` of one API key (used alone and inside `create_org`'s transaction).
macro_rules! insert_key_fn {
    ($db:ty) => {
        fn insert_key_query(
            key: &NewApiKey,
        ) -> sqlx::query::Query<'_, $db, <$db as sqlx::Database>::Arguments<'_>> {
            sqlx::query(
                "INSERT INTO api_keys (key_hash, org_id, kind, mode, hint, created_at, disabled_at) \
                 VALUES ($1, $2, $3, $4, $5, $6, NULL)",
            )
            .bind(&key.key_hash[..])
            .bind(&key.org_id)
            .bind(key.kind.as_str())
            .bind(key.mode.as_str())
            .bind(&key.hint)
            .bind(key.created_at.0)
        }
    };
}

pub(crate) use insert_key_fn;

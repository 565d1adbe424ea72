//! What both backends share: [`SqlStore`], which implements [`Store`] once for any
//! [`Backend`], with the SQL both SQLite and PostgreSQL accept and the typed rows it reads.
//! A backend (`sqlite.rs`, `postgres.rs`) supplies only what differs: connecting, appending
//! an audit batch, and its pools.

use std::fmt;

use futures_util::future::BoxFuture;
use sqlx::{Database, Encode, Executor, FromRow, IntoArguments, Pool, Type};

use super::block::{self, AgentBlockRow, FullBlock, Head, StoredBlock};
use super::{
    AgentRecord, Appended, CheckedBlock, KeyRecord, LogPage, LogQuery, NewApiKey, OrgRecord, PoolStats,
    Revocations, SharedBuckets, SigningKeyRecord, Store, StoreError, StoreFuture, StoredCheckpoint,
};
use crate::domain::audit::{AuditEntry, AuditRecord};
use crate::domain::{ApiKeyKind, KeyMode, Ledger, Millis, OrgLimits, Plan, Totals, VerifyResult};
use crate::tlog::tree::{Hash, Subtree};

/// What a backend does its own way. Implemented by the database types themselves
/// (`sqlx::Sqlite`, `sqlx::Postgres`).
pub trait Backend: Database {
    /// As `Store::backend` names it.
    const BACKEND: &'static str;
    /// What the backend keeps beside its main pool.
    type Extra: Send + Sync + fmt::Debug + 'static;
    /// A transaction that no other such transaction runs beside, on any instance: the
    /// store's one-time work (recording the fleet's signing key, the first organization,
    /// dropping the empty per-record log tables) takes it.
    const EXCLUSIVE: Exclusive;
    /// Selects whether the per-record `audit_log` of schema 1 and 2 still exists.
    const LEGACY_LOG_EXISTS: &'static str;
    /// Inside the exclusive transaction's `begin`, binding org and mode: waits for any other
    /// instance checkpointing the same ledger (none needed where `begin` already serializes).
    const CHECKPOINT_LOCK: Option<&'static str>;
    /// How a page of the log must be written for this backend's planner to use the indexes
    /// (see `log_blocks_sql`).
    const LOG_PLAN: LogPlan;

    /// Appends a batch as one unit: every record, or nothing and the entries back.
    fn append(
        store: &SqlStore<Self>,
        entries: Vec<AuditEntry>,
    ) -> BoxFuture<'_, Result<Vec<AuditRecord>, Refused>>;
    /// The store's shared rate-limit buckets, if a fleet shares them.
    fn shared_buckets(store: &SqlStore<Self>) -> Option<&dyn SharedBuckets>;
    /// Rows an `UPDATE` changed (sqlx has no trait for it).
    fn rows_affected(done: &Self::QueryResult) -> u64;
    /// Connections of each pool.
    fn pools(store: &SqlStore<Self>) -> Vec<PoolStats>;
    /// Closes every pool; pending work finishes first.
    fn close(store: &SqlStore<Self>) -> BoxFuture<'_, ()>;
}

/// How a log page's SQL is written for a backend's planner.
pub struct LogPlan {
    /// Name the failure's partial index (`INDEXED BY`): SQLite, without statistics, prefers
    /// the primary key to an equally long partial index.
    pub name_index: bool,
    /// Look each block of an agent's rows up through a fenced `LATERAL` (PostgreSQL, on tables
    /// not analyzed yet, joined with a scan of every block of the ledger per agent row).
    pub lateral_join: bool,
}

/// A batch the store did not take: why, and its entries as they were handed in.
pub type Refused = (StoreError, Vec<AuditEntry>);

/// How a backend opens an exclusive transaction: `begin`, then `lock`, which waits for any
/// other exclusive transaction to end.
pub struct Exclusive {
    pub begin: &'static str,
    pub lock: &'static str,
}

/// A store on a SQL database: its main pool, and what its backend keeps beside it.
#[derive(Debug)]
pub struct SqlStore<DB: Backend> {
    pub(super) pool: Pool<DB>,
    pub(super) extra: DB::Extra,
}

/// The stored columns of `agents`, in insert order.
const AGENT_INSERT_COLUMNS: &str = "id, org_id, mode, name, issuer_domain, description, scopes, \
    created_at, issued_at, expires_at, revoked_at, revocation_reason";

/// What an agent read selects (`FROM agents`, not aliased): the stored columns, then
/// `verification_count`: the running totals of the agent's newest block row in each mode's
/// ledger (records are counted where they were written), two look-ups on a primary key. The
/// audit batch writes those rows anyway, so counting needs no write to the agent row.
const AGENT_COLUMNS: &str = "id, org_id, mode, name, issuer_domain, description, scopes, \
    created_at, issued_at, expires_at, revoked_at, revocation_reason, \
    COALESCE((SELECT c.n_valid + c.n_invalid + c.n_expired + c.n_revoked FROM audit_block_agents c \
     WHERE c.org_id = agents.org_id AND c.mode = 'live' AND c.agent_id = agents.id \
     ORDER BY c.first_seq DESC LIMIT 1), 0) + \
    COALESCE((SELECT c.n_valid + c.n_invalid + c.n_expired + c.n_revoked FROM audit_block_agents c \
     WHERE c.org_id = agents.org_id AND c.mode = 'test' AND c.agent_id = agents.id \
     ORDER BY c.first_seq DESC LIMIT 1), 0) \
    AS verification_count";

/// An agent as `AGENT_COLUMNS` selects it.
#[derive(FromRow)]
struct AgentRow {
    id: String,
    org_id: String,
    mode: String,
    name: String,
    issuer_domain: String,
    description: String,
    /// A JSON array of strings.
    scopes: String,
    created_at: i64,
    issued_at: i64,
    expires_at: i64,
    revoked_at: Option<i64>,
    revocation_reason: Option<String>,
    verification_count: i64,
}

impl AgentRow {
    fn into_record(self) -> Result<AgentRecord, StoreError> {
        let scopes: Vec<String> = serde_json::from_str(&self.scopes)
            .map_err(|_| StoreError::Corrupt(format!("scopes of {}", self.id)))?;
        Ok(AgentRecord {
            mode: parse_mode(&self.mode)?,
            id: self.id,
            org_id: self.org_id,
            name: self.name,
            issuer_domain: self.issuer_domain,
            description: self.description,
            scopes,
            created_at: Millis(self.created_at),
            issued_at: Millis(self.issued_at),
            expires_at: Millis(self.expires_at),
            revoked_at: self.revoked_at.map(Millis),
            revocation_reason: self.revocation_reason,
            verification_count: self.verification_count,
        })
    }
}

/// An agent right after a revocation, with the epoch the revocation was stamped with.
#[derive(FromRow)]
struct RevokedAgentRow {
    #[sqlx(flatten)]
    agent: AgentRow,
    revoked_epoch: Option<i64>,
}

const ORG_COLUMNS: &str = "id, name, plan, verify_limit, other_limit, max_expiry_seconds, created_at";

#[derive(FromRow)]
struct OrgRow {
    id: String,
    name: String,
    plan: String,
    verify_limit: i64,
    other_limit: i64,
    max_expiry_seconds: i64,
    created_at: i64,
}

impl OrgRow {
    /// The organization with the limits it runs under ([`OrgLimits::in_force`]).
    fn into_record(self) -> Result<OrgRecord, StoreError> {
        let corrupt = || StoreError::Corrupt(format!("limits of organization {}", self.id));
        let plan =
            Plan::parse(&self.plan).ok_or_else(|| StoreError::Corrupt(format!("plan {}", self.plan)))?;
        let stored = OrgLimits {
            verify_per_minute: u32::try_from(self.verify_limit).map_err(|_| corrupt())?,
            other_per_minute: u32::try_from(self.other_limit).map_err(|_| corrupt())?,
            max_expiry_seconds: u64::try_from(self.max_expiry_seconds).map_err(|_| corrupt())?,
        };
        Ok(OrgRecord {
            plan,
            limits: OrgLimits::in_force(plan, stored),
            id: self.id,
            name: self.name,
            created_at: Millis(self.created_at),
        })
    }
}

#[derive(FromRow)]
struct KeyRow {
    kind: String,
    mode: String,
    disabled_at: Option<i64>,
    org_id: String,
}

/// The newest block of a ledger; binds org, mode. Read as a [`HeadRow`].
pub const LEDGER_HEAD_SQL: &str = "SELECT last_seq, last_hash, n_valid, n_invalid, n_expired, n_revoked \
    FROM audit_blocks WHERE org_id = $1 AND mode = $2 ORDER BY first_seq DESC LIMIT 1";

#[derive(FromRow)]
pub struct HeadRow {
    last_seq: i64,
    last_hash: Vec<u8>,
    #[sqlx(flatten)]
    totals: TotalsRow,
}

/// Where the next record of a ledger goes: after its newest block, or at genesis.
pub fn ledger_head(row: Option<HeadRow>) -> Result<Head, StoreError> {
    match row {
        Some(h) => Ok(Head {
            seq: h.last_seq,
            hash: hash32(h.last_hash)?,
            totals: h.totals.into(),
        }),
        None => Ok(Head::default()),
    }
}

/// Running totals of a ledger or an agent, as stored.
#[derive(FromRow)]
struct TotalsRow {
    n_valid: i64,
    n_invalid: i64,
    n_expired: i64,
    n_revoked: i64,
}

impl From<TotalsRow> for Totals {
    fn from(t: TotalsRow) -> Self {
        [t.n_valid, t.n_invalid, t.n_expired, t.n_revoked]
    }
}

/// Running totals of the newest block row of a ledger, or of an agent in it; binds org,
/// mode, [agent].
fn totals_sql(by_agent: bool) -> &'static str {
    if by_agent {
        "SELECT n_valid, n_invalid, n_expired, n_revoked FROM audit_block_agents \
         WHERE org_id = $1 AND mode = $2 AND agent_id = $3 ORDER BY first_seq DESC LIMIT 1"
    } else {
        "SELECT n_valid, n_invalid, n_expired, n_revoked FROM audit_blocks \
         WHERE org_id = $1 AND mode = $2 ORDER BY first_seq DESC LIMIT 1"
    }
}

/// One row of `revocations_after`: the epoch's own row has no agent.
#[derive(FromRow)]
struct RevocationRow {
    id: Option<String>,
    reason: Option<String>,
    epoch: i64,
}

pub fn hash32(v: Vec<u8>) -> Result<[u8; 32], StoreError> {
    v.try_into()
        .map_err(|_| StoreError::Corrupt("audit hash length".into()))
}

pub fn parse_mode(s: &str) -> Result<KeyMode, StoreError> {
    KeyMode::parse(s).ok_or_else(|| StoreError::Corrupt(format!("mode {s}")))
}

fn scopes_json(scopes: &[String]) -> String {
    serde_json::to_string(scopes).expect("strings serialize")
}

/// The blocks a page of `GET /v1/log` reads, newest first; binds in order: org, mode,
/// [agent], [before], number of blocks. Every block it returns holds at least one matching
/// record (the agent's rows and the result bits say so exactly), except that the block
/// holding `before` may hold none below it: `limit + 2` blocks always fill a page and tell
/// whether more follow. The result test is written into the SQL as a literal (one of four
/// fixed bits) in exactly the form of the partial index of that failure's blocks, so both
/// planners use it, generic plans included.
fn log_blocks_sql(q: &LogQuery<'_>, plan: &LogPlan) -> String {
    use std::fmt::Write;
    let indexed_by = |table: &str| match q.result {
        Some(r) if plan.name_index && r != VerifyResult::Valid => {
            format!(" INDEXED BY {table}_{}", r.as_str())
        }
        _ => String::new(),
    };
    let mut sql = String::from("SELECT b.first_seq, b.last_seq, b.prev_hash, b.records FROM ");
    let mut n = 2;
    let t = if q.agent_id.is_some() {
        n += 1;
        // Each block by its primary key. PostgreSQL, on tables not analyzed yet, joined with a
        // scan of every block of the ledger per agent row (a page of 200 took 100 ms on 170k
        // records); the LATERAL, fenced by OFFSET 0, leaves it only the key look-up.
        let join = if !plan.lateral_join {
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
        let _ = write!(sql, " AND ({t}.results & {}) <> 0", r.bit());
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
#[cfg(feature = "test-hooks")]
const CHAIN_BLOCKS_SQL: &str = "SELECT first_seq, last_seq, prev_hash, records FROM audit_blocks \
    WHERE org_id = $1 AND mode = $2 AND first_seq >= COALESCE((SELECT MAX(first_seq) FROM audit_blocks \
    WHERE org_id = $1 AND mode = $2 AND first_seq <= $3 + 1), 0) ORDER BY first_seq LIMIT $4";

/// The blocks holding `seq` `$3..=$4` of a ledger, oldest first; binds org, mode, first, last.
const RANGE_BLOCKS_SQL: &str = "SELECT first_seq, last_seq, prev_hash, records FROM audit_blocks \
    WHERE org_id = $1 AND mode = $2 AND first_seq >= COALESCE((SELECT MAX(first_seq) FROM audit_blocks \
    WHERE org_id = $1 AND mode = $2 AND first_seq <= $3), 0) AND first_seq <= $4 ORDER BY first_seq";

const CHECKPOINT_COLUMNS: &str = "org_id, mode, tree_size, root, note, created_at";

#[derive(FromRow)]
pub struct CheckpointRow {
    org_id: String,
    mode: String,
    tree_size: i64,
    root: Vec<u8>,
    note: String,
    created_at: i64,
}

impl CheckpointRow {
    fn into_record(self) -> Result<StoredCheckpoint, StoreError> {
        Ok(StoredCheckpoint {
            ledger: Ledger {
                mode: parse_mode(&self.mode)?,
                org_id: self.org_id,
            },
            size: u64::try_from(self.tree_size)
                .map_err(|_| StoreError::Corrupt("checkpoint tree size".into()))?,
            root: hash32(self.root)?,
            note: self.note,
            created_at: Millis(self.created_at),
        })
    }
}

/// Stored subtree hashes go in statements of this many rows.
const NODES_PER_INSERT: usize = 200;

fn seq_i64(n: u64) -> Result<i64, StoreError> {
    i64::try_from(n).map_err(|_| StoreError::Corrupt(format!("sequence number {n} out of range")))
}

/// Inserts an organization and its keys inside the caller's transaction.
async fn insert_org<DB: Database>(
    tx: &mut sqlx::Transaction<'_, DB>,
    org: &OrgRecord,
    keys: &[NewApiKey],
) -> Result<(), StoreError>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> &'q [u8]: Encode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
{
    let sql = format!("INSERT INTO orgs ({ORG_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7)");
    sqlx::query(&sql)
        .bind(org.id.as_str())
        .bind(org.name.as_str())
        .bind(org.plan.as_str())
        .bind(i64::from(org.limits.verify_per_minute))
        .bind(i64::from(org.limits.other_per_minute))
        .bind(org.limits.max_expiry_seconds as i64)
        .bind(org.created_at.0)
        .execute(&mut **tx)
        .await?;
    for key in keys {
        insert_key(key).execute(&mut **tx).await?;
    }
    Ok(())
}

/// The `INSERT` of one API key (used alone and inside `create_org`'s transaction).
fn insert_key<'q, DB: Database>(key: &'q NewApiKey) -> sqlx::query::Query<'q, DB, DB::Arguments<'q>>
where
    &'q [u8]: Encode<'q, DB> + Type<DB>,
    &'q str: Encode<'q, DB> + Type<DB>,
    i64: Encode<'q, DB> + Type<DB>,
{
    sqlx::query(
        "INSERT INTO api_keys (key_hash, org_id, kind, mode, hint, created_at, disabled_at) \
         VALUES ($1, $2, $3, $4, $5, $6, NULL)",
    )
    .bind(&key.key_hash[..])
    .bind(key.org_id.as_str())
    .bind(key.kind.as_str())
    .bind(key.mode.as_str())
    .bind(key.hint.as_str())
    .bind(key.created_at.0)
}

impl<DB: Backend> SqlStore<DB>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
{
    /// Opens an exclusive transaction (`Backend::EXCLUSIVE`).
    async fn exclusive(&self) -> Result<sqlx::Transaction<'static, DB>, StoreError> {
        let mut tx = self.pool.begin_with(DB::EXCLUSIVE.begin).await?;
        sqlx::query(DB::EXCLUSIVE.lock).execute(&mut *tx).await?;
        Ok(tx)
    }
}

#[derive(FromRow)]
pub struct SigningKeyRow {
    kid: String,
    public_key: Vec<u8>,
    created_at: i64,
    private_key: Option<Vec<u8>>,
    activates_at: Option<i64>,
    retired_at: Option<i64>,
    last_expires_at: Option<i64>,
}

impl SigningKeyRow {
    fn into_record(self) -> Result<SigningKeyRecord, StoreError> {
        let public_key = self
            .public_key
            .try_into()
            .map_err(|_| StoreError::Corrupt(format!("public key of signing key {}", self.kid)))?;
        Ok(SigningKeyRecord {
            kid: self.kid,
            public_key,
            created_at: Millis(self.created_at),
            sealed: self.private_key,
            activates_at: self.activates_at.map(Millis),
            retired_at: self.retired_at.map(Millis),
            last_expires_at: self.last_expires_at.map(Millis),
        })
    }
}

const SIGNING_KEYS_SQL: &str = "SELECT kid, public_key, created_at, private_key, activates_at, retired_at, \
     last_expires_at FROM signing_keys ORDER BY created_at, kid";

const INSERT_SIGNING_KEY_SQL: &str = "INSERT INTO signing_keys \
     (kid, public_key, created_at, private_key, activates_at, retired_at, last_expires_at) \
     VALUES ($1, $2, $3, $4, $5, $6, $7)";

fn insert_signing_key<'q, DB: Database>(
    key: &'q SigningKeyRecord,
) -> sqlx::query::Query<'q, DB, DB::Arguments<'q>>
where
    &'q [u8]: Encode<'q, DB> + Type<DB>,
    &'q str: Encode<'q, DB> + Type<DB>,
    Option<&'q [u8]>: Encode<'q, DB> + Type<DB>,
    i64: Encode<'q, DB> + Type<DB>,
    Option<i64>: Encode<'q, DB> + Type<DB>,
{
    sqlx::query(INSERT_SIGNING_KEY_SQL)
        .bind(key.kid.as_str())
        .bind(&key.public_key[..])
        .bind(key.created_at.0)
        .bind(key.sealed.as_deref())
        .bind(key.activates_at.map(|m| m.0))
        .bind(key.retired_at.map(|m| m.0))
        .bind(key.last_expires_at.map(|m| m.0))
}

/// The SQL both backends run alike. The bounds say what sqlx must be able to do with the
/// backend's types; both `Sqlite` and `Postgres` can.
impl<DB: Backend> Store for SqlStore<DB>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> &'q [u8]: Encode<'q, DB> + Type<DB>,
    for<'q> Option<&'q str>: Encode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
    for<'q> Option<i64>: Encode<'q, DB> + Type<DB>,
    for<'q> Option<&'q [u8]>: Encode<'q, DB> + Type<DB>,
    for<'q> String: Encode<'q, DB> + Type<DB>,
    for<'r> AgentRow: FromRow<'r, DB::Row>,
    for<'r> RevokedAgentRow: FromRow<'r, DB::Row>,
    for<'r> OrgRow: FromRow<'r, DB::Row>,
    for<'r> KeyRow: FromRow<'r, DB::Row>,
    for<'r> TotalsRow: FromRow<'r, DB::Row>,
    for<'r> RevocationRow: FromRow<'r, DB::Row>,
    for<'r> StoredBlock: FromRow<'r, DB::Row>,
    for<'r> (i64,): FromRow<'r, DB::Row>,
    for<'r> (bool,): FromRow<'r, DB::Row>,
    for<'r> (String, String): FromRow<'r, DB::Row>,
    for<'r> SigningKeyRow: FromRow<'r, DB::Row>,
    for<'r> CheckpointRow: FromRow<'r, DB::Row>,
    for<'r> FullBlock: FromRow<'r, DB::Row>,
    for<'r> AgentBlockRow: FromRow<'r, DB::Row>,
    for<'r> (i64, Vec<u8>): FromRow<'r, DB::Row>,
    for<'r> (String, String, String, i64): FromRow<'r, DB::Row>,
{
    fn backend(&self) -> &'static str {
        DB::BACKEND
    }

    fn pool_stats(&self) -> Vec<PoolStats> {
        DB::pools(self)
    }

    fn ping(&self) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            sqlx::query("SELECT 1").execute(&self.pool).await?;
            Ok(())
        })
    }

    fn close(&self) -> BoxFuture<'_, ()> {
        DB::close(self)
    }

    fn shared_buckets(&self) -> Option<&dyn SharedBuckets> {
        DB::shared_buckets(self)
    }

    fn upgrade(&self) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            // Looked at without a lock first: every start and every command opens the store,
            // and the exclusive transaction would make each wait for the running writers.
            let (exists,): (bool,) = sqlx::query_as(DB::LEGACY_LOG_EXISTS)
                .fetch_one(&self.pool)
                .await?;
            if !exists {
                return Ok(());
            }
            let mut tx = self.exclusive().await?;
            let (exists,): (bool,) = sqlx::query_as(DB::LEGACY_LOG_EXISTS).fetch_one(&mut *tx).await?;
            if !exists {
                return Ok(()); // another instance dropped it meanwhile
            }
            let (held,): (bool,) = sqlx::query_as("SELECT EXISTS (SELECT 1 FROM audit_log)")
                .fetch_one(&mut *tx)
                .await?;
            if held {
                return Err(StoreError::Corrupt(
                    "this database holds a per-record audit log (schema 1 or 2, written by a \
                     pre-release version), which this version does not read; its tables are \
                     unchanged"
                        .into(),
                ));
            }
            // Empty, as every database migration 1 created is: the blocks replace it.
            sqlx::query("DROP TABLE audit_counts").execute(&mut *tx).await?;
            sqlx::query("DROP TABLE audit_log").execute(&mut *tx).await?;
            tx.commit().await?;
            Ok(())
        })
    }

    fn signing_keys(&self) -> StoreFuture<'_, Vec<SigningKeyRecord>> {
        Box::pin(async move {
            let rows: Vec<SigningKeyRow> = sqlx::query_as(SIGNING_KEYS_SQL).fetch_all(&self.pool).await?;
            rows.into_iter().map(SigningKeyRow::into_record).collect()
        })
    }

    fn record_first_signing_key<'a>(
        &'a self,
        key: &'a SigningKeyRecord,
    ) -> StoreFuture<'a, Vec<SigningKeyRecord>> {
        Box::pin(async move {
            let mut tx = self.exclusive().await?;
            let recorded: Vec<SigningKeyRow> = sqlx::query_as(SIGNING_KEYS_SQL).fetch_all(&mut *tx).await?;
            if !recorded.is_empty() {
                return recorded.into_iter().map(SigningKeyRow::into_record).collect();
            }
            insert_signing_key::<DB>(key).execute(&mut *tx).await?;
            tx.commit().await?;
            Ok(vec![key.clone()])
        })
    }

    fn create_first_org<'a>(&'a self, org: &'a OrgRecord, keys: &'a [NewApiKey]) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            let mut tx = self.exclusive().await?;
            let (n,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM orgs")
                .fetch_one(&mut *tx)
                .await?;
            if n > 0 {
                return Ok(false);
            }
            insert_org(&mut tx, org, keys).await?;
            tx.commit().await?;
            Ok(true)
        })
    }

    fn add_signing_key<'a>(&'a self, key: &'a SigningKeyRecord) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            insert_signing_key::<DB>(key).execute(&self.pool).await?;
            Ok(())
        })
    }

    fn retire_signing_key<'a>(&'a self, kid: &'a str, at: Millis) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            let done =
                sqlx::query("UPDATE signing_keys SET retired_at = $2 WHERE kid = $1 AND retired_at IS NULL")
                    .bind(kid)
                    .bind(at.0)
                    .execute(&self.pool)
                    .await?;
            Ok(DB::rows_affected(&done) == 1)
        })
    }

    fn note_token_expiry<'a>(&'a self, kid: &'a str, expires_at: Millis) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            sqlx::query(
                "UPDATE signing_keys SET last_expires_at = $2 \
                 WHERE kid = $1 AND (last_expires_at IS NULL OR last_expires_at < $2)",
            )
            .bind(kid)
            .bind(expires_at.0)
            .execute(&self.pool)
            .await?;
            Ok(())
        })
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
            insert_org(&mut tx, org, keys).await?;
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
            .bind(org.id.as_str())
            .bind(org.plan.as_str())
            .bind(i64::from(org.limits.verify_per_minute))
            .bind(i64::from(org.limits.other_per_minute))
            .bind(org.limits.max_expiry_seconds as i64)
            .execute(&self.pool)
            .await?;
            Ok(DB::rows_affected(&done) == 1)
        })
    }

    fn get_org<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Option<OrgRecord>> {
        Box::pin(async move {
            let sql = format!("SELECT {ORG_COLUMNS} FROM orgs WHERE id = $1");
            let row: Option<OrgRow> = sqlx::query_as(&sql).bind(id).fetch_optional(&self.pool).await?;
            row.map(OrgRow::into_record).transpose()
        })
    }

    fn insert_key<'a>(&'a self, key: &'a NewApiKey) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            insert_key(key).execute(&self.pool).await?;
            Ok(())
        })
    }

    fn find_key<'a>(&'a self, key_hash: &'a [u8; 32]) -> StoreFuture<'a, Option<KeyRecord>> {
        Box::pin(async move {
            let row: Option<KeyRow> =
                sqlx::query_as("SELECT kind, mode, disabled_at, org_id FROM api_keys WHERE key_hash = $1")
                    .bind(&key_hash[..])
                    .fetch_optional(&self.pool)
                    .await?;
            let Some(row) = row else { return Ok(None) };
            let org = self
                .get_org(&row.org_id)
                .await?
                .ok_or_else(|| StoreError::Corrupt(format!("key of missing organization {}", row.org_id)))?;
            Ok(Some(KeyRecord {
                org,
                kind: ApiKeyKind::parse(&row.kind)
                    .ok_or_else(|| StoreError::Corrupt(format!("key kind {}", row.kind)))?,
                mode: parse_mode(&row.mode)?,
                disabled: row.disabled_at.is_some(),
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
            Ok(DB::rows_affected(&done) == 1)
        })
    }

    fn insert_agent<'a>(&'a self, a: &'a AgentRecord) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let sql = format!(
                "INSERT INTO agents ({AGENT_INSERT_COLUMNS}) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)"
            );
            sqlx::query(&sql)
                .bind(a.id.as_str())
                .bind(a.org_id.as_str())
                .bind(a.mode.as_str())
                .bind(a.name.as_str())
                .bind(a.issuer_domain.as_str())
                .bind(a.description.as_str())
                .bind(scopes_json(&a.scopes))
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
            let sql = format!("SELECT {AGENT_COLUMNS} FROM agents WHERE id = $1");
            let row: Option<AgentRow> = sqlx::query_as(&sql).bind(id).fetch_optional(&self.pool).await?;
            row.map(AgentRow::into_record).transpose()
        })
    }

    fn list_agents<'a>(&'a self, org_id: &'a str, mode: KeyMode) -> StoreFuture<'a, Vec<AgentRecord>> {
        Box::pin(async move {
            let sql = format!(
                "SELECT {AGENT_COLUMNS} FROM agents WHERE org_id = $1 AND mode = $2 ORDER BY id DESC"
            );
            let rows: Vec<AgentRow> = sqlx::query_as(&sql)
                .bind(org_id)
                .bind(mode.as_str())
                .fetch_all(&self.pool)
                .await?;
            rows.into_iter().map(AgentRow::into_record).collect()
        })
    }

    fn scan_agents<'a>(&'a self, after_id: &'a str, limit: u32) -> StoreFuture<'a, Vec<AgentRecord>> {
        Box::pin(async move {
            let sql = format!("SELECT {AGENT_COLUMNS} FROM agents WHERE id > $1 ORDER BY id LIMIT $2");
            let rows: Vec<AgentRow> = sqlx::query_as(&sql)
                .bind(after_id)
                .bind(i64::from(limit))
                .fetch_all(&self.pool)
                .await?;
            rows.into_iter().map(AgentRow::into_record).collect()
        })
    }

    fn renew_token<'a>(
        &'a self,
        id: &'a str,
        issued_at: Millis,
        expires_at: Millis,
    ) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            let done = sqlx::query(
                "UPDATE agents SET issued_at = $2, expires_at = $3 WHERE id = $1 AND revoked_at IS NULL",
            )
            .bind(id)
            .bind(issued_at.0)
            .bind(expires_at.0)
            .execute(&self.pool)
            .await?;
            Ok(DB::rows_affected(&done) == 1)
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
            let sql = format!("SELECT {AGENT_COLUMNS}, revoked_epoch FROM agents WHERE id = $1");
            let row: Option<RevokedAgentRow> =
                sqlx::query_as(&sql).bind(id).fetch_optional(&self.pool).await?;
            row.map(|r| Ok((r.agent.into_record()?, r.revoked_epoch)))
                .transpose()
        })
    }

    fn revocations_after(&self, after: i64) -> StoreFuture<'_, Revocations> {
        Box::pin(async move {
            // One statement, so the epoch and the list come from the same snapshot; the
            // epoch's row is the one without an agent id.
            let rows: Vec<RevocationRow> = sqlx::query_as(
                "SELECT CAST(NULL AS TEXT) AS id, CAST(NULL AS TEXT) AS reason, epoch \
                 FROM revocation_epoch WHERE id = 1 \
                 UNION ALL \
                 SELECT id, revocation_reason, revoked_epoch FROM agents WHERE revoked_epoch > $1",
            )
            .bind(after)
            .fetch_all(&self.pool)
            .await?;
            let mut out = Revocations::default();
            for row in rows {
                match row.id {
                    Some(id) => out.revoked.push((id, row.reason)),
                    None => out.epoch = row.epoch,
                }
            }
            Ok(out)
        })
    }

    fn append_audit(&self, entries: Vec<AuditEntry>) -> BoxFuture<'_, Appended> {
        Box::pin(async move {
            let n = entries.len();
            let (failure, entries) = match DB::append(self, entries).await {
                Ok(records) => return Appended::all(records),
                Err(refused) => refused,
            };
            let ledgers = crate::store::batch::ledgers(&entries);
            if failure.is_unavailable() || ledgers.len() < 2 {
                return Appended::none(n, failure);
            }
            // One ledger's trouble must not fail the other ledgers' records: each alone.
            tracing::warn!(error = %failure, ledgers = ledgers.len(), "audit batch refused; appending its ledgers one by one");
            let mut records: Vec<Option<AuditRecord>> = (0..n).map(|_| None).collect();
            let mut last_failure = None;
            for ledger in &ledgers {
                let (at, part): (Vec<usize>, Vec<AuditEntry>) = entries
                    .iter()
                    .enumerate()
                    .filter(|(_, e)| &e.ledger == ledger)
                    .map(|(i, e)| (i, e.clone()))
                    .unzip();
                match DB::append(self, part).await {
                    Ok(written) => {
                        for (i, r) in at.into_iter().zip(written) {
                            records[i] = Some(r);
                        }
                    }
                    Err((e, _)) => last_failure = Some(e),
                }
            }
            Appended {
                records,
                failure: last_failure,
            }
        })
    }

    fn read_log<'a>(&'a self, q: LogQuery<'a>) -> StoreFuture<'a, LogPage> {
        Box::pin(async move {
            let sql = log_blocks_sql(&q, &DB::LOG_PLAN);
            let mut query = sqlx::query_as::<_, StoredBlock>(&sql)
                .bind(q.ledger.org_id.as_str())
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
            for b in &blocks {
                let mut found = block::decode(q.ledger, b, |p| {
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
            let query = sqlx::query_as(totals_sql(q.agent_id.is_some()))
                .bind(q.ledger.org_id.as_str())
                .bind(q.ledger.mode.as_str());
            let totals: Option<TotalsRow> = match q.agent_id {
                Some(agent) => query.bind(agent),
                None => query,
            }
            .fetch_optional(&self.pool)
            .await?;
            let totals: Totals = totals.map_or([0; 4], Into::into);
            Ok(LogPage {
                records,
                has_more,
                total: match q.result {
                    Some(r) => totals[r.index()],
                    None => totals.iter().sum(),
                },
            })
        })
    }

    #[cfg(feature = "test-hooks")]
    fn read_chain<'a>(
        &'a self,
        ledger: &'a Ledger,
        after_seq: i64,
        limit: u32,
    ) -> StoreFuture<'a, Vec<AuditRecord>> {
        Box::pin(async move {
            // Every block holds at least one record: `limit + 1` blocks hold `limit`
            // records after `after_seq` if there are that many.
            let blocks: Vec<StoredBlock> = sqlx::query_as(CHAIN_BLOCKS_SQL)
                .bind(ledger.org_id.as_str())
                .bind(ledger.mode.as_str())
                .bind(after_seq)
                .bind(i64::from(limit) + 1)
                .fetch_all(&self.pool)
                .await?;
            let mut records = Vec::new();
            for b in &blocks {
                records.extend(block::decode(ledger, b, |p| p.seq > after_seq)?);
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
            let rows: Vec<(String, String)> = sqlx::query_as(
                "SELECT org_id, mode FROM audit_blocks UNION SELECT org_id, mode FROM audit_checkpoints \
                 ORDER BY org_id, mode",
            )
            .fetch_all(&self.pool)
            .await?;
            rows.into_iter()
                .map(|(org_id, mode)| {
                    Ok(Ledger {
                        org_id,
                        mode: parse_mode(&mode)?,
                    })
                })
                .collect()
        })
    }

    fn ledger_size<'a>(&'a self, ledger: &'a Ledger) -> StoreFuture<'a, u64> {
        Box::pin(async move {
            let row: Option<(i64,)> = sqlx::query_as(
                "SELECT last_seq FROM audit_blocks WHERE org_id = $1 AND mode = $2 ORDER BY first_seq DESC LIMIT 1",
            )
            .bind(ledger.org_id.as_str())
            .bind(ledger.mode.as_str())
            .fetch_optional(&self.pool)
            .await?;
            let last = row.map_or(0, |(n,)| n);
            u64::try_from(last).map_err(|_| StoreError::Corrupt(format!("last_seq {last}")))
        })
    }

    fn record_hashes<'a>(&'a self, ledger: &'a Ledger, first: u64, last: u64) -> StoreFuture<'a, Vec<Hash>> {
        Box::pin(async move {
            let (first, last) = (seq_i64(first)?, seq_i64(last)?);
            let blocks: Vec<StoredBlock> = sqlx::query_as(RANGE_BLOCKS_SQL)
                .bind(ledger.org_id.as_str())
                .bind(ledger.mode.as_str())
                .bind(first)
                .bind(last)
                .fetch_all(&self.pool)
                .await?;
            let mut out = Vec::with_capacity(usize::try_from(last - first + 1).unwrap_or(0).min(1 << 20));
            let mut next = first;
            for b in blocks.iter().filter(|b| b.last_seq >= first) {
                if b.first_seq > next {
                    return Err(StoreError::Corrupt(format!(
                        "ledger {ledger}: no block holds seq {next} (the next starts at {})",
                        b.first_seq
                    )));
                }
                block::record_hashes(b, next..=last, &mut out)?;
                next = b.last_seq + 1;
            }
            Ok(out)
        })
    }

    fn tree_nodes<'a>(
        &'a self,
        ledger: &'a Ledger,
        height: u32,
        indices: std::ops::Range<u64>,
    ) -> StoreFuture<'a, Vec<(u64, Hash)>> {
        Box::pin(async move {
            let rows: Vec<(i64, Vec<u8>)> = sqlx::query_as(
                "SELECT idx, hash FROM audit_tree_nodes WHERE org_id = $1 AND mode = $2 AND height = $3 \
                 AND idx >= $4 AND idx < $5 ORDER BY idx",
            )
            .bind(ledger.org_id.as_str())
            .bind(ledger.mode.as_str())
            .bind(i64::from(height))
            .bind(seq_i64(indices.start)?)
            .bind(seq_i64(indices.end)?)
            .fetch_all(&self.pool)
            .await?;
            rows.into_iter()
                .map(|(i, h)| Ok((i as u64, hash32(h)?)))
                .collect()
        })
    }

    fn latest_checkpoint<'a>(&'a self, ledger: &'a Ledger) -> StoreFuture<'a, Option<StoredCheckpoint>> {
        Box::pin(async move {
            let row: Option<CheckpointRow> = sqlx::query_as(&format!(
                "SELECT {CHECKPOINT_COLUMNS} FROM audit_checkpoints WHERE org_id = $1 AND mode = $2 \
                 ORDER BY tree_size DESC LIMIT 1"
            ))
            .bind(ledger.org_id.as_str())
            .bind(ledger.mode.as_str())
            .fetch_optional(&self.pool)
            .await?;
            row.map(CheckpointRow::into_record).transpose()
        })
    }

    fn checkpoints<'a>(&'a self, ledger: &'a Ledger) -> StoreFuture<'a, Vec<StoredCheckpoint>> {
        Box::pin(async move {
            let rows: Vec<CheckpointRow> = sqlx::query_as(&format!(
                "SELECT {CHECKPOINT_COLUMNS} FROM audit_checkpoints WHERE org_id = $1 AND mode = $2 \
                 ORDER BY tree_size"
            ))
            .bind(ledger.org_id.as_str())
            .bind(ledger.mode.as_str())
            .fetch_all(&self.pool)
            .await?;
            rows.into_iter().map(CheckpointRow::into_record).collect()
        })
    }

    fn add_checkpoint<'a>(
        &'a self,
        cp: &'a StoredCheckpoint,
        after: u64,
        nodes: &'a [(Subtree, Hash)],
    ) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            let (org, mode) = (cp.ledger.org_id.as_str(), cp.ledger.mode.as_str());
            let mut tx = self.pool.begin_with(DB::EXCLUSIVE.begin).await?;
            if let Some(lock) = DB::CHECKPOINT_LOCK {
                sqlx::query(lock).bind(org).bind(mode).execute(&mut *tx).await?;
            }
            let (latest,): (i64,) = sqlx::query_as(
                "SELECT COALESCE(MAX(tree_size), 0) FROM audit_checkpoints WHERE org_id = $1 AND mode = $2",
            )
            .bind(org)
            .bind(mode)
            .fetch_one(&mut *tx)
            .await?;
            if latest != seq_i64(after)? {
                return Ok(false);
            }
            for chunk in nodes.chunks(NODES_PER_INSERT) {
                let mut sql =
                    String::from("INSERT INTO audit_tree_nodes (org_id, mode, height, idx, hash) VALUES ");
                for i in 0..chunk.len() {
                    use std::fmt::Write as _;
                    let p = 3 + 3 * i;
                    let sep = if i == 0 { "" } else { ", " };
                    let _ = write!(sql, "{sep}($1, $2, ${p}, ${}, ${})", p + 1, p + 2);
                }
                let mut q = sqlx::query(&sql).bind(org).bind(mode);
                for (s, h) in chunk {
                    q = q.bind(i64::from(s.height)).bind(seq_i64(s.index)?).bind(&h[..]);
                }
                q.execute(&mut *tx).await?;
            }
            sqlx::query(&format!(
                "INSERT INTO audit_checkpoints ({CHECKPOINT_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6)"
            ))
            .bind(org)
            .bind(mode)
            .bind(seq_i64(cp.size)?)
            .bind(&cp.root[..])
            .bind(cp.note.as_str())
            .bind(cp.created_at.0)
            .execute(&mut *tx)
            .await?;
            tx.commit().await?;
            Ok(true)
        })
    }

    fn read_blocks<'a>(
        &'a self,
        ledger: &'a Ledger,
        after: i64,
        limit: u32,
    ) -> StoreFuture<'a, Vec<CheckedBlock>> {
        Box::pin(async move {
            let rows: Vec<FullBlock> = sqlx::query_as(
                "SELECT first_seq, last_seq, prev_hash, records, last_hash, results, \
                 n_valid, n_invalid, n_expired, n_revoked FROM audit_blocks \
                 WHERE org_id = $1 AND mode = $2 AND first_seq > $3 ORDER BY first_seq LIMIT $4",
            )
            .bind(ledger.org_id.as_str())
            .bind(ledger.mode.as_str())
            .bind(after)
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await?;
            Ok(rows
                .into_iter()
                .map(|b| CheckedBlock {
                    first_seq: b.block.first_seq,
                    last_seq: b.block.last_seq,
                    records: block::decode(ledger, &b.block, |_| true),
                    last_hash: b.last_hash,
                    results: b.results,
                    totals: [b.n_valid, b.n_invalid, b.n_expired, b.n_revoked],
                })
                .collect())
        })
    }

    fn agent_rows<'a>(
        &'a self,
        ledger: &'a Ledger,
        agent_id: &'a str,
    ) -> StoreFuture<'a, Vec<AgentBlockRow>> {
        Box::pin(async move {
            Ok(sqlx::query_as(
                "SELECT first_seq, results, n_valid, n_invalid, n_expired, n_revoked FROM audit_block_agents \
                 WHERE agent_id = $1 AND org_id = $2 AND mode = $3 ORDER BY first_seq",
            )
            .bind(agent_id)
            .bind(ledger.org_id.as_str())
            .bind(ledger.mode.as_str())
            .fetch_all(&self.pool)
            .await?)
        })
    }

    fn agent_row_counts(&self) -> StoreFuture<'_, Vec<(Ledger, String, i64)>> {
        Box::pin(async move {
            let rows: Vec<(String, String, String, i64)> = sqlx::query_as(
                "SELECT org_id, mode, agent_id, COUNT(*) FROM audit_block_agents GROUP BY org_id, mode, agent_id",
            )
            .fetch_all(&self.pool)
            .await?;
            rows.into_iter()
                .map(|(org_id, mode, agent, n)| {
                    Ok((
                        Ledger {
                            org_id,
                            mode: parse_mode(&mode)?,
                        },
                        agent,
                        n,
                    ))
                })
                .collect()
        })
    }
}

//! Agents, and what instances learn of each other's revocations.

use sqlx::{ColumnIndex, Decode, Encode, Executor, FromRow, IntoArguments, Type};

use super::sql::{parse_mode, Backend, SqlStore};
use super::{AgentRecord, Revocations, StoreError, StoreFuture};
use crate::domain::{KeyMode, Ledger, Millis};

/// Agents: registered, given tokens, revoked for good.
pub trait AgentStore {
    /// A ledger's revoked agents and when, in the order of their revocations: by revocation
    /// epoch (agents revoked before there were epochs first, by time).
    fn revocations_of<'a>(&'a self, ledger: &'a Ledger) -> StoreFuture<'a, Vec<(String, Millis)>>;
    fn insert_agent<'a>(&'a self, agent: &'a AgentRecord) -> StoreFuture<'a, ()>;
    /// Any organization's agent: callers check ownership.
    fn get_agent<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Option<AgentRecord>>;
    /// An organization's agents in one mode, newest first.
    fn list_agents<'a>(&'a self, org_id: &'a str, mode: KeyMode) -> StoreFuture<'a, Vec<AgentRecord>>;
    /// All agents with an id greater than `after_id`, in id order (for loading the registry).
    fn scan_agents<'a>(&'a self, after_id: &'a str, limit: u32) -> StoreFuture<'a, Vec<AgentRecord>>;
    /// Records a newly issued token; false (and no change) when the agent is revoked or missing.
    fn renew_token<'a>(&'a self, id: &'a str, issued_at: Millis, expires_at: Millis)
        -> StoreFuture<'a, bool>;
    /// Revokes once; a second call changes nothing. Returns the agent as stored afterwards,
    /// with the revocation epoch its revocation was stamped with (none for an agent revoked
    /// before the store had epochs).
    fn revoke_agent<'a>(
        &'a self,
        id: &'a str,
        at: Millis,
        reason: Option<&'a str>,
    ) -> StoreFuture<'a, Option<(AgentRecord, Option<i64>)>>;
    /// The committed revocation epoch and every agent revoked with a higher epoch than
    /// `after`, read in one snapshot (for instances to learn each other's revocations).
    fn revocations_after(&self, after: i64) -> StoreFuture<'_, Revocations>;
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

/// One row of `revocations_after`: the epoch's own row has no agent.
#[derive(FromRow)]
struct RevocationRow {
    id: Option<String>,
    reason: Option<String>,
    epoch: i64,
}

fn scopes_json(scopes: &[String]) -> String {
    serde_json::to_string(scopes).expect("strings serialize")
}

impl<DB: Backend> AgentStore for SqlStore<DB>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> Option<&'q str>: Encode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
    for<'q> Option<i64>: Encode<'q, DB> + Type<DB>,
    for<'q> String: Encode<'q, DB> + Type<DB>,
    for<'r> String: Decode<'r, DB> + Type<DB>,
    for<'r> Option<String>: Decode<'r, DB> + Type<DB>,
    for<'r> i64: Decode<'r, DB> + Type<DB>,
    for<'r> Option<i64>: Decode<'r, DB> + Type<DB>,
    for<'r> &'r str: ColumnIndex<DB::Row>,
    usize: ColumnIndex<DB::Row>,
{
    fn revocations_of<'a>(&'a self, ledger: &'a Ledger) -> StoreFuture<'a, Vec<(String, Millis)>> {
        Box::pin(async move {
            let rows: Vec<(String, i64)> = sqlx::query_as(
                "SELECT id, revoked_at FROM agents WHERE org_id = $1 AND mode = $2 AND revoked_at IS NOT NULL \
                 ORDER BY COALESCE(revoked_epoch, 0), revoked_at, id",
            )
            .bind(ledger.org_id.as_str())
            .bind(ledger.mode.as_str())
            .fetch_all(&self.pool)
            .await?;
            Ok(rows.into_iter().map(|(id, at)| (id, Millis(at))).collect())
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
}

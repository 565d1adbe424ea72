//! A revocation, inside its transaction: the agent's row, and the Shared Signals events it
//! owes. Every path that revokes (the API's revoke, a name changing hands) comes here, so the
//! rule of which streams get an event is this file's `RECIPIENTS`, one statement both
//! backends run.

use sqlx::{ColumnIndex, Decode, Encode, Executor, IntoArguments, Type};

use super::agent_rows::{RevokedAgentRow, AGENT_COLUMNS};
use super::sql::Backend;
use super::ssf::{enqueue, NewEvent};
use super::{AgentRecord, StoreError};
use agentid_core::domain::Millis;

/// The streams that get an event when the agent `$1` of organization `$2`, mode `$3`, is
/// revoked: that organization's and mode's streams that carry revocations, enabled or paused
/// (a disabled stream drops its events), with no subjects or with the agent among them.
pub(crate) const RECIPIENTS: &str = "SELECT s.id FROM ssf_streams s \
     WHERE s.org_id = $2 AND s.mode = $3 AND s.revocations \
     AND s.status IN ('enabled', 'paused') \
     AND (NOT EXISTS (SELECT 1 FROM ssf_subjects x WHERE x.stream_id = s.id) \
          OR EXISTS (SELECT 1 FROM ssf_subjects x WHERE x.stream_id = s.id AND x.agent_id = $1)) \
     ORDER BY s.id";

/// Revokes the agents `ids` (those not revoked yet) inside the caller's transaction, at `at`
/// for `reason`, and queues one `session-revoked` event for each stream `RECIPIENTS` names
/// (within each stream's bound, `ssf::enqueue`);
/// returns them as stored after, with the revocation epoch each was stamped with (the epoch
/// trigger of migration 0004 moves and stamps it). An agent revoked already is returned as
/// it is, and owes no new event.
pub(crate) async fn revoke_in<DB: Backend>(
    tx: &mut sqlx::Transaction<'_, DB>,
    ids: &[String],
    at: Millis,
    reason: Option<&str>,
) -> Result<Vec<(AgentRecord, Option<i64>)>, StoreError>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> Option<&'q str>: Encode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
    for<'r> String: Decode<'r, DB> + Type<DB>,
    for<'r> Option<String>: Decode<'r, DB> + Type<DB>,
    for<'r> i64: Decode<'r, DB> + Type<DB>,
    for<'r> Option<i64>: Decode<'r, DB> + Type<DB>,
    for<'r> &'r str: ColumnIndex<DB::Row>,
    usize: ColumnIndex<DB::Row>,
{
    let mut out = Vec::with_capacity(ids.len());
    for id in ids {
        let done = sqlx::query(
            "UPDATE agents SET revoked_at = $2, revocation_reason = $3 WHERE id = $1 AND revoked_at IS NULL",
        )
        .bind(id.as_str())
        .bind(at.0)
        .bind(reason)
        .execute(&mut **tx)
        .await?;
        let sql = format!("SELECT {AGENT_COLUMNS}, revoked_epoch FROM agents WHERE id = $1");
        let Some(row) = sqlx::query_as::<DB, RevokedAgentRow>(&sql)
            .bind(id.as_str())
            .fetch_optional(&mut **tx)
            .await?
        else {
            continue;
        };
        let agent = row.agent.into_record()?;
        if DB::rows_affected(&done) == 1 {
            queue_events(tx, &agent, at).await?;
        }
        out.push((agent, row.revoked_epoch));
    }
    Ok(out)
}

/// One `session-revoked` event for each stream that carries the agent's revocation.
async fn queue_events<DB: Backend>(
    tx: &mut sqlx::Transaction<'_, DB>,
    agent: &AgentRecord,
    at: Millis,
) -> Result<(), StoreError>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> Option<&'q str>: Encode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
    for<'r> String: Decode<'r, DB> + Type<DB>,
    for<'r> i64: Decode<'r, DB> + Type<DB>,
    usize: ColumnIndex<DB::Row>,
{
    let streams: Vec<(String,)> = sqlx::query_as(RECIPIENTS)
        .bind(agent.id.as_str())
        .bind(agent.org_id.as_str())
        .bind(agent.mode.as_str())
        .fetch_all(&mut **tx)
        .await?;
    let event = NewEvent {
        kind: "session-revoked",
        agent_id: Some(agent.id.as_str()),
        issuer: Some(agent.issuer_domain.as_str()),
        reason: agent.revocation_reason.as_deref(),
        state: None,
        at,
    };
    for (stream,) in streams {
        enqueue(tx, &stream, &event).await?;
    }
    Ok(())
}

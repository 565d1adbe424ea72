//! The SQL of `crate::revoke` for one backend: `DB` is its database.

use super::ssf::enqueue;
use crate::agent_rows::{RevokedAgentRow, AGENT_COLUMNS};
use crate::sql::Backend;
use crate::ssf::NewEvent;
use crate::{AgentRecord, StoreError};
use agentid_core::domain::Millis;

use crate::revoke::STREAM_FACTS;
use agentid_core::domain::streams::{receives_revocation, StreamFacts};

use super::DB;

/// Revokes the agents `ids` (those not revoked yet) inside the caller's transaction, at `at`
/// for `reason`, and queues one `session-revoked` event for each stream that receives it
/// (within each stream's bound, `ssf::enqueue`);
/// returns them as stored after, with the revocation epoch each was stamped with (the epoch
/// trigger of migration 0004 moves and stamps it). An agent revoked already is returned as
/// it is, and owes no new event.
pub(crate) async fn revoke_in(
    tx: &mut sqlx::Transaction<'_, DB>,
    ids: &[String],
    at: Millis,
    reason: Option<&str>,
) -> Result<Vec<(AgentRecord, Option<i64>)>, StoreError> {
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
async fn queue_events(
    tx: &mut sqlx::Transaction<'_, DB>,
    agent: &AgentRecord,
    at: Millis,
) -> Result<(), StoreError> {
    let streams: Vec<(String, String, bool, bool, bool)> = sqlx::query_as(STREAM_FACTS)
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
    for (stream, status, revocations, narrowed, names_agent) in streams {
        let facts = StreamFacts {
            status: &status,
            revocations,
            narrowed,
            names_agent,
        };
        if receives_revocation(&facts) {
            enqueue(tx, &stream, &event).await?;
        }
    }
    Ok(())
}

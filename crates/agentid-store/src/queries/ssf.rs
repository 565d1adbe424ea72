//! The SQL of `crate::ssf` for one backend: `DB` is its database.

use crate::sql::{Backend, SqlStore};
use crate::{SsfEvent, StoreError, StoreFuture, StreamRecord};
use agentid_core::domain::{new_id, IdPrefix, KeyMode, Millis};
use agentid_core::domain::{AgentId, OrgId, StreamId};

use crate::ssf::{
    events_json, EventRow, NewEvent, SsfStore, StreamRow, DUE, EVENT_COLUMNS, MAX_PENDING, SETTLE,
    STREAM_COLUMNS,
};

use super::DB;

/// Queues `event` on `stream_id` inside the caller's transaction, unless the stream is gone
/// or disabled, and keeps the bound: past [`MAX_PENDING`] the stream's oldest events are
/// deleted and counted as dropped. Costs the same however many events wait (the stream's row
/// keeps the count). The stream's row is locked first, as every transaction that touches a
/// stream's events locks it first ([`lock_stream`]): a disable or delete that commits first
/// is seen here (nothing queued), one that waits for this removes what this queued, and
/// nothing waits on an event while holding the row another waits for.
pub(crate) async fn enqueue(
    tx: &mut sqlx::Transaction<'_, DB>,
    stream_id: &str,
    event: &NewEvent<'_>,
) -> Result<bool, StoreError> {
    let Some((pending,)): Option<(i64,)> = sqlx::query_as(
        "UPDATE ssf_streams SET pending = pending + 1, next_due_at = COALESCE(next_due_at, $2) \
         WHERE id = $1 AND status <> 'disabled' RETURNING pending",
    )
    .bind(stream_id)
    .bind(event.at.0)
    .fetch_optional(&mut **tx)
    .await?
    else {
        return Ok(false);
    };
    sqlx::query(
        "INSERT INTO ssf_events (stream_id, jti, kind, agent_id, issuer, reason, state, event_at, \
         next_attempt_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $8)",
    )
    .bind(stream_id)
    .bind(new_id(IdPrefix::Event).as_str())
    .bind(event.kind)
    .bind(event.agent_id)
    .bind(event.issuer)
    .bind(event.reason)
    .bind(event.state)
    .bind(event.at.0)
    .execute(&mut **tx)
    .await?;
    if pending > MAX_PENDING {
        let dropped = sqlx::query(
            "DELETE FROM ssf_events WHERE seq IN \
             (SELECT seq FROM ssf_events WHERE stream_id = $1 ORDER BY seq LIMIT $2)",
        )
        .bind(stream_id)
        .bind(pending - MAX_PENDING)
        .execute(&mut **tx)
        .await?;
        let n = DB::rows_affected(&dropped) as i64;
        sqlx::query(&format!(
            "UPDATE ssf_streams SET dropped = dropped + $2, {SETTLE} WHERE id = $1"
        ))
        .bind(stream_id)
        .bind(n)
        .execute(&mut **tx)
        .await?;
    }
    Ok(true)
}

/// Locks stream `stream_id`'s row, before any of its events is touched (see [`enqueue`]);
/// false when there is no such stream.
async fn lock_stream(tx: &mut sqlx::Transaction<'_, DB>, stream_id: &str) -> Result<bool, StoreError> {
    let done = sqlx::query("UPDATE ssf_streams SET pending = pending WHERE id = $1")
        .bind(stream_id)
        .execute(&mut **tx)
        .await?;
    Ok(DB::rows_affected(&done) == 1)
}

impl SsfStore for SqlStore<DB> {
    fn insert_stream<'a>(&'a self, s: &'a StreamRecord, max: i64) -> StoreFuture<'a, bool> {
        Box::pin(self.outage.ride_out(move || async move {
            let mut tx = self.exclusive().await?;
            let (n,): (i64,) =
                sqlx::query_as("SELECT COUNT(*) FROM ssf_streams WHERE org_id = $1 AND mode = $2")
                    .bind(s.org_id.as_str())
                    .bind(s.mode.as_str())
                    .fetch_one(&mut *tx)
                    .await?;
            if n >= max {
                return Ok(false);
            }
            sqlx::query(&format!(
                "INSERT INTO ssf_streams ({STREAM_COLUMNS}) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)"
            ))
            .bind(s.id.as_str())
            .bind(s.org_id.as_str())
            .bind(s.mode.as_str())
            .bind(s.aud.as_str())
            .bind(s.method.as_str())
            .bind(s.endpoint_url.as_deref())
            .bind(s.poll_token_hash.as_deref())
            .bind(events_json(&s.events_requested))
            .bind(s.revocations)
            .bind(s.description.as_deref())
            .bind(s.status.as_str())
            .bind(s.created_at.0)
            .execute(&mut *tx)
            .await?;
            crate::sql::commit(tx).await?;
            Ok(true)
        }))
    }

    fn get_stream<'a>(&'a self, id: &'a StreamId) -> StoreFuture<'a, Option<StreamRecord>> {
        Box::pin(async move {
            let row: Option<StreamRow> =
                sqlx::query_as(&format!("SELECT {STREAM_COLUMNS} FROM ssf_streams WHERE id = $1"))
                    .bind(id.as_str())
                    .fetch_optional(&mut *self.conn().await?)
                    .await?;
            row.map(StreamRow::into_record).transpose()
        })
    }

    fn list_streams<'a>(&'a self, org_id: &'a OrgId, mode: KeyMode) -> StoreFuture<'a, Vec<StreamRecord>> {
        Box::pin(async move {
            let rows: Vec<StreamRow> = sqlx::query_as(&format!(
                "SELECT {STREAM_COLUMNS} FROM ssf_streams WHERE org_id = $1 AND mode = $2 \
                 ORDER BY created_at, id"
            ))
            .bind(org_id.as_str())
            .bind(mode.as_str())
            .fetch_all(&mut *self.conn().await?)
            .await?;
            rows.into_iter().map(StreamRow::into_record).collect()
        })
    }

    fn update_stream<'a>(&'a self, s: &'a StreamRecord) -> StoreFuture<'a, bool> {
        Box::pin(self.outage.ride_out(move || async move {
            let done = sqlx::query(
                "UPDATE ssf_streams SET aud = $2, endpoint_url = $3, events_requested = $4, \
                 revocations = $5, description = $6 WHERE id = $1",
            )
            .bind(s.id.as_str())
            .bind(s.aud.as_str())
            .bind(s.endpoint_url.as_deref())
            .bind(events_json(&s.events_requested))
            .bind(s.revocations)
            .bind(s.description.as_deref())
            .execute(&mut *self.conn().await?)
            .await?;
            Ok(DB::rows_affected(&done) == 1)
        }))
    }

    fn set_stream_status<'a>(&'a self, id: &'a StreamId, status: &'a str) -> StoreFuture<'a, bool> {
        Box::pin(self.outage.ride_out(move || async move {
            let mut tx = self.begin().await?;
            let done = sqlx::query("UPDATE ssf_streams SET status = $2 WHERE id = $1")
                .bind(id.as_str())
                .bind(status)
                .execute(&mut *tx)
                .await?;
            if DB::rows_affected(&done) != 1 {
                return Ok(false);
            }
            if status == "disabled" {
                let dropped = sqlx::query("DELETE FROM ssf_events WHERE stream_id = $1")
                    .bind(id.as_str())
                    .execute(&mut *tx)
                    .await?;
                settle(&mut tx, id.as_str(), DB::rows_affected(&dropped) as i64).await?;
            }
            crate::sql::commit(tx).await?;
            Ok(true)
        }))
    }

    fn delete_stream<'a>(&'a self, id: &'a StreamId) -> StoreFuture<'a, bool> {
        Box::pin(self.outage.ride_out(move || async move {
            let mut tx = self.begin().await?;
            if !lock_stream(&mut tx, id.as_str()).await? {
                return Ok(false);
            }
            sqlx::query("DELETE FROM ssf_events WHERE stream_id = $1")
                .bind(id.as_str())
                .execute(&mut *tx)
                .await?;
            sqlx::query("DELETE FROM ssf_subjects WHERE stream_id = $1")
                .bind(id.as_str())
                .execute(&mut *tx)
                .await?;
            let done = sqlx::query("DELETE FROM ssf_streams WHERE id = $1")
                .bind(id.as_str())
                .execute(&mut *tx)
                .await?;
            crate::sql::commit(tx).await?;
            Ok(DB::rows_affected(&done) == 1)
        }))
    }

    fn add_subject<'a>(
        &'a self,
        stream_id: &'a StreamId,
        agent_id: &'a AgentId,
        max: i64,
    ) -> StoreFuture<'a, Option<bool>> {
        Box::pin(self.outage.ride_out(move || async move {
            let mut tx = self.begin().await?;
            // The stream's row first (counts and adds are one at a time per stream; a stream
            // deleted meanwhile is no stream, not a foreign-key failure).
            let narrowed = sqlx::query("UPDATE ssf_streams SET narrowed = TRUE WHERE id = $1")
                .bind(stream_id.as_str())
                .execute(&mut *tx)
                .await?;
            if DB::rows_affected(&narrowed) != 1 {
                return Ok(None);
            }
            let (held, n): (bool, i64) = sqlx::query_as(
                "SELECT EXISTS (SELECT 1 FROM ssf_subjects WHERE stream_id = $1 AND agent_id = $2), \
                 (SELECT COUNT(*) FROM ssf_subjects WHERE stream_id = $1)",
            )
            .bind(stream_id.as_str())
            .bind(agent_id.as_str())
            .fetch_one(&mut *tx)
            .await?;
            if !held && n >= max {
                return Ok(Some(false));
            }
            sqlx::query(
                "INSERT INTO ssf_subjects (stream_id, agent_id) VALUES ($1, $2) ON CONFLICT DO NOTHING",
            )
            .bind(stream_id.as_str())
            .bind(agent_id.as_str())
            .execute(&mut *tx)
            .await?;
            crate::sql::commit(tx).await?;
            Ok(Some(true))
        }))
    }

    fn remove_subject<'a>(&'a self, stream_id: &'a StreamId, agent_id: &'a AgentId) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            let done = sqlx::query("DELETE FROM ssf_subjects WHERE stream_id = $1 AND agent_id = $2")
                .bind(stream_id.as_str())
                .bind(agent_id.as_str())
                .execute(&mut *self.conn().await?)
                .await?;
            Ok(DB::rows_affected(&done) == 1)
        })
    }

    fn add_verification<'a>(
        &'a self,
        stream_id: &'a StreamId,
        state: Option<&'a str>,
        at: Millis,
    ) -> StoreFuture<'a, ()> {
        Box::pin(self.outage.ride_out(move || async move {
            let mut tx = self.begin().await?;
            let event = NewEvent {
                kind: "verification",
                agent_id: None,
                issuer: None,
                reason: None,
                state,
                at,
            };
            if enqueue(&mut tx, stream_id.as_str(), &event).await? {
                crate::sql::commit(tx).await?;
            }
            Ok(())
        }))
    }

    fn claim_streams(
        &self,
        now: Millis,
        until: Millis,
        limit: u32,
    ) -> StoreFuture<'_, Vec<Result<StreamRecord, StoreError>>> {
        Box::pin(async move {
            // Looked at without a lock first: this runs every quarter second on every
            // instance, and on SQLite the exclusive transaction would queue behind, and hold
            // up, the audit writer. Both look at the streams' `next_due_at` (indexed), never
            // at the events, so they cost the same however many events wait.
            let (due,): (bool,) = sqlx::query_as(&format!("SELECT EXISTS (SELECT 1 {DUE})"))
                .bind(now.0)
                .fetch_one(&mut *self.conn().await?)
                .await?;
            if !due {
                return Ok(Vec::new());
            }
            let mut tx = self
                .pool
                .begin_with(DB::EXCLUSIVE.begin)
                .await
                .map_err(|e| self.acquire_error(e))?;
            let ids: Vec<(String,)> = sqlx::query_as(&format!(
                "SELECT s.id {DUE} ORDER BY s.next_due_at, s.id LIMIT $2{}",
                DB::SKIP_LOCKED
            ))
            .bind(now.0)
            .bind(i64::from(limit))
            .fetch_all(&mut *tx)
            .await?;
            let mut out = Vec::with_capacity(ids.len());
            for (id,) in ids {
                sqlx::query("UPDATE ssf_streams SET lease_until = $2 WHERE id = $1")
                    .bind(id.as_str())
                    .bind(until.0)
                    .execute(&mut *tx)
                    .await?;
                let row = sqlx::query_as::<_, StreamRow>(&format!(
                    "SELECT {STREAM_COLUMNS} FROM ssf_streams WHERE id = $1"
                ))
                .bind(id.as_str())
                .fetch_one(&mut *tx)
                .await;
                // A row that does not decode (a column of another type too: SQLite takes any
                // value in any column) stays leased and is reported, not returned: it would be
                // first of every claim after (its event stays due), and failing the claim for
                // it stopped every stream's delivery.
                out.push(match row {
                    Ok(row) => row.into_record(),
                    Err(e @ (sqlx::Error::ColumnDecode { .. } | sqlx::Error::Decode(_))) => {
                        Err(StoreError::Corrupt(format!("stream {id}: {e}")))
                    }
                    Err(e) => return Err(e.into()),
                });
            }
            tx.commit().await?;
            Ok(out)
        })
    }

    fn release_stream<'a>(
        &'a self,
        id: &'a StreamId,
        until: Millis,
        behind: Option<Millis>,
    ) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            sqlx::query(
                "UPDATE ssf_streams SET lease_until = NULL, next_due_at = CASE \
                 WHEN $3 IS NOT NULL AND next_due_at < $3 THEN $3 ELSE next_due_at END \
                 WHERE id = $1 AND lease_until = $2",
            )
            .bind(id.as_str())
            .bind(until.0)
            .bind(behind.map(|b| b.0))
            .execute(&mut *self.conn().await?)
            .await?;
            Ok(())
        })
    }

    fn pending_events<'a>(&'a self, stream_id: &'a StreamId, limit: u32) -> StoreFuture<'a, Vec<SsfEvent>> {
        Box::pin(async move {
            let rows: Vec<EventRow> = sqlx::query_as(&format!(
                "SELECT {EVENT_COLUMNS} FROM ssf_events WHERE stream_id = $1 ORDER BY seq LIMIT $2"
            ))
            .bind(stream_id.as_str())
            .bind(i64::from(limit))
            .fetch_all(&mut *self.conn().await?)
            .await?;
            Ok(rows.into_iter().map(Into::into).collect())
        })
    }

    fn events_done<'a>(&'a self, stream_id: &'a StreamId, seqs: &'a [i64]) -> StoreFuture<'a, ()> {
        Box::pin(self.outage.ride_out(move || async move {
            if seqs.is_empty() {
                return Ok(());
            }
            let mut tx = self.begin().await?;
            if !lock_stream(&mut tx, stream_id.as_str()).await? {
                return Ok(());
            }
            let mut n = 0;
            for chunk in seqs.chunks(500) {
                let params: Vec<String> = (0..chunk.len()).map(|i| format!("${}", i + 2)).collect();
                let sql = format!(
                    "DELETE FROM ssf_events WHERE stream_id = $1 AND seq IN ({})",
                    params.join(", ")
                );
                let mut q = sqlx::query(&sql).bind(stream_id.as_str());
                for seq in chunk {
                    q = q.bind(*seq);
                }
                n += DB::rows_affected(&q.execute(&mut *tx).await?) as i64;
            }
            settle(&mut tx, stream_id.as_str(), n).await?;
            crate::sql::commit(tx).await?;
            Ok(())
        }))
    }

    fn event_retry<'a>(
        &'a self,
        stream_id: &'a StreamId,
        seq: i64,
        attempts: i32,
        next: Millis,
    ) -> StoreFuture<'a, ()> {
        Box::pin(self.outage.ride_out(move || async move {
            let mut tx = self.begin().await?;
            if !lock_stream(&mut tx, stream_id.as_str()).await? {
                return Ok(());
            }
            sqlx::query(
                "UPDATE ssf_events SET attempts = $3, next_attempt_at = $4 WHERE stream_id = $1 AND seq = $2",
            )
            .bind(stream_id.as_str())
            .bind(seq)
            .bind(attempts)
            .bind(next.0)
            .execute(&mut *tx)
            .await?;
            settle(&mut tx, stream_id.as_str(), 0).await?;
            crate::sql::commit(tx).await?;
            Ok(())
        }))
    }

    fn ack_events<'a>(&'a self, stream_id: &'a StreamId, jtis: &'a [String]) -> StoreFuture<'a, u64> {
        Box::pin(self.outage.ride_out(move || async move {
            if jtis.is_empty() {
                return Ok(0);
            }
            let mut tx = self.begin().await?;
            if !lock_stream(&mut tx, stream_id.as_str()).await? {
                return Ok(0);
            }
            let mut n = 0;
            for jti in jtis {
                let done = sqlx::query("DELETE FROM ssf_events WHERE stream_id = $1 AND jti = $2")
                    .bind(stream_id.as_str())
                    .bind(jti.as_str())
                    .execute(&mut *tx)
                    .await?;
                n += DB::rows_affected(&done);
            }
            settle(&mut tx, stream_id.as_str(), n as i64).await?;
            crate::sql::commit(tx).await?;
            Ok(n)
        }))
    }

    fn outbox_totals(&self) -> StoreFuture<'_, (i64, i64)> {
        Box::pin(async move {
            Ok(sqlx::query_as(
                "SELECT CAST(COALESCE(SUM(pending), 0) AS BIGINT), CAST(COALESCE(SUM(dropped), 0) AS BIGINT) \
                 FROM ssf_streams",
            )
            .fetch_one(&mut *self.conn().await?)
            .await?)
        })
    }
}

/// Settles stream `stream_id`'s row after `removed` of its events were deleted (`SETTLE`).
/// The caller locked the row first ([`lock_stream`]): an event another transaction queued
/// holds that lock until it commits, and `SETTLE`, run after, then sees the event. (Run as
/// one statement that also took the lock, the update waited for it and then found the next
/// due time in the snapshot it started with, without that event: the stream was no longer
/// due, and the event waited for the stream's next one.)
async fn settle(tx: &mut sqlx::Transaction<'_, DB>, stream_id: &str, removed: i64) -> Result<(), StoreError> {
    sqlx::query(&format!("UPDATE ssf_streams SET {SETTLE} WHERE id = $1"))
        .bind(stream_id)
        .bind(removed)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

//! OpenID Shared Signals: streams, their subjects, and the outbox of events they are owed.
//! A revocation's events are written in the revocation's own transaction (`revoke.rs`); the
//! delivery task leases a stream at a time, so one instance of a fleet delivers its events,
//! in order.
//!
//! The outbox holds only what is owed: an event delivered, acknowledged, refused for good or
//! given up is deleted. Each stream keeps its own counts (`pending`, `dropped`) and when its
//! oldest event is due (`next_due_at`), kept in the transaction that changes its events, so
//! neither the bound of [`MAX_PENDING`] nor "is anything due?" costs more as events wait.

use sqlx::{ColumnIndex, Decode, Encode, Executor, IntoArguments, Type};

use super::sql::{parse_mode, Backend, SqlStore};
use super::{SsfEvent, StoreError, StoreFuture, StreamRecord};
use agentid_core::domain::{new_id, IdPrefix, KeyMode, Millis};

/// Events a stream may be owed, whatever its delivery method and state: an event written past
/// it drops the stream's oldest, which is counted in the stream's `dropped`.
pub const MAX_PENDING: i64 = 10_000;

/// Streams, subjects and the event outbox.
pub trait SsfStore {
    /// Stores a new stream unless its organization has `max` streams already (false then):
    /// counted and written in one exclusive transaction, so that concurrent creations cannot
    /// pass the bound together.
    fn insert_stream<'a>(&'a self, stream: &'a StreamRecord, max: i64) -> StoreFuture<'a, bool>;
    fn get_stream<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Option<StreamRecord>>;
    /// An organization's streams in one mode, oldest first.
    fn list_streams<'a>(&'a self, org_id: &'a str, mode: KeyMode) -> StoreFuture<'a, Vec<StreamRecord>>;
    /// Stores what a stream's owner may change (aud, delivery, events, description, status);
    /// a stream disabled drops the events it was owed. False when there is no such stream.
    fn update_stream<'a>(&'a self, stream: &'a StreamRecord) -> StoreFuture<'a, bool>;
    fn delete_stream<'a>(&'a self, id: &'a str) -> StoreFuture<'a, bool>;
    fn add_subject<'a>(&'a self, stream_id: &'a str, agent_id: &'a str) -> StoreFuture<'a, ()>;
    fn remove_subject<'a>(&'a self, stream_id: &'a str, agent_id: &'a str) -> StoreFuture<'a, bool>;
    /// Queues a verification event carrying `state`.
    fn add_verification<'a>(
        &'a self,
        stream_id: &'a str,
        state: Option<&'a str>,
        at: Millis,
    ) -> StoreFuture<'a, ()>;
    /// Leases up to `limit` enabled push streams with an event due at `now`, until `until`
    /// (no other instance takes them meanwhile).
    fn claim_streams(&self, now: Millis, until: Millis, limit: u32) -> StoreFuture<'_, Vec<StreamRecord>>;
    fn release_stream<'a>(&'a self, id: &'a str) -> StoreFuture<'a, ()>;
    /// A stream's pending events, oldest first.
    fn pending_events<'a>(&'a self, stream_id: &'a str, limit: u32) -> StoreFuture<'a, Vec<SsfEvent>>;
    /// Deletes a stream's events that are done (delivered, refused for good or given up).
    fn events_done<'a>(&'a self, stream_id: &'a str, seqs: &'a [i64]) -> StoreFuture<'a, ()>;
    /// Notes a failed attempt at the stream's oldest event, and when to try again.
    fn event_retry<'a>(
        &'a self,
        stream_id: &'a str,
        seq: i64,
        attempts: i32,
        next: Millis,
    ) -> StoreFuture<'a, ()>;
    /// Deletes the stream's events with these `jti`s (poll acknowledgements); how many.
    fn ack_events<'a>(&'a self, stream_id: &'a str, jtis: &'a [String]) -> StoreFuture<'a, u64>;
    /// Events owed and events dropped, over all streams: `(pending, dropped)`.
    fn outbox_totals(&self) -> StoreFuture<'_, (i64, i64)>;
}

/// An event to queue on a stream.
pub(crate) struct NewEvent<'a> {
    pub(crate) kind: &'a str,
    pub(crate) agent_id: Option<&'a str>,
    pub(crate) issuer: Option<&'a str>,
    pub(crate) reason: Option<&'a str>,
    pub(crate) state: Option<&'a str>,
    pub(crate) at: Millis,
}

/// Queues `event` on `stream_id` inside the caller's transaction, and keeps the bound: past
/// [`MAX_PENDING`] the stream's oldest events are deleted and counted as dropped. Costs the
/// same however many events wait (the stream's row keeps the count; its row lock orders
/// concurrent writers).
pub(crate) async fn enqueue<DB: Backend>(
    tx: &mut sqlx::Transaction<'_, DB>,
    stream_id: &str,
    event: &NewEvent<'_>,
) -> Result<(), StoreError>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> Option<&'q str>: Encode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
    for<'r> i64: Decode<'r, DB> + Type<DB>,
    usize: ColumnIndex<DB::Row>,
{
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
    let (pending,): (i64,) = sqlx::query_as(
        "UPDATE ssf_streams SET pending = pending + 1, next_due_at = COALESCE(next_due_at, $2) \
         WHERE id = $1 RETURNING pending",
    )
    .bind(stream_id)
    .bind(event.at.0)
    .fetch_one(&mut **tx)
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
    Ok(())
}

/// After `$2` of stream `$1`'s events are deleted: its count, and when its new oldest is due.
const SETTLE: &str = "pending = pending - $2, next_due_at = \
    (SELECT e.next_attempt_at FROM ssf_events e WHERE e.stream_id = $1 ORDER BY e.seq LIMIT 1)";

const STREAM_COLUMNS: &str = "id, org_id, mode, aud, method, endpoint_url, poll_token_hash, \
    events_requested, revocations, description, status, created_at";

row! {
    struct StreamRow {
        id: String,
        org_id: String,
        mode: String,
        aud: String,
        method: String,
        endpoint_url: Option<String>,
        poll_token_hash: Option<Vec<u8>>,
        events_requested: String,
        revocations: bool,
        description: Option<String>,
        status: String,
        created_at: i64,
    }
}

impl StreamRow {
    fn into_record(self) -> Result<StreamRecord, StoreError> {
        Ok(StreamRecord {
            mode: parse_mode(&self.mode)?,
            events_requested: serde_json::from_str(&self.events_requested)
                .map_err(|_| StoreError::Corrupt(format!("events of stream {}", self.id)))?,
            id: self.id,
            org_id: self.org_id,
            aud: self.aud,
            method: self.method,
            endpoint_url: self.endpoint_url,
            poll_token_hash: self.poll_token_hash,
            revocations: self.revocations,
            description: self.description,
            status: self.status,
            created_at: Millis(self.created_at),
        })
    }
}

const EVENT_COLUMNS: &str = "seq, stream_id, jti, kind, agent_id, issuer, reason, state, event_at, attempts";

row! {
    struct EventRow {
        seq: i64,
        stream_id: String,
        jti: String,
        kind: String,
        agent_id: Option<String>,
        issuer: Option<String>,
        reason: Option<String>,
        state: Option<String>,
        event_at: i64,
        attempts: i32,
    }
}

impl From<EventRow> for SsfEvent {
    fn from(r: EventRow) -> Self {
        SsfEvent {
            seq: r.seq,
            stream_id: r.stream_id,
            jti: r.jti,
            kind: r.kind,
            agent_id: r.agent_id,
            issuer: r.issuer,
            reason: r.reason,
            state: r.state,
            event_at: Millis(r.event_at),
            attempts: r.attempts,
        }
    }
}

fn events_json(events: &[String]) -> String {
    serde_json::to_string(events).expect("strings serialize")
}

impl<DB: Backend> SsfStore for SqlStore<DB>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> Option<&'q str>: Encode<'q, DB> + Type<DB>,
    for<'q> Option<&'q [u8]>: Encode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
    for<'q> i32: Encode<'q, DB> + Type<DB>,
    for<'q> bool: Encode<'q, DB> + Type<DB>,
    for<'q> String: Encode<'q, DB> + Type<DB>,
    for<'r> String: Decode<'r, DB> + Type<DB>,
    for<'r> Option<String>: Decode<'r, DB> + Type<DB>,
    for<'r> Option<Vec<u8>>: Decode<'r, DB> + Type<DB>,
    for<'r> i64: Decode<'r, DB> + Type<DB>,
    for<'r> i32: Decode<'r, DB> + Type<DB>,
    for<'r> bool: Decode<'r, DB> + Type<DB>,
    for<'r> &'r str: ColumnIndex<DB::Row>,
    usize: ColumnIndex<DB::Row>,
{
    fn insert_stream<'a>(&'a self, s: &'a StreamRecord, max: i64) -> StoreFuture<'a, bool> {
        Box::pin(self.outage.ride_out(move || async move {
            let mut tx = self.exclusive().await?;
            let (n,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM ssf_streams WHERE org_id = $1")
                .bind(s.org_id.as_str())
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

    fn get_stream<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Option<StreamRecord>> {
        Box::pin(async move {
            let row: Option<StreamRow> =
                sqlx::query_as(&format!("SELECT {STREAM_COLUMNS} FROM ssf_streams WHERE id = $1"))
                    .bind(id)
                    .fetch_optional(&mut *self.conn().await?)
                    .await?;
            row.map(StreamRow::into_record).transpose()
        })
    }

    fn list_streams<'a>(&'a self, org_id: &'a str, mode: KeyMode) -> StoreFuture<'a, Vec<StreamRecord>> {
        Box::pin(async move {
            let rows: Vec<StreamRow> = sqlx::query_as(&format!(
                "SELECT {STREAM_COLUMNS} FROM ssf_streams WHERE org_id = $1 AND mode = $2 \
                 ORDER BY created_at, id"
            ))
            .bind(org_id)
            .bind(mode.as_str())
            .fetch_all(&mut *self.conn().await?)
            .await?;
            rows.into_iter().map(StreamRow::into_record).collect()
        })
    }

    fn update_stream<'a>(&'a self, s: &'a StreamRecord) -> StoreFuture<'a, bool> {
        Box::pin(self.outage.ride_out(move || async move {
            let mut tx = self.begin().await?;
            let done = sqlx::query(
                "UPDATE ssf_streams SET aud = $2, endpoint_url = $3, events_requested = $4, \
                 revocations = $5, description = $6, status = $7 WHERE id = $1",
            )
            .bind(s.id.as_str())
            .bind(s.aud.as_str())
            .bind(s.endpoint_url.as_deref())
            .bind(events_json(&s.events_requested))
            .bind(s.revocations)
            .bind(s.description.as_deref())
            .bind(s.status.as_str())
            .execute(&mut *tx)
            .await?;
            if DB::rows_affected(&done) != 1 {
                return Ok(false);
            }
            if s.status == "disabled" {
                let dropped = sqlx::query("DELETE FROM ssf_events WHERE stream_id = $1")
                    .bind(s.id.as_str())
                    .execute(&mut *tx)
                    .await?;
                settle(&mut tx, &s.id, DB::rows_affected(&dropped) as i64).await?;
            }
            crate::sql::commit(tx).await?;
            Ok(true)
        }))
    }

    fn delete_stream<'a>(&'a self, id: &'a str) -> StoreFuture<'a, bool> {
        Box::pin(self.outage.ride_out(move || async move {
            let mut tx = self.begin().await?;
            sqlx::query("DELETE FROM ssf_events WHERE stream_id = $1")
                .bind(id)
                .execute(&mut *tx)
                .await?;
            sqlx::query("DELETE FROM ssf_subjects WHERE stream_id = $1")
                .bind(id)
                .execute(&mut *tx)
                .await?;
            let done = sqlx::query("DELETE FROM ssf_streams WHERE id = $1")
                .bind(id)
                .execute(&mut *tx)
                .await?;
            crate::sql::commit(tx).await?;
            Ok(DB::rows_affected(&done) == 1)
        }))
    }

    fn add_subject<'a>(&'a self, stream_id: &'a str, agent_id: &'a str) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            sqlx::query(
                "INSERT INTO ssf_subjects (stream_id, agent_id) VALUES ($1, $2) ON CONFLICT DO NOTHING",
            )
            .bind(stream_id)
            .bind(agent_id)
            .execute(&mut *self.conn().await?)
            .await?;
            Ok(())
        })
    }

    fn remove_subject<'a>(&'a self, stream_id: &'a str, agent_id: &'a str) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            let done = sqlx::query("DELETE FROM ssf_subjects WHERE stream_id = $1 AND agent_id = $2")
                .bind(stream_id)
                .bind(agent_id)
                .execute(&mut *self.conn().await?)
                .await?;
            Ok(DB::rows_affected(&done) == 1)
        })
    }

    fn add_verification<'a>(
        &'a self,
        stream_id: &'a str,
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
            enqueue(&mut tx, stream_id, &event).await?;
            crate::sql::commit(tx).await?;
            Ok(())
        }))
    }

    fn claim_streams(&self, now: Millis, until: Millis, limit: u32) -> StoreFuture<'_, Vec<StreamRecord>> {
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
                let row: StreamRow =
                    sqlx::query_as(&format!("SELECT {STREAM_COLUMNS} FROM ssf_streams WHERE id = $1"))
                        .bind(id.as_str())
                        .fetch_one(&mut *tx)
                        .await?;
                out.push(row.into_record()?);
            }
            tx.commit().await?;
            Ok(out)
        })
    }

    fn release_stream<'a>(&'a self, id: &'a str) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            sqlx::query("UPDATE ssf_streams SET lease_until = NULL WHERE id = $1")
                .bind(id)
                .execute(&mut *self.conn().await?)
                .await?;
            Ok(())
        })
    }

    fn pending_events<'a>(&'a self, stream_id: &'a str, limit: u32) -> StoreFuture<'a, Vec<SsfEvent>> {
        Box::pin(async move {
            let rows: Vec<EventRow> = sqlx::query_as(&format!(
                "SELECT {EVENT_COLUMNS} FROM ssf_events WHERE stream_id = $1 ORDER BY seq LIMIT $2"
            ))
            .bind(stream_id)
            .bind(i64::from(limit))
            .fetch_all(&mut *self.conn().await?)
            .await?;
            Ok(rows.into_iter().map(Into::into).collect())
        })
    }

    fn events_done<'a>(&'a self, stream_id: &'a str, seqs: &'a [i64]) -> StoreFuture<'a, ()> {
        Box::pin(self.outage.ride_out(move || async move {
            if seqs.is_empty() {
                return Ok(());
            }
            let mut tx = self.begin().await?;
            let mut n = 0;
            for chunk in seqs.chunks(500) {
                let params: Vec<String> = (0..chunk.len()).map(|i| format!("${}", i + 2)).collect();
                let sql = format!(
                    "DELETE FROM ssf_events WHERE stream_id = $1 AND seq IN ({})",
                    params.join(", ")
                );
                let mut q = sqlx::query(&sql).bind(stream_id);
                for seq in chunk {
                    q = q.bind(*seq);
                }
                n += DB::rows_affected(&q.execute(&mut *tx).await?) as i64;
            }
            settle(&mut tx, stream_id, n).await?;
            crate::sql::commit(tx).await?;
            Ok(())
        }))
    }

    fn event_retry<'a>(
        &'a self,
        stream_id: &'a str,
        seq: i64,
        attempts: i32,
        next: Millis,
    ) -> StoreFuture<'a, ()> {
        Box::pin(self.outage.ride_out(move || async move {
            let mut tx = self.begin().await?;
            sqlx::query(
                "UPDATE ssf_events SET attempts = $3, next_attempt_at = $4 WHERE stream_id = $1 AND seq = $2",
            )
            .bind(stream_id)
            .bind(seq)
            .bind(attempts)
            .bind(next.0)
            .execute(&mut *tx)
            .await?;
            settle(&mut tx, stream_id, 0).await?;
            crate::sql::commit(tx).await?;
            Ok(())
        }))
    }

    fn ack_events<'a>(&'a self, stream_id: &'a str, jtis: &'a [String]) -> StoreFuture<'a, u64> {
        Box::pin(self.outage.ride_out(move || async move {
            if jtis.is_empty() {
                return Ok(0);
            }
            let mut tx = self.begin().await?;
            let mut n = 0;
            for jti in jtis {
                let done = sqlx::query("DELETE FROM ssf_events WHERE stream_id = $1 AND jti = $2")
                    .bind(stream_id)
                    .bind(jti.as_str())
                    .execute(&mut *tx)
                    .await?;
                n += DB::rows_affected(&done);
            }
            settle(&mut tx, stream_id, n as i64).await?;
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

/// The push streams due at `$1`: enabled, not leased, their oldest event due.
const DUE: &str = "FROM ssf_streams s WHERE s.next_due_at <= $1 AND s.method = 'urn:ietf:rfc:8935' \
    AND s.status = 'enabled' AND (s.lease_until IS NULL OR s.lease_until < $1)";

/// Settles stream `stream_id`'s row after `removed` of its events were deleted (`SETTLE`).
/// The row is locked by a statement of its own first: an event another transaction queued
/// holds that lock until it commits, and `SETTLE`, run after, then sees the event. (Run as
/// one statement, the update waited for the lock and then found the next due time in the
/// snapshot it started with, without that event: the stream was no longer due, and the
/// event waited for the stream's next one.)
async fn settle<DB: Backend>(
    tx: &mut sqlx::Transaction<'_, DB>,
    stream_id: &str,
    removed: i64,
) -> Result<(), StoreError>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
{
    sqlx::query("UPDATE ssf_streams SET pending = pending WHERE id = $1")
        .bind(stream_id)
        .execute(&mut **tx)
        .await?;
    sqlx::query(&format!("UPDATE ssf_streams SET {SETTLE} WHERE id = $1"))
        .bind(stream_id)
        .bind(removed)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

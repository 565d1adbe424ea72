//! OpenID Shared Signals: streams, their subjects, and the outbox of events they are owed.
//! A revocation's events are written by a trigger in the revocation's own transaction
//! (migration 12); the delivery task leases a stream at a time, so one instance of a fleet
//! delivers its events, in order.

use sqlx::{ColumnIndex, Decode, Encode, Executor, FromRow, IntoArguments, Type};

use super::sql::{parse_mode, Backend, SqlStore};
use super::{SsfEvent, StoreError, StoreFuture, StreamRecord};
use agentid_core::domain::{KeyMode, Millis};

/// Streams, subjects and the event outbox.
pub trait SsfStore {
    fn count_streams<'a>(&'a self, org_id: &'a str) -> StoreFuture<'a, i64>;
    fn insert_stream<'a>(&'a self, stream: &'a StreamRecord) -> StoreFuture<'a, ()>;
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
        jti: &'a str,
        state: Option<&'a str>,
        at: Millis,
    ) -> StoreFuture<'a, ()>;
    /// Leases up to `limit` enabled push streams with an event due at `now`, until `until`
    /// (no other instance takes them meanwhile).
    fn claim_streams(&self, now: Millis, until: Millis, limit: u32) -> StoreFuture<'_, Vec<StreamRecord>>;
    fn release_stream<'a>(&'a self, id: &'a str) -> StoreFuture<'a, ()>;
    /// A stream's pending events, oldest first.
    fn pending_events<'a>(&'a self, stream_id: &'a str, limit: u32) -> StoreFuture<'a, Vec<SsfEvent>>;
    /// Marks events done (delivered, refused for good or given up), in one statement.
    fn events_done<'a>(&'a self, seqs: &'a [i64], at: Millis) -> StoreFuture<'a, ()>;
    /// Notes a failed attempt and when to try again.
    fn event_retry(&self, seq: i64, attempts: i32, next: Millis) -> StoreFuture<'_, ()>;
    /// Marks the stream's pending events with these `jti`s done (poll acknowledgements).
    fn ack_events<'a>(&'a self, stream_id: &'a str, jtis: &'a [String], at: Millis) -> StoreFuture<'a, u64>;
    /// Drops a stream's oldest pending events past `keep`; how many.
    fn drop_excess<'a>(&'a self, stream_id: &'a str, keep: u32, at: Millis) -> StoreFuture<'a, u64>;
    /// Events pending in all streams.
    fn pending_count(&self) -> StoreFuture<'_, i64>;
}

const STREAM_COLUMNS: &str = "id, org_id, mode, aud, method, endpoint_url, poll_token_hash, \
    events_requested, revocations, description, status, created_at";

#[derive(FromRow)]
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

#[derive(FromRow)]
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
    fn count_streams<'a>(&'a self, org_id: &'a str) -> StoreFuture<'a, i64> {
        Box::pin(async move {
            let (n,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM ssf_streams WHERE org_id = $1")
                .bind(org_id)
                .fetch_one(&self.pool)
                .await?;
            Ok(n)
        })
    }

    fn insert_stream<'a>(&'a self, s: &'a StreamRecord) -> StoreFuture<'a, ()> {
        Box::pin(async move {
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
            .execute(&self.pool)
            .await?;
            Ok(())
        })
    }

    fn get_stream<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Option<StreamRecord>> {
        Box::pin(async move {
            let row: Option<StreamRow> =
                sqlx::query_as(&format!("SELECT {STREAM_COLUMNS} FROM ssf_streams WHERE id = $1"))
                    .bind(id)
                    .fetch_optional(&self.pool)
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
            .fetch_all(&self.pool)
            .await?;
            rows.into_iter().map(StreamRow::into_record).collect()
        })
    }

    fn update_stream<'a>(&'a self, s: &'a StreamRecord) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            let mut tx = self.pool.begin().await?;
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
                sqlx::query("UPDATE ssf_events SET done_at = $2 WHERE stream_id = $1 AND done_at IS NULL")
                    .bind(s.id.as_str())
                    .bind(Millis::now().0)
                    .execute(&mut *tx)
                    .await?;
            }
            tx.commit().await?;
            Ok(true)
        })
    }

    fn delete_stream<'a>(&'a self, id: &'a str) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            let mut tx = self.pool.begin().await?;
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
            tx.commit().await?;
            Ok(DB::rows_affected(&done) == 1)
        })
    }

    fn add_subject<'a>(&'a self, stream_id: &'a str, agent_id: &'a str) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            sqlx::query(
                "INSERT INTO ssf_subjects (stream_id, agent_id) VALUES ($1, $2) ON CONFLICT DO NOTHING",
            )
            .bind(stream_id)
            .bind(agent_id)
            .execute(&self.pool)
            .await?;
            Ok(())
        })
    }

    fn remove_subject<'a>(&'a self, stream_id: &'a str, agent_id: &'a str) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            let done = sqlx::query("DELETE FROM ssf_subjects WHERE stream_id = $1 AND agent_id = $2")
                .bind(stream_id)
                .bind(agent_id)
                .execute(&self.pool)
                .await?;
            Ok(DB::rows_affected(&done) == 1)
        })
    }

    fn add_verification<'a>(
        &'a self,
        stream_id: &'a str,
        jti: &'a str,
        state: Option<&'a str>,
        at: Millis,
    ) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            sqlx::query(
                "INSERT INTO ssf_events (stream_id, jti, kind, state, event_at, next_attempt_at) \
                 VALUES ($1, $2, 'verification', $3, $4, $4)",
            )
            .bind(stream_id)
            .bind(jti)
            .bind(state)
            .bind(at.0)
            .execute(&self.pool)
            .await?;
            Ok(())
        })
    }

    fn claim_streams(&self, now: Millis, until: Millis, limit: u32) -> StoreFuture<'_, Vec<StreamRecord>> {
        Box::pin(async move {
            // Looked at without a lock first: this runs every quarter second on every
            // instance, and on SQLite the exclusive transaction would queue behind, and hold
            // up, the audit writer.
            let (due,): (bool,) = sqlx::query_as(
                "SELECT EXISTS (SELECT 1 FROM ssf_events e JOIN ssf_streams s ON s.id = e.stream_id \
                 WHERE e.done_at IS NULL AND e.next_attempt_at <= $1 AND s.method = 'urn:ietf:rfc:8935' \
                 AND s.status = 'enabled' AND (s.lease_until IS NULL OR s.lease_until < $1))",
            )
            .bind(now.0)
            .fetch_one(&self.pool)
            .await?;
            if !due {
                return Ok(Vec::new());
            }
            let mut tx = self.pool.begin_with(DB::EXCLUSIVE.begin).await?;
            let ids: Vec<(String,)> = sqlx::query_as(&format!(
                "SELECT s.id FROM ssf_streams s WHERE s.method = 'urn:ietf:rfc:8935' \
                 AND s.status = 'enabled' AND (s.lease_until IS NULL OR s.lease_until < $1) \
                 AND EXISTS (SELECT 1 FROM ssf_events e WHERE e.stream_id = s.id AND e.done_at IS NULL \
                 AND e.seq = (SELECT MIN(h.seq) FROM ssf_events h WHERE h.stream_id = s.id AND h.done_at IS NULL) \
                 AND e.next_attempt_at <= $1) ORDER BY s.id LIMIT $2{}",
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
                .execute(&self.pool)
                .await?;
            Ok(())
        })
    }

    fn pending_events<'a>(&'a self, stream_id: &'a str, limit: u32) -> StoreFuture<'a, Vec<SsfEvent>> {
        Box::pin(async move {
            let rows: Vec<EventRow> = sqlx::query_as(&format!(
                "SELECT {EVENT_COLUMNS} FROM ssf_events WHERE stream_id = $1 AND done_at IS NULL \
                 ORDER BY seq LIMIT $2"
            ))
            .bind(stream_id)
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await?;
            Ok(rows.into_iter().map(Into::into).collect())
        })
    }

    fn events_done<'a>(&'a self, seqs: &'a [i64], at: Millis) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            for chunk in seqs.chunks(500) {
                let params: Vec<String> = (0..chunk.len()).map(|i| format!("${}", i + 2)).collect();
                let sql = format!(
                    "UPDATE ssf_events SET done_at = $1 WHERE done_at IS NULL AND seq IN ({})",
                    params.join(", ")
                );
                let mut q = sqlx::query(&sql).bind(at.0);
                for seq in chunk {
                    q = q.bind(*seq);
                }
                q.execute(&self.pool).await?;
            }
            Ok(())
        })
    }

    fn event_retry(&self, seq: i64, attempts: i32, next: Millis) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            sqlx::query("UPDATE ssf_events SET attempts = $2, next_attempt_at = $3 WHERE seq = $1")
                .bind(seq)
                .bind(attempts)
                .bind(next.0)
                .execute(&self.pool)
                .await?;
            Ok(())
        })
    }

    fn ack_events<'a>(&'a self, stream_id: &'a str, jtis: &'a [String], at: Millis) -> StoreFuture<'a, u64> {
        Box::pin(async move {
            let mut n = 0;
            for jti in jtis {
                let done = sqlx::query(
                    "UPDATE ssf_events SET done_at = $3 WHERE stream_id = $1 AND jti = $2 AND done_at IS NULL",
                )
                .bind(stream_id)
                .bind(jti.as_str())
                .bind(at.0)
                .execute(&self.pool)
                .await?;
                n += DB::rows_affected(&done);
            }
            Ok(n)
        })
    }

    fn drop_excess<'a>(&'a self, stream_id: &'a str, keep: u32, at: Millis) -> StoreFuture<'a, u64> {
        Box::pin(async move {
            let done = sqlx::query(
                "UPDATE ssf_events SET done_at = $3 WHERE stream_id = $1 AND done_at IS NULL AND seq < \
                 (SELECT MIN(seq) FROM (SELECT seq FROM ssf_events WHERE stream_id = $1 AND done_at IS NULL \
                  ORDER BY seq DESC LIMIT $2) newest)",
            )
            .bind(stream_id)
            .bind(i64::from(keep))
            .bind(at.0)
            .execute(&self.pool)
            .await?;
            Ok(DB::rows_affected(&done))
        })
    }

    fn pending_count(&self) -> StoreFuture<'_, i64> {
        Box::pin(async move {
            let (n,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM ssf_events WHERE done_at IS NULL")
                .fetch_one(&self.pool)
                .await?;
            Ok(n)
        })
    }
}

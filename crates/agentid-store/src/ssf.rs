//! OpenID Shared Signals: streams, their subjects, and the outbox of events they are owed.
//! A revocation's events are written in the revocation's own transaction (`revoke.rs`); the
//! delivery task leases a stream at a time, so one instance of a fleet delivers its events,
//! in order.
//!
//! The outbox holds only what is owed: an event delivered, acknowledged, refused for good or
//! given up is deleted. Each stream keeps its own counts (`pending`, `dropped`) and when its
//! oldest event is due (`next_due_at`), kept in the transaction that changes its events, so
//! neither the bound of [`MAX_PENDING`] nor "is anything due?" costs more as events wait.

use super::sql::{decode, parse_mode};
use super::{SsfEvent, StoreError, StoreFuture, StreamRecord};
use agentid_core::domain::{AgentId, KeyMode, Millis, OrgId, StreamId};

/// Events a stream may be owed, whatever its delivery method and state: an event written past
/// it drops the stream's oldest, which is counted in the stream's `dropped`.
pub const MAX_PENDING: i64 = 10_000;

/// Streams, subjects and the event outbox.
pub trait SsfStore {
    /// Stores a new stream unless its organization has `max` streams already in its mode
    /// (false then): counted and written in one exclusive transaction, so that concurrent
    /// creations cannot pass the bound together.
    fn insert_stream<'a>(&'a self, stream: &'a StreamRecord, max: i64) -> StoreFuture<'a, bool>;
    fn get_stream<'a>(&'a self, id: &'a StreamId) -> StoreFuture<'a, Option<StreamRecord>>;
    /// An organization's streams in one mode, oldest first.
    fn list_streams<'a>(&'a self, org_id: &'a OrgId, mode: KeyMode) -> StoreFuture<'a, Vec<StreamRecord>>;
    /// Stores what a stream's owner configures (aud, delivery, events, description), not its
    /// status. False when there is no such stream.
    fn update_stream<'a>(&'a self, stream: &'a StreamRecord) -> StoreFuture<'a, bool>;
    /// Sets a stream's status alone (a disabled stream's events are dropped); false when it
    /// is gone.
    fn set_stream_status<'a>(&'a self, id: &'a StreamId, status: &'a str) -> StoreFuture<'a, bool>;
    fn delete_stream<'a>(&'a self, id: &'a StreamId) -> StoreFuture<'a, bool>;
    /// Adds a subject to a stream that holds fewer than `max` (one it holds already is added
    /// again); `None` when there is no such stream, `Some(false)` when it holds `max`.
    fn add_subject<'a>(
        &'a self,
        stream_id: &'a StreamId,
        agent_id: &'a AgentId,
        max: i64,
    ) -> StoreFuture<'a, Option<bool>>;
    fn remove_subject<'a>(&'a self, stream_id: &'a StreamId, agent_id: &'a AgentId) -> StoreFuture<'a, bool>;
    /// Queues a verification event carrying `state`, unless the stream is disabled (checked
    /// under its row's lock, so that a disable at the same time leaves nothing queued).
    fn add_verification<'a>(
        &'a self,
        stream_id: &'a StreamId,
        state: Option<&'a str>,
        at: Millis,
    ) -> StoreFuture<'a, ()>;
    /// Leases up to `limit` enabled push streams with an event due at `now`, until `until`
    /// (no other instance takes them meanwhile). A leased row that does not decode is an
    /// error in its place, the others are claimed all the same.
    fn claim_streams(
        &self,
        now: Millis,
        until: Millis,
        limit: u32,
    ) -> StoreFuture<'_, Vec<Result<StreamRecord, StoreError>>>;
    /// Ends the lease `claim_streams` gave until `until`, if it still holds it (one that ran
    /// out and another instance took is that instance's). With `behind`, a stream still due is
    /// due no earlier than then: a pass cut short goes behind the streams that waited.
    fn release_stream<'a>(
        &'a self,
        id: &'a StreamId,
        until: Millis,
        behind: Option<Millis>,
    ) -> StoreFuture<'a, ()>;
    /// A stream's pending events, oldest first.
    fn pending_events<'a>(&'a self, stream_id: &'a StreamId, limit: u32) -> StoreFuture<'a, Vec<SsfEvent>>;
    /// Deletes a stream's events that are done (delivered, refused for good or given up).
    fn events_done<'a>(&'a self, stream_id: &'a StreamId, seqs: &'a [i64]) -> StoreFuture<'a, ()>;
    /// Notes a failed attempt at the stream's oldest event, and when to try again.
    fn event_retry<'a>(
        &'a self,
        stream_id: &'a StreamId,
        seq: i64,
        attempts: i32,
        next: Millis,
    ) -> StoreFuture<'a, ()>;
    /// Deletes the stream's events with these `jti`s (poll acknowledgements); how many.
    fn ack_events<'a>(&'a self, stream_id: &'a StreamId, jtis: &'a [String]) -> StoreFuture<'a, u64>;
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

/// After `$2` of stream `$1`'s events are deleted: its count, and when its new oldest is due.
pub(crate) const SETTLE: &str = "pending = pending - $2, next_due_at = \
    (SELECT e.next_attempt_at FROM ssf_events e WHERE e.stream_id = $1 ORDER BY e.seq LIMIT 1)";

row! {
    pub(crate) struct StreamRow {
        id: String, org_id: String, mode: String, aud: String, method: String,
        endpoint_url: Option<String>, poll_token_hash: Option<Vec<u8>>, events_requested: String,
        revocations: bool, description: Option<String>, status: String, created_at: i64,
    }
}

pub(crate) const STREAM_COLUMNS: &str = StreamRow::COLUMNS;

impl StreamRow {
    pub(crate) fn into_record(self) -> Result<StreamRecord, StoreError> {
        Ok(StreamRecord {
            mode: parse_mode(&self.mode)?,
            events_requested: serde_json::from_str(&self.events_requested)
                .map_err(|_| StoreError::Corrupt(format!("events of stream {}", self.id)))?,
            id: decode("stream", &self.id, StreamId::parse)?,
            org_id: decode("organization", &self.org_id, OrgId::parse)?,
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

row! {
    pub(crate) struct EventRow {
        seq: i64, stream_id: String, jti: String, kind: String, agent_id: Option<String>,
        issuer: Option<String>, reason: Option<String>, state: Option<String>, event_at: i64,
        attempts: i32,
    }
}

pub(crate) const EVENT_COLUMNS: &str = EventRow::COLUMNS;

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

pub(crate) fn events_json(events: &[String]) -> String {
    serde_json::to_string(events).expect("strings serialize")
}

/// The push streams due at `$1`: enabled, not leased, their oldest event due.
pub(crate) const DUE: &str =
    "FROM ssf_streams s WHERE s.next_due_at <= $1 AND s.method = 'urn:ietf:rfc:8935' \
    AND s.status = 'enabled' AND (s.lease_until IS NULL OR s.lease_until < $1)";

//! The issuer-domain holdings list inside a transaction: reading the holdings in force of
//! some names (each event vouched for by the key file, or ignored and alarmed), appending
//! sealed events, and whether an organization may issue under a name.

use sqlx::{ColumnIndex, Database, Decode, Encode, Executor, IntoArguments, Type};

use super::StoreError;
use agentid_core::domain::holding::{self, DomainEvent, EventKind, Holding, ProofMethod, UnreadEvent};
use agentid_core::domain::Millis;
use agentid_core::keys::KeyRing;

row! {
    pub(crate) struct EventRow {
        seq: i64,
        kind: String,
        domain: String,
        org_id: String,
        method: Option<String>,
        at: i64,
        claimed_at: i64,
        reason: Option<String>,
        mac: Option<Vec<u8>>,
    }
}

impl EventRow {
    /// The event, or what could be read of a row that is none the service writes.
    pub(crate) fn read(self) -> Result<DomainEvent, UnreadEvent> {
        let commitment_id = holding::commitment_id(
            self.seq,
            &self.kind,
            &self.domain,
            &self.org_id,
            self.method.as_deref(),
        );
        let (seq, at) = (self.seq, Millis(self.at));
        self.into_event().map_err(|why| UnreadEvent {
            seq,
            commitment_id,
            at,
            why,
        })
    }

    fn into_event(self) -> Result<DomainEvent, String> {
        let bad = |what: &str| format!("its {what} is none the service writes");
        Ok(DomainEvent {
            kind: EventKind::parse(&self.kind).ok_or_else(|| bad("kind"))?,
            method: match &self.method {
                Some(m) => Some(ProofMethod::parse(m).ok_or_else(|| bad("method"))?),
                None => None,
            },
            mac: match &self.mac {
                Some(m) => Some(m.as_slice().try_into().map_err(|_| bad("mac"))?),
                None => None,
            },
            seq: self.seq,
            domain: self.domain,
            org_id: self.org_id,
            at: Millis(self.at),
            claimed_at: Millis(self.claimed_at),
            reason: self.reason,
        })
    }
}

pub(crate) const EVENT_COLUMNS: &str = "seq, kind, domain, org_id, method, at, claimed_at, reason, mac";

/// The event that closes what the migration carried over: unsealed events count up to it.
pub(crate) const MIGRATED_SEQ_SQL: &str = "SELECT MIN(seq) FROM domain_events WHERE kind = 'migrated'";

/// Whether the key file vouches for an event: its MAC checks, or it is a holding the
/// migration carried over (unsealed, before the event that closed them). Anything else is
/// a row written with database access alone: ignored, and an alarm.
pub fn vouched(keys: &KeyRing, e: &DomainEvent, migrated: Option<i64>) -> bool {
    let ok = keys.vouches_for_domain_event(e, migrated);
    if !ok {
        tracing::error!(seq = e.seq, domain = %e.domain, "integrity alarm: an issuer-domain event the key file does not vouch for is ignored");
        metrics::counter!("agentid_integrity_failures_total", "what" => "domain_event").increment(1);
    }
    ok
}

/// The events of `rows` the key file vouches for. A row that does not read as an event is
/// none either: ignored, and an alarm.
pub(crate) fn vouched_events(keys: &KeyRing, rows: Vec<EventRow>, migrated: Option<i64>) -> Vec<DomainEvent> {
    rows.into_iter()
        .filter_map(|r| match r.read() {
            Ok(e) => vouched(keys, &e, migrated).then_some(e),
            Err(u) => {
                unread_alarm(&u);
                None
            }
        })
        .collect()
}

/// The alarm of a stored event that does not read.
pub(crate) fn unread_alarm(u: &UnreadEvent) {
    tracing::error!(seq = u.seq, why = %u.why, "integrity alarm: an issuer-domain event that does not read as one is ignored");
    metrics::counter!("agentid_integrity_failures_total", "what" => "domain_event").increment(1);
}

/// The `IN (…)` list of `n` parameters from `$first` on.
fn params(first: usize, n: usize) -> String {
    (first..first + n)
        .map(|i| format!("${i}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The holdings in force (vouched for by the key file) of the names `names`, and (with
/// `below`) of every name below `below`, read inside the caller's transaction.
pub(crate) async fn holdings_in<DB>(
    tx: &mut sqlx::Transaction<'_, DB>,
    keys: &KeyRing,
    names: &[String],
    below: Option<&str>,
) -> Result<Vec<Holding>, StoreError>
where
    DB: Database,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'r> String: Decode<'r, DB> + Type<DB>,
    for<'r> Option<String>: Decode<'r, DB> + Type<DB>,
    for<'r> i64: Decode<'r, DB> + Type<DB>,
    for<'r> Option<i64>: Decode<'r, DB> + Type<DB>,
    for<'r> Option<Vec<u8>>: Decode<'r, DB> + Type<DB>,
    for<'r> &'r str: ColumnIndex<DB::Row>,
    usize: ColumnIndex<DB::Row>,
{
    let (migrated,): (Option<i64>,) = sqlx::query_as(MIGRATED_SEQ_SQL).fetch_one(&mut **tx).await?;
    let mut sql = format!(
        "SELECT {EVENT_COLUMNS} FROM domain_events WHERE domain IN ({})",
        params(1, names.len())
    );
    if below.is_some() {
        // Names are letters, digits, hyphens and dots: nothing LIKE reads as a wildcard.
        sql.push_str(&format!(" OR domain LIKE '%.' || ${}", names.len() + 1));
    }
    sql.push_str(" ORDER BY seq");
    let mut q = sqlx::query_as::<DB, EventRow>(&sql);
    for n in names {
        q = q.bind(n.as_str());
    }
    if let Some(b) = below {
        q = q.bind(b);
    }
    let events = vouched_events(keys, q.fetch_all(&mut **tx).await?, migrated);
    Ok(holding::current(&events))
}

/// Seals `events` with the key file and appends them, numbered after the last event; the
/// number of the last one.
pub async fn append<DB>(
    tx: &mut sqlx::Transaction<'_, DB>,
    keys: &KeyRing,
    events: Vec<DomainEvent>,
) -> Result<i64, StoreError>
where
    DB: Database,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> Option<&'q str>: Encode<'q, DB> + Type<DB>,
    for<'q> &'q [u8]: Encode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
    for<'r> Option<i64>: Decode<'r, DB> + Type<DB>,
    usize: ColumnIndex<DB::Row>,
{
    let (last,): (Option<i64>,) = sqlx::query_as("SELECT MAX(seq) FROM domain_events")
        .fetch_one(&mut **tx)
        .await?;
    let mut seq = last.unwrap_or(0);
    for mut event in events {
        // A row at the largest number (written with database access alone) must not wrap the
        // numbering round: no name changes hands until the operator removes it.
        seq = seq.checked_add(1).ok_or_else(|| {
            StoreError::Corrupt(
                "issuer-domain events are numbered up to the largest number a row can hold".into(),
            )
        })?;
        event.seq = seq;
        let mac = keys.domain_event_mac(&event.canonical());
        sqlx::query(&format!(
            "INSERT INTO domain_events ({EVENT_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)"
        ))
        .bind(event.seq)
        .bind(event.kind.as_str())
        .bind(event.domain.as_str())
        .bind(event.org_id.as_str())
        .bind(event.method.map(ProofMethod::as_str))
        .bind(event.at.0)
        .bind(event.claimed_at.0)
        .bind(event.reason.as_deref())
        .bind(&mac[..])
        .execute(&mut **tx)
        .await?;
    }
    Ok(seq)
}

/// Whether `org_id` may issue under `domain`, read inside the caller's transaction: one of
/// its holdings (vouched for) covers the name, and no other organization's does.
pub(crate) async fn check_issuer<DB>(
    tx: &mut sqlx::Transaction<'_, DB>,
    keys: &KeyRing,
    org_id: &str,
    domain: &str,
) -> Result<(), StoreError>
where
    DB: Database,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'r> String: Decode<'r, DB> + Type<DB>,
    for<'r> Option<String>: Decode<'r, DB> + Type<DB>,
    for<'r> i64: Decode<'r, DB> + Type<DB>,
    for<'r> Option<i64>: Decode<'r, DB> + Type<DB>,
    for<'r> Option<Vec<u8>>: Decode<'r, DB> + Type<DB>,
    for<'r> &'r str: ColumnIndex<DB::Row>,
    usize: ColumnIndex<DB::Row>,
{
    let held = holdings_in(tx, keys, &holding::name_and_parents(domain), None).await?;
    holding::may_issue(org_id, domain, &held).map_err(|why| StoreError::NotHeld {
        domain: domain.to_owned(),
        elsewhere: why == holding::NotCovered::HeldElsewhere,
    })
}

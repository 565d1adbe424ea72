//! The issuer-domain holdings list inside a transaction: reading the holdings in force of
//! some names (each event vouched for by the key file, or ignored and alarmed), appending
//! sealed events, and whether an organization may issue under a name.

use agentid_core::domain::holding::{self, DomainEvent, EventKind, ProofMethod, UnreadEvent};
use agentid_core::domain::Millis;

row! {
    pub(crate) struct EventRow {
        seq: i64, kind: String, domain: String, org_id: String, method: Option<String>, at: i64,
        claimed_at: i64, reason: Option<String>, mac: Option<Vec<u8>>,
    }
}

pub(crate) const EVENT_COLUMNS: &str = EventRow::COLUMNS;

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

/// The event that closes what the migration carried over: unsealed events count up to it.
pub(crate) const MIGRATED_SEQ_SQL: &str =
    "SELECT MIN(seq) FROM domain_events WHERE kind = 'migrated' AND seq >= 1";

/// The `IN (…)` list of `n` parameters from `$first` on.
pub(crate) fn params(first: usize, n: usize) -> String {
    (first..first + n)
        .map(|i| format!("${i}"))
        .collect::<Vec<_>>()
        .join(", ")
}

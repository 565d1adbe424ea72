//! The fleet's issuer-domain list, watched. Checkpoints commit to the whole list, but they
//! are made when a ledger grows; a name that changes hands writes no audit record, so
//! without more, no checkpoint would commit to the event that moved it, and deleting that
//! event (handing the name back) would go unseen. So:
//! - every tick, each instance reads how long the list is, and alarms when it is shorter
//!   than a list it appended to or read before (the list only grows);
//! - when the list holds events that neither a record this instance appended nor the service
//!   ledger's latest checkpoint covers, the instance appends a record saying so to that
//!   ledger ([`Event::DomainList`]): the ledger grows, and its next checkpoint commits to the
//!   longer list, which the witness and `audit verify` then hold the database to. Instances
//!   of a fleet may each append one for the same events; once a checkpoint covers them, none
//!   does.

use parking_lot::Mutex;

use agentid_store::DomainListSize;

/// What one instance knows of the issuer-domain list's length.
#[derive(Debug, Default)]
pub struct DomainListWatch {
    state: Mutex<WatchState>,
}

#[derive(Debug, Default)]
struct WatchState {
    /// The longest list this instance appended to or read.
    seen: DomainListSize,
    /// The shorter list last alarmed about: one alarm for each, not one each tick.
    alarmed: Option<DomainListSize>,
    /// How many events this instance knows a record of the service's ledger, or its latest
    /// checkpoint, to have said the list holds.
    recorded: u64,
}

impl DomainListWatch {
    /// This instance appended the event numbered `seq`.
    pub(crate) fn appended(&self, seq: i64) {
        let mut s = self.state.lock();
        s.seen.newest = s.seen.newest.max(seq);
    }

    /// The list read now: the longer list seen before, when this one is shorter and not
    /// yet alarmed about.
    pub(super) fn read(&self, now: DomainListSize) -> Option<DomainListSize> {
        let mut s = self.state.lock();
        if now.shorter_than(&s.seen) {
            if s.alarmed == Some(now) {
                return None;
            }
            s.alarmed = Some(now);
            return Some(s.seen);
        }
        s.seen = now;
        s.alarmed = None;
        None
    }

    /// How many events this instance knows a record or checkpoint to have said the list holds.
    pub(super) fn recorded(&self) -> u64 {
        self.state.lock().recorded
    }

    /// A record or checkpoint said the list holds `rows` events.
    pub(super) fn record(&self, rows: u64) {
        let mut s = self.state.lock();
        s.recorded = s.recorded.max(rows);
    }
}

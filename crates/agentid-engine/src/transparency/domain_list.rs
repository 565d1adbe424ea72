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

use agentid_core::domain::audit::{AuditEntry, Event};
use agentid_core::domain::{Ledger, Millis, VerifyResult};
use agentid_core::tlog::commit::Commitments;
use agentid_store::{DomainListSize, StoreError};

use super::checkpointer::{alarm, Transparency};
use crate::audit::AuditHandle;

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
    fn read(&self, now: DomainListSize) -> Option<DomainListSize> {
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
}

impl Transparency {
    /// One look at the list: an alarm when it is shorter than before, and a record of the
    /// service's ledger when it grew past what such a record last said.
    pub(super) async fn watch_domain_list(
        &self,
        audit: &AuditHandle,
        watch: &DomainListWatch,
    ) -> Result<(), StoreError> {
        let now = self.store.domain_list_size().await?;
        if let Some(seen) = watch.read(now) {
            alarm(
                "domain_list",
                &format!(
                    "the issuer-domain list holds {} events up to number {}, fewer than the {} up to number \
                     {} this instance read or appended before: who holds a name was rewritten",
                    now.rows, now.newest, seen.rows, seen.newest
                ),
            );
        }
        if now.rows <= watch.state.lock().recorded {
            return Ok(());
        }
        // Grown past what this instance recorded: perhaps a checkpoint commits to it already
        // (another instance's record, or a later checkpoint than this instance's record).
        let committed = self.domains_committed().await?;
        if now.rows <= committed {
            let mut s = watch.state.lock();
            s.recorded = s.recorded.max(committed);
            return Ok(());
        }
        let entry = AuditEntry {
            ledger: Ledger::service(),
            event: Event::DomainList,
            agent_id: String::new(),
            result: VerifyResult::Valid,
            failure_reason: Some(format!(
                "the issuer-domain list holds {} events, the newest numbered {}",
                now.rows, now.newest
            )),
            latency_us: 0,
            requested_at: Millis::now(),
            // Names no agent: nothing to re-check against revocations.
            revocations_seen: i64::MAX,
        };
        match audit.append(entry).await {
            Ok(_) => {
                let mut s = watch.state.lock();
                s.recorded = s.recorded.max(now.rows);
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot record that the issuer-domain list grew; trying again")
            }
        }
        Ok(())
    }

    /// How many issuer-domain events the service ledger's latest checkpoint commits to.
    async fn domains_committed(&self) -> Result<u64, StoreError> {
        let ledger = Ledger::service();
        let size = self.store.ledger_size(&ledger).await?;
        let Some(latest) = self.latest_signed(&ledger, size, false).await? else {
            return Ok(0);
        };
        Ok(self
            .key
            .verifier()
            .open(&latest.note)
            .ok()
            .and_then(|cp| Commitments::parse(&cp.extensions).ok().flatten())
            .map_or(0, |c| c.domains.count))
    }
}

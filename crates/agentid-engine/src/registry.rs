//! The registry: what a verify answer needs about each agent, and the revocation index.
//! Both live in `DashMap`s that the verify path reads without locks or awaits. Entries
//! never change once written (an agent's name, scopes and owner are fixed at registration;
//! revocation only ever adds), so readers can never see a half-updated agent, and writers
//! (registrations, revocations, cold misses, the resync task) never conflict: every write
//! is an insert-if-absent, in any order. The one ordered piece is the epoch watermark below,
//! kept under a mutex.
//!
//! Beside the index, `revocations_seen`: the revocation epoch (see `agentid_store::RevokedSince`) up
//! to which every revocation is in the index. A verification reads it before it looks at the
//! index and hands it to the audit writer with its entry, and the store re-checks a batch's
//! `valid` entries agent by agent only when a revocation was committed above it.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use dashmap::DashMap;
use parking_lot::Mutex;

use agentid_core::domain::{AgentId, KeyMode, OrgId};
use agentid_store::AgentRecord;

/// The fixed facts about an agent that verification uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentEntry {
    pub org_id: OrgId,
    pub mode: KeyMode,
    pub name: String,
    pub description: String,
}

impl From<&AgentRecord> for AgentEntry {
    fn from(a: &AgentRecord) -> Self {
        AgentEntry {
            org_id: a.org_id.clone(),
            mode: a.mode,
            name: a.name.clone(),
            description: a.description.clone(),
        }
    }
}

/// A revoked agent and the reason given, if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Revoked {
    pub(crate) reason: Option<String>,
}

#[derive(Debug, Default)]
pub struct Registry {
    agents: DashMap<AgentId, Arc<AgentEntry>>,
    revoked: DashMap<String, Revoked>,
    /// Every revocation with an epoch up to this one is in `revoked` (`epochs.seen`, kept
    /// here too so that the verify path reads it without a lock).
    revocations_seen: AtomicI64,
    epochs: Mutex<EpochWatermark>,
}

impl Registry {
    pub fn agent(&self, id: &str) -> Option<Arc<AgentEntry>> {
        self.agents.get(id).map(|e| Arc::clone(e.value()))
    }

    pub fn revocation(&self, id: &str) -> Option<Revoked> {
        self.revoked.get(id).map(|r| r.value().clone())
    }

    /// The epoch up to which every revocation is in the index. Read it before looking an
    /// agent up: a revocation the look-up missed then has a higher epoch.
    pub fn revocations_seen(&self) -> i64 {
        self.revocations_seen.load(Ordering::Acquire)
    }

    /// Adds what the store says about an agent (registration, load, or a cold miss).
    /// (A revoked agent's revocation goes in through `Revocations`, with its status bit.)
    pub fn learn(&self, a: &AgentRecord) -> Arc<AgentEntry> {
        let entry = Arc::new(AgentEntry::from(a));
        self.agents
            .entry(a.id.clone())
            .or_insert_with(|| Arc::clone(&entry))
            .clone()
    }

    /// Puts a revocation into the index (`Revocations` does, with the status bit).
    /// Revocation is permanent: the first reason recorded stays. One marked without its
    /// reason (the store could not be read then) takes the reason the resync brings.
    pub fn mark_revoked(&self, id: &str, reason: Option<String>) {
        let mut held = self
            .revoked
            .entry(id.to_owned())
            .or_insert(Revoked { reason: None });
        if held.reason.is_none() {
            held.reason = reason;
        }
    }

    /// The revocation stamped with `epoch` is in the index (this instance committed it).
    pub(crate) fn epoch_seen(&self, epoch: i64) {
        let mut epochs = self.epochs.lock();
        let seen = epochs.add(epoch);
        self.revocations_seen.store(seen, Ordering::Release);
    }

    /// Every revocation up to `epoch` is in the index (a load or a resync read them).
    pub(crate) fn reach_epoch(&self, epoch: i64) {
        let mut epochs = self.epochs.lock();
        let seen = epochs.reach(epoch);
        self.revocations_seen.store(seen, Ordering::Release);
    }

    pub(crate) fn agent_count(&self) -> usize {
        self.agents.len()
    }

    pub(crate) fn revoked_count(&self) -> usize {
        self.revoked.len()
    }
}

/// Where `revocations_seen` stands, and the epochs above it already in the index. It moves
/// only over an unbroken run of epochs: this instance's revocations arrive with their epochs,
/// possibly out of order, and another instance's fill the gaps only when a resync reads them.
#[derive(Debug, Default)]
struct EpochWatermark {
    seen: i64,
    /// In the index, but above `seen` with a gap below them.
    ahead: BTreeSet<i64>,
}

impl EpochWatermark {
    /// The revocation with this epoch is in the index. Returns the watermark.
    fn add(&mut self, epoch: i64) -> i64 {
        if epoch > self.seen {
            self.ahead.insert(epoch);
        }
        self.close_gaps()
    }

    /// Every revocation up to `epoch` is in the index. Returns the watermark.
    fn reach(&mut self, epoch: i64) -> i64 {
        self.seen = self.seen.max(epoch);
        let seen = self.seen;
        self.ahead.retain(|&e| e > seen);
        self.close_gaps()
    }

    fn close_gaps(&mut self) -> i64 {
        while self.ahead.first() == Some(&(self.seen + 1)) {
            self.ahead.pop_first();
            self.seen += 1;
        }
        self.seen
    }
}

#[cfg(test)]
mod tests {
    use super::{EpochWatermark, Registry};

    /// A revocation marked without its reason (the store unreadable a moment) takes the one
    /// the resync brings; a reason once held stays.
    #[test]
    fn a_revocation_marked_without_its_reason_takes_it_later() {
        let r = Registry::default();
        r.mark_revoked("agt_1", None);
        r.mark_revoked("agt_1", Some("stolen".into()));
        assert_eq!(r.revocation("agt_1").unwrap().reason.as_deref(), Some("stolen"));
        r.mark_revoked("agt_1", Some("other".into()));
        r.mark_revoked("agt_1", None);
        assert_eq!(r.revocation("agt_1").unwrap().reason.as_deref(), Some("stolen"));
    }

    #[test]
    fn the_watermark_moves_only_over_an_unbroken_run_of_epochs() {
        let mut w = EpochWatermark::default();
        assert_eq!(w.add(2), 0, "epoch 1 is missing");
        assert_eq!(w.add(4), 0);
        assert_eq!(w.add(1), 2, "1 and 2 are in, 3 is not");
        assert_eq!(w.add(2), 2, "an epoch seen twice changes nothing");
        assert_eq!(w.reach(3), 4, "a resync that read up to 3 joins the 4 held ahead");
        assert_eq!(w.reach(1), 4, "it never moves back");
        assert_eq!(w.add(6), 4);
        assert_eq!(w.reach(7), 7, "a resync past what is held ahead drops it");
        assert!(w.ahead.is_empty());
    }
}

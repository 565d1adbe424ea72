//! The one door through which a revocation enters this instance's memory, wherever it was
//! committed: its own revokes (and the revocations of a name changing hands), another
//! instance's (the resync, or the audit statement that found one), and those loaded at
//! start. Each sets the revocation index and the agent's status-list bit together, and a
//! revocation committed here wakes the Shared Signals deliverer (its events were queued in
//! the revocation's transaction).

use std::sync::Arc;
use std::time::Duration;

use agentid_core::domain::{AgentId, Millis, StatusPlace};
use agentid_store::{AgentRecord, RevokedSince, SharedStore, StoreError};

use super::registry::Registry;
use super::ssf::Ssf;
use super::status::StatusLists;

pub(crate) struct Revocations {
    registry: Arc<Registry>,
    status: Arc<StatusLists>,
    ssf: Arc<Ssf>,
}

impl Revocations {
    pub fn new(registry: Arc<Registry>, status: Arc<StatusLists>, ssf: Arc<Ssf>) -> Self {
        Revocations {
            registry,
            status,
            ssf,
        }
    }

    /// One revocation into the index and its bit into the status list.
    fn mark(&self, id: &AgentId, reason: Option<Option<&str>>, place: Option<(&StatusPlace, Millis)>) {
        self.registry.mark_revoked(id, reason);
        if let Some((place, at)) = place {
            self.status.revoke(place, at);
        }
    }

    /// An agent as the store holds it: revoked ones are marked (at start, and for an agent
    /// the verify path reads from the store).
    pub fn learn(&self, a: &AgentRecord) {
        if let Some(at) = a.revoked_at {
            self.mark(
                &a.id,
                Some(a.revocation_reason.as_deref()),
                a.status.as_ref().map(|p| (p, at)),
            );
        }
    }

    /// Revocations this instance committed, with the epoch each was stamped with.
    pub fn committed(&self, revoked: &[(AgentRecord, Option<i64>)]) {
        for (agent, epoch) in revoked {
            self.learn(agent);
            if let Some(epoch) = epoch {
                self.registry.epoch_seen(*epoch);
            }
        }
        if !revoked.is_empty() {
            self.ssf.wake();
        }
    }

    /// What the store said of every revocation above the watermark (a resync): into the
    /// index, then the watermark reaches the store's epoch.
    pub(crate) fn caught_up(&self, r: &RevokedSince) {
        for rev in &r.revoked {
            self.mark(
                &rev.agent_id,
                Some(rev.reason.as_deref()),
                rev.place.as_ref().map(|p| (p, rev.at)),
            );
        }
        self.registry.reach_epoch(r.epoch);
    }

    /// The reason a revoked agent was revoked for, if one was given: from the cache, else
    /// read from the store (and cached).
    pub(crate) async fn reason(&self, store: &SharedStore, id: &str) -> Result<Option<Arc<str>>, StoreError> {
        if let Some(held) = self.registry.revocation_reason(id) {
            return Ok(held);
        }
        let Some(agent) = AgentId::parse(id) else {
            return Ok(None);
        };
        Ok(match store.get_agent(&agent).await? {
            Some(a) if a.revoked_at.is_some() => {
                self.learn(&a);
                a.revocation_reason.map(Arc::from)
            }
            _ => None,
        })
    }

    /// A revocation the audit transaction saw that the index did not hold (another instance
    /// revoked the agent): read from the store.
    pub(crate) async fn seen_elsewhere(&self, store: &SharedStore, id: &str) {
        // The store revoked an agent it holds: its id is one.
        let Some(agent) = AgentId::parse(id) else {
            return;
        };
        match store.get_agent(&agent).await {
            Ok(Some(a)) if a.revoked_at.is_some() => self.learn(&a),
            // Not readable now: the index holds it, and its reason is read when an answer
            // says it; the resync brings the status bit.
            _ => self.mark(&agent, None, None),
        }
    }
}

/// Pulls the revocations other instances committed, every `every`, for as long as it runs,
/// and the status lists they opened. Revocations at or below the watermark are in the index;
/// it asks for the others. Any that this instance learns of meanwhile are marked twice,
/// which is harmless.
pub async fn resync(revocations: Arc<Revocations>, store: SharedStore, every: Duration) {
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticks.tick().await; // the first tick is immediate, and the registry was just loaded
    loop {
        ticks.tick().await;
        match store.status_lists().await {
            Ok(lists) => {
                for (id, size) in lists {
                    revocations.status.learn_list(&id, size);
                }
            }
            Err(e) => tracing::warn!(error = %e, "status list resync failed; retrying"),
        }
        match store
            .revocations_after(revocations.registry.revocations_seen())
            .await
        {
            Ok(r) => revocations.caught_up(&r),
            Err(e) => tracing::warn!(error = %e, "revocation resync failed; retrying"),
        }
    }
}

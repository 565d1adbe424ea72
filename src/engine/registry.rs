//! The registry: what a verify answer needs about each agent, and the revocation index.
//! Both live in `DashMap`s that the verify path reads without locks or awaits. Entries
//! never change once written (an agent's name, scopes and owner are fixed at registration;
//! revocation only ever adds), so readers can never see a half-updated agent.
//!
//! Beside the index, `revocations_seen`: the revocation epoch (see `store::Revocations`) up
//! to which every revocation is in the index. A verification reads it before it looks at the
//! index and hands it to the audit writer with its entry, and the store re-checks a batch's
//! `valid` entries agent by agent only when a revocation was committed above it.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use dashmap::DashMap;

use crate::domain::KeyMode;
use crate::store::{AgentRecord, SharedStore};

/// The fixed facts about an agent that verification uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentEntry {
    pub org_id: String,
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
    pub reason: Option<String>,
}

#[derive(Debug, Default)]
pub struct Registry {
    agents: DashMap<String, Arc<AgentEntry>>,
    revoked: DashMap<String, Revoked>,
    /// Every revocation with an epoch up to this one is in `revoked`.
    revocations_seen: AtomicI64,
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

    /// Only once every revocation up to `epoch` is in the index (it never moves back).
    pub(super) fn advance_revocations_seen(&self, epoch: i64) {
        self.revocations_seen.fetch_max(epoch, Ordering::Release);
    }

    /// Adds what the store says about an agent (registration, load, or a cold miss).
    pub fn learn(&self, a: &AgentRecord) -> Arc<AgentEntry> {
        if a.revoked_at.is_some() {
            self.mark_revoked(&a.id, a.revocation_reason.clone());
        }
        let entry = Arc::new(AgentEntry::from(a));
        self.agents
            .entry(a.id.clone())
            .or_insert_with(|| Arc::clone(&entry))
            .clone()
    }

    /// Revocation is permanent: the first reason recorded stays.
    pub fn mark_revoked(&self, id: &str, reason: Option<String>) {
        self.revoked.entry(id.to_owned()).or_insert(Revoked { reason });
    }

    pub fn agent_count(&self) -> usize {
        self.agents.len()
    }

    pub fn revoked_count(&self) -> usize {
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

/// The registry supervisor: the one writer of the registry. Registrations, revocations and
/// cold-miss loads go through its mailbox (so they apply in order); every few seconds it also
/// pulls revocations committed by other instances. Readers use the shared maps directly.
pub struct RegistrySupervisor {
    registry: Arc<Registry>,
    store: SharedStore,
    resync_every: Duration,
    epochs: EpochWatermark,
    resyncing: bool,
}

impl RegistrySupervisor {
    /// Takes over `revocations_seen` as the registry holds it (set by the initial load).
    pub fn start(registry: Arc<Registry>, store: SharedStore, resync_every: Duration) -> Addr<Self> {
        let epochs = EpochWatermark {
            seen: registry.revocations_seen(),
            ahead: BTreeSet::new(),
        };
        actix::Supervisor::start(move |_| RegistrySupervisor {
            registry,
            store,
            resync_every,
            epochs,
            resyncing: false,
        })
    }

    /// Gauges of the registry and of the store's pool.
    fn sample(&self) {
        metrics::gauge!("agentid_registry_agents").set(self.registry.agent_count() as f64);
        metrics::gauge!("agentid_revocation_index_size").set(self.registry.revoked_count() as f64);
        for p in self.store.pool_stats() {
            let gauge =
                |state| metrics::gauge!("agentid_store_connections", "pool" => p.pool, "state" => state);
            gauge("active").set(f64::from(p.open - p.idle.min(p.open)));
            gauge("idle").set(f64::from(p.idle));
            gauge("max").set(f64::from(p.max));
        }
    }

    fn resync(&mut self, ctx: &mut Context<Self>) {
        if self.resyncing {
            return;
        }
        self.resyncing = true;
        // Revocations at or below the watermark are in the index; ask for the others. Any
        // that this instance learns of meanwhile are marked twice, which is harmless.
        let after = self.epochs.seen;
        let store = self.store.clone();
        ctx.spawn(
            async move { store.revocations_after(after).await }
                .into_actor(self)
                .map(move |res, act, _| {
                    act.resyncing = false;
                    match res {
                        Ok(r) => {
                            for (id, reason) in r.revoked {
                                act.registry.mark_revoked(&id, reason);
                            }
                            let seen = act.epochs.reach(r.epoch);
                            act.registry.advance_revocations_seen(seen);
                        }
                        Err(e) => tracing::warn!(error = %e, "revocation resync failed; retrying"),
                    }
                }),
        );
    }
}

impl Actor for RegistrySupervisor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.run_interval(self.resync_every, |act, ctx| act.resync(ctx));
        self.sample();
        ctx.run_interval(crate::telemetry::SAMPLE_EVERY, |act, _| act.sample());
    }
}

impl actix::Supervised for RegistrySupervisor {
    fn restarting(&mut self, _: &mut Self::Context) {
        tracing::warn!("registry supervisor restarting");
        self.resyncing = false;
    }
}

/// Adds an agent the store knows; answers with the entry the registry now holds.
#[derive(Message)]
#[rtype(result = "Arc<AgentEntry>")]
pub struct Learn(pub AgentRecord);

impl Handler<Learn> for RegistrySupervisor {
    type Result = MessageResult<Learn>;

    fn handle(&mut self, msg: Learn, _: &mut Self::Context) -> Self::Result {
        MessageResult(self.registry.learn(&msg.0))
    }
}

/// Records a committed revocation, with its epoch when the store gave one.
#[derive(Message)]
#[rtype(result = "()")]
pub struct MarkRevoked {
    pub id: String,
    pub reason: Option<String>,
    pub epoch: Option<i64>,
}

impl Handler<MarkRevoked> for RegistrySupervisor {
    type Result = ();

    fn handle(&mut self, msg: MarkRevoked, _: &mut Self::Context) {
        self.registry.mark_revoked(&msg.id, msg.reason);
        if let Some(epoch) = msg.epoch {
            let seen = self.epochs.add(epoch);
            self.registry.advance_revocations_seen(seen);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::EpochWatermark;

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

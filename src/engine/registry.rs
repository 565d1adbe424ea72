//! The registry: what a verify answer needs about each agent, and the revocation index.
//! Both live in `DashMap`s that the verify path reads without locks or awaits. Entries
//! never change once written (an agent's name, scopes and owner are fixed at registration;
//! revocation only ever adds), so readers can never see a half-updated agent.

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use dashmap::DashMap;

use crate::domain::{KeyMode, Millis};
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
}

impl Registry {
    pub fn agent(&self, id: &str) -> Option<Arc<AgentEntry>> {
        self.agents.get(id).map(|e| Arc::clone(e.value()))
    }

    pub fn revocation(&self, id: &str) -> Option<Revoked> {
        self.revoked.get(id).map(|r| r.value().clone())
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

/// The registry supervisor: the one writer of the registry. Registrations, revocations and
/// cold-miss loads go through its mailbox (so they apply in order); every few seconds it also
/// pulls revocations committed by other instances. Readers use the shared maps directly.
pub struct RegistrySupervisor {
    registry: Arc<Registry>,
    store: SharedStore,
    resync_every: Duration,
    /// Revocations at or after this time are pulled on the next resync.
    watermark: Millis,
    resyncing: bool,
}

impl RegistrySupervisor {
    pub fn start(registry: Arc<Registry>, store: SharedStore, resync_every: Duration) -> Addr<Self> {
        let watermark = Millis::now();
        actix::Supervisor::start(move |_| RegistrySupervisor {
            registry,
            store,
            resync_every,
            watermark,
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
        // Overlap windows a little: clocks of instances differ, and marking twice is harmless.
        let since = Millis(self.watermark.0 - 5_000);
        let started = Millis::now();
        let store = self.store.clone();
        ctx.spawn(
            async move { store.revoked_since(since).await }
                .into_actor(self)
                .map(move |res, act, _| {
                    act.resyncing = false;
                    match res {
                        Ok(revoked) => {
                            for (id, reason) in revoked {
                                act.registry.mark_revoked(&id, reason);
                            }
                            act.watermark = started;
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

/// Records a committed revocation.
#[derive(Message)]
#[rtype(result = "()")]
pub struct MarkRevoked {
    pub id: String,
    pub reason: Option<String>,
}

impl Handler<MarkRevoked> for RegistrySupervisor {
    type Result = ();

    fn handle(&mut self, msg: MarkRevoked, _: &mut Self::Context) {
        self.registry.mark_revoked(&msg.id, msg.reason);
    }
}

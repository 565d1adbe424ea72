//! The registry: what a verify answer needs about each agent, and the revocation index.
//! Both live in `DashMap`s that the verify path reads without locks or awaits. Entries
//! never change once written (an agent's name, scopes and owner are fixed at registration;
//! revocation only ever adds), so readers can never see a half-updated agent.

use std::sync::Arc;

use dashmap::DashMap;

use crate::domain::KeyMode;
use crate::store::AgentRecord;

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

//! The registry: what a verify answer needs about each agent, and the revocation index.
//! The agents live in a `DashMap` and the index in a `DashSet` of ULIDs, which the verify path
//! reads without locks or awaits; the agents learned past the registry's byte budget, in a
//! weighted cache (its shards' locks) asked only when the map misses. The reasons given for
//! revocations are in a weighted cache too: a revoked token whose reason it does not hold
//! reads it from the store. Entries never change once written (an agent's name, scopes
//! and owner are fixed at registration; revocation only ever adds), so readers can never
//! see a half-updated agent, and writers (registrations, revocations, cold misses, the
//! resync task) never conflict: every write to a map is an insert-if-absent, in any order,
//! and the cache's an insert of the same entry. The one ordered piece is the epoch
//! watermark below, kept under a mutex.
//!
//! Beside the index, `revocations_seen`: the revocation epoch (see `agentid_store::RevokedSince`) up
//! to which every revocation is in the index. A verification reads it before it looks at the
//! index and hands it to the audit writer with its entry, and the store re-checks a batch's
//! `valid` entries agent by agent only when a revocation was committed above it.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;

use dashmap::{DashMap, DashSet};
use parking_lot::Mutex;

use agentid_core::domain::{agent_bits, AgentId, KeyMode, OrgId};
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

impl AgentEntry {
    /// About how many bytes it takes held under `id`: the entry, its strings, its key, and
    /// the map's, the `Arc`'s and the allocator's share.
    fn held_bytes(&self, id: &AgentId) -> u64 {
        let fixed = std::mem::size_of::<AgentEntry>() + std::mem::size_of::<AgentId>() + 160;
        let strings =
            id.as_str().len() + self.org_id.as_str().len() + self.name.len() + self.description.len();
        (fixed + strings) as u64
    }
}

/// The bytes the registry's agents may take by default (`EngineConfig::registry_bytes`).
pub const REGISTRY_BYTES: u64 = 512 << 20;

/// The weight of a revocation's reason in its cache: about its bytes held.
#[derive(Debug, Clone)]
struct ReasonWeight;

impl quick_cache::Weighter<u128, Option<Arc<str>>> for ReasonWeight {
    fn weight(&self, _: &u128, reason: &Option<Arc<str>>) -> u64 {
        64 + reason.as_ref().map_or(0, |r| r.len() as u64 + 32)
    }
}

/// The weight of an agent in the overflow cache: its bytes.
#[derive(Debug, Clone)]
struct AgentWeight;

impl quick_cache::Weighter<AgentId, Arc<AgentEntry>> for AgentWeight {
    fn weight(&self, id: &AgentId, entry: &Arc<AgentEntry>) -> u64 {
        entry.held_bytes(id)
    }
}

#[derive(Debug)]
pub struct Registry {
    /// The agents held for good, within `budget` bytes: issuers register agents, and memory
    /// is not theirs to fill. The verify path reads them without a lock.
    agents: DashMap<AgentId, Arc<AgentEntry>>,
    held: AtomicU64,
    budget: u64,
    /// Agents learned past the budget, in a cache of an eighth of it that keeps the ones
    /// verified often: whoever registers agents past the budget does not make every other
    /// agent registered since cost a store read at each verification. One in neither is
    /// read from the store when a verification needs it.
    overflow: quick_cache::sync::Cache<AgentId, Arc<AgentEntry>, AgentWeight>,
    /// The budget was reached (said once in the log).
    full: AtomicBool,
    /// Every revoked agent, by the bits of its ULID (`agent_bits`): revocation is for good
    /// and the index holds every one, so each takes 16 bytes and the map's share.
    revoked: DashSet<u128>,
    /// The reasons given for them, within a sixty-fourth of the budget. One not here is
    /// read from the store when an answer says it (revoked agents are verified seldom).
    reasons: quick_cache::sync::Cache<u128, Option<Arc<str>>, ReasonWeight>,
    /// Every revocation with an epoch up to this one is in `revoked` (`epochs.seen`, kept
    /// here too so that the verify path reads it without a lock).
    revocations_seen: AtomicI64,
    epochs: Mutex<EpochWatermark>,
}

impl Default for Registry {
    fn default() -> Self {
        Registry::new(REGISTRY_BYTES)
    }
}

impl Registry {
    /// A registry whose agents and reasons for revocation take at most about `budget`
    /// bytes: an eighth in the overflow cache, a sixty-fourth for reasons, the rest held
    /// for good.
    pub fn new(budget: u64) -> Self {
        Registry::split(budget - budget / 8 - budget / 64, budget / 8, budget / 64)
    }

    fn split(budget: u64, overflow: u64, reasons: u64) -> Self {
        // The caches' estimates of their entries: agents of a few hundred bytes, reasons of
        // a few dozen.
        let items = |bytes: u64, each: u64| usize::try_from(bytes / each).unwrap_or(usize::MAX).max(1);
        Registry {
            agents: DashMap::new(),
            held: AtomicU64::new(0),
            budget,
            overflow: quick_cache::sync::Cache::with_weighter(items(overflow, 256), overflow, AgentWeight),
            full: AtomicBool::new(false),
            revoked: DashSet::new(),
            reasons: quick_cache::sync::Cache::with_weighter(items(reasons, 128), reasons, ReasonWeight),
            revocations_seen: AtomicI64::new(0),
            epochs: Mutex::new(EpochWatermark::default()),
        }
    }

    pub fn agent(&self, id: &str) -> Option<Arc<AgentEntry>> {
        match self.agents.get(id) {
            Some(e) => Some(Arc::clone(e.value())),
            None => self.overflow.get(id),
        }
    }

    /// Whether the agent is revoked, as far as the index knows (see `revocations_seen`).
    pub fn is_revoked(&self, id: &str) -> bool {
        agent_bits(id).is_some_and(|bits| self.revoked.contains(&bits))
    }

    /// The reason a revoked agent was revoked for, when the cache holds it: `Some(None)`
    /// when none was given, `None` when only the store knows.
    pub fn revocation_reason(&self, id: &str) -> Option<Option<Arc<str>>> {
        self.reasons.get(&agent_bits(id)?)
    }

    /// The epoch up to which every revocation is in the index. Read it before looking an
    /// agent up: a revocation the look-up missed then has a higher epoch.
    pub fn revocations_seen(&self) -> i64 {
        self.revocations_seen.load(Ordering::Acquire)
    }

    /// Adds what the store says about an agent (registration, load, or a cold miss).
    /// (A revoked agent's revocation goes in through `Revocations`, with its status bit.)
    pub fn learn(&self, a: &AgentRecord) -> Arc<AgentEntry> {
        if let Some(held) = self.agent(a.id.as_str()) {
            return held;
        }
        let entry = Arc::new(AgentEntry::from(a));
        let size = entry.held_bytes(&a.id);
        // Taken before the insert, so that racing learns never hold more than the budget.
        let taken = self
            .held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                held.checked_add(size).filter(|&total| total <= self.budget)
            });
        if taken.is_err() {
            if !self.full.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    agents = self.agents.len(),
                    budget_bytes = self.budget,
                    "the registry holds as many agents for good as its budget takes: agents \
                     past it go to a cache of an eighth of it, which keeps the ones verified \
                     often, else are read from the store (--registry-bytes)"
                );
            }
            self.overflow.insert(a.id.clone(), Arc::clone(&entry));
            return entry;
        }
        match self.agents.entry(a.id.clone()) {
            dashmap::mapref::entry::Entry::Occupied(held) => {
                // Learned meanwhile by another caller: its bytes are counted once.
                self.held.fetch_sub(size, Ordering::AcqRel);
                Arc::clone(held.get())
            }
            dashmap::mapref::entry::Entry::Vacant(place) => {
                place.insert(Arc::clone(&entry));
                entry
            }
        }
    }

    /// Puts a revocation into the index (`Revocations` does, with the status bit), and
    /// the reason given into its cache when it is known (`Some`, holding `None` when none
    /// was given). A revocation is permanent and its reason fixed: the first one held stays.
    pub fn mark_revoked(&self, id: &AgentId, reason: Option<Option<&str>>) {
        // An agent's id has its bits (`AgentId::parse` takes only what `agent_bits` reads); a
        // name read back from an old record (`AgentId::parse_recorded`) may not, and is no agent's.
        let Some(bits) = agent_bits(id.as_str()) else {
            return;
        };
        self.revoked.insert(bits);
        if let Some(reason) = reason {
            if self.reasons.peek(&bits).is_none() {
                self.reasons.insert(bits, reason.map(Arc::from));
            }
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
        self.agents.len() + self.overflow.len()
    }

    /// About how many bytes the agents held and the reasons for revocations cached take
    /// (the budget's share; the revocation index is outside it).
    pub(crate) fn agent_bytes(&self) -> u64 {
        self.held.load(Ordering::Relaxed) + self.overflow.weight() + self.reasons.weight()
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
    use std::sync::Arc;

    use super::{AgentEntry, EpochWatermark, Registry};
    use agentid_core::domain::{AgentId, KeyMode};

    /// A revocation marked without its reason (the store unreadable a moment) takes it
    /// later; a reason once held stays.
    #[test]
    fn a_revocation_marked_without_its_reason_takes_it_later() {
        let r = Registry::default();
        let id = AgentId::generate();
        r.mark_revoked(&id, None);
        assert!(r.is_revoked(id.as_str()));
        assert_eq!(r.revocation_reason(id.as_str()), None, "only the store knows");
        r.mark_revoked(&id, Some(Some("stolen")));
        r.mark_revoked(&id, Some(Some("other")));
        r.mark_revoked(&id, Some(None));
        r.mark_revoked(&id, None);
        assert_eq!(r.revocation_reason(id.as_str()), Some(Some(Arc::from("stolen"))));
        assert!(!r.is_revoked(AgentId::generate().as_str()));
        assert!(!r.is_revoked("agt_"), "no agent");
    }

    /// Every revocation is held, whatever the budget; their reasons only within the bytes
    /// of their cache.
    #[test]
    fn revocations_are_all_held_and_their_reasons_within_their_bytes() {
        let r = Registry::split(0, 0, 64 * 1024);
        let ids: Vec<_> = (0..10_000).map(|_| AgentId::generate()).collect();
        let reason = "r".repeat(512);
        for id in &ids {
            r.mark_revoked(id, Some(Some(&reason)));
        }
        assert!(ids.iter().all(|id| r.is_revoked(id.as_str())));
        assert_eq!(r.revoked_count(), ids.len());
        assert!(r.reasons.weight() <= 64 * 1024, "{}", r.reasons.weight());
        let said = ids
            .iter()
            .filter(|id| r.revocation_reason(id.as_str()).is_some())
            .count();
        assert!((1..=110).contains(&said), "{said}");
    }

    /// Agents past the budget are not held: each is given back, read as it was, and the
    /// bytes held stay within the budget.
    #[test]
    fn agents_past_the_budget_are_not_held() {
        use agentid_core::domain::{IssuerDomain, Millis, OrgId, Scopes};
        let org = OrgId::generate();
        let agent = |n: u32| agentid_store::AgentRecord {
            id: AgentId::generate(),
            org_id: org.clone(),
            mode: KeyMode::Live,
            name: "n".into(),
            issuer_domain: IssuerDomain::parse("example.com").unwrap(),
            description: "d".repeat(1000 + n as usize),
            scopes: Scopes::parse(&["read:x"]).unwrap(),
            created_at: Millis(1),
            issued_at: Millis(1),
            expires_at: Millis(2),
            revoked_at: None,
            revocation_reason: None,
            status: None,
            jkt: None,
            jwk: None,
            key_mac: None,
            key_sealed_at: None,
            verification_count: 0,
        };
        let first = agent(0);
        let one = AgentEntry::from(&first).held_bytes(&first.id);
        let r = Registry::split(3 * one + 3, 0, 0);
        let agents: Vec<_> = (0..5).map(&agent).collect();
        for a in &agents {
            assert_eq!(*r.learn(a), AgentEntry::from(a));
        }
        let held: Vec<bool> = agents.iter().map(|a| r.agent(a.id.as_str()).is_some()).collect();
        assert_eq!(held, [true, true, true, false, false]);
        assert!(r.agent_bytes() <= 3 * one + 3, "{}", r.agent_bytes());
        // One held already is given back as held, and counted once.
        let before = r.agent_bytes();
        assert!(Arc::ptr_eq(
            &r.learn(&agents[0]),
            &r.agent(agents[0].id.as_str()).unwrap()
        ));
        assert_eq!(r.agent_bytes(), before);

        // Past the budget, agents go to the overflow cache, within its bytes.
        let r = Registry::split(0, 4 * one, 0);
        let agents: Vec<_> = (0..20).map(&agent).collect();
        for a in &agents {
            r.learn(a);
        }
        let held = agents.iter().filter(|a| r.agent(a.id.as_str()).is_some()).count();
        assert!((1..=4).contains(&held), "{held}");
        assert!(r.agent_bytes() <= 4 * one + 100, "{}", r.agent_bytes());
        assert!(r.agent(agents[19].id.as_str()).is_some(), "the last one learned");
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

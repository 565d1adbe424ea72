//! Who holds which name, decided here: which stored issuer-domain events count (the key file
//! vouches for them), what a new one is sealed with, and what the holdings they give allow
//! (core's `holding` rules). The store reads and writes the rows inside its transactions and
//! asks these rules ([`DomainRules`]); it decides nothing, and raises no alarm.

use agentid_core::domain::holding::{
    self, DomainEvent, Grant, HoldPlan, HoldRefused, Holding, NotCovered, UnreadEvent,
};
use std::sync::Arc;
use std::time::{Duration, Instant};

use agentid_core::domain::{IssuerDomain, OrgId};
use agentid_core::keys::KeyRing;
use agentid_store::{AgentRecord, DomainRules, SharedStore, StoreError};

use super::IssuerPolicy;

/// How long a holding found is trusted by an instance.
const HELD_FOR: Duration = Duration::from_secs(1);

/// The issuer-domain policy, and the key file its rules need: what a registration, a token
/// request or a signed request checks of the name it is issued under.
#[derive(Clone)]
pub struct IssuerCheck {
    policy: IssuerPolicy,
    keys: Arc<KeyRing>,
    /// Organizations found to hold an agent's issuer domain lately, and when: a name released
    /// is refused within `HELD_FOR` (a name taken by another organization revokes its
    /// agents, which every check sees at once).
    held: Arc<quick_cache::sync::Cache<(OrgId, IssuerDomain), Instant>>,
}

impl IssuerCheck {
    pub(crate) fn new(policy: IssuerPolicy, keys: Arc<KeyRing>) -> Self {
        IssuerCheck {
            policy,
            keys,
            held: Arc::new(quick_cache::sync::Cache::new(10_000)),
        }
    }

    /// The rules an issuance's transaction applies: none under the `open` policy, where any
    /// organization issues under any name.
    pub(crate) fn rules(&self) -> Option<Rules<'_>> {
        (self.policy == IssuerPolicy::Verified).then(|| Rules::new(&self.keys))
    }

    /// Whether the agent's organization may still speak for its issuer domain (under the
    /// `verified` policy), found in the store at most once per `HELD_FOR` per instance.
    pub(crate) async fn may_issue(
        &self,
        store: &SharedStore,
        agent: &AgentRecord,
    ) -> Result<Result<(), NotCovered>, StoreError> {
        let Some(rules) = self.rules() else {
            return Ok(Ok(()));
        };
        let (org, domain) = (&agent.org_id, &agent.issuer_domain);
        if self.held_lately(org, domain) {
            return Ok(Ok(()));
        }
        let held = store.holdings_over(&rules, domain.as_str()).await?;
        let decided = rules.may_issue(org.as_str(), domain.as_str(), &held);
        if decided.is_ok() {
            self.note_held(org, domain);
        }
        Ok(decided)
    }

    /// Whether one of `orgs` may speak for `domain` now (any of them, under the `open`
    /// policy): the holdings read once for all of them.
    pub(crate) async fn held_by_one_of(
        &self,
        store: &SharedStore,
        domain: &IssuerDomain,
        orgs: &[OrgId],
    ) -> Result<bool, StoreError> {
        let Some(rules) = self.rules() else {
            return Ok(!orgs.is_empty());
        };
        if orgs.iter().any(|org| self.held_lately(org, domain)) {
            return Ok(true);
        }
        if orgs.is_empty() {
            return Ok(false);
        }
        let held = store.holdings_over(&rules, domain.as_str()).await?;
        let holder = orgs
            .iter()
            .find(|org| rules.may_issue(org.as_str(), domain.as_str(), &held).is_ok());
        if let Some(org) = holder {
            self.note_held(org, domain);
        }
        Ok(holder.is_some())
    }

    /// Whether `org` was found to hold `domain` within `HELD_FOR`.
    fn held_lately(&self, org: &OrgId, domain: &IssuerDomain) -> bool {
        self.held
            .get(&(org.clone(), domain.clone()))
            .is_some_and(|at| at.elapsed() < HELD_FOR)
    }

    fn note_held(&self, org: &OrgId, domain: &IssuerDomain) {
        self.held.insert((org.clone(), domain.clone()), Instant::now());
    }
}

/// The rules, with the key file that seals and vouches for the events.
#[derive(Clone, Copy)]
pub struct Rules<'k> {
    keys: &'k KeyRing,
}

impl<'k> Rules<'k> {
    pub fn new(keys: &'k KeyRing) -> Self {
        Rules { keys }
    }

    /// Whether the key file vouches for an event: its MAC checks, or it is a holding the
    /// migration carried over (unsealed, before the event that closed them). Anything else
    /// was written with database access alone: it counts for nothing, and is an alarm.
    fn vouched(&self, e: &DomainEvent, migrated: Option<i64>) -> bool {
        let ok = self.keys.vouches_for_domain_event(e, migrated);
        if !ok {
            tracing::error!(seq = e.seq, domain = %e.domain, "integrity alarm: an issuer-domain event the key file does not vouch for is ignored");
            metrics::counter!("agentid_integrity_failures_total", "what" => "domain_event").increment(1);
        }
        ok
    }
}

/// A stored row that does not read as an event: it counts for nothing, and is an alarm.
fn unread(u: &UnreadEvent) {
    tracing::error!(seq = u.seq, why = %u.why, "integrity alarm: an issuer-domain event that does not read as one is ignored");
    metrics::counter!("agentid_integrity_failures_total", "what" => "domain_event").increment(1);
}

impl DomainRules for Rules<'_> {
    fn seal(&self, event: &DomainEvent) -> [u8; 32] {
        self.keys.domain_event_mac(&event.canonical())
    }

    fn holdings(&self, rows: &[Result<DomainEvent, UnreadEvent>], migrated: Option<i64>) -> Vec<Holding> {
        let vouched: Vec<&DomainEvent> = rows
            .iter()
            .filter_map(|r| match r {
                Ok(e) => self.vouched(e, migrated).then_some(e),
                Err(u) => {
                    unread(u);
                    None
                }
            })
            .collect();
        holding::current(vouched)
    }

    fn may_issue(&self, org_id: &str, domain: &str, held: &[Holding]) -> Result<(), NotCovered> {
        holding::may_issue(org_id, domain, held)
    }

    fn plan_hold(
        &self,
        org_id: &str,
        domain: &str,
        grant: Grant,
        related: &[Holding],
    ) -> Result<HoldPlan, HoldRefused> {
        holding::plan_hold(org_id, domain, grant, related)
    }
}

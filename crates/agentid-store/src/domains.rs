//! Issuer domains: organizations' pending claims, and the append-only list of holding events
//! (who holds which name). Every change of who holds what runs in the store's exclusive
//! transaction, as registration does, so that no agent is registered under a name while the
//! name changes hands.

use super::{Attempt, Claimed, DomainClaim, Held, Moved, NameMove, StoreFuture};
use agentid_core::domain::holding::{
    DomainEvent, Grant, HoldPlan, HoldRefused, Holding, NotCovered, UnreadEvent,
};
use agentid_core::domain::Millis;
use agentid_core::domain::{IssuerDomain, OrgId};

/// The reason a holding's release records when its organization gives it up.
pub const RELEASED_REASON: &str = "released by its organization";
/// ... when the organization's own new holding of the name replaces it.
pub const REPLACED_REASON: &str = "replaced by a new holding of the same organization";

/// The decisions an issuer-domain transaction asks of its caller, the engine, which makes
/// them with the key file and core's `holding` rules. The store reads and writes rows, inside
/// its transactions, and decides nothing.
pub trait DomainRules: Send + Sync {
    /// The seal (MAC) a new event is stored with, numbered as it will be stored.
    fn seal(&self, event: &DomainEvent) -> [u8; 32];
    /// The holdings in force that stored rows give: `rows` are every row of some names, in
    /// order, as read (a row that does not read as an event is what could be read of it);
    /// `migrated` numbers the event that closed what the migration carried over.
    fn holdings(&self, rows: &[Result<DomainEvent, UnreadEvent>], migrated: Option<i64>) -> Vec<Holding>;
    /// Whether `org_id` may issue under `domain`, given the holdings in force of it and of
    /// every name above it.
    fn may_issue(&self, org_id: &str, domain: &str, held: &[Holding]) -> Result<(), NotCovered>;
    /// What `org_id` holding `domain` as `grant` changes, given every holding of the name,
    /// of the names above it and of those below it.
    fn plan_hold(
        &self,
        org_id: &str,
        domain: &str,
        grant: Grant,
        related: &[Holding],
    ) -> Result<HoldPlan, HoldRefused>;
}

pub trait DomainStore {
    /// Every event of the holdings list, in order; a row that does not read as an event, as
    /// what could be read of it.
    fn domain_events(&self) -> StoreFuture<'_, Vec<Result<DomainEvent, UnreadEvent>>>;
    /// How many rows the holdings list has, and the newest one's number (0 for none): the
    /// list only grows, so either going down says rows were taken out.
    fn domain_list_size(&self) -> StoreFuture<'_, DomainListSize>;
    /// The holdings in force (as `rules` count the stored events), of one organization, or of
    /// every organization.
    fn holdings<'a>(
        &'a self,
        rules: &'a dyn DomainRules,
        org_id: Option<&'a OrgId>,
    ) -> StoreFuture<'a, Vec<Holding>>;
    /// The holdings in force of `name` and of every name above it.
    fn holdings_over<'a>(
        &'a self,
        rules: &'a dyn DomainRules,
        name: &'a str,
    ) -> StoreFuture<'a, Vec<Holding>>;
    /// Claims a name for an organization: at most `max_pending` pending claims each, and at
    /// most `max_names` names held and claimed together.
    fn claim_domain<'a>(
        &'a self,
        rules: &'a dyn DomainRules,
        claim: &'a DomainClaim,
        max_pending: u32,
        max_names: u32,
    ) -> StoreFuture<'a, Claimed>;
    fn domain_claim<'a>(
        &'a self,
        org_id: &'a OrgId,
        domain: &'a IssuerDomain,
    ) -> StoreFuture<'a, Option<DomainClaim>>;
    fn domain_claims<'a>(&'a self, org_id: &'a OrgId) -> StoreFuture<'a, Vec<DomainClaim>>;
    /// Counts a verification attempt of a claim, at most `per_minute` in any minute for the
    /// organization and name (kept apart from the claim: releasing it and claiming again
    /// keeps the count).
    fn domain_attempt<'a>(
        &'a self,
        org_id: &'a OrgId,
        domain: &'a IssuerDomain,
        now: Millis,
        per_minute: usize,
    ) -> StoreFuture<'a, Attempt>;
    /// The organization holds `domain` from `now` on, as `grant` says (`holding::plan_hold`):
    /// the holdings it covers end, the organization's claim of it is done, and a move is
    /// noted when other organizations' agents under it are owed a revocation
    /// ([`DomainStore::revoke_moved`] revokes them). All in one exclusive transaction, whose
    /// work does not grow with the agents under the name.
    fn hold_domain<'a>(
        &'a self,
        rules: &'a dyn DomainRules,
        org_id: &'a OrgId,
        domain: &'a IssuerDomain,
        grant: Grant,
        claimed_at: Millis,
        now: Millis,
    ) -> StoreFuture<'a, Result<Held, HoldRefused>>;
    /// The moves whose revocations are not done, oldest first.
    fn name_moves(&self) -> StoreFuture<'_, Vec<NameMove>>;
    /// Revokes up to `max` of the agents `m` owes a revocation, in one transaction (an
    /// ordinary one: registrations go on meanwhile); the one that finds fewer left ends the
    /// move. Safe to run at once from several places: an agent is revoked once.
    fn revoke_moved<'a>(&'a self, m: &'a NameMove, max: u32) -> StoreFuture<'a, Moved>;
    /// The issuer domains agents use, with the organizations that use each (all of them, or
    /// one organization's), by name.
    fn issuer_domains_in_use<'a>(
        &'a self,
        org_id: Option<&'a OrgId>,
    ) -> StoreFuture<'a, Vec<(String, String)>>;
    /// Ends the organization's holding of `domain` and drops its claim of it; false when it
    /// had neither. Its agents keep their tokens.
    fn release_domain<'a>(
        &'a self,
        rules: &'a dyn DomainRules,
        org_id: &'a OrgId,
        domain: &'a IssuerDomain,
        now: Millis,
    ) -> StoreFuture<'a, bool>;
}

row! {
    pub(crate) struct ClaimRow {
        org_id: String, domain: String, nonce: String, created_at: i64,
    }
}

pub(crate) const CLAIM_COLUMNS: &str = ClaimRow::COLUMNS;

impl From<ClaimRow> for DomainClaim {
    fn from(r: ClaimRow) -> Self {
        DomainClaim {
            org_id: r.org_id,
            domain: r.domain,
            nonce: r.nonce,
            created_at: Millis(r.created_at),
        }
    }
}

/// How long the holdings list is ([`DomainStore::domain_list_size`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DomainListSize {
    pub rows: u64,
    /// The newest row's number, 0 when there is none.
    pub newest: i64,
}

impl DomainListSize {
    /// Whether this list is shorter than `earlier` by either measure.
    pub fn shorter_than(&self, earlier: &DomainListSize) -> bool {
        self.rows < earlier.rows || self.newest < earlier.newest
    }
}

/// The attempts of the last minute, from their stored form (`ms,ms,…`).
pub(crate) fn recent_attempts(stored: &str, now: Millis) -> Vec<i64> {
    stored
        .split(',')
        .filter_map(|t| t.parse::<i64>().ok())
        .filter(|t| now.0 - t < 60_000 && *t <= now.0)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attempts_of_the_last_minute() {
        let now = Millis(1_000_000);
        assert_eq!(recent_attempts("", now), Vec::<i64>::new());
        assert_eq!(
            recent_attempts("939999,940001,999999,garbage,2000000", now),
            vec![940001, 999999]
        );
    }
}

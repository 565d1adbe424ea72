//! Agents: registered (each with its status place), read, given tokens, revoked; and what
//! instances learn of each other's revocations.

use super::places::PlaceDraw;
use agentid_core::domain::{AgentId, IssuerDomain, OrgId};

use super::{AgentRecord, RevokedSince, StoreFuture};
use crate::domains::DomainRules;
use agentid_core::domain::holding::NotCovered;
use agentid_core::domain::{KeyMode, Ledger, Millis, StatusPlace};

/// What a renewal does to an agent's key binding: it is written only while the agent still
/// has the binding it read (a renewal that changed the binding meanwhile wins, and this one
/// changes nothing: it never writes back a key that another issue-token replaced).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyBinding<'a> {
    /// The MAC of the binding as read.
    pub read: &'a [u8; 32],
    /// The binding from now on, sealed; none keeps the one read (and its seal).
    pub new: Option<NewBinding<'a>>,
}

/// A key binding, sealed: the key's RFC 7638 thumbprint (the token's `cnf.jkt`) and the key
/// as `PublicJwk::canonical` writes it, or neither for a bearer agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NewBinding<'a> {
    pub jkt: Option<&'a str>,
    pub jwk: Option<&'a str>,
    /// The key file's MAC of the binding (`AgentRecord::key_canonical`), and when it was made.
    pub mac: &'a [u8; 32],
    pub sealed_at: Millis,
}

/// Agents: registered, given tokens, revoked for good; and, as OAuth clients, the
/// assertions they authenticated with.
pub trait AgentStore {
    /// A ledger's revoked agents and when, in the order of their revocations: by revocation
    /// epoch (agents revoked before there were epochs first, by time).
    fn revocations_of<'a>(&'a self, ledger: &'a Ledger) -> StoreFuture<'a, Vec<(String, Millis)>>;
    /// Inserts a new agent at a free place of the newest status list of its mode, in a
    /// transaction that no other placement (and no change of who holds a name) runs beside:
    /// see [`PlaceDraw`]. With `issuer`, only when its organization may issue under its issuer
    /// domain, as the rules decide from the holdings read in the same transaction. Returns
    /// the place and its list's size.
    fn insert_agent_placed<'a>(
        &'a self,
        agent: &'a AgentRecord,
        placing: &'a PlaceDraw,
        issuer: Option<&'a dyn DomainRules>,
    ) -> StoreFuture<'a, Result<(StatusPlace, u64), NotCovered>>;
    /// Every status list: id and number of places.
    fn status_lists(&self) -> StoreFuture<'_, Vec<(String, u64)>>;
    /// Any organization's agent: callers check ownership.
    fn get_agent<'a>(&'a self, id: &'a AgentId) -> StoreFuture<'a, Option<AgentRecord>>;
    /// The live agents of `issuer_domain` that are not revoked and are bound to a key, by id,
    /// at most `limit`: a signature directory's.
    fn keyed_agents<'a>(
        &'a self,
        issuer_domain: &'a IssuerDomain,
        limit: u32,
    ) -> StoreFuture<'a, Vec<AgentRecord>>;
    /// The first (by id) live agent of `issuer_domain` that is not revoked and is bound to the
    /// key whose RFC 7638 thumbprint is `jkt`: who signed a request naming that `keyid`.
    fn keyed_agent<'a>(
        &'a self,
        issuer_domain: &'a IssuerDomain,
        jkt: &'a str,
    ) -> StoreFuture<'a, Option<AgentRecord>>;
    /// The organizations that ever registered a live agent under `issuer_domain` (revoked
    /// ones count), at most `limit`, the one that registered last first.
    fn issuer_agent_orgs<'a>(
        &'a self,
        issuer_domain: &'a IssuerDomain,
        limit: u32,
    ) -> StoreFuture<'a, Vec<OrgId>>;
    /// An organization's agents in one mode, newest first: with an id below `before` when
    /// given, at most `limit` when given.
    fn list_agents<'a>(
        &'a self,
        org_id: &'a OrgId,
        mode: KeyMode,
        before: Option<&'a AgentId>,
        limit: Option<u32>,
    ) -> StoreFuture<'a, Vec<AgentRecord>>;
    /// All agents with an id greater than `after_id`, in id order (for loading the registry).
    fn scan_agents<'a>(&'a self, after_id: &'a str, limit: u32) -> StoreFuture<'a, Vec<AgentRecord>>;
    /// Records a newly issued token and its key binding; false (and no change) when the
    /// agent is revoked or missing, or its binding is no longer the one `binding` read.
    /// With `issuer`, only when the agent's organization may still issue under its issuer
    /// domain, as the rules decide from the holdings read in the same exclusive transaction.
    fn renew_token<'a>(
        &'a self,
        id: &'a AgentId,
        issued_at: Millis,
        expires_at: Millis,
        binding: KeyBinding<'a>,
        issuer: Option<&'a dyn DomainRules>,
    ) -> StoreFuture<'a, Result<bool, NotCovered>>;
    /// Marks a client assertion used until `expires_at` (`key`: what identifies it, its
    /// client and `jti`); false when it was used already.
    fn use_assertion<'a>(&'a self, key: &'a str, expires_at: Millis) -> StoreFuture<'a, bool>;
    /// Forgets that the assertion `key` was used: its use was not recorded, and the caller
    /// may try again with it.
    fn release_assertion<'a>(&'a self, key: &'a str) -> StoreFuture<'a, ()>;
    /// Forgets the assertions that expired before `now`: they can pass no more.
    fn forget_assertions(&self, now: Millis) -> StoreFuture<'_, ()>;
    /// Makes `secret_hash` (sealed by `mac`) the agent's client secret, in one transaction:
    /// the secret it replaces stays valid until `previous_until`, any older one is deleted.
    fn new_client_secret<'a>(
        &'a self,
        id: &'a AgentId,
        secret_hash: &'a [u8; 32],
        mac: &'a [u8; 32],
        now: Millis,
        previous_until: Millis,
    ) -> StoreFuture<'a, ()>;
    /// When `secret_hash` was made and its seal as stored, when it is a client secret of the
    /// agent valid at `now` (the seal empty when it has none; the engine checks it).
    fn client_secret_holds<'a>(
        &'a self,
        id: &'a AgentId,
        secret_hash: &'a [u8; 32],
        now: Millis,
    ) -> StoreFuture<'a, Option<(Millis, Vec<u8>)>>;
    /// Revokes once; a second call changes nothing. Returns the agent as stored afterwards,
    /// with the revocation epoch its revocation was stamped with (none for an agent revoked
    /// before the store had epochs).
    fn revoke_agent<'a>(
        &'a self,
        id: &'a AgentId,
        at: Millis,
        reason: Option<&'a str>,
    ) -> StoreFuture<'a, Option<(AgentRecord, Option<i64>)>>;
    /// The committed revocation epoch and every agent revoked with a higher epoch than
    /// `after`, read in one snapshot (for instances to learn each other's revocations).
    fn revocations_after(&self, after: i64) -> StoreFuture<'_, RevokedSince>;
}

row! {
    /// One row of `revocations_after`: the epoch's own row has no agent.
    pub(crate) struct RevocationRow {
        id: Option<String>, reason: Option<String>, epoch: i64, revoked_at: Option<i64>,
        status_list: Option<String>, status_idx: Option<i64>,
    }
}

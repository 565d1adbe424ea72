//! The records the store keeps and returns: what every layer above it reads, so that none
//! of them needs the store's own types to name an agent, an organization or a stream.

use std::fmt;

use crate::domain::audit::AuditRecord;
use crate::domain::holding::Holding;
use crate::domain::{
    AgentId, ApiKeyKind, IdpId, IssuerDomain, KeyMode, Ledger, Millis, OrgId, OrgLimits, Plan, Scopes,
    StatusPlace, StreamId, VerifyResult,
};
use crate::tlog::tree::Hash;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrgRecord {
    pub id: OrgId,
    pub name: String,
    pub plan: Plan,
    /// The limits as stored: what its seal covers (the limits in force, [`OrgRecord::limits`],
    /// follow from them and the plan's table, which a later version may change without
    /// breaking a seal).
    pub stored_limits: OrgLimits,
    pub created_at: Millis,
    /// The key file's MAC of [`OrgRecord::canonical`]; `None` on a row whose MAC is not one
    /// (from before seals, until an instance seals it). A plan or limits written with
    /// database access alone have none that checks: the organization's keys are refused.
    pub mac: Option<[u8; 32]>,
    /// When it was sealed: the database takes only a fresh seal, so an earlier plan copied
    /// back with its seal is refused.
    pub sealed_at: Millis,
}

impl OrgRecord {
    /// The limits it runs under: [`OrgLimits::in_force`] of its plan and stored limits.
    pub fn limits(&self) -> OrgLimits {
        OrgLimits::in_force(self.plan, self.stored_limits)
    }

    /// The bytes its MAC is computed over: what the organization may do (its id, its plan
    /// and its stored limits) and when it was sealed, in a fixed order. Its name is not
    /// sealed.
    pub fn canonical(&self) -> Vec<u8> {
        let limits = self.stored_limits;
        serde_json::to_vec(&(
            "organization v1",
            self.id.as_str(),
            self.sealed_at.0,
            self.plan.as_str(),
            limits.verify_per_minute,
            limits.other_per_minute,
            limits.max_expiry_seconds,
        ))
        .expect("a tuple of strings and numbers serializes")
    }
}

/// The bytes the MAC of an agent's key binding is computed over (`AgentRecord::key_canonical`).
pub fn agent_key_canonical(
    agent: &AgentId,
    jkt: Option<&str>,
    jwk: Option<&str>,
    sealed_at: Option<Millis>,
) -> Vec<u8> {
    serde_json::to_vec(&("agent key v1", agent.as_str(), jkt, jwk, sealed_at.map(|m| m.0)))
        .expect("a tuple of strings and numbers serializes")
}

/// The bytes an agent's client secret's MAC is computed over: whose it is, which (its
/// SHA-256) and when it was made.
pub fn client_secret_canonical(agent: &AgentId, secret_hash: &[u8; 32], created_at: Millis) -> Vec<u8> {
    serde_json::to_vec(&("client secret v1", agent.as_str(), secret_hash, created_at.0))
        .expect("a tuple serializes")
}

/// The bytes an API key's MAC is computed over: which key (its SHA-256), whose, and what it
/// may do (its kind and mode), in a fixed order.
pub fn api_key_canonical(key_hash: &[u8; 32], org_id: &OrgId, kind: ApiKeyKind, mode: KeyMode) -> Vec<u8> {
    serde_json::to_vec(&(
        "api key v1",
        key_hash,
        org_id.as_str(),
        kind.as_str(),
        mode.as_str(),
    ))
    .expect("a tuple of strings serializes")
}

/// An API key as stored: only its SHA-256 and a display hint.
#[derive(Clone)]
pub struct NewApiKey {
    /// `key_…`: how the key is named once it is made (listed, disabled), never the key.
    pub id: String,
    /// What its holder calls it, if anything.
    pub name: Option<String>,
    pub key_hash: [u8; 32],
    pub org_id: OrgId,
    pub kind: ApiKeyKind,
    pub mode: KeyMode,
    pub hint: String,
    pub created_at: Millis,
    /// The key file's MAC of [`api_key_canonical`]: a key row written with database access
    /// alone has none that checks, and is refused.
    pub mac: [u8; 32],
}

impl fmt::Debug for NewApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NewApiKey")
            .field("id", &self.id)
            .field("org_id", &self.org_id)
            .field("hint", &self.hint)
            .finish_non_exhaustive()
    }
}

/// What a presented key resolves to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyRecord {
    pub org: OrgRecord,
    pub kind: ApiKeyKind,
    pub mode: KeyMode,
    pub disabled: bool,
    /// When it was last noted in use (noted at most once a minute).
    pub last_used_at: Option<Millis>,
    /// Its MAC as stored (see [`NewApiKey::mac`]); `None` on a row whose MAC is not one (from
    /// before seals, until an instance seals it).
    pub mac: Option<[u8; 32]>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentRecord {
    pub id: AgentId,
    pub org_id: OrgId,
    pub mode: KeyMode,
    pub name: String,
    pub issuer_domain: IssuerDomain,
    pub description: String,
    pub scopes: Scopes,
    pub created_at: Millis,
    pub issued_at: Millis,
    pub expires_at: Millis,
    pub revoked_at: Option<Millis>,
    pub revocation_reason: Option<String>,
    /// Its place in a Token Status List (none only before `Agents::register` placed it).
    pub status: Option<StatusPlace>,
    /// The RFC 7638 thumbprint of the key its newest token is bound to (`cnf.jkt`); none for
    /// a bearer token.
    pub jkt: Option<String>,
    /// That key itself, as `PublicJwk::canonical` writes it: the key an agent authenticates
    /// with as an OAuth client (`private_key_jwt`). None where `jkt` is.
    pub jwk: Option<String>,
    /// The key file's MAC of [`AgentRecord::key_canonical`], on every agent, bound to a key
    /// or to none: a key written into the row, or taken out of it, with database access
    /// alone is an integrity alarm. `None` on a row whose MAC is not one (from before seals,
    /// until an instance seals it).
    pub key_mac: Option<[u8; 32]>,
    /// When that MAC was made: the database takes only a fresh one, so an earlier binding
    /// copied back with its seal is refused.
    pub key_sealed_at: Option<Millis>,
    pub verification_count: i64,
}

impl AgentRecord {
    /// The bytes the MAC of its key binding is computed over: the agent and the key (its
    /// thumbprint and the key itself, or none), in a fixed order.
    pub fn key_canonical(&self) -> Vec<u8> {
        agent_key_canonical(
            &self.id,
            self.jkt.as_deref(),
            self.jwk.as_deref(),
            self.key_sealed_at,
        )
    }

    pub fn ledger(&self) -> Ledger {
        Ledger {
            org_id: self.org_id.as_str().to_owned(),
            mode: self.mode,
        }
    }
}

#[derive(Debug, Clone)]
pub struct LogQuery<'a> {
    pub ledger: &'a Ledger,
    pub agent_id: Option<&'a str>,
    pub result: Option<VerifyResult>,
    /// Only records with a smaller sequence number (the cursor).
    pub before_seq: Option<i64>,
    pub limit: u32,
}

#[derive(Debug, Clone)]
pub struct LogPage {
    pub records: Vec<AuditRecord>,
    pub has_more: bool,
    pub total: i64,
}

/// A signed checkpoint of a ledger, as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredCheckpoint {
    pub ledger: Ledger,
    pub size: u64,
    pub root: Hash,
    /// The C2SP signed note.
    pub note: String,
    pub created_at: Millis,
}

/// What the store knows of revocations after a given epoch. Every revocation moves the
/// store's revocation epoch by one in its own transaction and is stamped with the new value
/// (a trigger does both, migration 0004), so an instance that holds every revocation up to
/// epoch K in memory knows that nothing was revoked since while the epoch is still K.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RevokedSince {
    /// The committed epoch: no revocation has a higher one.
    pub epoch: i64,
    /// Agents revoked with an epoch above the one asked about.
    pub revoked: Vec<Revocation>,
}

/// One agent's revocation, as the instances learn it from each other.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Revocation {
    pub agent_id: AgentId,
    pub reason: Option<String>,
    pub at: Millis,
    /// Its status place (every stored agent has one: migration 15 placed those registered
    /// before status lists).
    pub place: Option<StatusPlace>,
}

/// An identity provider an organization trusts to vouch for people (whose tokens its agents
/// may exchange), with its keys given inline or where to fetch them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdentityProviderRecord {
    pub id: IdpId,
    pub org_id: OrgId,
    /// Its `iss`, exactly.
    pub issuer: String,
    /// Its key set, as given (JSON), or
    pub jwks: Option<String>,
    /// where it publishes it.
    pub jwks_uri: Option<String>,
    pub created_at: Millis,
    /// The key file's MAC of [`IdentityProviderRecord::canonical`]: a row written with
    /// database access alone (or changed there) has none that checks, and is trusted by no
    /// one.
    pub mac: Option<[u8; 32]>,
}

impl IdentityProviderRecord {
    /// The bytes its MAC is computed over: JSON of every member but the MAC, in a fixed order.
    pub fn canonical(&self) -> Vec<u8> {
        serde_json::to_vec(&(
            "identity provider v1",
            self.id.as_str(),
            self.org_id.as_str(),
            &self.issuer,
            &self.jwks,
            &self.jwks_uri,
            self.created_at.0,
        ))
        .expect("a record serializes")
    }
}

/// A stream as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamRecord {
    pub id: StreamId,
    pub org_id: OrgId,
    pub mode: KeyMode,
    pub aud: String,
    /// `urn:ietf:rfc:8935` (push) or `urn:ietf:rfc:8936` (poll).
    pub method: String,
    pub endpoint_url: Option<String>,
    pub poll_token_hash: Option<Vec<u8>>,
    pub events_requested: Vec<String>,
    /// Revocations are among the events delivered.
    pub revocations: bool,
    pub description: Option<String>,
    /// `enabled`, `paused` or `disabled`.
    pub status: String,
    pub created_at: Millis,
}

/// An event a stream is owed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SsfEvent {
    pub seq: i64,
    pub stream_id: String,
    pub jti: String,
    /// `session-revoked` or `verification`.
    pub kind: String,
    pub agent_id: Option<String>,
    pub issuer: Option<String>,
    pub reason: Option<String>,
    pub state: Option<String>,
    pub event_at: Millis,
    pub attempts: i32,
}

/// A name an organization has claimed and not yet proven.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DomainClaim {
    pub org_id: String,
    pub domain: String,
    /// The challenge value is derived from it (`KeyRing::domain_challenge`).
    pub nonce: String,
    pub created_at: Millis,
}

/// What claiming a name came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claimed {
    New(DomainClaim),
    /// The organization had claimed it already: that claim.
    Pending(DomainClaim),
    /// The organization holds it already.
    Held(Holding),
    /// The organization has `max` pending claims already.
    TooMany {
        max: u32,
    },
    /// The organization holds and claims `max` names already.
    TooManyNames {
        max: u32,
    },
}

/// Whether a verification attempt may go ahead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attempt {
    Allowed,
    /// The claim's attempts of the last minute are used up: the next is allowed this much later.
    Wait(std::time::Duration),
    /// No such claim.
    NoClaim,
}

/// A name held, and what that changed.
#[derive(Debug, Clone)]
pub struct Held {
    pub holding: Holding,
    /// Holdings that ended (other organizations' that the new one covers, and a holding of
    /// the organization's own that it replaces).
    pub ended: Vec<Holding>,
    /// The move whose revocations follow (other organizations' agents issued under the
    /// name), when it revokes any: in bounded batches, outside the lock the move took.
    pub moving: Option<NameMove>,
    /// Other organizations' agents revoked because they issued under a name that changed
    /// hands, with the revocation epoch each was stamped with: those whoever moved the name
    /// revoked before it answered.
    pub revoked: Vec<(AgentRecord, Option<i64>)>,
}

/// A name that changed hands: every agent of another organization issued under it (and,
/// with `below`, under the names below it) is owed a revocation, at `at`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NameMove {
    /// The hold's issuer-domain event.
    pub seq: i64,
    /// The new holder.
    pub org_id: String,
    pub domain: String,
    pub below: bool,
    pub at: Millis,
}

/// One batch of a move's revocations.
#[derive(Debug, Clone, Default)]
pub struct Moved {
    /// The agents this batch revoked, with the revocation epoch each was stamped with.
    pub revoked: Vec<(AgentRecord, Option<i64>)>,
    /// No agent is left to revoke: the move is done (its row is gone).
    pub done: bool,
}

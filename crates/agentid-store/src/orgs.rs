//! Organizations and their API keys.

use super::sql::decode;
use super::{KeyRecord, NewApiKey, OrgRecord, StoreError, StoreFuture};
use agentid_core::domain::{AgentId, ApiKeyKind, KeyMode, Millis, OrgId, OrgLimits, Plan};

/// Organizations and the API keys that act for them.
pub trait OrgStore {
    fn count_orgs(&self) -> StoreFuture<'_, i64>;
    /// Creates the organization with its keys if the store has none yet (an exclusive
    /// transaction, so of instances starting at once on an empty store exactly one does).
    /// Returns whether it did.
    fn create_first_org<'a>(&'a self, org: &'a OrgRecord, keys: &'a [NewApiKey]) -> StoreFuture<'a, bool>;
    /// Creates an organization together with its first keys (one transaction).
    fn create_org<'a>(&'a self, org: &'a OrgRecord, keys: &'a [NewApiKey]) -> StoreFuture<'a, ()>;
    /// Changes plan and limits; false when no such organization exists.
    fn update_org<'a>(&'a self, org: &'a OrgRecord) -> StoreFuture<'a, bool>;
    fn get_org<'a>(&'a self, id: &'a OrgId) -> StoreFuture<'a, Option<OrgRecord>>;
    fn insert_key<'a>(&'a self, key: &'a NewApiKey) -> StoreFuture<'a, ()>;
    fn find_key<'a>(&'a self, key_hash: &'a [u8; 32]) -> StoreFuture<'a, Option<KeyRecord>>;
    /// Every organization, oldest first.
    fn list_orgs(&self) -> StoreFuture<'_, Vec<OrgRecord>>;
    /// An organization's keys as stored (never the key: its display hint), oldest first.
    fn list_keys<'a>(&'a self, org_id: &'a OrgId) -> StoreFuture<'a, Vec<KeyListing>>;
    /// Disables a key for good; false when no such key exists.
    fn disable_key<'a>(&'a self, key_hash: &'a [u8; 32], at: Millis) -> StoreFuture<'a, bool>;
    /// Disables the key `id` (`key_…`) for good; false when no such key exists.
    fn disable_key_id<'a>(&'a self, id: &'a str, at: Millis) -> StoreFuture<'a, bool>;
    /// Notes that the key was used at `at`, unless it was noted less than `every` before.
    fn note_key_used<'a>(&'a self, key_hash: &'a [u8; 32], at: Millis, every: Millis) -> StoreFuture<'a, ()>;
    /// Rows from before seals, still unsealed: up to `limit` of each kind.
    fn unsealed(&self, limit: u32) -> StoreFuture<'_, Unsealed>;
    /// Writes seals on rows [`OrgStore::unsealed`] listed, each only while it is still
    /// unsealed (one transaction); returns how many it sealed.
    fn seal<'a>(&'a self, seals: &'a Seals) -> StoreFuture<'a, u64>;
}

/// Rows from before seals, still unsealed: organizations; API keys (their hash,
/// organization, kind and mode); agents bound to a key (the agent, its key's thumbprint and
/// the key); agents' client secrets (the agent and the secret's hash).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Unsealed {
    pub orgs: Vec<OrgRecord>,
    pub keys: Vec<([u8; 32], OrgId, ApiKeyKind, KeyMode)>,
    pub agent_keys: Vec<(AgentId, Option<String>, Option<String>)>,
    /// With when each was made.
    pub client_secrets: Vec<(AgentId, [u8; 32], Millis)>,
}

/// The seals of rows [`Unsealed`] listed, each with what names its row.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Seals {
    /// With when each was sealed.
    pub orgs: Vec<(OrgId, [u8; 32], Millis)>,
    /// By the key's hash.
    pub keys: Vec<([u8; 32], [u8; 32])>,
    /// With when each was sealed.
    pub agent_keys: Vec<(AgentId, [u8; 32], Millis)>,
    /// By the agent and the secret's hash.
    pub client_secrets: Vec<(AgentId, [u8; 32], [u8; 32])>,
}

/// A key as `agentid key list` shows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct KeyListing {
    /// `key_…`: what `agentid key disable --id` takes.
    pub(crate) id: String,
    pub(crate) name: Option<String>,
    pub(crate) kind: &'static str,
    pub(crate) mode: &'static str,
    /// Its prefix and last four characters, as shown when it was made.
    pub(crate) key: String,
    pub(crate) created_at: Millis,
    /// When it was last used (to the minute), or null.
    pub(crate) last_used_at: Option<Millis>,
    pub(crate) disabled: bool,
}

row! {
    pub(crate) struct OrgRow {
        id: String, name: String, plan: String, verify_limit: i64, other_limit: i64,
        max_expiry_seconds: i64, created_at: i64, mac: Vec<u8>, sealed_at: i64,
    }
}

pub(crate) const ORG_COLUMNS: &str = OrgRow::COLUMNS;

impl OrgRow {
    /// The organization as stored (the limits it runs under follow: `OrgRecord::limits`).
    pub(crate) fn into_record(self) -> Result<OrgRecord, StoreError> {
        let corrupt = || StoreError::Corrupt(format!("limits of organization {}", self.id));
        let plan =
            Plan::parse(&self.plan).ok_or_else(|| StoreError::Corrupt(format!("plan {}", self.plan)))?;
        let stored = OrgLimits {
            verify_per_minute: u32::try_from(self.verify_limit).map_err(|_| corrupt())?,
            other_per_minute: u32::try_from(self.other_limit).map_err(|_| corrupt())?,
            max_expiry_seconds: u64::try_from(self.max_expiry_seconds).map_err(|_| corrupt())?,
        };
        Ok(OrgRecord {
            plan,
            stored_limits: stored,
            id: decode("organization", &self.id, OrgId::parse)?,
            name: self.name,
            created_at: Millis(self.created_at),
            // Empty until sealed; a MAC of another length vouches for nothing.
            mac: self.mac.as_slice().try_into().ok(),
            sealed_at: Millis(self.sealed_at),
        })
    }
}

row! {
    pub(crate) struct ListedKeyRow {
        id: String, name: Option<String>, kind: String, mode: String, hint: String,
        created_at: i64, last_used_at: Option<i64>, disabled_at: Option<i64>,
    }
}

row! {
    pub(crate) struct KeyRow {
        kind: String, mode: String, disabled_at: Option<i64>, org_id: String,
        last_used_at: Option<i64>, mac: Vec<u8>,
    }
}

row! {
    pub(crate) struct UnsealedKeyRow {
        key_hash: Vec<u8>, org_id: String, kind: String, mode: String,
    }
}

row! {
    pub(crate) struct UnsealedAgentKeyRow {
        id: String, jkt: Option<String>, jwk: Option<String>,
    }
}

row! {
    pub(crate) struct UnsealedSecretRow {
        agent_id: String, secret_hash: Vec<u8>, created_at: i64,
    }
}

//! Organizations and their API keys.

use super::sql::decode;
use super::{KeyRecord, NewApiKey, OrgRecord, StoreError, StoreFuture};
use agentid_core::domain::{ApiKeyKind, KeyMode, Millis, OrgId, OrgLimits, Plan};

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
    /// The organizations and keys without a seal, unless some row has one.
    fn unsealed(&self) -> StoreFuture<'_, Unsealed>;
    /// Seals rows [`OrgStore::unsealed`] listed, each only while it is still unsealed (one
    /// transaction).
    fn seal<'a>(
        &'a self,
        orgs: &'a [(OrgId, [u8; 32])],
        keys: &'a [([u8; 32], [u8; 32])],
    ) -> StoreFuture<'a, ()>;
}

/// Rows without a seal: organizations, and keys (their hash, organization, kind and mode);
/// none listed when some row has a seal (`any_sealed`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Unsealed {
    pub any_sealed: bool,
    pub orgs: Vec<OrgRecord>,
    pub keys: Vec<([u8; 32], OrgId, ApiKeyKind, KeyMode)>,
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
        max_expiry_seconds: i64, created_at: i64, mac: Vec<u8>,
    }
}

pub(crate) const ORG_COLUMNS: &str = OrgRow::COLUMNS;

impl OrgRow {
    /// The organization with the limits it runs under ([`OrgLimits::in_force`]).
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
            limits: OrgLimits::in_force(plan, stored),
            id: decode("organization", &self.id, OrgId::parse)?,
            name: self.name,
            created_at: Millis(self.created_at),
            // Empty until sealed; a MAC of another length vouches for nothing.
            mac: self.mac.as_slice().try_into().ok(),
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

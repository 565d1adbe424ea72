//! The identity providers organizations trust: facts and one bounded insert.

use super::{IdentityProviderRecord, StoreError, StoreFuture};
use agentid_core::domain::{AgentId, IdpId, Millis, OrgId};

/// What an insert did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdpAdded {
    Added,
    /// The organization trusts `max` already.
    Full,
    /// The organization trusts this issuer already.
    Exists,
}

/// The identity providers organizations trust.
pub trait IdentityProviderStore {
    /// Adds `idp` unless its organization has `max` already or trusts its issuer (one
    /// exclusive transaction, so two adds at once cannot pass `max`).
    fn add_identity_provider<'a>(
        &'a self,
        idp: &'a IdentityProviderRecord,
        max: i64,
    ) -> StoreFuture<'a, IdpAdded>;
    /// An organization's, oldest first.
    fn identity_providers<'a>(&'a self, org_id: &'a OrgId) -> StoreFuture<'a, Vec<IdentityProviderRecord>>;
    /// Removes one of the organization's; false when it has no such one.
    fn remove_identity_provider<'a>(&'a self, org_id: &'a OrgId, id: &'a IdpId) -> StoreFuture<'a, bool>;
    /// Notes that the organization revoked the person `(iss, sub)` at `at`, and queues a
    /// `subject-revoked` event on each of its live streams that carries revocations (enabled
    /// or paused), in one transaction.
    fn revoke_subject<'a>(
        &'a self,
        org_id: &'a OrgId,
        iss: &'a str,
        sub: &'a str,
        at: Millis,
    ) -> StoreFuture<'a, ()>;
    /// What a delegated token of the organization's agents for the person `(iss, sub)`
    /// stands on: the provider's row (its seal is the engine's to check), when the person was
    /// revoked last, and which of the `chain`'s agents are revoked.
    fn delegation_standing<'a>(
        &'a self,
        org_id: &'a OrgId,
        iss: &'a str,
        sub: &'a str,
        chain: &'a [AgentId],
    ) -> StoreFuture<'a, Standing>;
}

/// What a delegated token stands on, as the store has it now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Standing {
    /// The organization's provider of that issuer, as stored.
    pub provider: Option<IdentityProviderRecord>,
    /// When the organization last revoked the person.
    pub subject_revoked_at: Option<Millis>,
    /// The agents of the chain that are revoked.
    pub revoked: Vec<AgentId>,
}

row! {
    pub(crate) struct IdentityProviderRow {
        id: String, org_id: String, issuer: String, jwks: Option<String>, jwks_uri: Option<String>,
        created_at: i64, mac: Option<Vec<u8>>,
    }
}

impl IdentityProviderRow {
    pub(crate) fn into_record(self) -> Result<IdentityProviderRecord, StoreError> {
        Ok(IdentityProviderRecord {
            id: super::sql::decode("identity provider", &self.id, IdpId::parse)?,
            org_id: super::sql::decode("organization", &self.org_id, OrgId::parse)?,
            issuer: self.issuer,
            jwks: self.jwks,
            jwks_uri: self.jwks_uri,
            created_at: Millis(self.created_at),
            // A MAC of another length vouches for nothing: the engine finds it so.
            mac: self.mac.and_then(|m| m.as_slice().try_into().ok()),
        })
    }
}

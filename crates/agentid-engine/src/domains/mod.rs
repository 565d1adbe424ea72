//! Issuer domains: an organization claims a name, proves it (a DNS TXT record, or a file at
//! a well-known HTTPS path, as ACME's dns-01 and http-01 do), and from then on issues under
//! it; under the `verified` policy nothing else may. Who holds what, and what a name changing
//! hands does, are `domain::holding`'s rules, applied in the store's exclusive transaction.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

pub mod moves;
mod proof;
mod rules;

pub use rules::{IssuerCheck, Rules};

use super::outbound::Outbound;
use agentid_core::domain::holding::{Grant, Holding};
use agentid_core::domain::{IssuerDomain, Millis, OrgId, ValidationError};
use agentid_core::keys::KeyRing;
use agentid_store::{Attempt, Claimed, DomainClaim, SharedStore, StoreError};

use crate::transparency::DomainListWatch;
use moves::{Mover, INLINE_BUDGET};

/// Pending claims an organization may have at once.
pub(crate) const MAX_PENDING: u32 = 100;
/// Names an organization may hold and claim together (a name proved by DNS covers the names
/// below it, which take no place of their own).
pub(crate) const MAX_NAMES: u32 = 1000;
/// Verification attempts of one organization's claims of a name in any minute.
pub(crate) const ATTEMPTS_PER_MINUTE: usize = 10;
/// Verifications of one organization's claims under way at once (each may hold a proof's
/// fetch for its timeout): a quarter of the proofs' share, so that one organization's names
/// that hang leave other organizations theirs.
pub(crate) const VERIFYING_PER_ORG: usize = PROOF_FETCHES / 4;
/// The label under which the TXT record is looked up.
pub(crate) const DNS_LABEL: &str = "_agentid-challenge";
/// What the TXT record says, before the value.
pub(crate) const TXT_PREFIX: &str = "agentid-domain-verification=";
/// Where the HTTPS file is.
pub(crate) const WELL_KNOWN_PATH: &str = "/.well-known/agentid-domain-verification";
/// The HTTPS check's bounds: a verification takes at most two lookups (5 s each) and one
/// fetch, 15 s.
const FETCH_TIMEOUT: Duration = Duration::from_secs(5);
const VERIFICATION_TIME: Duration = Duration::from_secs(3 * FETCH_TIMEOUT.as_secs());
const FETCH_MAX_BYTES: usize = 4096;
/// How much of an answer a failure message repeats.
const MESSAGE_MAX: usize = 300;

/// Whether an organization must hold the issuer domains it registers agents under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IssuerPolicy {
    /// Only under names it proved or the operator granted (the default).
    Verified,
    /// Under any name (single-tenant and development deployments).
    Open,
}

#[derive(Debug, Clone)]
pub struct DomainConfig {
    pub policy: IssuerPolicy,
    /// Let the HTTPS check reach loopback and private addresses, and fall back to
    /// `http://<name>` when HTTPS fails: development and tests only.
    pub allow_insecure: bool,
}

impl DomainConfig {
    pub fn new(policy: IssuerPolicy, allow_insecure: bool) -> Self {
        DomainConfig {
            policy,
            allow_insecure,
        }
    }
}

impl Default for DomainConfig {
    fn default() -> Self {
        DomainConfig::new(IssuerPolicy::Verified, false)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DomainError {
    #[error("{0}")]
    Invalid(#[from] ValidationError),
    #[error("this organization has no claim of {0}")]
    NotFound(String),
    #[error("an organization has at most {max} pending domain claims: verify or release some first")]
    TooMany { max: u32 },
    #[error(
        "an organization holds and claims at most {max} names together: release some first (a name \
         proved by DNS covers the names below it)"
    )]
    TooManyNames { max: u32 },
    /// No proof held, or the proof cannot take the name: what each lookup found.
    #[error("{0}")]
    NotVerified(String),
    #[error("at most {ATTEMPTS_PER_MINUTE} verification attempts a minute per domain")]
    RateLimited(Duration),
    /// The organization's verifications under way are as many as it may have: try again
    /// after the time one may take.
    #[error("an organization verifies at most {VERIFYING_PER_ORG} names at once")]
    Busy(Duration),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A domain as its organization sees it.
#[derive(Debug, Clone)]
pub struct DomainView {
    pub domain: String,
    /// Held (`Some`), or claimed and pending.
    pub holding: Option<Holding>,
    pub created_at: Millis,
    /// While pending: what to publish.
    pub challenge: Option<Challenge>,
}

/// What an organization publishes to prove a name, either way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Challenge {
    /// `_agentid-challenge.<name>`
    pub dns_name: String,
    /// `agentid-domain-verification=<value>`
    pub dns_value: String,
    /// `https://<name>/.well-known/agentid-domain-verification`
    pub https_url: String,
    /// `<value>`
    pub https_content: String,
}

/// Issuer domains: claims, proofs, holdings.
pub struct Domains {
    store: SharedStore,
    keys: Arc<KeyRing>,
    cfg: DomainConfig,
    /// Revokes what a name that changed hands owes.
    mover: Arc<Mover>,
    /// Told of each event appended (an instance alarms when the list later reads shorter).
    domain_list: Arc<DomainListWatch>,
    /// Where the proofs are looked up and fetched.
    outbound: Arc<Outbound>,
    /// The proofs' share of the outbound fetches: names whose servers hang (each caller's
    /// pending claims, tried again and again) leave other fetches theirs.
    proofs: Arc<tokio::sync::Semaphore>,
    /// Each organization's verifications under way (none is held at 0).
    verifying: parking_lot::Mutex<HashMap<OrgId, usize>>,
}

/// One of an organization's verifications under way, counted until it is dropped.
struct Verifying<'a> {
    counts: &'a parking_lot::Mutex<HashMap<OrgId, usize>>,
    org_id: OrgId,
}

impl Drop for Verifying<'_> {
    fn drop(&mut self) {
        let mut counts = self.counts.lock();
        if let Some(n) = counts.get_mut(&self.org_id) {
            *n -= 1;
            if *n == 0 {
                counts.remove(&self.org_id);
            }
        }
    }
}

/// The most HTTPS proofs fetched at once: a quarter of what the outbound client takes.
const PROOF_FETCHES: usize = crate::outbound::MAX_FETCHES / 4;

impl Domains {
    pub(crate) fn new(
        store: SharedStore,
        keys: Arc<KeyRing>,
        cfg: DomainConfig,
        mover: Arc<Mover>,
        domain_list: Arc<DomainListWatch>,
        outbound: Arc<Outbound>,
    ) -> Self {
        Domains {
            outbound,
            proofs: Arc::new(tokio::sync::Semaphore::new(PROOF_FETCHES)),
            verifying: parking_lot::Mutex::new(HashMap::new()),
            store,
            keys,
            cfg,
            mover,
            domain_list,
        }
    }

    /// Counts a verification of `org_id`'s under way, unless it has as many as it may.
    fn start_verifying(&self, org_id: &OrgId) -> Option<Verifying<'_>> {
        let mut counts = self.verifying.lock();
        let n = counts.entry(org_id.clone()).or_insert(0);
        if *n >= VERIFYING_PER_ORG {
            return None;
        }
        *n += 1;
        Some(Verifying {
            counts: &self.verifying,
            org_id: org_id.clone(),
        })
    }

    pub fn policy(&self) -> IssuerPolicy {
        self.cfg.policy
    }

    fn challenge(&self, claim: &DomainClaim) -> Challenge {
        let value = self
            .keys
            .domain_challenge(&claim.org_id, &claim.domain, &claim.nonce);
        Challenge {
            dns_name: format!("{DNS_LABEL}.{}", claim.domain),
            dns_value: format!("{TXT_PREFIX}{value}"),
            https_url: format!("https://{}{WELL_KNOWN_PATH}", claim.domain),
            https_content: value,
        }
    }

    fn pending(&self, claim: &DomainClaim) -> DomainView {
        DomainView {
            domain: claim.domain.clone(),
            holding: None,
            created_at: claim.created_at,
            challenge: Some(self.challenge(claim)),
        }
    }

    fn held(h: Holding) -> DomainView {
        DomainView {
            domain: h.domain.clone(),
            created_at: h.claimed_at,
            holding: Some(h),
            challenge: None,
        }
    }

    /// Claims a name (pending until proven); true when the claim is new. A name the
    /// organization holds, or has claimed, answers as it is.
    pub async fn claim(
        &self,
        org_id: &OrgId,
        name: &IssuerDomain,
    ) -> Result<(DomainView, bool), DomainError> {
        use base64::Engine as _;
        let claim = DomainClaim {
            org_id: org_id.as_str().to_owned(),
            domain: name.as_str().to_owned(),
            nonce: base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(rand::random::<[u8; 16]>()),
            created_at: Millis::now(),
        };
        match self
            .store
            .claim_domain(&Rules::new(&self.keys), &claim, MAX_PENDING, MAX_NAMES)
            .await?
        {
            Claimed::New(c) => Ok((self.pending(&c), true)),
            Claimed::Pending(c) => Ok((self.pending(&c), false)),
            Claimed::Held(h) => Ok((Self::held(h), false)),
            Claimed::TooMany { max } => Err(DomainError::TooMany { max }),
            Claimed::TooManyNames { max } => Err(DomainError::TooManyNames { max }),
        }
    }

    /// The organization's domains: held ones and pending claims, by name.
    pub async fn list(&self, org_id: &OrgId) -> Result<Vec<DomainView>, DomainError> {
        let mut out: Vec<DomainView> = self
            .store
            .holdings(&Rules::new(&self.keys), Some(org_id))
            .await?
            .into_iter()
            .map(Self::held)
            .collect();
        for c in self.store.domain_claims(org_id).await? {
            if !out.iter().any(|d| d.domain == c.domain) {
                out.push(self.pending(&c));
            }
        }
        out.sort_by(|a, b| a.domain.cmp(&b.domain));
        Ok(out)
    }

    /// One of the organization's domains.
    pub async fn get(&self, org_id: &OrgId, name: &IssuerDomain) -> Result<DomainView, DomainError> {
        if let Some(h) = self.held_by(org_id, name.as_str()).await? {
            return Ok(Self::held(h));
        }
        match self.store.domain_claim(org_id, name).await? {
            Some(c) => Ok(self.pending(&c)),
            None => Err(DomainError::NotFound(name.as_str().to_owned())),
        }
    }

    async fn held_by(&self, org_id: &OrgId, name: &str) -> Result<Option<Holding>, StoreError> {
        Ok(self
            .store
            .holdings_over(&Rules::new(&self.keys), name)
            .await?
            .into_iter()
            .find(|h| h.domain == name && *org_id == *h.org_id))
    }

    /// Proves a claim: DNS first, then HTTPS. On success the organization holds the name,
    /// as `holding::plan_hold` says; other organizations' agents under what it takes are
    /// revoked, here at once (in memory too) and on other instances by their next check. A
    /// name the organization holds already answers as it is, with no check.
    pub async fn verify(&self, org_id: &OrgId, domain: &IssuerDomain) -> Result<DomainView, DomainError> {
        let name = domain.as_str();
        if let Some(h) = self.held_by(org_id, name).await? {
            return Ok(Self::held(h));
        }
        let Some(claim) = self.store.domain_claim(org_id, domain).await? else {
            return Err(DomainError::NotFound(name.to_owned()));
        };
        // Before an attempt is counted: one refused here is no attempt.
        let _verifying = self
            .start_verifying(org_id)
            .ok_or(DomainError::Busy(VERIFICATION_TIME))?;
        match self
            .store
            .domain_attempt(org_id, domain, Millis::now(), ATTEMPTS_PER_MINUTE)
            .await?
        {
            Attempt::Allowed => {}
            Attempt::Wait(d) => return Err(DomainError::RateLimited(d)),
            Attempt::NoClaim => return Err(DomainError::NotFound(name.to_owned())),
        }
        let value = self.challenge(&claim).https_content;
        let (method, mut found) = self.prove(name, &value).await;
        let Some(method) = method else {
            return Err(DomainError::NotVerified(found.join("; ")));
        };
        let held = self
            .store
            .hold_domain(
                &Rules::new(&self.keys),
                org_id,
                domain,
                Grant::Proof(method),
                claim.created_at,
                Millis::now(),
            )
            .await?;
        match held {
            Ok(held) => {
                self.domain_list.appended(held.holding.seq);
                if let Some(m) = &held.moving {
                    // The name is the organization's now, whatever happens here: what is
                    // not revoked before the answer, the mover revokes.
                    if let Err(e) = self.mover.start(m, INLINE_BUDGET).await {
                        tracing::warn!(domain = %name, error = %e, "the name changed hands; its former holders' agents are revoked in the background");
                    }
                }
                Ok(Self::held(held.holding))
            }
            Err(refused) => {
                found.push(refused.to_string());
                Err(DomainError::NotVerified(found.join("; ")))
            }
        }
    }

    /// Ends the organization's holding of the name and its claim of it. Its agents keep
    /// their tokens until they expire, and get no new ones.
    pub async fn release(&self, org_id: &OrgId, name: &IssuerDomain) -> Result<(), DomainError> {
        if self
            .store
            .release_domain(&Rules::new(&self.keys), org_id, name, Millis::now())
            .await?
        {
            Ok(())
        } else {
            Err(DomainError::NotFound(name.as_str().to_owned()))
        }
    }
}

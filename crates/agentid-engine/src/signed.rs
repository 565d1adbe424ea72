//! Signed requests (Web Bot Auth): the signature directories agentid serves for its issuers'
//! agents, and the online check of a request a receiver forwards, with the revocation and the
//! audit record the protocol lacks.
//!
//! A directory (`/v1/directories/{issuer_domain}`) lists the Ed25519 keys of the name's live
//! agents that are bound to a key and not revoked, each with its RFC 7638 thumbprint as
//! `kid`: read from the store on each call, so a revoked agent's key is gone at once. A
//! signed request whose `Signature-Agent` is one of these directories is checked against it
//! (the agent found by the signature's `keyid`), and so is one that names an issuer domain's own
//! `https://<name>/.well-known/http-message-signatures-directory` while an organization with
//! agents under the name here holds it (its issuer serves this directory there). A signature
//! agent elsewhere is fetched only when the receiver trusts it (its policy's `trusted`), under
//! the outbound rule, kept as its `Cache-Control` says (1 minute to 1 day, else 5 minutes),
//! asked again with its `ETag`, a failure remembered 5 minutes, one fetch of a URL at a time;
//! its Ed25519 and RSA keys (RSA-PSS with SHA-512) count. Else the request is `unverified`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;

use agentid_core::domain::audit::{AuditEntry, Event};
use agentid_core::domain::{IssuerDomain, KeyMode, Ledger, Millis, VerifyResult};
use agentid_core::httpsig::{self, Refusal, Request, SignatureKey, Signed};
use agentid_core::keys::KeyRing;
use agentid_core::token::dpop::PublicJwk;
use agentid_store::{AgentRecord, SharedStore, StoreError};

use crate::audit::{AuditError, AuditHandle};

use crate::domains::IssuerCheck;
use crate::kept::{Keeping, Kept};
use crate::once::Spent;
use crate::outbound::Outbound;
use crate::registry::Registry;

/// Where an issuer serves its directory from its own origin (draft-meunier-http-message-
/// signatures-directory): `https://<issuer domain>` then this path names that name's directory.
pub const WELL_KNOWN_DIRECTORY: &str = "/.well-known/http-message-signatures-directory";
/// The most keys a directory lists.
pub const MAX_DIRECTORY_KEYS: u32 = 1000;

/// What a check came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestResult {
    /// Signed by a key of the directory it names, in its time, never seen before.
    Verified,
    /// Signed, and the signature fails: malformed, out of its time, covering too little, a
    /// replay, a key the directory lacks, a revoked agent, a bad signature.
    Invalid,
    /// Nothing this service can vouch for: no signature with the tag asked for, or a
    /// signature agent that is not one of its directories and that the receiver does not trust.
    Unverified,
}

impl RequestResult {
    pub fn as_str(self) -> &'static str {
        match self {
            RequestResult::Verified => "verified",
            RequestResult::Invalid => "invalid",
            RequestResult::Unverified => "unverified",
        }
    }
}

/// The receiver's policy: the tag a signature must carry, and the signature agents beside
/// agentid's own directories whose keys it takes (fetched from them).
#[derive(Debug, Clone)]
pub struct RequestPolicy {
    pub tag: String,
    pub trusted: Vec<String>,
}

impl Default for RequestPolicy {
    fn default() -> Self {
        RequestPolicy {
            tag: httpsig::WEB_BOT_AUTH.to_owned(),
            trusted: Vec::new(),
        }
    }
}

/// The most signature agents a policy trusts, and the longest URL.
pub const MAX_TRUSTED: usize = 16;
pub const MAX_AGENT_URL: usize = 1024;

/// Signature directories' settings.
#[derive(Debug, Clone, Default)]
pub struct SignedConfig {
    /// Third parties' directories may be `http://` and on local addresses: for development.
    pub allow_local_directories: bool,
}

/// A checked request: the result, why when it is not verified, the signature's facts, and the
/// agent when it is one of agentid's.
#[derive(Debug, Clone)]
pub struct RequestCheck {
    pub result: RequestResult,
    pub reason: Option<String>,
    pub signature: Option<SignatureFacts>,
    pub agent: Option<AgentRecord>,
}

#[derive(Debug, Clone)]
pub struct SignatureFacts {
    pub signature_agent: Option<String>,
    pub keyid: String,
    pub tag: String,
    pub created: i64,
    pub expires: i64,
}

pub struct SignedRequests {
    directories_held: ThirdParties,
    /// Whether a signer's organization still holds its issuer domain.
    issuers: IssuerCheck,
    store: SharedStore,
    registry: Arc<Registry>,
    audit: AuditHandle,
    /// `<public URL>/v1/directories/`: a signature agent under it is one of ours.
    directories: String,
    max_skew_secs: i64,
    /// Nonces seen, fleet-wide.
    spent: Arc<Spent>,
    /// The key file, which seals the keys agents are bound to.
    keys: Arc<KeyRing>,
}

impl SignedRequests {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        store: SharedStore,
        registry: Arc<Registry>,
        audit: AuditHandle,
        public_url: &str,
        max_skew_secs: i64,
        outbound: Arc<Outbound>,
        cfg: &SignedConfig,
        issuers: IssuerCheck,
        spent: Arc<Spent>,
        keys: Arc<KeyRing>,
    ) -> Self {
        SignedRequests {
            directories_held: ThirdParties::new(outbound, cfg.allow_local_directories),
            issuers,
            store,
            registry,
            audit,
            directories: format!("{}/v1/directories/", public_url.trim_end_matches('/')),
            max_skew_secs,
            spent,
            keys,
        }
    }

    /// The URL of `domain`'s directory.
    pub fn directory_url(&self, domain: &IssuerDomain) -> String {
        format!("{}{}", self.directories, domain.as_str())
    }

    /// The public keys (Ed25519) of `domain`'s live agents bound to a key and not revoked,
    /// each a JWK with its thumbprint as `kid`, by agent id: the first [`MAX_DIRECTORY_KEYS`]
    /// (the check itself finds any agent by its key).
    pub async fn directory(&self, domain: &IssuerDomain) -> Result<Vec<Value>, StoreError> {
        Ok(self
            .keyed(domain)
            .await?
            .into_iter()
            .map(|listed| {
                let mut v: Value = serde_json::from_str(&listed.jwk.canonical()).unwrap_or(Value::Null);
                v["kid"] = listed.kid.into();
                v
            })
            .collect())
    }

    /// The directory's agents with their Ed25519 key and its thumbprint, of organizations
    /// that still hold the name.
    async fn keyed(&self, domain: &IssuerDomain) -> Result<Vec<Listed>, StoreError> {
        let agents = self.store.keyed_agents(domain, MAX_DIRECTORY_KEYS).await?;
        // Asked once per organization: a name's agents are mostly one organization's.
        let mut holds = std::collections::HashMap::new();
        let mut listed = Vec::new();
        for agent in agents.into_iter().filter_map(|a| self.listed(a)) {
            let org = agent.agent.org_id.clone();
            let held = match holds.get(&org) {
                Some(&held) => held,
                None => {
                    let held = self.issuers.may_issue(&self.store, &agent.agent).await?.is_ok();
                    holds.insert(org, held);
                    held
                }
            };
            if held {
                listed.push(agent);
            }
        }
        Ok(listed)
    }

    /// Whether agentid speaks for `domain`'s own origin: an organization that registered a
    /// live agent under it (revoked ones count, so that revoking every agent leaves their keys
    /// refused) may still issue there. A name that changed hands, or was let go, is its new
    /// owner's origin to serve.
    async fn speaks_for(&self, domain: &IssuerDomain) -> Result<bool, StoreError> {
        let orgs = self.store.issuer_agent_orgs(domain, MAX_NAME_ORGS).await?;
        self.issuers.held_by_one_of(&self.store, domain, &orgs).await
    }

    /// An agent as its directory lists it (its Ed25519 key, read once, and its thumbprint),
    /// when it is live, not revoked, and its stored key matches its stored thumbprint (else an
    /// integrity alarm).
    fn listed(&self, a: AgentRecord) -> Option<Listed> {
        if a.mode != KeyMode::Live || self.registry.is_revoked(a.id.as_str()) {
            return None;
        }
        let key = PublicJwk::from_canonical(a.jwk.as_deref()?).ok()?;
        let kid = key.thumbprint();
        if Some(&kid) != a.jkt.as_ref() {
            tracing::error!(agent = %a.id, "integrity alarm: an agent's stored key does not match its thumbprint");
            metrics::counter!("agentid_integrity_failures_total", "what" => "agent_key").increment(1);
            return None;
        }
        // A key written into the row with database access alone (an alarm) signs for nobody.
        if !crate::seals::agent_key_vouched(&self.keys, &a) {
            return None;
        }
        let PublicJwk::Ed25519 { key: ed25519, .. } = &key else {
            return None;
        };
        Some(Listed {
            key: SignatureKey::Ed25519(*ed25519),
            agent: a,
            jwk: key,
            kid,
        })
    }

    /// Checks `req`'s signature under `policy`, records the check (in the agent's ledger when
    /// the key is one of agentid's agents', else in the service's), and answers.
    pub async fn check(
        &self,
        req: &Request<'_>,
        policy: &RequestPolicy,
        received: Instant,
    ) -> Result<RequestCheck, CheckError> {
        let now = Millis::now();
        let revocations_seen = self.registry.revocations_seen();
        let check = self.judge(req, policy, now).await?;
        let agent = check.agent.as_ref();
        let recorded = self
            .audit
            .append(AuditEntry {
                ledger: agent.map_or_else(Ledger::service, AgentRecord::ledger),
                event: Event::Verification,
                agent_id: agent.map(|a| a.id.to_string()).unwrap_or_default(),
                result: match check.result {
                    RequestResult::Verified => VerifyResult::Valid,
                    _ => VerifyResult::Invalid,
                },
                failure_reason: check
                    .reason
                    .as_ref()
                    .map(|r| format!("signed request {}: {r}", check.result.as_str())),
                latency_us: received.elapsed().as_micros() as i64,
                requested_at: now,
                revocations_seen,
            })
            .await;
        let record = match recorded {
            Ok(record) => record,
            Err(e) => {
                if check.result == RequestResult::Verified {
                    // Its nonce was taken: the caller, told to try again, may.
                    self.release_nonce(req, policy).await;
                }
                return Err(e.into());
            }
        };
        let check = if check.result == RequestResult::Verified && record.result != VerifyResult::Valid {
            // Revoked on another instance meanwhile: the store saw it inside the batch.
            RequestCheck {
                result: RequestResult::Invalid,
                reason: Some("the agent is revoked".into()),
                ..check
            }
        } else {
            check
        };
        metrics::counter!("agentid_signed_request_results_total", "result" => check.result.as_str())
            .increment(1);
        Ok(check)
    }

    async fn judge(
        &self,
        req: &Request<'_>,
        policy: &RequestPolicy,
        now: Millis,
    ) -> Result<RequestCheck, StoreError> {
        let refused = |result, reason: String, signature| RequestCheck {
            result,
            reason: Some(reason),
            signature,
            agent: None,
        };
        let signed = match httpsig::parse(req, &policy.tag) {
            Ok(s) => s,
            Err(Refusal::Unsigned(why)) => return Ok(refused(RequestResult::Unverified, why, None)),
            Err(Refusal::Invalid(why)) => return Ok(refused(RequestResult::Invalid, why, None)),
        };
        let facts = Some(facts(&signed));
        if let Err(Refusal::Invalid(why) | Refusal::Unsigned(why)) =
            signed.check(now.as_secs(), self.max_skew_secs)
        {
            return Ok(refused(RequestResult::Invalid, why, facts));
        }
        let Some(url) = signed.signature_agent.as_deref() else {
            let why = "the request names no Signature-Agent: where its key is published is unknown".into();
            return Ok(refused(RequestResult::Unverified, why, facts));
        };
        let ours = url.strip_prefix(&self.directories);
        let theirs = url
            .strip_prefix("https://")
            .and_then(|rest| rest.strip_suffix(WELL_KNOWN_DIRECTORY));
        let Some(domain) = ours.or(theirs).and_then(|d| IssuerDomain::parse(d).ok()) else {
            return self.third_party(&signed, url, policy, facts).await;
        };
        let signer = self
            .store
            .keyed_agent(&domain, &signed.keyid)
            .await?
            .and_then(|a| self.listed(a));
        if ours.is_none() && signer.is_none() && !self.speaks_for(&domain).await? {
            // An issuer's own origin that serves no agentid agent: not ours to judge.
            return self.third_party(&signed, url, policy, facts).await;
        }
        let Some(Listed { agent, key, .. }) = signer else {
            let why = format!(
                "no live agent of {domain} has the key {} (unknown, revoked or never bound)",
                signed.keyid
            );
            return Ok(refused(RequestResult::Invalid, why, facts));
        };
        if !signed.verifies_with(&key) {
            return Ok(refused(
                RequestResult::Invalid,
                "the signature does not verify with the agent's key".into(),
                facts,
            ));
        }
        if self.issuers.may_issue(&self.store, &agent).await?.is_err() {
            let why = format!(
                "the agent's organization no longer holds its issuer domain {}",
                agent.issuer_domain
            );
            return Ok(refused(RequestResult::Invalid, why, facts));
        }
        if let Err(why) = self.fresh(&signed).await? {
            return Ok(refused(RequestResult::Invalid, why, facts));
        }
        Ok(RequestCheck {
            result: RequestResult::Verified,
            reason: None,
            signature: facts,
            agent: Some(agent),
        })
    }

    /// Refuses a signature whose nonce was seen before anywhere in the fleet (the store keeps
    /// each until its signature expires). No memory of the instance's own stands before the
    /// store: a signer chooses its signature's expiry (up to a day ahead), so a bounded memory
    /// filled with a day's worth of its own nonces would have had to refuse everyone's.
    async fn fresh(&self, signed: &Signed) -> Result<Result<(), String>, StoreError> {
        let Some(key) = nonce_key(signed) else {
            return Ok(Ok(()));
        };
        if !self
            .spent
            .spend(&key, Millis::from_secs(signed.expires), Millis::now())
            .await?
        {
            return Ok(Err("the signature's nonce was seen before: a replay".into()));
        }
        Ok(Ok(()))
    }

    /// Forgets that the nonce of `req`'s signature was seen (what `fresh` took).
    async fn release_nonce(&self, req: &Request<'_>, policy: &RequestPolicy) {
        let Some(key) = httpsig::parse(req, &policy.tag).ok().as_ref().and_then(nonce_key) else {
            return;
        };
        if let Err(e) = self.store.release_assertion(&key).await {
            tracing::warn!(error = %e, "cannot release a signed request's nonce; its retry is refused as a replay");
        }
    }

    /// A signature agent that is not agentid's: its directory, fetched when the receiver
    /// trusts it.
    async fn third_party(
        &self,
        signed: &Signed,
        url: &str,
        policy: &RequestPolicy,
        facts: Option<SignatureFacts>,
    ) -> Result<RequestCheck, StoreError> {
        let refused = |result, reason: String| RequestCheck {
            result,
            reason: Some(reason),
            signature: facts.clone(),
            agent: None,
        };
        if !policy.trusted.iter().any(|t| t == url) {
            let why = format!(
                "the signature agent {url} is neither one of this service's directories nor one this receiver trusts"
            );
            return Ok(refused(RequestResult::Unverified, why));
        }
        let keys = match self.directories_held.keys(url).await {
            Ok(k) => k,
            Err(why) => {
                return Ok(refused(
                    RequestResult::Unverified,
                    format!("its directory {url}: {why}"),
                ))
            }
        };
        let Some(key) = keys.iter().find(|(kid, _)| *kid == signed.keyid).map(|(_, k)| k) else {
            return Ok(refused(
                RequestResult::Invalid,
                format!("the directory {url} has no key {}", signed.keyid),
            ));
        };
        if !signed.verifies_with(key) {
            return Ok(refused(
                RequestResult::Invalid,
                "the signature does not verify with the directory's key".into(),
            ));
        }
        if let Err(why) = self.fresh(signed).await? {
            return Ok(refused(RequestResult::Invalid, why));
        }
        Ok(RequestCheck {
            result: RequestResult::Verified,
            reason: None,
            signature: facts,
            agent: None,
        })
    }
}

/// An agent of a directory: its record, its key (read from the store once) as the directory
/// lists it and as a signature is checked with it, and the key's thumbprint.
struct Listed {
    agent: AgentRecord,
    jwk: PublicJwk,
    key: SignatureKey,
    kid: String,
}

/// Third parties' signature directories, fetched and kept (see the module's documentation).
struct ThirdParties(Kept<Vec<(String, SignatureKey)>>);

const DIRECTORIES: Keeping = Keeping {
    fresh_for: Duration::from_secs(300),
    max_age: Some((60, 86_400)),
    failure_for: Duration::from_secs(300),
    // A directory is not fetched again for a key it lacks.
    refetch_after: Duration::ZERO,
    timeout: Duration::from_secs(5),
    max_bytes: 64 * 1024,
};
const DIRECTORY_MAX_KEYS: usize = 100;
/// The most organizations with agents under one name looked at (the name's holders over
/// time: one at a time holds it under the `verified` policy).
const MAX_NAME_ORGS: u32 = 100;

impl ThirdParties {
    fn new(outbound: Arc<Outbound>, allow_local: bool) -> Self {
        ThirdParties(Kept::new(outbound, allow_local, DIRECTORIES))
    }

    async fn keys(&self, url: &str) -> Result<Arc<Vec<(String, SignatureKey)>>, String> {
        if url.len() > MAX_AGENT_URL {
            return Err("its URL is too long".into());
        }
        self.0.get(url, false, directory_keys).await
    }
}

/// The Ed25519 and RSA keys of a directory (a JWK Set), by their RFC 7638 thumbprint; other
/// keys, and RFC 9421's published test keys, are passed over.
fn directory_keys(body: &[u8]) -> Result<Vec<(String, SignatureKey)>, String> {
    let v: Value = serde_json::from_slice(body).map_err(|_| "it is not JSON".to_owned())?;
    let keys = v
        .get("keys")
        .and_then(Value::as_array)
        .ok_or_else(|| "it is not a key set".to_owned())?;
    if keys.len() > DIRECTORY_MAX_KEYS {
        return Err(format!("it lists more than {DIRECTORY_MAX_KEYS} keys"));
    }
    Ok(keys.iter().filter_map(SignatureKey::from_jwk).collect())
}

fn facts(s: &Signed) -> SignatureFacts {
    SignatureFacts {
        signature_agent: s.signature_agent.clone(),
        keyid: s.keyid.clone(),
        tag: s.tag.clone(),
        created: s.created,
        expires: s.expires,
    }
}

/// Why a check could not be answered: the store, or the audit record.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Unrecorded(#[from] AuditError),
}

/// What a signature's nonce is remembered by, fleet-wide: its key's and its own.
fn nonce_key(signed: &Signed) -> Option<String> {
    let nonce = signed.nonce.as_ref()?;
    Some(crate::once::used_key(&["web-bot-auth", &signed.keyid, nonce]))
}

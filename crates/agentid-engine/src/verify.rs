//! Online verification: form, key, signature, agent, revocation, expiry; then the audit
//! record is committed, and only then is the outcome returned, with its answer rendered. The
//! use case owns the verified-token cache: a token is cached once its answer is known, the
//! valid answer's fixed part with it, so a hot token costs one look-up and one write of
//! `verified_at`.

use std::sync::Arc;
use std::time::Instant;

use agentid_core::domain::audit::{revoked_failure_reason, AuditEntry, Event};
use agentid_core::domain::{AgentId, Ledger, Millis, VerifyResult};
use agentid_core::keys::KeyRing;
use agentid_core::token::policy::{Policy, PolicyRefusal};
use agentid_core::token::{Claims, RejectReason};
use agentid_store::{SharedStore, StoreError};

use crate::audit::AuditHandle;
use crate::dpop::{Presented, ProofCheck, ProofError};
use crate::registry::{AgentEntry, Registry};
use crate::revocations::Revocations;
use crate::verifier::{CacheOutcome, TokenVerifier, VerifiedToken};
use crate::VerifyError;

/// The outcome of one online verification, after its audit record is committed.
#[derive(Debug, Clone)]
pub struct Verification {
    pub result: VerifyResult,
    /// Present exactly when `result` is `Valid`.
    pub valid: Option<ValidToken>,
    /// Why a token that passed was refused all the same: its DPoP proof (`result` is then
    /// `Invalid`).
    pub proof_error: Option<ProofError>,
    /// Why a token that passed was refused all the same: the receiver's policy (`result` is
    /// then `Invalid`).
    pub policy_error: Option<PolicyRefusal>,
    pub verified_at: Millis,
}

#[derive(Debug, Clone)]
pub struct ValidToken {
    pub token: Arc<VerifiedToken>,
    pub agent: Arc<AgentEntry>,
}

/// How the HTTP layer renders a valid answer's fixed part (all of it but what changes from
/// one answer to the next). The engine keeps the rendering with the cached token and weighs
/// it with the cache entry; it never reads it.
pub type Render = fn(&ValidToken) -> String;

/// What the checks concluded before the audit record was written.
struct Outcome {
    ledger: Ledger,
    agent_id: String,
    result: VerifyResult,
    failure_reason: Option<String>,
    valid: Option<ValidToken>,
    /// `Registry::revocations_seen` as the check began.
    revocations_seen: i64,
    /// The token's cache entry is to be written once its answer is known.
    cache_it: bool,
    proof_error: Option<ProofError>,
    policy_error: Option<PolicyRefusal>,
}

/// The verify path's counters, registered once: `metrics::counter!` with labels looks the
/// series up (hashing its labels) on every call.
struct Counters {
    /// Indexed by `VerifyResult::index`.
    results: [metrics::Counter; 4],
    unrecorded: metrics::Counter,
    cache_hit: metrics::Counter,
    cache_miss: metrics::Counter,
}

impl Counters {
    fn register() -> Self {
        // Handles taken before the recorder is installed would count nowhere.
        crate::recorder::handle();
        let result =
            |r: VerifyResult| metrics::counter!("agentid_verify_results_total", "result" => r.as_str());
        let cache = |o: &'static str| metrics::counter!("agentid_token_cache_requests_total", "outcome" => o);
        Counters {
            // `ALL` is in `index` order.
            results: VerifyResult::ALL.map(result),
            unrecorded: metrics::counter!("agentid_verify_results_total", "result" => "unrecorded"),
            cache_hit: cache("hit"),
            cache_miss: cache("miss"),
        }
    }
}

pub struct Verify {
    counters: Counters,
    store: SharedStore,
    registry: Arc<Registry>,
    tokens: Arc<TokenVerifier>,
    audit: AuditHandle,
    revocations: Arc<Revocations>,
    proofs: ProofCheck,
    /// The key file: it vouches for the identity providers delegated tokens stand on.
    keys: Arc<KeyRing>,
}

/// How a token is presented: alone (`GET /v1/verify/{token}`, where a bound token answers
/// with its `cnf` and the receiver asks for a proof), or with what a DPoP check needs
/// (`POST /v1/verify`: a bound token without its proof is refused).
#[derive(Debug, Clone, Copy)]
pub enum Presentation<'a> {
    Token,
    Dpop(Option<Presented<'a>>),
}

impl Verify {
    pub(crate) fn new(
        store: SharedStore,
        registry: Arc<Registry>,
        tokens: Arc<TokenVerifier>,
        audit: AuditHandle,
        revocations: Arc<Revocations>,
        proofs: ProofCheck,
        keys: Arc<KeyRing>,
    ) -> Self {
        Verify {
            counters: Counters::register(),
            store,
            registry,
            tokens,
            audit,
            revocations,
            proofs,
            keys,
        }
    }

    /// Verifies `token` (received at `received`), records it, and answers.
    pub async fn verify(
        &self,
        token: &str,
        received: Instant,
        render: Render,
    ) -> Result<Verification, VerifyError> {
        self.verify_presented(token, Presentation::Token, received, render)
            .await
    }

    /// Verifies `token` presented as `how`, records it, and answers.
    pub async fn verify_presented(
        &self,
        token: &str,
        how: Presentation<'_>,
        received: Instant,
        render: Render,
    ) -> Result<Verification, VerifyError> {
        self.verify_for(token, how, None, received, render).await
    }

    /// Verifies `token` presented as `how` for a receiver with `policy` (a token that passes
    /// but does not meet it is recorded `invalid`, with why), records it, and answers.
    pub async fn verify_for(
        &self,
        token: &str,
        how: Presentation<'_>,
        policy: Option<&Policy>,
        received: Instant,
        render: Render,
    ) -> Result<Verification, VerifyError> {
        let now = Millis::now();
        let mut checked = match self.check(token, now).await {
            Ok(c) => c,
            Err(e) => {
                self.counters.unrecorded.increment(1);
                return Err(VerifyError::AgentUnreadable(e));
            }
        };
        let mut taken = None;
        if let (Presentation::Dpop(presented), Some(valid)) = (how, &checked.valid) {
            match self
                .proofs
                .check(token, &valid.token.claims, presented.as_ref(), now.as_secs())
            {
                Ok(t) => taken = t,
                Err(refused) => {
                    checked.result = VerifyResult::Invalid;
                    checked.failure_reason = Some(refused.reason);
                    checked.proof_error = Some(refused.error);
                    checked.valid = None;
                }
            }
        }
        if let (Some(policy), Some(valid)) = (policy, &checked.valid) {
            if let Err(refused) = policy.check(&valid.token.claims) {
                checked.result = VerifyResult::Invalid;
                checked.failure_reason = Some(refused.describe());
                checked.policy_error = Some(refused);
                checked.valid = None;
            }
        }
        let entry = AuditEntry {
            ledger: checked.ledger,
            event: Event::Verification,
            agent_id: checked.agent_id,
            result: checked.result,
            failure_reason: checked.failure_reason,
            latency_us: received.elapsed().as_micros() as i64,
            requested_at: now,
            revocations_seen: checked.revocations_seen,
        };
        let record = match self.audit.append(entry).await {
            Ok(r) => r,
            Err(e) => {
                self.counters.unrecorded.increment(1);
                // Not answered, so not used: the receiver, told to retry, sends it again.
                if let Some(t) = &taken {
                    self.proofs.seen.release(t);
                }
                return Err(e.into());
            }
        };
        self.counters.results[record.result.index()].increment(1);
        if record.result == VerifyResult::Revoked && checked.result == VerifyResult::Valid {
            // Another instance revoked the agent; the store told us inside the audit transaction.
            // Boxed, as every rare branch of this path is: each request's future is as large as
            // its largest await, and a hot verify's is moved into its task and touched again
            // when its batch commits.
            Box::pin(self.revocations.seen_elsewhere(&self.store, &record.agent_id)).await;
        }
        let verification = Verification {
            result: record.result,
            valid: checked.valid.filter(|_| record.result == VerifyResult::Valid),
            proof_error: checked
                .proof_error
                .filter(|_| record.result == VerifyResult::Invalid),
            policy_error: checked
                .policy_error
                .filter(|_| record.result == VerifyResult::Invalid),
            verified_at: now,
        };
        if let (true, Some(v)) = (checked.cache_it, &verification.valid) {
            // The answer is rendered before the entry is written, so it is weighed with it.
            v.token.valid_answer(|| render(v));
            self.tokens.remember(token, &v.token);
        }
        Ok(verification)
    }

    /// The outcome of the checks, or the store's error when the agent had to be read from
    /// it and could not be.
    async fn check(&self, raw: &str, now: Millis) -> Result<Outcome, StoreError> {
        // Before the revocation index is read (see `Registry::revocations_seen`).
        let revocations_seen = self.registry.revocations_seen();
        let (checked, cache) = self.tokens.check(raw);
        match cache {
            CacheOutcome::Hit => self.counters.cache_hit.increment(1),
            CacheOutcome::Miss => self.counters.cache_miss.increment(1),
            CacheOutcome::Disabled => {}
        }
        let token = match checked {
            Ok(t) => t,
            Err(rej) => {
                // A forgery is recorded in the ledger of the agent it names, wherever that
                // agent was registered.
                let sub = rej.sub.filter(|s| AgentId::parse(s).is_some());
                let owner = match &sub {
                    Some(s) => self.find_agent(s).await?,
                    None => None,
                };
                return Ok(invalid(sub, owner, rej.reason, revocations_seen));
            }
        };
        let claims = &token.claims;
        let Some(agent) = self.find_agent(claims.agent_id()).await? else {
            return Ok(invalid(None, None, RejectReason::UnknownAgent, revocations_seen));
        };
        let ledger = Ledger {
            org_id: agent.org_id.as_str().to_owned(),
            mode: agent.mode,
        };
        let (mut result, mut failure_reason) = if self.registry.is_revoked(claims.agent_id()) {
            let reason = Box::pin(self.revocations.reason(&self.store, claims.agent_id())).await?;
            (
                VerifyResult::Revoked,
                Some(revoked_failure_reason(reason.as_deref())),
            )
        } else if Millis::from_secs(claims.exp) <= now {
            let at = Millis::from_secs(claims.exp).to_rfc3339();
            (VerifyResult::Expired, Some(format!("token expired at {at}")))
        } else {
            (VerifyResult::Valid, None)
        };
        if result == VerifyResult::Valid && claims.act.is_some() {
            if let Some(why) = Box::pin(self.chain_refusal(claims, &agent)).await? {
                (result, failure_reason) = (VerifyResult::Revoked, Some(why));
            }
        }
        let miss = cache == CacheOutcome::Miss;
        if miss && result != VerifyResult::Valid {
            // No answer to render: cached now (a valid one is, once its record is committed).
            self.tokens.remember(raw, &token);
        }
        // A valid token is cached (or, cached before it had an answer, weighed again) once its
        // answer is rendered.
        let cache_it = result == VerifyResult::Valid && (miss || !token.has_answer());
        Ok(Outcome {
            ledger,
            agent_id: claims.agent_id().to_owned(),
            result,
            failure_reason,
            valid: (result == VerifyResult::Valid).then(|| ValidToken { token, agent }),
            revocations_seen,
            cache_it,
            proof_error: None,
            policy_error: None,
        })
    }

    /// Why a delegated token no longer stands (an agent of its chain revoked, its provider
    /// no longer trusted, its person revoked), read from the store on every verification:
    /// each of these is seen at once, fleet-wide. `None` for a token that acts for nobody.
    async fn chain_refusal(&self, claims: &Claims, agent: &AgentEntry) -> Result<Option<String>, StoreError> {
        let (Some(act), Some(id)) = (&claims.act, &claims.sub_id) else {
            return Ok(None);
        };
        let Some(chain) = crate::delegation::chain_ids(act) else {
            return Ok(Some(
                "the token's chain names something that is not an agent".into(),
            ));
        };
        if let Some(gone) = chain.iter().find(|a| self.registry.is_revoked(a.as_str())) {
            return Ok(Some(format!("agent {gone} of the token's chain is revoked")));
        }
        let standing = self
            .store
            .delegation_standing(&agent.org_id, &id.iss, &id.sub, &chain[1..])
            .await?;
        Ok(crate::delegation::verdict(&self.keys, claims, &standing))
    }

    /// The agent with this id: from the registry, else (registered through another
    /// instance, or past the registry's budget) from the store, learned on the way.
    async fn find_agent(&self, id: &str) -> Result<Option<Arc<AgentEntry>>, StoreError> {
        match self.registry.agent(id) {
            Some(a) => Ok(Some(a)),
            // Boxed: an await the verify path of a held agent never takes (see `verify`).
            None => Box::pin(self.agent_from_store(id)).await,
        }
    }

    /// An agent the registry does not hold, read from the store and learned (a revoked one
    /// with its revocation).
    async fn agent_from_store(&self, id: &str) -> Result<Option<Arc<AgentEntry>>, StoreError> {
        let Some(id) = AgentId::parse(id) else {
            return Ok(None);
        };
        let Some(a) = self.store.get_agent(&id).await? else {
            return Ok(None);
        };
        self.revocations.learn(&a);
        Ok(Some(self.registry.learn(&a)))
    }
}

/// An invalid token is recorded in the ledger of the agent it names (`sub`, well formed)
/// when that agent exists (`owner`: its owner sees forgery attempts), otherwise in the
/// service's own ledger.
fn invalid(
    sub: Option<String>,
    owner: Option<Arc<AgentEntry>>,
    reason: RejectReason,
    revocations_seen: i64,
) -> Outcome {
    let ledger = owner.map_or_else(Ledger::service, |a| Ledger {
        org_id: a.org_id.as_str().to_owned(),
        mode: a.mode,
    });
    Outcome {
        ledger,
        agent_id: sub.unwrap_or_default(),
        result: VerifyResult::Invalid,
        failure_reason: Some(reason.describe().to_owned()),
        valid: None,
        revocations_seen,
        cache_it: false,
        proof_error: None,
        policy_error: None,
    }
}

//! agentid as an OAuth 2 authorization server for agents: an agent is an OAuth client
//! (`client_id` = its id) that authenticates with a JWT signed by the key bound to it
//! (`private_key_jwt`, RFC 7523) and gets an access token (RFC 9068) for the resources it
//! names (RFC 8707), with the scopes it asks for among its own, bound to a DPoP key when it
//! sends a proof (RFC 9449 §5). Every request that names a client is recorded in the audit
//! log (`Event::TokenRequest`): a token is handed out only once its record is committed as
//! `valid`, so a revocation anywhere in the fleet stops it as it stops a verification.

use std::sync::Arc;
use std::time::Instant;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use sha2::{Digest, Sha256};

use agentid_core::domain::audit::{revoked_failure_reason, AuditEntry, Event};
use agentid_core::domain::{new_id, AgentId, IdPrefix, KeyMode, Ledger, Millis, VerifyResult};
use agentid_core::keys::{KeyRing, SigningKeys};
use agentid_core::token::dpop::{check_proof, Expected as ProofExpected, PublicJwk};
use agentid_core::token::{absolute_uri, assertion, Actor, Audience, Claims, Confirmation, MAX_TOKEN_LEN};
use agentid_store::{AgentRecord, OrgRecord, SharedStore, StoreError};

use crate::delegation::{Delegation, ProviderKeys};
use crate::domains::IssuerCheck;
use crate::once::Spent;
use crate::outbound::Outbound;
use crate::ratelimit::{Class, Decision, RateLimits, RateSubject};
use crate::verifier::TokenVerifier;

use crate::audit::AuditHandle;
use crate::dpop::{Replays, TakenProof};
use crate::expiries::NotedExpiries;
use crate::registry::Registry;
use crate::revocations::Revocations;
use crate::status::StatusLists;

pub mod request;

pub use request::{
    OAuthError, TokenRequest, ACCESS_TOKEN_TYPE, CLIENT_CREDENTIALS, ID_JAG_PROFILE, ID_JAG_TYP,
    ID_TOKEN_TYPE, JWT_BEARER_ASSERTION, JWT_BEARER_GRANT, JWT_TYPE, TOKEN_EXCHANGE,
};

/// The longest a client assertion may live (`exp - iat`): what the MCP SDK signs.
pub const MAX_ASSERTION_LIFETIME_SECS: i64 = 300;
/// Resources one token may name at most, and the longest one.
pub const MAX_RESOURCES: usize = 10;
/// The longest client secret read (the service's are 46 characters).
const MAX_CLIENT_SECRET_LEN: usize = 256;
pub use agentid_core::token::MAX_RESOURCE_LEN;
/// How many DPoP proofs of token requests an instance remembers to refuse a replay.
const REMEMBERED_PROOFS: usize = 100_000;

/// The authorization server's settings.
#[derive(Debug, Clone)]
pub struct OAuthConfig {
    /// How long an access token lives.
    pub access_token_lifetime: std::time::Duration,
    /// The most agents a delegation chain may hold (a person's agent handing its task on).
    pub max_delegation_depth: usize,
    /// Identity providers' `jwks_uri` may be `http://` and resolve to local addresses: for
    /// development only.
    pub allow_local_provider_keys: bool,
}

impl Default for OAuthConfig {
    fn default() -> Self {
        OAuthConfig {
            access_token_lifetime: std::time::Duration::from_secs(15 * 60),
            max_delegation_depth: 4,
            allow_local_provider_keys: false,
        }
    }
}

/// A client whose assertion checked: the agent, as the store had it, and its organization
/// (whose limits its requests count against).
#[derive(Debug, Clone)]
pub struct Client {
    pub agent: AgentRecord,
    pub org: OrgRecord,
    /// The cell of the organization's bucket its request took.
    pub charged: Decision,
    /// The client assertion it spent (its key in the store), given back when the token it
    /// asked for cannot be recorded.
    pub(crate) spent: Option<String>,
}

/// An access token handed out.
#[derive(Clone)]
pub struct AccessToken {
    pub token: String,
    /// `DPoP` when bound to the proof's key, else `Bearer`.
    pub token_type: &'static str,
    pub expires_in: i64,
    pub scope: String,
    /// Token exchange answers it (RFC 8693 §2.2.1).
    pub issued_token_type: Option<&'static str>,
}

impl std::fmt::Debug for AccessToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AccessToken")
            .field("token", &"…")
            .field("token_type", &self.token_type)
            .field("expires_in", &self.expires_in)
            .field("scope", &self.scope)
            .field("issued_token_type", &self.issued_token_type)
            .finish()
    }
}

pub struct OAuth {
    pub(crate) store: SharedStore,
    pub(crate) registry: Arc<Registry>,
    pub(crate) revocations: Arc<Revocations>,
    pub(crate) signing: Arc<SigningKeys>,
    pub(crate) status: Arc<StatusLists>,
    pub(crate) audit: AuditHandle,
    pub(crate) issuers: IssuerCheck,
    /// The issuer identifier (the public URL) and the token endpoint's URL: what an
    /// assertion's `aud` and a proof's `htu` name.
    pub(crate) issuer: String,
    pub(crate) token_endpoint: String,
    pub(crate) lifetime_secs: i64,
    pub(crate) max_skew_secs: i64,
    pub(crate) proofs: Replays,
    pub(crate) expiries: Arc<NotedExpiries>,
    /// An authenticated client's requests count against its organization's other calls.
    limits: Arc<RateLimits>,
    /// The delegation grants: token exchange and ID-JAG.
    delegation: Delegation,
    /// Assertions and ID-JAGs spent, fleet-wide.
    spent: Arc<Spent>,
}

impl OAuth {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        store: SharedStore,
        registry: Arc<Registry>,
        revocations: Arc<Revocations>,
        signing: Arc<SigningKeys>,
        status: Arc<StatusLists>,
        audit: AuditHandle,
        issuers: IssuerCheck,
        expiries: Arc<NotedExpiries>,
        tokens: Arc<TokenVerifier>,
        outbound: Arc<Outbound>,
        keys: Arc<KeyRing>,
        limits: Arc<RateLimits>,
        spent: Arc<Spent>,
        public_url: &str,
        cfg: &OAuthConfig,
        max_skew_secs: i64,
    ) -> Self {
        let issuer = public_url.trim_end_matches('/').to_owned();
        let delegation = Delegation {
            store: store.clone(),
            registry: registry.clone(),
            tokens,
            provider_keys: ProviderKeys::new(outbound, cfg.allow_local_provider_keys),
            keys,
            issuer: issuer.clone(),
            max_skew_secs,
            max_delegation_depth: cfg.max_delegation_depth,
        };
        OAuth {
            delegation,
            token_endpoint: format!("{issuer}/oauth/token"),
            issuer,
            store,
            registry,
            revocations,
            signing,
            status,
            audit,
            issuers,
            lifetime_secs: cfg.access_token_lifetime.as_secs() as i64,
            max_skew_secs,
            proofs: Replays::new(REMEMBERED_PROOFS),
            expiries,
            limits,
            spent,
        }
    }

    /// The issuer identifier (RFC 8414): the service's public URL.
    pub fn issuer(&self) -> &str {
        &self.issuer
    }

    /// What an access token's lifetime is, in seconds.
    pub fn lifetime_secs(&self) -> i64 {
        self.lifetime_secs
    }

    /// What the request asks for, checked before anyone is authenticated: the grant, the
    /// way the client authenticates, the resources.
    pub fn check_request(&self, req: &TokenRequest<'_>) -> Result<(), OAuthError> {
        match req.grant_type {
            None => return Err(OAuthError::InvalidRequest("grant_type is required".into())),
            Some(CLIENT_CREDENTIALS) => {}
            Some(TOKEN_EXCHANGE) => check_exchange(req)?,
            Some(JWT_BEARER_GRANT) => {
                if req.assertion.is_none() {
                    return Err(OAuthError::InvalidRequest(
                        "assertion is required: an ID-JAG (typ oauth-id-jag+jwt)".into(),
                    ));
                }
            }
            Some(other) => {
                return Err(OAuthError::UnsupportedGrantType(format!(
                    "grant_type {other:?} is not supported: use client_credentials, {TOKEN_EXCHANGE} \
                     or {JWT_BEARER_GRANT}"
                )))
            }
        }
        check_client(req)?;
        // Counted first: thousands of audiences against thousands of resources would cost a
        // quadratic match before any client is known.
        if req.audiences.len() > MAX_RESOURCES {
            return Err(OAuthError::InvalidTarget(format!(
                "at most {MAX_RESOURCES} audiences a token"
            )));
        }
        // RFC 8693's `audience` names a target logically; a token's audience here is the
        // resource it is for. One the resources do not name would be dropped unseen.
        if let Some(other) = req.audiences.iter().find(|a| !req.resources.contains(a)) {
            return Err(OAuthError::InvalidTarget(format!(
                "audience {other:?} is not a resource asked for: name the target as resource (RFC 8707)"
            )));
        }
        if req.grant_type == Some(JWT_BEARER_GRANT) && req.resources.is_empty() {
            // The ID-JAG names its resource.
            return Ok(());
        }
        check_resources(&req.resources)
    }

    /// Authenticates the client of `req` (whose form `check_request` passed). A refusal of a
    /// client that exists is recorded in its organization's log, any other in the
    /// service's, before it is answered.
    pub async fn authenticate(
        &self,
        req: &TokenRequest<'_>,
        received: Instant,
    ) -> Result<Client, OAuthError> {
        let now = Millis::now();
        if let Some(secret) = req.client_secret {
            return self
                .authenticate_secret(req.client_id.unwrap_or_default(), secret, now, received)
                .await;
        }
        let assertion = req.client_assertion.unwrap_or_default();
        let claimed = assertion::claimed_client(assertion);
        let named = claimed.as_deref().and_then(AgentId::parse);
        let agent = match named {
            Some(id) => self.store.get_agent(&id).await?,
            None => None,
        };
        let Some(agent) = agent else {
            let why = match &claimed {
                Some(c) => no_agent(c),
                None => "client_assertion is not a JWT whose sub names the client".to_owned(),
            };
            return Err(self
                .refused(None, VerifyResult::Invalid, why, now, received)
                .await);
        };
        if let Some(id) = req.client_id.filter(|id| agent.id != **id) {
            let why = match AgentId::parse(id) {
                Some(_) => format!("client_id {id:?} is not the client the assertion names"),
                None => {
                    "the client_id is not an agent id (agt_…), nor the client the assertion names".to_owned()
                }
            };
            return Err(self
                .refused(Some(&agent), VerifyResult::Invalid, why, now, received)
                .await);
        }
        let key = match agent.jwk.as_deref().map(PublicJwk::from_canonical) {
            Some(Ok(key)) if Some(key.thumbprint()) == agent.jkt => {
                // A key written into the row with database access alone (an alarm).
                if !crate::seals::agent_key_vouched(&self.delegation.keys, &agent) {
                    let why = "the agent's key cannot be read".to_owned();
                    return Err(self
                        .refused(Some(&agent), VerifyResult::Invalid, why, now, received)
                        .await);
                }
                key
            }
            Some(_) => {
                tracing::error!(agent = %agent.id, "integrity alarm: an agent's stored key does not match its thumbprint");
                metrics::counter!("agentid_integrity_failures_total", "what" => "agent_key").increment(1);
                let why = "the agent's key cannot be read".to_owned();
                return Err(self
                    .refused(Some(&agent), VerifyResult::Invalid, why, now, received)
                    .await);
            }
            None => {
                let why = "the agent is bound to no key: bind one with POST /v1/agents/{id}/issue-token \
                           {\"jwk\": …} to let it authenticate"
                    .to_owned();
                return Err(self
                    .refused(Some(&agent), VerifyResult::Invalid, why, now, received)
                    .await);
            }
        };
        let audiences = [self.issuer.as_str(), self.token_endpoint.as_str()];
        let expected = assertion::Expected {
            client_id: agent.id.as_str(),
            audiences: &audiences,
            now: now.as_secs(),
            max_lifetime: MAX_ASSERTION_LIFETIME_SECS,
            max_skew: self.max_skew_secs,
        };
        let checked = match assertion::check(assertion, &key, &expected) {
            Ok(c) => c,
            Err(e) => {
                let why = format!("client_assertion: {e}");
                return Err(self
                    .refused(Some(&agent), VerifyResult::Invalid, why, now, received)
                    .await);
            }
        };
        self.refuse_revoked(&agent, now, received).await?;
        // Charged before the assertion is spent: a client past its organization's limit
        // costs no write. A replay gives its cell back below: it costs the organization
        // nothing.
        let (org, charged) = self.charged(&agent, now, received).await?;
        // Fleet-wide: the store remembers each assertion until it expires.
        let mut id = Sha256::new();
        id.update(agent.id.as_str().as_bytes());
        id.update([0]);
        id.update(checked.jti.as_bytes());
        let id = URL_SAFE_NO_PAD.encode(id.finalize());
        if !self.spent.spend(&id, Millis::from_secs(checked.exp), now).await? {
            self.limits.return_cell(bucket(&org), Class::Other);
            let why =
                "client_assertion was used already (its jti): sign a new one for each request".to_owned();
            return Err(self
                .refused(Some(&agent), VerifyResult::Invalid, why, now, received)
                .await);
        }
        if let Err(e) = self.refuse_revoked(&agent, now, received).await {
            if matches!(e, OAuthError::Unavailable(_)) {
                // Not refused for good but told to try again (503): what the request spent is
                // given back, so that the same request may.
                if let Err(e) = self.store.release_assertion(&id).await {
                    tracing::warn!(error = %e, "cannot give back an assertion whose refusal was not recorded");
                }
                self.limits.return_cell(bucket(&org), Class::Other);
            }
            return Err(e);
        }
        Ok(Client {
            agent,
            org,
            charged,
            spent: Some(id),
        })
    }

    /// Refuses (recorded) an agent revoked in memory (at once, fleet-wide) or as stored.
    async fn refuse_revoked(
        &self,
        agent: &AgentRecord,
        now: Millis,
        received: Instant,
    ) -> Result<(), OAuthError> {
        let reason = if agent.revoked_at.is_some() {
            agent.revocation_reason.as_deref().map(Arc::from)
        } else if self.registry.is_revoked(agent.id.as_str()) {
            // Revoked since it was read.
            self.revocations.reason(&self.store, agent.id.as_str()).await?
        } else {
            return Ok(());
        };
        let why = revoked_failure_reason(reason.as_deref());
        Err(self
            .refused(Some(agent), VerifyResult::Revoked, why, now, received)
            .await)
    }

    /// The agent's organization, and the cell of its bucket of other calls the request takes;
    /// refused past its limit.
    async fn charged(
        &self,
        agent: &AgentRecord,
        now: Millis,
        received: Instant,
    ) -> Result<(OrgRecord, Decision), OAuthError> {
        let Some(org) = self.store.get_org(&agent.org_id).await? else {
            return Err(StoreError::Corrupt(format!("agent {} has no organization", agent.id)).into());
        };
        // A plan or limits the key file does not vouch for were written with database access
        // alone: the organization's agents get no tokens under them (as its keys open
        // nothing). Refused, and recorded, as an authentication that failed.
        if !crate::seals::org_vouched(&self.delegation.keys, &org) {
            let why = "the agent's organization may not get tokens".to_owned();
            return Err(self
                .refused(Some(agent), VerifyResult::Invalid, why, now, received)
                .await);
        }
        let charged = self.limits.check(bucket(&org), Class::Other).await;
        if !charged.allowed {
            return Err(OAuthError::RateLimited(charged));
        }
        Ok((org, charged))
    }

    /// Authenticates an agent by its client secret (`client_secret_basic`, `client_secret_post`):
    /// one of its secrets still valid, and the agent not revoked. A refusal is recorded as
    /// `authenticate`'s are.
    async fn authenticate_secret(
        &self,
        client_id: &str,
        secret: &str,
        now: Millis,
        received: Instant,
    ) -> Result<Client, OAuthError> {
        let agent = match AgentId::parse(client_id) {
            Some(id) => self.store.get_agent(&id).await?,
            None => None,
        };
        let Some(agent) = agent else {
            let why = no_agent(client_id);
            return Err(self
                .refused(None, VerifyResult::Invalid, why, now, received)
                .await);
        };
        // The secret first: a caller without it learns nothing of the agent (that it is
        // revoked), as with a key assertion, whose signature is checked first.
        let holds = if secret.len() <= MAX_CLIENT_SECRET_LEN {
            let hash = crate::apikeys::hash_key(secret);
            match self.store.client_secret_holds(&agent.id, &hash, now).await? {
                Some((made, mac)) => {
                    crate::seals::client_secret_vouched(&self.delegation.keys, &agent.id, &hash, (made, &mac))
                }
                None => false,
            }
        } else {
            false
        };
        if !holds {
            let why = "client_secret is not one of the agent's, or it expired (POST \
                       /v1/agents/{id}/client-secret makes one)"
                .to_owned();
            return Err(self
                .refused(Some(&agent), VerifyResult::Invalid, why, now, received)
                .await);
        }
        self.refuse_revoked(&agent, now, received).await?;
        let (org, charged) = self.charged(&agent, now, received).await?;
        Ok(Client {
            agent,
            org,
            charged,
            spent: None,
        })
    }

    /// Hands `client` an access token for what `req` asks, once the record of it is
    /// committed; a refusal is recorded too.
    pub async fn issue(
        &self,
        client: &Client,
        req: &TokenRequest<'_>,
        received: Instant,
    ) -> Result<AccessToken, OAuthError> {
        let now = Millis::now();
        let agent = &client.agent;
        let revocations_seen = self.registry.revocations_seen();
        let delegated = match self.delegation.grant(agent, req, now).await {
            Ok(d) => d,
            Err(e @ (OAuthError::Unavailable(_) | OAuthError::ServerError)) => return Err(e),
            Err(e) => return Err(self.refused_after(agent, e, now, received).await),
        };
        let resources: Vec<String> = match delegated.as_ref().and_then(|d| d.resource.as_deref()) {
            Some(r) if req.resources.iter().any(|asked| asked != &r) => {
                let e = OAuthError::InvalidTarget(format!(
                    "the assertion is for the resource {r}: ask for that one, or name none"
                ));
                return Err(self.refused_after(agent, e, now, received).await);
            }
            Some(r) => vec![r.to_owned()],
            None if req.resources.is_empty() => {
                let e = OAuthError::InvalidTarget(
                    "resource is required: the assertion names none (RFC 8707)".into(),
                );
                return Err(self.refused_after(agent, e, now, received).await);
            }
            None => req.resources.iter().map(|r| (*r).to_owned()).collect(),
        };
        let scoped = match &delegated {
            Some(d) => delegated_scope(req.scope, &agent.scopes, d.allowed.as_deref()),
            None => granted_scope(req.scope, &agent.scopes),
        };
        let granted = match scoped {
            Ok(g) => g,
            Err(e) => return Err(self.refused_after(agent, e, now, received).await),
        };
        let proof = match req.dpop.map(|proof| self.check_dpop(proof, now)).transpose() {
            Ok(taken) => taken,
            Err(e) => return Err(self.refused_after(agent, e, now, received).await),
        };
        match self.issuers.may_issue(&self.store, agent).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => {
                let refusal = OAuthError::InvalidClient(format!(
                    "the agent's organization no longer holds its issuer domain {}",
                    agent.issuer_domain
                ));
                return Err(self.refused_after(agent, refusal, now, received).await);
            }
            Err(e) => return Err(e.into()),
        }
        if self.registry.is_revoked(agent.id.as_str()) {
            return Err(self
                .refused(
                    Some(agent),
                    VerifyResult::Revoked,
                    "agent revoked".into(),
                    now,
                    received,
                )
                .await);
        }
        let issued = now.as_secs();
        let cap = delegated.as_ref().and_then(|d| d.exp_cap).unwrap_or(i64::MAX);
        // No longer than the organization's longest token (an enterprise may shorten it).
        let longest = i64::try_from(client.org.limits().max_expiry_seconds).unwrap_or(i64::MAX);
        let expires = (issued + self.lifetime_secs.min(longest)).min(cap);
        if expires <= issued {
            // RFC 7523 §3.1: an assertion that expired is the grant's fault, invalid_grant.
            let e = match req.grant_type {
                Some(JWT_BEARER_GRANT) => OAuthError::InvalidGrant("the assertion expires now".into()),
                _ => OAuthError::InvalidRequest("the subject token expires now".into()),
            };
            return Err(self.refused_after(agent, e, now, received).await);
        }
        let single_use = delegated.as_ref().and_then(|d| d.single_use.clone());
        let (sub, sub_id, act) = match delegated {
            Some(d) => {
                let act = match d.inner {
                    Some(inner) => inner.wrapped(agent.id.as_str(), agent.issuer_domain.as_str()),
                    None => Actor {
                        sub: agent.id.to_string(),
                        issuer_domain: agent.issuer_domain.to_string(),
                        act: None,
                    },
                };
                (d.sub_id.sub.clone(), Some(d.sub_id), Some(act))
            }
            None => (agent.id.to_string(), None, None),
        };
        let claims = Claims {
            client_id: Some(agent.id.to_string()),
            aud: Some(Audience::of(resources)),
            sub_id,
            act,
            scope: Some(granted.clone()),
            issuer_domain: Some(agent.issuer_domain.to_string()),
            status: agent.status.as_ref().map(|p| self.status.claim(p)),
            livemode: (agent.mode == KeyMode::Test).then_some(false),
            cnf: proof.as_ref().map(|p| Confirmation {
                jkt: p.jkt().to_owned(),
            }),
            ..Claims::agent(
                &self.issuer,
                &sub,
                &new_id(IdPrefix::Request)[4..],
                issued,
                expires,
                Vec::new(),
            )
        };
        let (token, kid) = self.signing.sign(&claims);
        if token.len() > MAX_TOKEN_LEN {
            let e = OAuthError::InvalidRequest(format!(
                "the token would be {} bytes, over the {MAX_TOKEN_LEN}-byte limit of a token: ask for fewer \
                 or shorter resources or scopes",
                token.len()
            ));
            return Err(self.refused_after(agent, e, now, received).await);
        }
        self.expiries
            .note(&self.store, &kid, Millis::from_secs(expires))
            .await?;
        // Spent last but the record: a request refused before this leaves it for a corrected
        // one, and so does a record that cannot be written (given back below).
        if let Some((key, until)) = &single_use {
            if !self.spent.spend(key, *until, now).await? {
                let e = OAuthError::InvalidGrant("assertion was used already (its jti)".into());
                return Err(self.refused_after(agent, e, now, received).await);
            }
        }
        let recorded = self
            .audit
            .append(AuditEntry {
                ledger: agent.ledger(),
                event: Event::TokenRequest,
                agent_id: agent.id.to_string(),
                result: VerifyResult::Valid,
                failure_reason: None,
                latency_us: received.elapsed().as_micros() as i64,
                requested_at: now,
                revocations_seen,
            })
            .await;
        let record = match recorded {
            Ok(record) => record,
            Err(e) => {
                // Not handed out: what the request spent is given back, so that the same
                // request, told to try again (503), may.
                let spent = [single_use.as_ref().map(|(key, _)| key), client.spent.as_ref()];
                for key in spent.into_iter().flatten() {
                    if let Err(e) = self.store.release_assertion(key).await {
                        tracing::warn!(error = %e, "cannot give back an assertion whose token was not recorded");
                    }
                }
                if let Some(proof) = &proof {
                    self.proofs.release(proof);
                }
                return Err(e.into());
            }
        };
        if record.result != VerifyResult::Valid {
            // Revoked on another instance meanwhile: the store saw it inside the batch.
            Box::pin(self.revocations.seen_elsewhere(&self.store, agent.id.as_str())).await;
            return Err(OAuthError::InvalidClient("the agent is revoked".into()));
        }
        Ok(AccessToken {
            token,
            token_type: if claims.cnf.is_some() { "DPoP" } else { "Bearer" },
            expires_in: expires - issued,
            scope: granted,
            issued_token_type: (req.grant_type == Some(TOKEN_EXCHANGE)).then_some(ACCESS_TOKEN_TYPE),
        })
    }

    /// A token request's DPoP proof (RFC 9449 §5), taken: made for a POST to the token
    /// endpoint, now, and not used before.
    fn check_dpop(&self, proof: &str, now: Millis) -> Result<TakenProof, OAuthError> {
        let expected = ProofExpected {
            htm: "POST",
            htu: &self.token_endpoint,
            token: None,
            now: now.as_secs(),
            max_skew: self.max_skew_secs,
        };
        let checked = check_proof(proof, &expected).map_err(|e| OAuthError::InvalidDpopProof(e.0))?;
        self.proofs
            .take(checked, now.as_secs() - self.max_skew_secs)
            .map_err(|r| OAuthError::InvalidDpopProof(r.reason))
    }

    /// Records a refusal after the client authenticated, and gives it back.
    async fn refused_after(
        &self,
        agent: &AgentRecord,
        e: OAuthError,
        now: Millis,
        received: Instant,
    ) -> OAuthError {
        let why = format!("token request refused: {e}");
        let result = VerifyResult::Invalid;
        self.recorded(Some(agent), result, why, e, now, received).await
    }

    /// Records a refused authentication, and answers `invalid_client` (or what kept it from
    /// being recorded).
    async fn refused(
        &self,
        agent: Option<&AgentRecord>,
        result: VerifyResult,
        why: String,
        now: Millis,
        received: Instant,
    ) -> OAuthError {
        let answer = match result {
            VerifyResult::Revoked => OAuthError::InvalidClient("the agent is revoked".into()),
            _ => OAuthError::InvalidClient(why.clone()),
        };
        self.recorded(agent, result, why, answer, now, received).await
    }

    /// Records a refused request, and answers `answer`, or what kept the record from being
    /// committed.
    async fn recorded(
        &self,
        agent: Option<&AgentRecord>,
        result: VerifyResult,
        why: String,
        answer: OAuthError,
        now: Millis,
        received: Instant,
    ) -> OAuthError {
        let entry = AuditEntry {
            ledger: agent.map_or_else(Ledger::service, AgentRecord::ledger),
            event: Event::TokenRequest,
            agent_id: agent.map(|a| a.id.to_string()).unwrap_or_default(),
            result,
            failure_reason: Some(why),
            latency_us: received.elapsed().as_micros() as i64,
            requested_at: now,
            revocations_seen: self.registry.revocations_seen(),
        };
        match self.audit.append(entry).await {
            Ok(_) => answer,
            Err(e) => e.into(),
        }
    }
}

/// An organization's bucket of other calls.
fn bucket(org: &OrgRecord) -> RateSubject<'_> {
    RateSubject::Org {
        org_id: org.id.as_str(),
        per_minute: org.limits().other_per_minute,
    }
}

/// Why no agent answers to `named` (a client_id, or the sub of an assertion), as the log
/// records it: the text is echoed only when it is an agent id, for a client may have put its
/// secret there, and a ledger keeps what it is given for good.
fn no_agent(named: &str) -> String {
    if AgentId::parse(named).is_some() {
        format!("no agent {named:?}: the client_id is the agent's id (agt_…)")
    } else {
        "the client_id is not an agent id (agt_…)".to_owned()
    }
}

/// How the client of `req` authenticates: by a client secret (with its client_id) or by a
/// `private_key_jwt` assertion, one of the two (RFC 6749 §2.3).
fn check_client(req: &TokenRequest<'_>) -> Result<(), OAuthError> {
    let assertion = req.client_assertion_type.is_some() || req.client_assertion.is_some();
    if req.client_secret.is_some() {
        // RFC 6749 §2.3: one way of authenticating a request, no more.
        if assertion {
            return Err(OAuthError::InvalidRequest(
                "both a client secret and a client assertion: authenticate one way".into(),
            ));
        }
        if req.client_id.is_none_or(str::is_empty) {
            return Err(OAuthError::InvalidClient(
                "client_id is required with a client secret".into(),
            ));
        }
        return Ok(());
    }
    match req.client_assertion_type {
        Some(JWT_BEARER_ASSERTION) => {}
        None => {
            return Err(OAuthError::InvalidClient(format!(
                "the client authenticates with private_key_jwt (client_assertion_type \
                 {JWT_BEARER_ASSERTION} and a client_assertion signed by the agent's key), \
                 or with the agent's client secret (client_secret_basic, client_secret_post)"
            )))
        }
        Some(other) => {
            return Err(OAuthError::InvalidClient(format!(
                "client_assertion_type {other:?} is not supported: use {JWT_BEARER_ASSERTION}"
            )))
        }
    }
    if req.client_assertion.is_none_or(str::is_empty) {
        return Err(OAuthError::InvalidClient("client_assertion is required".into()));
    }
    Ok(())
}

/// A token exchange's form (RFC 8693 §2.1): a subject token of a type taken, no actor token
/// (the authenticated agent is the actor), an access token asked for.
fn check_exchange(req: &TokenRequest<'_>) -> Result<(), OAuthError> {
    if req.subject_token.is_none() {
        return Err(OAuthError::InvalidRequest("subject_token is required".into()));
    }
    match req.subject_token_type {
        Some(ID_TOKEN_TYPE | JWT_TYPE | ACCESS_TOKEN_TYPE) => {}
        None => {
            return Err(OAuthError::InvalidRequest(
                "subject_token_type is required".into(),
            ))
        }
        Some(other) => {
            return Err(OAuthError::InvalidRequest(format!(
            "subject_token_type {other:?} is not taken: {ID_TOKEN_TYPE}, {JWT_TYPE} or {ACCESS_TOKEN_TYPE}"
        )))
        }
    }
    if req.actor_token.is_some() {
        return Err(OAuthError::InvalidRequest(
            "actor_token is not taken: the authenticated agent is the actor".into(),
        ));
    }
    match req.requested_token_type {
        None | Some(ACCESS_TOKEN_TYPE) => Ok(()),
        Some(other) => Err(OAuthError::InvalidRequest(format!(
            "requested_token_type {other:?}: only {ACCESS_TOKEN_TYPE} is issued"
        ))),
    }
}

/// RFC 8707 §2: one or more absolute URIs, none with a fragment.
fn check_resources(resources: &[&str]) -> Result<(), OAuthError> {
    if resources.is_empty() {
        return Err(OAuthError::InvalidTarget(
            "resource is required: the absolute URI of the service the token is for (RFC 8707)".into(),
        ));
    }
    if resources.len() > MAX_RESOURCES {
        return Err(OAuthError::InvalidTarget(format!(
            "at most {MAX_RESOURCES} resources a token"
        )));
    }
    for r in resources {
        if let Err(why) = absolute_uri(r) {
            return Err(OAuthError::InvalidTarget(format!("resource {r:?}: {why}")));
        }
    }
    Ok(())
}

/// The scope granted: what was asked (in its order, each once), all of it the agent's; all
/// of the agent's when nothing was asked.
fn granted_scope(asked: Option<&str>, held: &[String]) -> Result<String, OAuthError> {
    let asked: Vec<&str> = asked.map_or_else(Vec::new, |s| s.split(' ').filter(|s| !s.is_empty()).collect());
    if asked.is_empty() {
        return Ok(held.join(" "));
    }
    let mut granted: Vec<&str> = Vec::with_capacity(asked.len());
    for s in asked {
        if !held.iter().any(|h| h == s) {
            return Err(OAuthError::InvalidScope(format!(
                "scope {s:?} is not one of the agent's scopes"
            )));
        }
        if !granted.contains(&s) {
            granted.push(s);
        }
    }
    Ok(granted.join(" "))
}

/// A delegated token's scope: what was asked (all of the agent's when nothing was), of what
/// the agent holds and what the subject token allowed; nothing left is `invalid_scope`.
fn delegated_scope(
    asked: Option<&str>,
    held: &[String],
    allowed: Option<&[String]>,
) -> Result<String, OAuthError> {
    let asked: Vec<&str> = asked.map_or_else(Vec::new, |s| s.split(' ').filter(|s| !s.is_empty()).collect());
    let mut granted: Vec<&str> = Vec::new();
    let wanted: Vec<&str> = if asked.is_empty() {
        held.iter().map(String::as_str).collect()
    } else {
        asked
    };
    // Each scope is looked for in the subject token's list once, and only one the agent
    // holds (a handful): a request that repeats a scope thousands of times against a token
    // that allows thousands costs no more than one that names it once.
    let mut tried: Vec<&str> = Vec::new();
    for s in wanted {
        if tried.contains(&s) || !held.iter().any(|h| h == s) {
            continue;
        }
        tried.push(s);
        if allowed.is_none_or(|a| a.iter().any(|x| x == s)) {
            granted.push(s);
        }
    }
    if granted.is_empty() {
        return Err(OAuthError::InvalidScope(
            "no scope is left: what was asked, what the agent holds and what the subject token allows \
             share none"
                .into(),
        ));
    }
    Ok(granted.join(" "))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Secrets a request or an answer carries never show in `Debug` (a `?value` in a log).
    #[test]
    fn debug_shows_no_secret() {
        let secret = "S3CRET-VALUE";
        let request = TokenRequest {
            client_id: Some("agt_x"),
            client_secret: Some(secret),
            client_assertion: Some(secret),
            dpop: Some(secret),
            subject_token: Some(secret),
            actor_token: Some(secret),
            assertion: Some(secret),
            ..TokenRequest::default()
        };
        let answer = AccessToken {
            token: secret.into(),
            token_type: "Bearer",
            expires_in: 60,
            scope: "read:docs".into(),
            issued_token_type: None,
        };
        let issued = crate::agents::IssuedToken {
            agent_id: AgentId::parse("agt_01m8nbw6g1k0m5bpbc9rpng1rf").unwrap(),
            token: secret.into(),
            expires_at: Millis(0),
        };
        let presented = crate::dpop::Presented {
            proof: secret,
            htm: "GET",
            htu: "https://a.example/",
        };
        for shown in [
            format!("{request:?}"),
            format!("{answer:?}"),
            format!("{issued:?}"),
            format!("{presented:?}"),
        ] {
            assert!(!shown.contains(secret), "{shown}");
            assert!(shown.contains('…'), "{shown}");
        }
    }

    #[test]
    fn a_delegated_scope_is_the_intersection_of_every_link() {
        let held = vec!["read:a".to_owned(), "write:b".to_owned()];
        let allowed = vec!["read:a".to_owned()];
        assert_eq!(delegated_scope(None, &held, None).unwrap(), "read:a write:b");
        assert_eq!(delegated_scope(None, &held, Some(&allowed)).unwrap(), "read:a");
        assert_eq!(
            delegated_scope(Some("write:b read:a"), &held, Some(&allowed)).unwrap(),
            "read:a"
        );
        assert!(matches!(
            delegated_scope(Some("write:b"), &held, Some(&allowed)),
            Err(OAuthError::InvalidScope(_))
        ));
        assert!(matches!(
            delegated_scope(None, &held, Some(&[])),
            Err(OAuthError::InvalidScope(_))
        ));
    }

    #[test]
    fn resources_are_absolute_uris_without_fragments() {
        for ok in [
            "https://api.example/mcp",
            "http://127.0.0.1:8000/mcp/",
            "https://api.example/a?b=c",
            "urn:example:service",
        ] {
            assert!(check_resources(&[ok]).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "/relative",
            "api.example/mcp",
            "https://api.example/mcp#frag",
            "https://",
            "https:///path",
            "https://api.example/a b",
            "1http://x",
            "https://api.example/é",
        ] {
            assert!(
                matches!(check_resources(&[bad]), Err(OAuthError::InvalidTarget(_))),
                "{bad}"
            );
        }
        assert!(matches!(check_resources(&[]), Err(OAuthError::InvalidTarget(_))));
        let many = vec!["https://a.example"; MAX_RESOURCES + 1];
        assert!(check_resources(&many).is_err());
        let long = format!("https://a.example/{}", "x".repeat(MAX_RESOURCE_LEN));
        assert!(check_resources(&[&long]).is_err());
    }

    #[test]
    fn the_scope_granted_is_what_was_asked_of_what_is_held() {
        let held = vec!["read:a".to_owned(), "write:b".to_owned()];
        assert_eq!(granted_scope(None, &held).unwrap(), "read:a write:b");
        assert_eq!(granted_scope(Some(""), &held).unwrap(), "read:a write:b");
        assert_eq!(granted_scope(Some("write:b"), &held).unwrap(), "write:b");
        assert_eq!(
            granted_scope(Some("write:b  read:a write:b"), &held).unwrap(),
            "write:b read:a"
        );
        assert!(matches!(
            granted_scope(Some("read:a admin:all"), &held),
            Err(OAuthError::InvalidScope(_))
        ));
        assert!(matches!(
            granted_scope(Some("read:"), &held),
            Err(OAuthError::InvalidScope(_))
        ));
    }
}

//! The engine: agentid's use cases, between an HTTP handler and the store, each in a file of
//! its own: verification (`verify`, with its token cache), the issuer's agents (`agents`),
//! issuer domains (`domains`), the verifiable log (`transparency`), Shared Signals (`ssf`),
//! rate limits and API keys; `revocations` is the one door through which a revocation enters
//! memory. `start` builds them and the tasks that keep an instance in step with its fleet;
//! `admin` and `grants` are the operator's rules.
#![forbid(unsafe_code)]

pub mod admin;
mod agents;
mod apikeys;
mod audit;
pub mod delegation;
pub mod domains;
mod dpop;
mod expiries;
pub mod grants;
pub mod identity_providers;
mod kept;
pub mod oauth;
mod once;
pub mod outbound;
pub mod ratelimit;
pub mod recorder;
mod registry;
mod revocations;
mod seals;
pub mod signed;
pub mod ssf;
mod start;
pub mod status;
pub mod transparency;
mod verifier;
mod verify;

use std::sync::Arc;
use std::time::Duration;

use agentid_core::domain::Millis;
use agentid_core::keys::{KeyRing, PublicKeys};
use agentid_store::{LogPage, LogQuery, SharedStore};

use agentid_core::domain::holding::NotCovered;
pub use agentid_store::StoreError;
pub use agents::{
    Agents, Binding, IssuedToken, Listing, Registration, CLIENT_SECRET_PREFIX, MAX_LISTING_BYTES,
};
pub use apikeys::{hash_key, Caller, KeyLookup};
pub use audit::{AuditError, GrownLedgers, WriterConfig};
pub use dpop::{Presented, ProofError};
pub use registry::{AgentEntry, Registry};
pub use verifier::VerifiedToken;
pub use verify::{Presentation, Render, ValidToken, Verification, Verify};

use apikeys::ApiKeys;
use audit::{AuditHandle, WriterThread};
use domains::Domains;
use ratelimit::RateLimits;
use ssf::Ssf;
use status::StatusLists;
use transparency::checkpointer::Transparency;
use verifier::TokenVerifier;

/// How long a successful store ping answers health checks.
pub(crate) const HEALTH_REUSE_MS: i64 = 1000;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("agent not found")]
    AgentNotFound,
    #[error("agent is revoked")]
    AgentRevoked,
    #[error("expiry_seconds exceeds the plan maximum of {max} seconds")]
    ExpiryTooLong { max: u64 },
    /// The agent's token would be longer than a verifier accepts (`MAX_TOKEN_LEN`).
    #[error("the token would be {len} bytes, over the {max}-byte limit of a token")]
    TokenTooLong { len: usize, max: usize },
    /// The organization may not issue under the issuer domain: it holds no name that covers
    /// it (`elsewhere`: another organization's holding does).
    #[error("the organization does not hold the issuer domain {domain}")]
    NotHeld { domain: String, elsewhere: bool },
    /// The organization's unpaged lists being sent on this instance hold
    /// [`MAX_LISTING_BYTES`] already.
    #[error(
        "the organization's unpaged agent lists being sent on this instance hold {max} bytes already: finish one, or page with ?limit"
    )]
    TooManyListings { max: usize },
    /// Other issue-token calls changed the agent's key binding between this one's read and
    /// its write, on each of its attempts.
    #[error(
        "the agent's key binding kept changing under this request (other issue-token calls); retry shortly"
    )]
    BindingContended,
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl EngineError {
    /// The refusal of `domain`, as the rules gave it.
    pub(crate) fn not_held(domain: &str, why: NotCovered) -> Self {
        EngineError::NotHeld {
            domain: domain.to_owned(),
            elsewhere: why == NotCovered::HeldElsewhere,
        }
    }
}

/// Why a verification got no answer, and so no record.
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    /// Its record could not be committed (fail closed: no answer without a record).
    #[error(transparent)]
    Unrecorded(#[from] AuditError),
    /// The agent the token names is not in memory (registered through another instance) and
    /// could not be read from the store, so the outcome cannot be told: not `TOKEN_INVALID`.
    #[error("the token's agent could not be read: {0}")]
    AgentUnreadable(#[source] StoreError),
}

#[derive(Debug, Clone)]
pub struct EngineConfig {
    pub writer: WriterConfig,
    /// Bytes of verified tokens (and their answers) remembered; 0 disables the cache.
    pub token_cache_bytes: u64,
    /// Bytes the registry's agents and cached revocation reasons may take (about); an agent
    /// registered past them is read from the store at each verification of its tokens.
    pub registry_bytes: u64,
    /// How often the registry pulls revocations committed by other instances.
    pub registry_resync: Duration,
    /// How long a resolved API key is trusted before the store is asked again.
    pub key_cache_ttl: Duration,
    /// How often the fleet's signing keys are read again (rotations, retirements).
    pub key_refresh: Duration,
    /// A ledger that grew gets a new checkpoint at most this often.
    pub checkpoint_interval: Duration,
    /// How far a DPoP proof's `iat` may be from now, either way.
    pub dpop_max_skew: Duration,
    /// The public host, which names the log key and every ledger's checkpoints.
    pub log_host: String,
    /// The public URL: status lists' `iss` and the base of their URIs.
    pub public_url: String,
    pub status: status::StatusConfig,
    pub ssf: ssf::SsfConfig,
    pub domains: domains::DomainConfig,
    pub oauth: oauth::OAuthConfig,
    pub signed: signed::SignedConfig,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            writer: WriterConfig::default(),
            token_cache_bytes: 64 << 20,
            registry_bytes: registry::REGISTRY_BYTES,
            // Status lists on every instance hold a revocation within 2 s of its commit.
            registry_resync: Duration::from_secs(1),
            key_cache_ttl: apikeys::KEY_CACHE_TTL,
            key_refresh: Duration::from_secs(5),
            checkpoint_interval: Duration::from_secs(10),
            dpop_max_skew: Duration::from_secs(60),
            log_host: "localhost".to_owned(),
            public_url: "http://localhost".to_owned(),
            status: status::StatusConfig::default(),
            ssf: ssf::SsfConfig::default(),
            domains: domains::DomainConfig::default(),
            oauth: oauth::OAuthConfig::default(),
            signed: signed::SignedConfig::default(),
        }
    }
}

/// The running engine: its use cases, and what they share.
pub struct Engine {
    verify: Verify,
    agents: Agents,
    oauth: oauth::OAuth,
    signed: signed::SignedRequests,
    domains: Domains,
    api_keys: ApiKeys,
    rate_limits: Arc<RateLimits>,
    transparency: Arc<Transparency>,
    status: Arc<StatusLists>,
    ssf: Arc<Ssf>,
    tokens: Arc<TokenVerifier>,
    registry: Arc<Registry>,
    audit: AuditHandle,
    store: SharedStore,
    keys: Arc<KeyRing>,
    /// Unix ms of the last successful store ping (health checks reuse it for a second).
    last_ping_ok: std::sync::atomic::AtomicI64,
    _audit_thread: WriterThread,
    _background: start::Background,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("store", &self.store.backend())
            .finish_non_exhaustive()
    }
}

impl Engine {
    /// Online verification.
    pub fn verify(&self) -> &Verify {
        &self.verify
    }

    /// The issuer's agents: register, read, list, issue tokens, revoke.
    pub fn agents(&self) -> &Agents {
        &self.agents
    }

    /// The identity providers organizations trust.
    pub fn identity_providers(&self) -> identity_providers::IdentityProviders {
        identity_providers::IdentityProviders {
            store: self.store.clone(),
            keys: self.keys.clone(),
        }
    }

    /// Signed requests (Web Bot Auth): directories and the online check.
    pub fn signed_requests(&self) -> &signed::SignedRequests {
        &self.signed
    }

    /// The OAuth 2 authorization server: agents get their own access tokens.
    pub fn oauth(&self) -> &oauth::OAuth {
        &self.oauth
    }

    /// Issuer domains: claims, proofs, holdings.
    pub fn domains(&self) -> &Domains {
        &self.domains
    }

    /// Checkpoints and proofs of the audit log.
    pub fn transparency(&self) -> &Transparency {
        &self.transparency
    }

    /// The Shared Signals transmitter.
    pub fn ssf(&self) -> &Ssf {
        &self.ssf
    }

    /// The status lists, as this instance serves them.
    pub fn status_lists(&self) -> &StatusLists {
        &self.status
    }

    pub fn rate_limits(&self) -> &RateLimits {
        &self.rate_limits
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    pub fn store(&self) -> &SharedStore {
        &self.store
    }

    /// The key file's key: the cursor MAC secret and the log key come from it.
    pub fn keys(&self) -> &KeyRing {
        &self.keys
    }

    /// The keys that validate tokens now (JWKS), and the signing key's (PEM).
    pub fn public_keys(&self) -> Arc<PublicKeys> {
        self.tokens.keys()
    }

    /// A page of a ledger's records, newest first (the caller's ledger: handlers build the
    /// query from the caller).
    pub async fn read_log(&self, q: LogQuery<'_>) -> Result<LogPage, StoreError> {
        self.store.read_log(q).await
    }

    /// Resolves a presented key; `ip` pays for store look-ups of keys the cache has not seen.
    pub async fn authenticate(&self, presented: &str, ip: std::net::IpAddr) -> Result<KeyLookup, StoreError> {
        self.api_keys
            .lookup(presented, || self.rate_limits.check_key_lookup(ip))
            .await
    }

    /// [`Engine::authenticate`] from what the cache holds (a valid key past its time is
    /// refreshed, free): a key it does not know is [`KeyLookup::Throttled`], looked up nowhere
    /// and charged to no one. For calls that count against nothing (`/health`).
    pub async fn authenticate_known(&self, presented: &str) -> Result<KeyLookup, StoreError> {
        self.api_keys
            .lookup(presented, || {
                ratelimit::decision(0, 0, std::time::Duration::ZERO, Some(std::time::Duration::ZERO))
            })
            .await
    }

    /// Whether the store answers. A success is trusted for one second, so a health check
    /// under load costs one database round trip per second, not one per call.
    pub async fn store_healthy(&self) -> bool {
        use std::sync::atomic::Ordering;
        let now = Millis::now().0;
        if now - self.last_ping_ok.load(Ordering::Relaxed) < HEALTH_REUSE_MS {
            return true;
        }
        let ok = matches!(
            tokio::time::timeout(Duration::from_secs(2), self.store.ping()).await,
            Ok(Ok(()))
        );
        if ok {
            self.last_ping_ok.store(now, Ordering::Relaxed);
        }
        ok
    }

    /// Waits for the audit writer to commit everything handed to it so far, and gives back
    /// the rate-limit cells this instance leased and did not use.
    pub async fn drain(&self) {
        self.audit.drain().await;
        self.rate_limits.give_back(true).await;
    }

    /// The instance's graceful stop, before its store closes: delivers no push stream more
    /// (a push under way ends within its timeout, and its stream is released), then
    /// [`Engine::drain`]. For good: the engine delivers nothing after it.
    pub async fn stop(&self) {
        self.ssf
            .stop(ssf::PUSH_TIMEOUT + std::time::Duration::from_secs(1))
            .await;
        self.drain().await;
    }

    /// Reads the fleet's signing keys now, as the periodic refresh does.
    pub async fn refresh_keys(&self) -> Result<(), StoreError> {
        start::refresh_keys(&self.agents.signing, &self.tokens, &self.store).await
    }
}

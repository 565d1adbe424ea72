//! The engine: everything between an HTTP handler and the store. It owns the in-memory
//! state (registry, revocation index, API-key cache), the verify path, and the audit writer.

#![forbid(unsafe_code)]

pub mod admin;
mod apikeys;
mod audit;
pub mod domains;
pub mod grants;
pub mod outbound;
pub mod ratelimit;
pub mod recorder;
pub mod registry;
pub mod ssf;
pub mod status;
pub mod transparency;
pub mod verifier;

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::transparency::checkpointer::{self, Grown, Transparency};
use agentid_core::domain::audit::{AuditEntry, AuditRecord};
use agentid_core::domain::{
    new_id, AgentFields, AgentId, IdPrefix, IssuerDomain, KeyMode, Ledger, Millis, RevokeReason, StatusPlace,
    VerifyResult,
};
use agentid_core::keys::{KeyRing, SigningKeys};
use agentid_core::token::{Claims, RejectReason};
use agentid_store::{AgentRecord, LogPage, LogQuery, OrgRecord, Placing, Revocations, SharedStore};

pub use agentid_store::StoreError;
pub use apikeys::{generate_key, hash_key, ApiKeys, Caller, KeyLookup};
use audit::WriterThread;
pub use audit::{AuditError, AuditHandle, WriterConfig};
pub use registry::{AgentEntry, Registry, Revoked};
pub use verifier::{CacheOutcome, CheckedToken};

use ratelimit::RateLimits;
use status::StatusLists;
use verifier::TokenVerifier;

/// How long a successful store ping answers health checks.
pub const HEALTH_REUSE_MS: i64 = 1000;

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
    #[error(transparent)]
    Store(#[from] StoreError),
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
    /// How often the registry pulls revocations committed by other instances.
    pub registry_resync: Duration,
    /// How long a resolved API key is trusted before the store is asked again.
    pub key_cache_ttl: Duration,
    /// How often the fleet's signing keys are read again (rotations, retirements).
    pub key_refresh: Duration,
    /// A ledger that grew gets a new checkpoint at most this often.
    pub checkpoint_interval: Duration,
    /// The public host, which names the log key and every ledger's checkpoints.
    pub log_host: String,
    /// The public URL: status lists' `iss` and the base of their URIs.
    pub public_url: String,
    pub status: status::StatusConfig,
    pub ssf: ssf::SsfConfig,
    pub domains: domains::DomainConfig,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            writer: WriterConfig::default(),
            token_cache_bytes: 64 << 20,
            // Status lists on every instance hold a revocation within 2 s of its commit.
            registry_resync: Duration::from_secs(1),
            key_cache_ttl: apikeys::KEY_CACHE_TTL,
            key_refresh: Duration::from_secs(5),
            checkpoint_interval: Duration::from_secs(10),
            log_host: "localhost".to_owned(),
            public_url: "http://localhost".to_owned(),
            status: status::StatusConfig::default(),
            ssf: ssf::SsfConfig::default(),
            domains: domains::DomainConfig::default(),
        }
    }
}

/// A freshly registered agent and its first token.
#[derive(Debug, Clone)]
pub struct Registration {
    pub agent: AgentRecord,
    pub token: String,
}

/// A newly issued token.
#[derive(Debug, Clone)]
pub struct IssuedToken {
    pub agent_id: String,
    pub token: String,
    pub expires_at: Millis,
}

/// The outcome of one online verification, after its audit record is committed.
#[derive(Debug, Clone)]
pub struct Verification {
    pub result: VerifyResult,
    /// Present exactly when `result` is `Valid`.
    pub valid: Option<ValidToken>,
    pub verified_at: Millis,
}

#[derive(Debug, Clone)]
pub struct ValidToken {
    pub token: Arc<CheckedToken>,
    pub agent: Arc<AgentEntry>,
}

/// What the checks concluded before the audit record was written.
struct Checked {
    ledger: Ledger,
    agent_id: String,
    result: VerifyResult,
    failure_reason: Option<String>,
    valid: Option<ValidToken>,
    /// `Registry::revocations_seen` as the check began.
    revocations_seen: i64,
}

/// The verify path's counters, registered once: `metrics::counter!` with labels looks the
/// series up (hashing its labels) on every call.
struct VerifyCounters {
    /// Indexed by `VerifyResult::index`.
    results: [metrics::Counter; 4],
    unrecorded: metrics::Counter,
    cache_hit: metrics::Counter,
    cache_miss: metrics::Counter,
}

impl VerifyCounters {
    fn register() -> Self {
        // Handles taken before the recorder is installed would count nowhere.
        crate::recorder::handle();
        let result =
            |r: VerifyResult| metrics::counter!("agentid_verify_results_total", "result" => r.as_str());
        let cache = |o: &'static str| metrics::counter!("agentid_token_cache_requests_total", "outcome" => o);
        VerifyCounters {
            // `ALL` is in `index` order.
            results: VerifyResult::ALL.map(result),
            unrecorded: metrics::counter!("agentid_verify_results_total", "result" => "unrecorded"),
            cache_hit: cache("hit"),
            cache_miss: cache("miss"),
        }
    }

    fn result(&self, r: VerifyResult) -> &metrics::Counter {
        &self.results[r.index()]
    }
}

pub struct Engine {
    counters: VerifyCounters,
    store: SharedStore,
    keys: Arc<KeyRing>,
    signing: Arc<SigningKeys>,
    registry: Arc<Registry>,
    verifier: Arc<TokenVerifier>,
    audit: AuditHandle,
    _audit_thread: WriterThread,
    api_keys: ApiKeys,
    rate_limits: Arc<RateLimits>,
    transparency: Arc<Transparency>,
    status: Arc<StatusLists>,
    ssf: Arc<ssf::Ssf>,
    domains: domains::Domains,
    /// Unix ms of the last successful store ping (health checks reuse it for a second).
    last_ping_ok: std::sync::atomic::AtomicI64,
    _background: Background,
}

/// The engine's periodic tasks (revocation resync, bucket eviction, gauges), stopped with it.
struct Background(Vec<tokio::task::JoinHandle<()>>);

impl Drop for Background {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

/// Follows the fleet's signing keys: rotations and retirements reach this instance within
/// `every`.
async fn follow_keys(
    signing: Arc<SigningKeys>,
    verifier: Arc<TokenVerifier>,
    store: SharedStore,
    every: Duration,
) {
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticks.tick().await;
    loop {
        ticks.tick().await;
        if let Err(e) = refresh_keys(&signing, &verifier, &store).await {
            tracing::warn!(error = %e, "cannot read the signing keys; keeping the ones in use");
        }
    }
}

async fn refresh_keys(
    signing: &SigningKeys,
    verifier: &TokenVerifier,
    store: &SharedStore,
) -> Result<(), StoreError> {
    let keys = store.signing_keys().await?;
    let refreshed = signing.update(&keys, Millis::now()).map_err(recorded_keys)?;
    report_unvouched(&refreshed.unvouched);
    if let Some(public) = refreshed.changed {
        tracing::info!(signing = public.current_kid(), "signing keys changed");
        verifier.set_keys(public);
    }
    Ok(())
}

/// Recorded signing keys the key file does not vouch for: written with database access
/// alone, or altered. They are ignored; each is an alarm, once per instance.
fn report_unvouched(unvouched: &[agentid_core::keys::Unvouched]) {
    for u in unvouched {
        tracing::error!(kid = %u.kid, why = u.why, "integrity alarm: a recorded signing key is ignored");
        metrics::counter!("agentid_integrity_failures_total", "what" => "signing_key").increment(1);
    }
}

/// Recorded keys that make no key set are stored values the service did not write.
fn recorded_keys(e: agentid_core::keys::KeyError) -> StoreError {
    StoreError::Corrupt(e.to_string())
}

/// Samples the gauges of the registry and of the store's pools, for as long as it runs.
async fn sample_gauges(registry: Arc<Registry>, store: SharedStore) {
    let mut ticks = tokio::time::interval(crate::recorder::SAMPLE_EVERY);
    loop {
        ticks.tick().await;
        metrics::gauge!("agentid_registry_agents").set(registry.agent_count() as f64);
        metrics::gauge!("agentid_revocation_index_size").set(registry.revoked_count() as f64);
        for p in store.pool_stats() {
            let gauge =
                |state| metrics::gauge!("agentid_store_connections", "pool" => p.pool, "state" => state);
            gauge("active").set(f64::from(p.open - p.idle.min(p.open)));
            gauge("idle").set(f64::from(p.idle));
            gauge("max").set(f64::from(p.max));
        }
    }
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("store", &self.store.backend())
            .finish_non_exhaustive()
    }
}

impl Engine {
    /// Loads the registry and revocation index from the store and starts the audit writer.
    /// Must run inside an actix system.
    pub async fn start(
        store: SharedStore,
        keys: Arc<KeyRing>,
        cfg: EngineConfig,
    ) -> Result<Engine, StoreError> {
        let registry = Arc::new(Registry::default());
        // Read before the agents are: every revocation up to this epoch is then in the scan
        // (`i64::MAX`: the epoch alone, no agent).
        let epoch = store.revocations_after(i64::MAX).await?.epoch;
        let mut after = String::new();
        let mut revoked_places = Vec::new();
        loop {
            let page = store.scan_agents(&after, 1000).await?;
            let Some(last) = page.last() else { break };
            after = last.id.clone();
            for a in &page {
                registry.learn(a);
                if let (Some(place), Some(at)) = (&a.status, a.revoked_at) {
                    revoked_places.push((place.clone(), at));
                }
            }
        }
        registry.caught_up(&Revocations {
            epoch,
            ..Revocations::default()
        });
        tracing::info!(
            agents = registry.agent_count(),
            revoked = registry.revoked_count(),
            "registry loaded"
        );
        let (signing, unvouched) =
            SigningKeys::new(keys.clone(), &store.signing_keys().await?, Millis::now())
                .map_err(recorded_keys)?;
        report_unvouched(&unvouched);
        let signing = Arc::new(signing);
        let verifier = Arc::new(TokenVerifier::new(
            signing.current().public().clone(),
            cfg.token_cache_bytes,
        ));
        let status = Arc::new(StatusLists::new(
            cfg.status.clone(),
            &cfg.public_url,
            signing.clone(),
        ));
        for (id, size) in store.status_lists().await? {
            status.learn_list(&id, size);
        }
        for (place, at) in &revoked_places {
            status.revoke(place, *at);
        }
        status.publish();
        let ssf = Arc::new(ssf::Ssf::new(
            store.clone(),
            signing.clone(),
            &cfg.public_url,
            cfg.ssf.clone(),
        ));
        let grown = Arc::new(Grown::default());
        let (audit, audit_thread) = AuditHandle::start(store.clone(), cfg.writer, grown.clone());
        let rate_limits = Arc::new(RateLimits::new(&store));
        let transparency = Arc::new(Transparency::new(
            store.clone(),
            keys.log_key(&checkpointer::log_key_name(&cfg.log_host)),
            &cfg.log_host,
            cfg.checkpoint_interval,
            grown,
        ));
        let background = Background(vec![
            tokio::spawn(registry::resync(
                registry.clone(),
                status.clone(),
                store.clone(),
                cfg.registry_resync,
            )),
            tokio::spawn(status::publisher(status.clone())),
            tokio::spawn(ssf::deliverer(ssf.clone())),
            tokio::spawn(ratelimit::upkeep(rate_limits.clone())),
            tokio::spawn(sample_gauges(registry.clone(), store.clone())),
            tokio::spawn(transparency.clone().run()),
            tokio::spawn(follow_keys(
                signing.clone(),
                verifier.clone(),
                store.clone(),
                cfg.key_refresh,
            )),
        ]);
        if cfg.domains.policy == domains::IssuerPolicy::Open {
            tracing::warn!(
                "issuer domains are open: any organization may issue under any name, and a token's \
                 issuer proves nothing (for single-tenant and development deployments only)"
            );
        }
        let domains = domains::Domains::new(store.clone(), keys.clone(), cfg.domains.clone());
        Ok(Engine {
            domains,
            counters: VerifyCounters::register(),
            last_ping_ok: std::sync::atomic::AtomicI64::new(0),
            rate_limits,
            transparency,
            status,
            ssf,
            _background: background,
            api_keys: ApiKeys::new(store.clone(), cfg.key_cache_ttl),
            verifier,
            store,
            keys,
            signing,
            registry,
            audit,
            _audit_thread: audit_thread,
        })
    }

    pub fn store(&self) -> &SharedStore {
        &self.store
    }

    /// How a new place is drawn: at random (herd privacy), in the newest list of the mode
    /// while half of it is free.
    fn placing(&self, mode: KeyMode) -> Placing {
        let cfg = self.status.config();
        Placing {
            mode,
            new_list: new_id(IdPrefix::StatusList),
            size: cfg.size,
            fill: cfg.fill(),
            draws: (0..64).map(|_| rand::random::<u64>()).collect(),
        }
    }

    /// The Shared Signals transmitter.
    pub fn ssf(&self) -> &ssf::Ssf {
        &self.ssf
    }

    /// The status lists, as this instance serves them.
    pub fn status_lists(&self) -> &StatusLists {
        &self.status
    }

    /// The key file's key: the cursor MAC secret and the log key come from it.
    pub fn keys(&self) -> &KeyRing {
        &self.keys
    }

    /// The keys that validate tokens now (JWKS), and the signing key's (PEM).
    pub fn public_keys(&self) -> Arc<agentid_core::keys::PublicKeys> {
        self.verifier.keys()
    }

    /// Reads the fleet's signing keys now, as the periodic refresh does (tests).
    #[cfg(feature = "test-hooks")]
    pub async fn refresh_keys(&self) -> Result<(), StoreError> {
        refresh_keys(&self.signing, &self.verifier, &self.store).await
    }

    /// Checkpoints and proofs of the audit log.
    pub fn transparency(&self) -> &Transparency {
        &self.transparency
    }

    /// A valid token's answer was rendered for the first time: the token is cached with it
    /// (or its entry, cached before it had one, is weighed again).
    pub fn answer_rendered(&self, token: &str, checked: &Arc<verifier::CheckedToken>) {
        self.verifier.remember(token, checked);
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
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

    pub fn rate_limits(&self) -> &RateLimits {
        &self.rate_limits
    }

    /// Resolves a presented key; `ip` pays for store look-ups of keys the cache has not seen.
    pub async fn authenticate(&self, presented: &str, ip: std::net::IpAddr) -> Result<KeyLookup, StoreError> {
        self.api_keys
            .lookup(presented, || self.rate_limits.check_key_lookup(ip))
            .await
    }

    /// Waits for the audit writer to commit everything handed to it so far, and gives back
    /// the rate-limit cells this instance leased and did not use.
    pub async fn drain(&self) {
        self.audit.drain().await;
        self.rate_limits.give_back(true).await;
    }

    /// The audit writer's next flush panics (its batch is answered 503, the writer goes on).
    #[cfg(feature = "test-hooks")]
    pub fn inject_audit_panic(&self) {
        self.audit.inject_flush_panic();
    }

    /// An agent the registry does not hold, read from the store and learned.
    async fn agent_from_store(&self, id: &str) -> Result<Option<Arc<AgentEntry>>, StoreError> {
        Ok(self.store.get_agent(id).await?.map(|a| self.registry.learn(&a)))
    }

    /// A revocation the audit transaction saw but the index did not hold (another instance
    /// revoked the agent): its reason is read from the store.
    async fn learn_revocation(&self, id: &str) {
        let agent = self.store.get_agent(id).await.ok().flatten();
        self.registry
            .mark_revoked(id, agent.and_then(|a| a.revocation_reason));
    }

    pub async fn register(&self, caller: &Caller, fields: AgentFields) -> Result<Registration, EngineError> {
        check_expiry(&caller.org, fields.expiry.get())?;
        let now = Millis::now();
        let issued = Millis::from_secs(now.as_secs());
        let id = AgentId::generate();
        let agent = AgentRecord {
            id: id.as_str().to_owned(),
            org_id: caller.org.id.clone(),
            mode: caller.mode,
            name: fields.name.as_str().to_owned(),
            issuer_domain: fields.issuer_domain.as_str().to_owned(),
            description: fields.description.as_str().to_owned(),
            scopes: fields.scopes.into_vec(),
            created_at: now,
            issued_at: issued,
            expires_at: issued.plus_secs(fields.expiry.get() as i64),
            revoked_at: None,
            revocation_reason: None,
            status: None,
            verification_count: 0,
        };
        // An agent whose token no verifier would accept is not registered: a token with the
        // longest place and URI a list can give is signed first.
        let longest = StatusPlace {
            list: new_id(IdPrefix::StatusList),
            idx: u64::MAX,
        };
        self.sign(
            &AgentRecord {
                status: Some(longest),
                ..agent.clone()
            },
            agent.issued_at,
            agent.expires_at,
        )
        .await?;
        let (place, size) = self
            .store
            .insert_agent_placed(&agent, &self.placing(caller.mode), self.domains.issuer_check())
            .await?;
        self.status.learn_list(&place.list, size);
        let agent = AgentRecord {
            status: Some(place),
            ..agent
        };
        let token = self.sign(&agent, agent.issued_at, agent.expires_at).await?;
        self.registry.learn(&agent);
        Ok(Registration { agent, token })
    }

    /// The caller's agent, or `AgentNotFound` (also for other organizations' and modes' agents).
    pub async fn agent(&self, caller: &Caller, id: &str) -> Result<AgentRecord, EngineError> {
        if AgentId::parse(id).is_none() {
            return Err(EngineError::AgentNotFound);
        }
        match self.store.get_agent(id).await? {
            Some(a) if a.org_id == caller.org.id && a.mode == caller.mode => Ok(a),
            _ => Err(EngineError::AgentNotFound),
        }
    }

    /// Succeeds when the agent exists and belongs to the caller's organization and mode.
    pub async fn ensure_owned(&self, caller: &Caller, id: &str) -> Result<(), EngineError> {
        let Some(entry) = self.find_agent(id).await? else {
            return Err(EngineError::AgentNotFound);
        };
        if entry.org_id == caller.org.id && entry.mode == caller.mode {
            Ok(())
        } else {
            Err(EngineError::AgentNotFound)
        }
    }

    /// A page of a ledger's records, newest first (the caller's ledger: handlers build the
    /// query from the caller).
    pub async fn read_log(&self, q: LogQuery<'_>) -> Result<LogPage, StoreError> {
        self.store.read_log(q).await
    }

    /// The caller's agents, newest first: after the agent `before` when given, up to `limit`
    /// when given.
    pub async fn list_agents(
        &self,
        caller: &Caller,
        before: Option<&str>,
        limit: Option<u32>,
    ) -> Result<Vec<AgentRecord>, EngineError> {
        Ok(self
            .store
            .list_agents(&caller.org.id, caller.mode, before, limit)
            .await?)
    }

    /// Issues a new token. Allowed for expired agents (they become active again), refused
    /// for revoked ones. Earlier tokens stay valid until their own expiry.
    pub async fn issue_token(&self, caller: &Caller, id: &str) -> Result<IssuedToken, EngineError> {
        let mut agent = self.agent(caller, id).await?;
        if agent.revoked_at.is_some() {
            return Err(EngineError::AgentRevoked);
        }
        if agent.status.is_none() {
            // Registered before status lists: its tokens from now on carry a place too.
            let (place, size) = self
                .store
                .place_agent(&agent.id, &self.placing(agent.mode))
                .await?
                .ok_or(EngineError::AgentNotFound)?;
            self.status.learn_list(&place.list, size);
            agent.status = Some(place);
        }
        let lifetime = (agent.expires_at.0 - agent.issued_at.0).max(1000) / 1000;
        let lifetime = lifetime.min(caller.org.limits.max_expiry_seconds as i64);
        let issued = Millis::from_secs(Millis::now().as_secs());
        let expires = issued.plus_secs(lifetime);
        let token = self.sign(&agent, issued, expires).await?;
        if !self
            .store
            .renew_token(&agent.id, issued, expires, self.domains.issuer_check())
            .await?
        {
            return Err(EngineError::AgentRevoked);
        }
        Ok(IssuedToken {
            agent_id: agent.id,
            token,
            expires_at: expires,
        })
    }

    /// Revokes for good: commit to the store, then the in-memory index, then answer.
    /// A second revoke returns what the first one stored.
    pub async fn revoke(
        &self,
        caller: &Caller,
        id: &str,
        reason: Option<RevokeReason>,
    ) -> Result<(AgentRecord, Millis), EngineError> {
        let agent = self.agent(caller, id).await?;
        let (stored, epoch) = self
            .store
            .revoke_agent(
                &agent.id,
                Millis::now(),
                reason.as_ref().map(RevokeReason::as_str),
            )
            .await?
            .ok_or(EngineError::AgentNotFound)?;
        let at = stored.revoked_at.ok_or_else(|| {
            StoreError::Corrupt(format!("revoked agent {} has no revocation time", stored.id))
        })?;
        self.revoked(std::slice::from_ref(&(stored.clone(), epoch)));
        Ok((stored, at))
    }

    /// Revocations this instance committed, into memory: the revocation index, the status
    /// lists, and a wake of the Shared Signals deliverer (the events were queued in the
    /// revocations' transaction).
    fn revoked(&self, revoked: &[(AgentRecord, Option<i64>)]) {
        for (agent, epoch) in revoked {
            self.registry
                .revoked(&agent.id, agent.revocation_reason.clone(), *epoch);
            if let (Some(place), Some(at)) = (&agent.status, agent.revoked_at) {
                self.status.revoke(place, at);
            }
        }
        if !revoked.is_empty() {
            self.ssf.wake();
        }
    }

    /// Issuer domains: claims, proofs, holdings.
    pub fn domains(&self) -> &domains::Domains {
        &self.domains
    }

    /// Proves the caller's claim of a name. When the name changes hands, the agents of other
    /// organizations under it are revoked, here at once (in memory too) and on other
    /// instances by their next check.
    pub async fn verify_domain(
        &self,
        caller: &Caller,
        name: &IssuerDomain,
    ) -> Result<domains::DomainView, domains::DomainError> {
        let (view, held) = self.domains.verify(&caller.org.id, name).await?;
        if let Some(held) = held {
            if !held.revoked.is_empty() {
                tracing::info!(
                    domain = %name.as_str(),
                    org_id = %caller.org.id,
                    revoked = held.revoked.len(),
                    "issuer domain changed hands; the former holders' agents under it are revoked"
                );
            }
            self.revoked(&held.revoked);
        }
        Ok(view)
    }

    /// The agent's token, if it fits what verifiers accept (`MAX_TOKEN_LEN`: a token travels in
    /// a URL path, and proxies commonly refuse request lines past 8 KiB).
    /// The signing key notes the token's expiry, so that it stays in the key set at least
    /// until then after a rotation.
    async fn sign(
        &self,
        agent: &AgentRecord,
        issued: Millis,
        expires: Millis,
    ) -> Result<String, EngineError> {
        let (token, kid) = self.signing.sign(&Claims {
            iss: agent.issuer_domain.clone(),
            sub: agent.id.clone(),
            jti: new_id(IdPrefix::Request)[4..].to_owned(),
            iat: issued.as_secs(),
            exp: expires.as_secs(),
            scopes: agent.scopes.clone(),
            status: agent.status.as_ref().map(|p| self.status.claim(p)),
            livemode: (agent.mode == KeyMode::Test).then_some(false),
        });
        if token.len() > agentid_core::token::MAX_TOKEN_LEN {
            return Err(EngineError::TokenTooLong {
                len: token.len(),
                max: agentid_core::token::MAX_TOKEN_LEN,
            });
        }
        self.store.note_token_expiry(&kid, expires).await?;
        Ok(token)
    }

    /// Online verification: form, key, signature, agent, revocation, expiry; then the
    /// audit record is committed, and only then is the outcome returned.
    pub async fn verify(&self, token: &str, received: Instant) -> Result<Verification, VerifyError> {
        let now = Millis::now();
        let checked = match self.check(token, now).await {
            Ok(c) => c,
            Err(e) => {
                self.counters.unrecorded.increment(1);
                return Err(VerifyError::AgentUnreadable(e));
            }
        };
        let entry = AuditEntry {
            ledger: checked.ledger,
            agent_id: checked.agent_id,
            result: checked.result,
            failure_reason: checked.failure_reason,
            latency_us: received.elapsed().as_micros() as i64,
            requested_at: now,
            revocations_seen: checked.revocations_seen,
        };
        let record: AuditRecord = match self.audit.append(entry).await {
            Ok(r) => r,
            Err(e) => {
                self.counters.unrecorded.increment(1);
                return Err(e.into());
            }
        };
        self.counters.result(record.result).increment(1);
        if record.result == VerifyResult::Revoked && checked.result == VerifyResult::Valid {
            // Another instance revoked the agent; the store told us inside the audit transaction.
            // Boxed, as every rare branch of this path is: each request's future is as large as
            // its largest await, and a hot verify's is moved into its task and touched again
            // when its batch commits.
            Box::pin(self.learn_revocation(&record.agent_id)).await;
        }
        Ok(Verification {
            result: record.result,
            valid: checked.valid.filter(|_| record.result == VerifyResult::Valid),
            verified_at: now,
        })
    }

    /// The outcome of the checks, or the store's error when the agent had to be read from
    /// it and could not be.
    async fn check(&self, token: &str, now: Millis) -> Result<Checked, StoreError> {
        // Before the revocation index is read (see `Registry::revocations_seen`).
        let revocations_seen = self.registry.revocations_seen();
        let raw = token;
        let (checked, cache) = self.verifier.check(raw);
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
                return Ok(self.invalid(sub, owner, rej.reason, revocations_seen));
            }
        };
        let claims = &token.claims;
        let Some(agent) = self.find_agent(&claims.sub).await? else {
            return Ok(self.invalid(None, None, RejectReason::UnknownAgent, revocations_seen));
        };
        let ledger = Ledger {
            org_id: agent.org_id.clone(),
            mode: agent.mode,
        };
        let (result, failure_reason) = if let Some(rev) = self.registry.revocation(&claims.sub) {
            (
                VerifyResult::Revoked,
                Some(agentid_core::domain::audit::revoked_failure_reason(
                    rev.reason.as_deref(),
                )),
            )
        } else if Millis::from_secs(claims.exp) <= now {
            (
                VerifyResult::Expired,
                Some(format!(
                    "token expired at {}",
                    Millis::from_secs(claims.exp).to_rfc3339()
                )),
            )
        } else {
            (VerifyResult::Valid, None)
        };
        if cache == CacheOutcome::Miss && result != VerifyResult::Valid {
            // No answer to render: cached now (a valid one is, once rendered, by the caller).
            self.verifier.remember(raw, &token);
        }
        let agent_id = claims.sub.clone();
        Ok(Checked {
            ledger,
            agent_id,
            result,
            failure_reason,
            valid: (result == VerifyResult::Valid).then(|| ValidToken { token, agent }),
            revocations_seen,
        })
    }

    /// An invalid token is recorded in the ledger of the agent it names (`sub`, well formed)
    /// when that agent exists (`owner`: its owner sees forgery attempts), otherwise in the
    /// service's own ledger.
    fn invalid(
        &self,
        sub: Option<String>,
        owner: Option<Arc<AgentEntry>>,
        reason: RejectReason,
        revocations_seen: i64,
    ) -> Checked {
        let ledger = owner.map_or_else(Ledger::service, |a| Ledger {
            org_id: a.org_id.clone(),
            mode: a.mode,
        });
        let agent_id = sub.unwrap_or_default();
        Checked {
            ledger,
            agent_id,
            result: VerifyResult::Invalid,
            failure_reason: Some(reason.describe().to_owned()),
            valid: None,
            revocations_seen,
        }
    }

    /// The agent with this id: from the registry, else (registered through another
    /// instance) from the store, learned on the way.
    async fn find_agent(&self, id: &str) -> Result<Option<Arc<AgentEntry>>, StoreError> {
        match self.registry.agent(id) {
            Some(a) => Ok(Some(a)),
            // Boxed: a rare await on the verify path (see `verify`).
            None => Box::pin(self.agent_from_store(id)).await,
        }
    }
}

fn check_expiry(org: &OrgRecord, requested: u64) -> Result<(), EngineError> {
    let max = org.limits.max_expiry_seconds;
    if requested > max {
        return Err(EngineError::ExpiryTooLong { max });
    }
    Ok(())
}

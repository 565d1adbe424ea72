//! Starting the engine: the registry and every revocation loaded from the store, the key set
//! in force, the status lists, the use cases built on them, and the tasks that keep this
//! instance in step with the fleet (the revocation resync, key refresh, status-list
//! publisher, Shared Signals deliverer, rate-limit upkeep, checkpointer, gauges).

use std::sync::Arc;
use std::time::Duration;

use agentid_core::domain::Millis;
use agentid_core::keys::{KeyError, KeyRing, SigningKeys, Unvouched};
use agentid_store::{SharedStore, StoreError};

use crate::agents::Agents;
use crate::apikeys::ApiKeys;
use crate::audit::AuditHandle;
use crate::audit::GrownLedgers;
use crate::domains::moves::Mover;
use crate::domains::{Domains, IssuerCheck, IssuerPolicy};
use crate::dpop::{ProofCheck, MAX_REMEMBERED_PROOFS};
use crate::expiries::NotedExpiries;
use crate::oauth::OAuth;
use crate::once::Spent;
use crate::outbound::Outbound;
use crate::ratelimit::{self, RateLimits};
use crate::registry::Registry;
use crate::revocations::{self, Revocations};
use crate::signed;
use crate::ssf::{self, Ssf};
use crate::status::{self, StatusLists};
use crate::transparency::checkpointer::Transparency;
use crate::transparency::DomainListWatch;
use crate::verifier::TokenVerifier;
use crate::verify::Verify;
use crate::{Engine, EngineConfig};

/// The engine's periodic tasks, stopped with it.
pub(crate) struct Background(Vec<tokio::task::JoinHandle<()>>);

impl Drop for Background {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

impl Engine {
    /// Loads the registry and every revocation from the store, builds the use cases and
    /// starts the audit writer and the background tasks. Must run inside an actix system.
    /// Every connection to an address a caller gave goes through `outbound`.
    pub async fn start(
        store: SharedStore,
        keys: Arc<KeyRing>,
        cfg: EngineConfig,
        outbound: Outbound,
    ) -> Result<Engine, StoreError> {
        let outbound = Arc::new(outbound);
        crate::seals::seal_unsealed(&store, &keys).await?;
        let (signing, unvouched) =
            SigningKeys::new(keys.clone(), &store.signing_keys().await?, Millis::now())
                .map_err(recorded_keys)?;
        report_unvouched(&unvouched);
        let signing = Arc::new(signing);
        let status = Arc::new(StatusLists::new(
            cfg.status.clone(),
            &cfg.public_url,
            signing.clone(),
        ));
        for (id, size) in store.status_lists().await? {
            status.learn_list(&id, size);
        }
        let ssf = Arc::new(Ssf::new(
            store.clone(),
            signing.clone(),
            &cfg.public_url,
            cfg.ssf.clone(),
            outbound.clone(),
        ));
        let registry = Arc::new(Registry::new(cfg.registry_bytes));
        let revocations = Arc::new(Revocations::new(registry.clone(), status.clone(), ssf.clone()));
        load_agents(&store, &registry, &revocations).await?;
        status.publish();
        let tokens = Arc::new(TokenVerifier::new(
            signing.current().public().clone(),
            cfg.token_cache_bytes,
        ));
        let grown = Arc::new(GrownLedgers::default());
        let (audit, audit_thread) =
            AuditHandle::start(store.clone(), cfg.writer, grown.clone(), keys.clone());
        let rate_limits = Arc::new(RateLimits::new(&store));
        let domain_list = Arc::new(DomainListWatch::default());
        let transparency = Arc::new(
            Transparency::new(
                store.clone(),
                keys.clone(),
                &cfg.log_host,
                cfg.checkpoint_interval,
                grown,
            )
            .watching_domains(audit.clone(), domain_list.clone()),
        );
        let mover = Arc::new(Mover::new(store.clone(), revocations.clone()));
        let background = Background(vec![
            tokio::spawn(mover.clone().run()),
            tokio::spawn(revocations::resync(
                revocations.clone(),
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
                tokens.clone(),
                store.clone(),
                cfg.key_refresh,
            )),
        ]);
        if cfg.domains.policy == IssuerPolicy::Open {
            tracing::warn!(
                "issuer domains are open: any organization may issue under any name, and a token's \
                 issuer proves nothing (for single-tenant and development deployments only)"
            );
        }
        let issuers = IssuerCheck::new(cfg.domains.policy, keys.clone());
        let expiries = Arc::new(NotedExpiries::default());
        let spent = Arc::new(Spent::new(store.clone()));
        Ok(Engine {
            verify: Verify::new(
                store.clone(),
                registry.clone(),
                tokens.clone(),
                audit.clone(),
                revocations.clone(),
                ProofCheck::new(cfg.dpop_max_skew.as_secs() as i64, MAX_REMEMBERED_PROOFS),
                keys.clone(),
            ),
            oauth: OAuth::new(
                store.clone(),
                registry.clone(),
                revocations.clone(),
                signing.clone(),
                status.clone(),
                audit.clone(),
                issuers.clone(),
                expiries.clone(),
                tokens.clone(),
                outbound.clone(),
                keys.clone(),
                rate_limits.clone(),
                spent.clone(),
                &cfg.public_url,
                &cfg.oauth,
                cfg.dpop_max_skew.as_secs() as i64,
            ),
            signed: signed::SignedRequests::new(
                store.clone(),
                registry.clone(),
                audit.clone(),
                &cfg.public_url,
                cfg.dpop_max_skew.as_secs() as i64,
                outbound.clone(),
                &cfg.signed,
                issuers.clone(),
                spent,
                keys.clone(),
            ),
            agents: Agents {
                keys: keys.clone(),
                store: store.clone(),
                listings: Arc::default(),
                signing: signing.clone(),
                registry: registry.clone(),
                status: status.clone(),
                revocations: revocations.clone(),
                issuers,
                expiries,
            },
            domains: Domains::new(
                store.clone(),
                keys.clone(),
                cfg.domains.clone(),
                mover,
                domain_list,
                outbound,
            ),
            api_keys: ApiKeys::new(store.clone(), keys.clone(), cfg.key_cache_ttl),
            last_ping_ok: std::sync::atomic::AtomicI64::new(0),
            rate_limits,
            transparency,
            status,
            ssf,
            tokens,
            registry,
            audit,
            store,
            keys,
            _audit_thread: audit_thread,
            _background: background,
        })
    }
}

/// Every agent into the registry, and every revocation into memory (`Revocations`). The
/// epoch is read first: every revocation up to it is then in the scan.
async fn load_agents(
    store: &SharedStore,
    registry: &Registry,
    revocations: &Revocations,
) -> Result<(), StoreError> {
    // `i64::MAX`: the epoch alone, no agent.
    let epoch = store.revocations_after(i64::MAX).await?.epoch;
    let mut after = String::new();
    loop {
        let page = store.scan_agents(&after, 1000).await?;
        let Some(last) = page.last() else { break };
        after = last.id.as_str().to_owned();
        for a in &page {
            registry.learn(a);
            revocations.learn(a);
        }
    }
    registry.reach_epoch(epoch);
    tracing::info!(
        agents = registry.agent_count(),
        revoked = registry.revoked_count(),
        "registry loaded"
    );
    Ok(())
}

/// Follows the fleet's signing keys: rotations and retirements reach this instance within
/// `every`.
async fn follow_keys(
    signing: Arc<SigningKeys>,
    tokens: Arc<TokenVerifier>,
    store: SharedStore,
    every: Duration,
) {
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticks.tick().await;
    loop {
        ticks.tick().await;
        if let Err(e) = refresh_keys(&signing, &tokens, &store).await {
            tracing::warn!(error = %e, "cannot read the signing keys; keeping the ones in use");
        }
    }
}

pub async fn refresh_keys(
    signing: &SigningKeys,
    tokens: &TokenVerifier,
    store: &SharedStore,
) -> Result<(), StoreError> {
    let keys = store.signing_keys().await?;
    let refreshed = signing.update(&keys, Millis::now()).map_err(recorded_keys)?;
    report_unvouched(&refreshed.unvouched);
    if let Some(public) = refreshed.changed {
        tracing::info!(signing = public.current_kid(), "signing keys changed");
        tokens.set_keys(public);
    }
    Ok(())
}

/// Recorded signing keys the key file does not vouch for: written with database access
/// alone, or altered. They are ignored; each is an alarm, once per instance.
fn report_unvouched(unvouched: &[Unvouched]) {
    for u in unvouched {
        tracing::error!(kid = %u.kid, why = u.why, "integrity alarm: a recorded signing key is ignored");
        metrics::counter!("agentid_integrity_failures_total", "what" => "signing_key").increment(1);
    }
}

/// Recorded keys that make no key set are stored values the service did not write.
fn recorded_keys(e: KeyError) -> StoreError {
    StoreError::Corrupt(e.to_string())
}

/// Samples the gauges of the registry and of the store's pools, for as long as it runs.
async fn sample_gauges(registry: Arc<Registry>, store: SharedStore) {
    let mut ticks = tokio::time::interval(crate::recorder::SAMPLE_EVERY);
    loop {
        ticks.tick().await;
        metrics::gauge!("agentid_registry_agents").set(registry.agent_count() as f64);
        metrics::gauge!("agentid_registry_bytes").set(registry.agent_bytes() as f64);
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

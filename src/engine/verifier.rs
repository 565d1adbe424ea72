//! Signature checking for the verify path: the verified-token cache, and the verifier actor
//! pool that takes signature work off the HTTP workers when it is configured.
//!
//! Strategies (chosen by measurement, see load/README.md), each falling back to `verify_strict`
//! for tokens of other keys and on any mismatch: `recompute-s` (the default) recomputes the
//! `S` half of the current key's signature for the token's own `R` and compares in constant
//! time (two hashes and a scalar multiply-add; it and `verify_strict` can disagree only on
//! tokens made with the private key, see `KeyRing::s_matches`); `resign` recomputes the whole
//! deterministic signature (exactly `verify_strict`'s answers, about half its cost); `strict`
//! is plain `verify_strict`; `batch` gathers the pool's concurrent jobs into one
//! `verify_batch` (made exact, see `KeyRing::verify_batch`).

use std::sync::{Arc, OnceLock};

use actix::prelude::*;
use tokio::sync::oneshot;

use crate::token::{self, Claims, KeyRing, RejectReason, Rejected, Unverified};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum VerifyStrategy {
    RecomputeS,
    Resign,
    Strict,
    Batch,
}

#[derive(Debug, Clone)]
pub struct VerifierConfig {
    /// Verifier actor threads; 0 checks signatures on the HTTP worker itself.
    pub threads: usize,
    pub strategy: VerifyStrategy,
    /// Most jobs one verifier actor takes at once (the batch size for `batch`).
    pub max_batch: usize,
    /// Verified tokens remembered; 0 disables the cache.
    pub cache_capacity: usize,
}

impl Default for VerifierConfig {
    fn default() -> Self {
        VerifierConfig {
            threads: 0,
            strategy: VerifyStrategy::RecomputeS,
            max_batch: 64,
            cache_capacity: 65_536,
        }
    }
}

/// Token string → a token whose signature has been checked. Keyed by the whole token, so
/// two different strings never share an entry; expiry and revocation are not cached (they
/// are checked on every call).
type TokenCache = quick_cache::sync::Cache<Box<str>, Arc<CheckedToken>>;

/// The claims of a token whose signature checked out, and what its answers can reuse.
#[derive(Debug)]
pub struct CheckedToken {
    pub claims: Claims,
    /// The part of the token's valid answer that never changes, rendered by the HTTP layer
    /// on the first valid answer: it is made of the claims and the agent's registry entry,
    /// and an entry never changes once the registry has it.
    valid_answer: OnceLock<Box<str>>,
}

impl CheckedToken {
    pub fn new(claims: Claims) -> Self {
        CheckedToken {
            claims,
            valid_answer: OnceLock::new(),
        }
    }

    /// The rendered fixed part of the valid answer, rendering it with `render` the first time.
    pub fn valid_answer(&self, render: impl FnOnce() -> String) -> &str {
        self.valid_answer.get_or_init(|| render().into_boxed_str())
    }
}

/// Whether a check was answered from the cache (for metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheOutcome {
    Hit,
    Miss,
    Disabled,
}

pub struct TokenVerifier {
    keys: Arc<KeyRing>,
    strategy: VerifyStrategy,
    cache: Option<TokenCache>,
    pool: Option<Pool>,
}

impl TokenVerifier {
    /// Starts the pool's actors when `threads > 0` (must run inside an actix system).
    pub fn new(keys: Arc<KeyRing>, cfg: &VerifierConfig) -> Self {
        let cache = (cfg.cache_capacity > 0).then(|| TokenCache::new(cfg.cache_capacity));
        let pool = (cfg.threads > 0).then(|| Pool::start(keys.clone(), cfg));
        TokenVerifier {
            keys,
            strategy: cfg.strategy,
            cache,
            pool,
        }
    }

    /// A token with a valid signature from a known key, as the cache keeps it.
    pub async fn check(&self, token: &str) -> (Result<Arc<CheckedToken>, Rejected>, CacheOutcome) {
        let outcome = match &self.cache {
            Some(cache) => match cache.get(token) {
                Some(checked) => return (Ok(checked), CacheOutcome::Hit),
                None => CacheOutcome::Miss,
            },
            None => CacheOutcome::Disabled,
        };
        // Boxed: the decoded claims held across the pool's answer would otherwise make every
        // verify's future larger, hits included. One allocation beside a signature check.
        (Box::pin(self.check_signature(token)).await, outcome)
    }

    /// Decode and signature check, on the pool when there is one; caches what passes.
    async fn check_signature(&self, token: &str) -> Result<Arc<CheckedToken>, Rejected> {
        let unverified = token::decode(token)?;
        let checked = match &self.pool {
            Some(pool) => match pool.check(token).await {
                Some(r) => r,
                // The pool did not answer (it is stopping): check here instead.
                None => check_one(&self.keys, self.strategy, &unverified),
            },
            None => check_one(&self.keys, self.strategy, &unverified),
        };
        match checked {
            Ok(()) => {
                let checked = Arc::new(CheckedToken::new(unverified.claims));
                if let Some(cache) = &self.cache {
                    cache.insert(token.into(), checked.clone());
                }
                Ok(checked)
            }
            Err(reason) => Err(Rejected {
                reason,
                sub: Some(unverified.claims.sub),
            }),
        }
    }
}

fn check_one(keys: &KeyRing, strategy: VerifyStrategy, u: &Unverified<'_>) -> Result<(), RejectReason> {
    match strategy {
        VerifyStrategy::RecomputeS => keys.verify(u),
        VerifyStrategy::Resign => keys.verify_resigning(u),
        VerifyStrategy::Strict | VerifyStrategy::Batch => keys.verify_strict(u),
    }
}

struct Job {
    token: String,
    reply: oneshot::Sender<Result<(), RejectReason>>,
}

/// Jobs wait in a crossbeam queue; a `Wake` tells one verifier actor to drain up to
/// `max_batch` of them. A wake that finds the queue empty costs nothing.
struct Pool {
    jobs: crossbeam_channel::Sender<Job>,
    addr: Addr<VerifierActor>,
}

impl Pool {
    fn start(keys: Arc<KeyRing>, cfg: &VerifierConfig) -> Pool {
        let (tx, rx) = crossbeam_channel::unbounded();
        let (strategy, max_batch) = (cfg.strategy, cfg.max_batch.max(1));
        let addr = SyncArbiter::start(cfg.threads, move || VerifierActor {
            keys: keys.clone(),
            jobs: rx.clone(),
            strategy,
            max_batch,
        });
        Pool { jobs: tx, addr }
    }

    async fn check(&self, token: &str) -> Option<Result<(), RejectReason>> {
        let (reply, answer) = oneshot::channel();
        self.jobs
            .send(Job {
                token: token.to_owned(),
                reply,
            })
            .ok()?;
        self.addr.do_send(Wake);
        answer.await.ok()
    }
}

#[derive(Message)]
#[rtype(result = "()")]
struct Wake;

struct VerifierActor {
    keys: Arc<KeyRing>,
    jobs: crossbeam_channel::Receiver<Job>,
    strategy: VerifyStrategy,
    max_batch: usize,
}

impl Actor for VerifierActor {
    type Context = SyncContext<Self>;
}

impl Handler<Wake> for VerifierActor {
    type Result = ();

    fn handle(&mut self, _: Wake, _: &mut SyncContext<Self>) {
        let jobs: Vec<Job> = self.jobs.try_iter().take(self.max_batch).collect();
        if jobs.is_empty() {
            return;
        }
        let decoded: Vec<Option<Unverified<'_>>> =
            jobs.iter().map(|j| token::decode(&j.token).ok()).collect();
        let results: Vec<Result<(), RejectReason>> = match self.strategy {
            VerifyStrategy::Batch => {
                let refs: Vec<&Unverified<'_>> = decoded.iter().flatten().collect();
                let mut batch = self.keys.verify_batch(&refs).into_iter();
                decoded
                    .iter()
                    .map(|d| match d {
                        Some(_) => batch.next().unwrap_or(Err(RejectReason::BadSignature)),
                        None => Err(RejectReason::Malformed),
                    })
                    .collect()
            }
            strategy => decoded
                .iter()
                .map(|d| match d {
                    Some(u) => check_one(&self.keys, strategy, u),
                    None => Err(RejectReason::Malformed),
                })
                .collect(),
        };
        drop(decoded);
        for (job, result) in jobs.into_iter().zip(results) {
            let _ = job.reply.send(result);
        }
    }
}

//! Token Status Lists (draft-ietf-oauth-status-list), served from memory.
//!
//! Every agent registered gets a place, drawn at random among the free places of the newest
//! list (`AgentStore::insert_agent_placed`), and keeps it for all its tokens (the `status`
//! claim). Each instance holds every list's bits; a revocation sets its agent's bit: this
//! instance's at once, another instance's when the registry's resync reads it. A task signs
//! each changed list again (with the key that signs tokens) at most every `PUBLISH_EVERY`,
//! and every list at least every half `ttl`, so a served list is never older than that and
//! never carries a key that left JWKS. A request reads the signed list from memory.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};
use sha2::{Digest, Sha256};

use agentid_core::domain::{Millis, StatusBits, StatusPlace};
use agentid_core::keys::SigningKeys;
use agentid_core::token::{Status, StatusListRef};

/// How often changed lists are signed again.
pub(crate) const PUBLISH_EVERY: Duration = Duration::from_millis(100);
/// The media type of a signed list.
pub(crate) const MEDIA_TYPE: &str = "statuslist+jwt";

#[derive(Debug, Clone)]
pub struct StatusConfig {
    /// Places of a new list.
    pub size: u64,
    /// How long receivers may cache a list (its `ttl` claim and `max-age`).
    pub ttl: Duration,
}

impl Default for StatusConfig {
    fn default() -> Self {
        StatusConfig {
            size: 1 << 20,
            ttl: Duration::from_secs(60),
        }
    }
}

impl StatusConfig {
    /// Bounds of `--status-list-size`: whole bytes, and at most 16 Mi places (2 MiB).
    pub const MIN_SIZE: u64 = agentid_core::domain::MIN_LIST_SIZE;
    pub const MAX_SIZE: u64 = agentid_core::domain::MAX_LIST_SIZE;
}

/// A signed list as it is served.
#[derive(Debug)]
pub struct Served {
    pub jwt: String,
    pub etag: String,
    kid: String,
    signed: Instant,
    /// The list's `exp`, in seconds.
    exp: i64,
}

impl Served {
    /// How long a cache may keep this list from `now`: `ttl`, or what is left of its life
    /// when that is less (whole seconds, rounded down).
    pub fn max_age(&self, ttl: Duration, now: Millis) -> u64 {
        let left = self.exp.saturating_mul(1000).saturating_sub(now.0).max(0) / 1000;
        ttl.as_secs().min(left as u64)
    }
}

struct List {
    bits: StatusBits,
    /// When each revocation not yet in a served list was committed (for the delay metric).
    pending: Vec<Millis>,
    dirty: bool,
    served: Option<Arc<Served>>,
}

/// Every status list this instance knows, and their signed forms.
pub struct StatusLists {
    cfg: StatusConfig,
    /// The public URL: the lists' `iss`, and the base of their `uri`.
    base: String,
    signing: Arc<SigningKeys>,
    lists: RwLock<HashMap<String, Mutex<List>>>,
    /// Revocations in lists this instance does not know yet (another instance made them).
    waiting: Mutex<Vec<(StatusPlace, Millis)>>,
}

impl StatusLists {
    pub(crate) fn new(cfg: StatusConfig, base: &str, signing: Arc<SigningKeys>) -> Self {
        StatusLists {
            cfg,
            base: base.trim_end_matches('/').to_owned(),
            signing,
            lists: RwLock::default(),
            waiting: Mutex::default(),
        }
    }

    pub fn config(&self) -> &StatusConfig {
        &self.cfg
    }

    /// The URI of a list.
    pub(crate) fn uri(&self, list: &str) -> String {
        format!("{}/v1/status/{list}", self.base)
    }

    /// The `status` claim of a token of an agent at `place`.
    pub fn claim(&self, place: &StatusPlace) -> Status {
        Status {
            status_list: StatusListRef {
                idx: place.idx,
                uri: self.uri(place.list.as_str()),
            },
        }
    }

    /// Learns a list of `size` places and signs it (known already: nothing changes).
    pub(crate) fn learn_list(&self, id: &str, size: u64) {
        if self.lists.read().contains_key(id) {
            return;
        }
        if !(StatusConfig::MIN_SIZE..=StatusConfig::MAX_SIZE).contains(&size) {
            // No list the service makes: a row written into the database, whose bits would
            // be this instance's memory. No agent's place is in it (places never move).
            crate::transparency::alarm(
                "status_list",
                &format!("status list {id} of {size} places, which no list of the service has; not held"),
            );
            return;
        }
        self.lists.write().entry(id.to_owned()).or_insert_with(|| {
            Mutex::new(List {
                bits: StatusBits::new(size),
                pending: Vec::new(),
                dirty: true,
                served: None,
            })
        });
        let waiting: Vec<_> = std::mem::take(&mut *self.waiting.lock());
        for (place, at) in waiting {
            self.revoke(&place, at);
        }
        // Served from now on: a token naming it may be checked at once.
        self.publish();
    }

    /// Sets the bit of a revoked agent's place (`at`: when the revocation was committed).
    pub fn revoke(&self, place: &StatusPlace, at: Millis) {
        let lists = self.lists.read();
        match lists.get(place.list.as_str()) {
            Some(list) => {
                let mut list = list.lock();
                if !list.bits.is_revoked(place.idx) && list.bits.revoke(place.idx) {
                    list.pending.push(at);
                    list.dirty = true;
                }
            }
            None => self.waiting.lock().push((place.clone(), at)),
        }
    }

    /// The signed list `id`, if this instance knows it and has signed it.
    pub fn get(&self, id: &str) -> Option<Arc<Served>> {
        self.lists.read().get(id).and_then(|l| l.lock().served.clone())
    }

    /// Signs again every list that changed, whose signature is half a `ttl` old, or that was
    /// signed with a key no longer the active one.
    pub fn publish(&self) {
        let kid = self.signing.signing_kid();
        let lists = self.lists.read();
        for (id, list) in lists.iter() {
            let mut list = list.lock();
            let stale = list
                .served
                .as_ref()
                .is_none_or(|s| s.kid != kid || s.signed.elapsed() >= self.cfg.ttl / 2);
            if !(list.dirty || stale) {
                continue;
            }
            let served = self.sign(id, &list.bits);
            list.served = Some(Arc::new(served));
            list.dirty = false;
            let now = Millis::now();
            for at in list.pending.drain(..) {
                metrics::histogram!("agentid_status_list_publish_delay_seconds")
                    .record((now.0 - at.0).max(0) as f64 / 1000.0);
            }
        }
    }

    fn sign(&self, id: &str, bits: &StatusBits) -> Served {
        let iat = Millis::now().as_secs();
        let ttl = self.cfg.ttl.as_secs().max(1);
        let exp = iat + 2 * ttl as i64;
        let claims = serde_json::json!({
            "iss": self.base,
            "sub": self.uri(id),
            "iat": iat,
            // Twice the ttl: a list is signed again every half ttl, so what a receiver holds
            // lives at least as long as it may keep it.
            "exp": exp,
            "ttl": ttl,
            "status_list": {"bits": 1, "lst": bits.lst()},
        });
        let (jwt, kid) = self.signing.sign_json(MEDIA_TYPE, &claims);
        let etag = format!(
            "\"{}\"",
            agentid_core::domain::hex(&Sha256::digest(jwt.as_bytes())[..16])
        );
        Served {
            jwt,
            etag,
            kid,
            signed: Instant::now(),
            exp,
        }
    }
}

/// Signs changed lists again, every `PUBLISH_EVERY`, for as long as it runs. Compressing a
/// large list takes tens of milliseconds (1,048,576 places, 10 % revoked: ~40 ms), so it runs
/// off the async threads, and a pass that took long makes the next wait four times as long:
/// under a storm of revocations publishing takes at most a fifth of a core.
pub(crate) async fn publisher(lists: Arc<StatusLists>) {
    loop {
        let pass = lists.clone();
        let took = tokio::task::spawn_blocking(move || {
            let started = Instant::now();
            pass.publish();
            started.elapsed()
        })
        .await
        .unwrap_or_default();
        tokio::time::sleep(PUBLISH_EVERY.max(took * 4)).await;
    }
}

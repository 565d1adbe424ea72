//! API keys: generation, hashing, and a short-lived cache of what a presented key resolves to,
//! so that authenticated calls do not each cost a database round trip.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::distributions::{Alphanumeric, DistString};
use sha2::{Digest, Sha256};

use agentid_core::domain::org::{key_prefix, parse_key_prefix};
use agentid_core::domain::{new_id, IdPrefix};
use agentid_core::domain::{ApiKeyKind, KeyMode, Millis, OrgId};
use agentid_core::keys::{KeyRing, Sealed};
use agentid_core::records::api_key_canonical;

use crate::seals::{key_vouched, org_vouched};
use agentid_store::{NewApiKey, OrgRecord, SharedStore, StoreError};

/// How long a resolved key is trusted before the store is asked again (the default of
/// `EngineConfig::key_cache_ttl`); bounds how late a disabled key or a changed plan is noticed.
pub(crate) const KEY_CACHE_TTL: Duration = Duration::from_secs(10);
const KEY_CACHE_CAPACITY: usize = 10_000;

/// Who is calling, as resolved from a valid key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub org: OrgRecord,
    pub mode: KeyMode,
    pub kind: ApiKeyKind,
}

/// The result of looking up a presented key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyLookup {
    Valid(Arc<Caller>),
    /// Malformed, unknown or disabled: all the same to the caller (401).
    Rejected,
    /// Not in the cache, and the caller's address may not have more keys looked up now.
    Throttled(crate::ratelimit::Decision),
}

/// SHA-256 of the whole key (an API key, or an agent's client secret, as stored). Each carries
/// ≥ 160 random bits, so a fast hash is the right one.
pub fn hash_key(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

/// How often a key's use is written down (`last_used_at`): at most once a minute a key.
const NOTE_USE_EVERY: Millis = Millis(60_000);

/// A new random key (`sk_live_` + 40 alphanumerics, about 238 bits) and its stored form, with
/// an id (`key_` + a ULID), the name its holder gave it, and the key file's seal.
pub fn generate_key(
    keys: &KeyRing,
    org_id: &OrgId,
    kind: ApiKeyKind,
    mode: KeyMode,
    name: Option<&str>,
) -> (String, NewApiKey) {
    let secret = Alphanumeric.sample_string(&mut rand::rngs::OsRng, 40);
    let key = format!("{}{secret}", key_prefix(kind, mode));
    let hint = format!("{}…{}", key_prefix(kind, mode), &secret[secret.len() - 4..]);
    let key_hash = hash_key(&key);
    let stored = NewApiKey {
        id: new_id(IdPrefix::ApiKey),
        name: name.map(str::to_owned),
        key_hash,
        mac: keys.seal(Sealed::ApiKey, &api_key_canonical(&key_hash, org_id, kind, mode)),
        org_id: org_id.clone(),
        kind,
        mode,
        hint,
        created_at: Millis::now(),
    };
    (key, stored)
}

pub(crate) struct ApiKeys {
    store: SharedStore,
    keys: Arc<KeyRing>,
    cache: quick_cache::sync::Cache<[u8; 32], (Instant, KeyLookup)>,
    ttl: Duration,
}

impl ApiKeys {
    pub fn new(store: SharedStore, keys: Arc<KeyRing>, ttl: Duration) -> Self {
        ApiKeys {
            store,
            keys,
            cache: quick_cache::sync::Cache::new(KEY_CACHE_CAPACITY),
            ttl,
        }
    }

    /// What the key resolves to. A key the cache does not know costs a store look-up, which
    /// `may_load` must allow first; refreshing a key the cache held is not charged. Callers
    /// presenting the same key at once share one look-up: the first holds the cache slot's
    /// guard, the others wait for what it finds (without this, every connection of a busy
    /// receiver missed together when the entry expired, and the unknown-key budget answered
    /// some of them 429).
    pub(crate) async fn lookup(
        &self,
        presented: &str,
        may_load: impl FnOnce() -> crate::ratelimit::Decision,
    ) -> Result<KeyLookup, StoreError> {
        let Some((kind, mode)) = parse_key_prefix(presented) else {
            return Ok(KeyLookup::Rejected);
        };
        if presented.len() > 128 || !presented.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            return Ok(KeyLookup::Rejected);
        }
        let hash = hash_key(presented);
        let mut expired = None;
        let guard = loop {
            match self.cache.get_value_or_guard_async(&hash).await {
                Ok((at, found)) if at.elapsed() < self.ttl => return Ok(found),
                // Expired: drop it, so that one caller refreshes it while the others wait.
                // Only a key that was valid is refreshed free: looking a rejected key up
                // again is charged like any unknown key, or a caller could cycle through
                // rejected keys at one store read each per expiry.
                Ok((at, found)) => {
                    if matches!(found, KeyLookup::Valid(_)) {
                        expired = Some((at, found));
                    }
                    self.cache.remove(&hash);
                }
                Err(guard) => break guard,
            }
        };
        if expired.is_none() {
            let allowed = may_load();
            if !allowed.allowed {
                metrics::counter!("agentid_api_key_lookups_total", "outcome" => "throttled").increment(1);
                return Ok(KeyLookup::Throttled(allowed));
            }
        }
        // The entry's lifetime counts from the question, not the answer: a slow read must not
        // stretch how long a key disabled meanwhile keeps working.
        let asked = Instant::now();
        let stored = match self.store.find_key(&hash).await {
            Ok(stored) => stored,
            Err(e) => {
                // A refresh the store could not answer (an outage) leaves the key known, its
                // entry still expired: the next call refreshes it again, free, and answers
                // for the outage instead of being charged as an unknown key's look-up.
                if let Some(entry) = expired {
                    let _ = guard.insert(entry);
                }
                return Err(e);
            }
        };
        let found = match stored {
            Some(s)
                if !s.disabled
                    && s.kind == kind
                    && s.mode == mode
                    && key_vouched(&self.keys, &hash, &s)
                    && org_vouched(&self.keys, &s.org) =>
            {
                self.note_use(hash, s.last_used_at);
                KeyLookup::Valid(Arc::new(Caller {
                    org: s.org,
                    mode,
                    kind,
                }))
            }
            _ => KeyLookup::Rejected,
        };
        let outcome = if matches!(found, KeyLookup::Valid(_)) {
            "found"
        } else {
            "rejected"
        };
        metrics::counter!("agentid_api_key_lookups_total", "outcome" => outcome).increment(1);
        let _ = guard.insert((asked, found.clone()));
        Ok(found)
    }

    /// Writes down that a valid key was used, when it was last written down a minute ago or
    /// more: off the request's path (a key in use is looked up again every cache lifetime), and
    /// a failure costs only the note.
    fn note_use(&self, hash: [u8; 32], last: Option<Millis>) {
        let now = Millis::now();
        if last.is_some_and(|l| now.0 - l.0 < NOTE_USE_EVERY.0) {
            return;
        }
        let store = self.store.clone();
        tokio::spawn(async move {
            if let Err(e) = store.note_key_used(&hash, now, NOTE_USE_EVERY).await {
                tracing::debug!(error = %e, "the key's last use was not noted");
            }
        });
    }
}

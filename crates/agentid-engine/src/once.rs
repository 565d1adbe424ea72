//! One-time credentials (a client assertion, an ID-JAG, a signed request's nonce): what the
//! store remembers a used one by, fleet-wide, and for how long.

use std::sync::atomic::{AtomicI64, Ordering};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use sha2::{Digest, Sha256};

use agentid_core::domain::Millis;
use agentid_store::{SharedStore, StoreError};

/// The store's memory of spent credentials, kept until each expires. Whichever path spends
/// one deletes the rows past their expiry first, at most once a second per instance: every
/// kind of credential bounds the table, whichever kinds a deployment sees.
pub(crate) struct Spent {
    store: SharedStore,
    /// When this instance last deleted expired rows (Unix ms).
    last_pruned: AtomicI64,
}

impl Spent {
    pub(crate) fn new(store: SharedStore) -> Self {
        Spent {
            store,
            last_pruned: AtomicI64::new(0),
        }
    }

    /// Remembers `key` until `expires`: false when it was spent already.
    pub(crate) async fn spend(&self, key: &str, expires: Millis, now: Millis) -> Result<bool, StoreError> {
        self.forget_expired(now).await;
        self.store.use_assertion(key, expires).await
    }

    async fn forget_expired(&self, now: Millis) {
        let last = self.last_pruned.load(Ordering::Relaxed);
        if now.0 - last < 1000
            || self
                .last_pruned
                .compare_exchange(last, now.0, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        // A minute after: another instance, whose clock may run behind this one's, still
        // refuses a replay until its own clock passes the expiry (each is refused by its
        // `exp` anyway: the rows only bound the table).
        if let Err(e) = self.store.forget_assertions(now.plus_secs(-60)).await {
            tracing::warn!(error = %e, "cannot delete expired one-time credentials; trying again later");
        }
    }
}

/// The SHA-256 of `parts`, each ended by a zero byte, in base64url.
pub(crate) fn used_key(parts: &[&str]) -> String {
    let mut key = Sha256::new();
    for part in parts {
        key.update(part.as_bytes());
        key.update([0]);
    }
    URL_SAFE_NO_PAD.encode(key.finalize())
}

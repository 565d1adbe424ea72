//! The latest token expiry each signing key was noted with in the store (so that a rotated
//! key stays in the key set until its last token expires), as this instance noted it: a new
//! token whose expiry is already covered costs no write. Expiries are noted rounded up to
//! the minute, so a stream of tokens writes about once a minute per key, not once a token.

use std::collections::HashMap;

use parking_lot::Mutex;

use agentid_core::domain::Millis;
use agentid_store::{SharedStore, StoreError};

const MINUTE_MS: i64 = 60_000;

#[derive(Default)]
pub(crate) struct NotedExpiries {
    /// Signing key id → the expiry this instance last noted for it. The fleet's keys are few.
    noted: Mutex<HashMap<String, Millis>>,
}

impl NotedExpiries {
    /// Makes sure the store keeps `kid` until at least `expires`.
    pub(crate) async fn note(
        &self,
        store: &SharedStore,
        kid: &str,
        expires: Millis,
    ) -> Result<(), StoreError> {
        let at = Millis(expires.0.saturating_add(MINUTE_MS - 1) / MINUTE_MS * MINUTE_MS);
        if self.noted.lock().get(kid).is_some_and(|n| n.0 >= at.0) {
            return Ok(());
        }
        store.note_token_expiry(kid, at).await?;
        let mut noted = self.noted.lock();
        let held = noted.entry(kid.to_owned()).or_insert(at);
        held.0 = held.0.max(at.0);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expiries_round_up_to_the_minute() {
        let round = |ms: i64| (ms + MINUTE_MS - 1) / MINUTE_MS * MINUTE_MS;
        assert_eq!(round(60_000), 60_000);
        assert_eq!(round(60_001), 120_000);
        assert_eq!(round(1), 60_000);
    }
}

//! Signature checking for the verify path, and the verified-token cache in front of it.
//! A token is decoded strictly and its signature checked with the public key its `kid`
//! names (`PublicKeys::verify`, RFC 8032 strict verification): the verify path holds no
//! secret, and accepts exactly what offline validators accept. A token that passes is
//! cached under its whole string, so a hot token costs one look-up.

use std::sync::{Arc, OnceLock};

use crate::token::{self, Claims, PublicKeys, Rejected};

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
    keys: Arc<PublicKeys>,
    cache: Option<TokenCache>,
}

impl TokenVerifier {
    /// `cache_capacity` verified tokens are remembered; 0 disables the cache.
    pub fn new(keys: Arc<PublicKeys>, cache_capacity: usize) -> Self {
        TokenVerifier {
            keys,
            cache: (cache_capacity > 0).then(|| TokenCache::new(cache_capacity)),
        }
    }

    /// A token with a valid signature from a known key, as the cache keeps it.
    pub fn check(&self, token: &str) -> (Result<Arc<CheckedToken>, Rejected>, CacheOutcome) {
        let outcome = match &self.cache {
            Some(cache) => match cache.get(token) {
                Some(checked) => return (Ok(checked), CacheOutcome::Hit),
                None => CacheOutcome::Miss,
            },
            None => CacheOutcome::Disabled,
        };
        (self.check_signature(token), outcome)
    }

    /// Decode and signature check; caches what passes.
    fn check_signature(&self, token: &str) -> Result<Arc<CheckedToken>, Rejected> {
        let unverified = token::decode(token)?;
        if let Err(reason) = self.keys.verify(&unverified) {
            return Err(Rejected {
                reason,
                sub: Some(unverified.claims.sub),
            });
        }
        let checked = Arc::new(CheckedToken::new(unverified.claims));
        if let Some(cache) = &self.cache {
            cache.insert(token.into(), checked.clone());
        }
        Ok(checked)
    }
}

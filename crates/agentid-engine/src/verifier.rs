//! Signature checking for the verify path, and the verified-token cache in front of it.
//! A token is decoded strictly and its signature checked with the public key its `kid`
//! names (`PublicKeys::verify`, RFC 8032 strict verification): the verify path holds no
//! secret, and accepts exactly what offline validators accept. A token that passes is
//! cached under its whole string once its answer is known (`TokenVerifier::remember`: one
//! insert a token, with the rendered answer when it is valid), so a hot token costs one
//! look-up.

use std::sync::{Arc, OnceLock};

use agentid_core::keys::PublicKeys;
use agentid_core::token::{self, Claims, Rejected};

/// Token string → a token whose signature has been checked. Keyed by the whole token, so
/// two different strings never share an entry; expiry and revocation are not cached (they
/// are checked on every call). Bounded by bytes, not entries: a token may be 4 KiB and its
/// answer as much again, so a count of entries bounds nothing useful.
type TokenCache = quick_cache::sync::Cache<Box<str>, Entry, TokenWeight>;

/// A cached token and the weight it was inserted with: the weight must stay what it was
/// while the entry is in the cache, even once the shared token gains its rendered answer.
#[derive(Clone)]
struct Entry {
    checked: Arc<VerifiedToken>,
    weight: u64,
}

impl Entry {
    fn new(token: &str, checked: Arc<VerifiedToken>) -> Self {
        Entry {
            weight: weight(token, &checked),
            checked,
        }
    }
}

/// What an entry costs beside its strings: the key's and the value's allocations and the
/// cache's own bookkeeping (measured order of magnitude, rounded up).
const ENTRY_OVERHEAD: u64 = 256;

/// The bytes an entry holds: the token, the claims' strings, and the rendered answer if
/// there is one (an entry that gains one is inserted again, see `TokenVerifier::remember`).
fn weight(token: &str, checked: &VerifiedToken) -> u64 {
    let c = &checked.claims;
    let access = c.client_id.as_ref().map_or(0, String::len)
        + c.scope.as_ref().map_or(0, String::len)
        + c.issuer_domain.as_ref().map_or(0, String::len)
        + c.aud
            .as_ref()
            .map_or(0, |a| a.values().iter().map(|r| r.len() + 24).sum());
    let delegation = c.sub_id.as_ref().map_or(0, |s| s.iss.len() + s.sub.len() + 48)
        + c.act.as_ref().map_or(0, |a| {
            a.chain()
                .iter()
                .map(|x| x.sub.len() + x.issuer_domain.len() + 64)
                .sum()
        });
    let claims = c.iss.len()
        + c.sub.len()
        + delegation
        + c.jti.len()
        + c.scopes.iter().map(|s| s.len() + 24).sum::<usize>()
        + access;
    let answer = checked.valid_answer.get().map_or(0, |a| a.len());
    (token.len() + claims + answer) as u64 + ENTRY_OVERHEAD
}

#[derive(Debug, Clone, Copy)]
struct TokenWeight;

impl quick_cache::Weighter<Box<str>, Entry> for TokenWeight {
    fn weight(&self, _: &Box<str>, entry: &Entry) -> u64 {
        entry.weight
    }
}

/// The claims of a token whose signature checked out, and what its answers can reuse.
#[derive(Debug)]
pub struct VerifiedToken {
    pub claims: Claims,
    /// The part of the token's valid answer that never changes, rendered by the HTTP layer
    /// on the first valid answer: it is made of the claims and the agent's registry entry,
    /// and an entry never changes once the registry has it.
    valid_answer: OnceLock<Box<str>>,
    /// The key set generation its signature was checked with (see `TokenVerifier::remember`).
    keys_generation: u64,
}

impl VerifiedToken {
    /// Claims checked with the first key set (tests and benchmarks build them).
    pub fn new(claims: Claims) -> Self {
        VerifiedToken::checked_in(claims, 0)
    }

    fn checked_in(claims: Claims, keys_generation: u64) -> Self {
        VerifiedToken {
            claims,
            valid_answer: OnceLock::new(),
            keys_generation,
        }
    }

    /// The rendered fixed part of the valid answer, rendering it with `render` the first time
    /// (the HTTP layer renders it; the cache counts its bytes).
    pub fn valid_answer(&self, render: impl FnOnce() -> String) -> &str {
        self.valid_answer.get_or_init(|| render().into_boxed_str())
    }

    /// Whether the valid answer has been rendered.
    pub(crate) fn has_answer(&self) -> bool {
        self.valid_answer.get().is_some()
    }
}

/// Whether a check was answered from the cache (for metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CacheOutcome {
    Hit,
    Miss,
    Disabled,
}

pub(crate) struct TokenVerifier {
    /// Replaced when the fleet's keys change (a rotation, a retirement), with a generation
    /// that counts the replacements.
    keys: parking_lot::RwLock<(Arc<PublicKeys>, u64)>,
    cache: Option<TokenCache>,
}

impl TokenVerifier {
    /// Verified tokens are remembered up to `cache_bytes` (tokens, claims and answers); 0
    /// disables the cache.
    pub fn new(keys: Arc<PublicKeys>, cache_bytes: u64) -> Self {
        TokenVerifier {
            keys: parking_lot::RwLock::new((keys, 0)),
            cache: (cache_bytes > 0).then(|| {
                // A typical entry (a ~330-byte token and its answer) weighs about 1 KiB.
                let items = usize::try_from(cache_bytes / 1024).unwrap_or(usize::MAX).max(16);
                TokenCache::with_weighter(items, cache_bytes, TokenWeight)
            }),
        }
    }

    /// Validates with `keys` from now on. Every cached token is forgotten: one signed by a key
    /// that left the set must not verify from the cache. The cache is cleared under the write
    /// lock that also moves the generation on, and `remember` inserts under the read lock
    /// only a token checked in the generation it reads: so no token checked with the old keys
    /// can be inserted after the clear.
    pub(crate) fn set_keys(&self, keys: Arc<PublicKeys>) {
        let mut current = self.keys.write();
        *current = (keys, current.1 + 1);
        if let Some(cache) = &self.cache {
            cache.clear();
        }
    }

    /// The keys that validate tokens now.
    pub fn keys(&self) -> Arc<PublicKeys> {
        self.keys.read().0.clone()
    }

    /// Caches a checked token, once its answer is known: for a valid one, once the answer is
    /// rendered, so that a miss inserts once, with the weight the entry keeps. Called again
    /// for a cached entry that has just gained its answer, it weighs the entry again. Nothing
    /// is inserted if the key set changed since the check.
    pub(crate) fn remember(&self, token: &str, checked: &Arc<VerifiedToken>) {
        let Some(cache) = &self.cache else { return };
        let keys = self.keys.read();
        if keys.1 == checked.keys_generation {
            cache.insert(token.into(), Entry::new(token, checked.clone()));
        }
    }

    /// The bytes the cache holds now (its entries' weights).
    #[cfg(test)]
    pub(crate) fn cached_bytes(&self) -> u64 {
        self.cache.as_ref().map_or(0, |c| c.weight())
    }

    /// A token with a valid signature from a known key, as the cache keeps it.
    pub fn check(&self, token: &str) -> (Result<Arc<VerifiedToken>, Rejected>, CacheOutcome) {
        let outcome = match &self.cache {
            Some(cache) => match cache.get(token) {
                Some(entry) => return (Ok(entry.checked), CacheOutcome::Hit),
                None => CacheOutcome::Miss,
            },
            None => CacheOutcome::Disabled,
        };
        (self.check_signature(token), outcome)
    }

    /// Decode and signature check (the caller remembers what passes).
    fn check_signature(&self, token: &str) -> Result<Arc<VerifiedToken>, Rejected> {
        let unverified = token::decode(token)?;
        let keys = self.keys.read();
        let generation = keys.1;
        if let Err(reason) = keys.0.verify(&unverified) {
            return Err(Rejected {
                reason,
                sub: Some(unverified.claims.agent_id().to_owned()),
            });
        }
        Ok(Arc::new(VerifiedToken::checked_in(unverified.claims, generation)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentid_core::keys::KeyRing;

    fn claims(sub: &str) -> Claims {
        Claims::agent("example.com", sub, "j", 1, i64::MAX / 2, vec!["read:x".into()])
    }

    /// A retirement that reaches the instance while a check of the retired key's token is
    /// between its signature check and its cache insert: the insert writes nothing, and the
    /// next check refuses the token.
    #[test]
    fn a_key_set_change_during_a_check_leaves_no_stale_entry() {
        let old = KeyRing::from_signing_key(ed25519_dalek::SigningKey::from_bytes(&[5; 32]));
        let new = KeyRing::from_signing_key(ed25519_dalek::SigningKey::from_bytes(&[6; 32]));
        let v = TokenVerifier::new(old.public().clone(), 1 << 20);
        let token = old.sign(&claims("agt_1"));
        let checked = v.check(&token).0.expect("checked with the keys of its start");
        v.set_keys(new.public().clone());
        v.remember(&token, &checked);
        assert_eq!(
            v.cached_bytes(),
            0,
            "the retired key's token was cached after the clear"
        );
        let (again, outcome) = v.check(&token);
        assert!(again.is_err(), "answered from the cache: {outcome:?}");
    }

    /// A check inserts nothing: a token is answered from the cache once it is remembered
    /// (its answer known), and remembering it again after a key set change does nothing.
    #[test]
    fn a_token_is_cached_when_remembered_and_only_in_its_key_generation() {
        let ring = KeyRing::from_signing_key(ed25519_dalek::SigningKey::from_bytes(&[5; 32]));
        let v = TokenVerifier::new(ring.public().clone(), 1 << 20);
        let token = ring.sign(&claims("agt_1"));
        let (first, outcome) = v.check(&token);
        assert_eq!(outcome, CacheOutcome::Miss);
        assert_eq!(
            v.check(&token).1,
            CacheOutcome::Miss,
            "a check alone cached the token"
        );
        let first = first.unwrap();
        first.valid_answer(|| "{\"valid\":true,".into());
        v.remember(&token, &first);
        let (hit, outcome) = v.check(&token);
        assert_eq!(outcome, CacheOutcome::Hit);
        assert!(Arc::ptr_eq(&hit.unwrap(), &first) && first.has_answer());

        v.set_keys(ring.public().clone());
        assert_eq!(v.cached_bytes(), 0);
        v.remember(&token, &first);
        assert_eq!(
            v.check(&token).1,
            CacheOutcome::Miss,
            "checked with the previous key set"
        );
    }

    /// The cache holds at most its bytes, however large the tokens: tokens near the 4 KiB
    /// cap with rendered answers fill it by bytes, not by count.
    #[test]
    fn the_cache_is_bounded_by_bytes() {
        let ring = KeyRing::from_signing_key(ed25519_dalek::SigningKey::from_bytes(&[5; 32]));
        let cap = 256 * 1024;
        let v = TokenVerifier::new(ring.public().clone(), cap);
        for i in 0..400 {
            let token = ring.sign(&Claims::agent(
                "example.com",
                &format!("agt_{i}"),
                &format!("{i}"),
                1,
                i64::MAX / 2,
                (0..20).map(|j| format!("s{j}:{}", "x".repeat(120))).collect(),
            ));
            assert!(token.len() > 3000 && token.len() <= agentid_core::token::MAX_TOKEN_LEN);
            let (checked, _) = v.check(&token);
            let checked = checked.unwrap();
            checked.valid_answer(|| "a".repeat(3000));
            v.remember(&token, &checked);
            assert!(v.cached_bytes() <= cap, "{} > {cap}", v.cached_bytes());
        }
        // Full, by bytes: some 40 entries of ~9 KB, not 400.
        assert!(v.cached_bytes() > cap / 2, "{}", v.cached_bytes());
    }
}

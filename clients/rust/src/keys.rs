//! The service's keys: its JWKS, cached for as long as it says, refreshed behind the caller,
//! fetched for an unknown kid at most once per interval.

use std::collections::HashMap;
use std::time::Instant;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use ed25519_dalek::VerifyingKey;
use serde_json::Value;

use crate::error::{invalid, unavailable};
use crate::transport::cache_for;
use crate::{Error, State, Verifier};

/// The Ed25519 keys of a JWKS, by `kid`; `UNAVAILABLE` when it is not one.
fn read_jwks(body: &[u8]) -> Result<HashMap<String, VerifyingKey>, Error> {
    let unusable = |why: &str| unavailable(format!("the service's JWKS is unusable: {why}"));
    let doc: Value = serde_json::from_slice(body).map_err(|_| unusable("not JSON"))?;
    let Some(jwks) = doc.get("keys").and_then(Value::as_array) else {
        return Err(unusable("no keys array"));
    };
    let mut keys = HashMap::new();
    for jwk in jwks {
        if jwk["kty"] != "OKP" || jwk["crv"] != "Ed25519" {
            continue;
        }
        let Some(kid) = jwk["kid"].as_str() else {
            continue;
        };
        let key = jwk["x"]
            .as_str()
            .and_then(|x| URL_SAFE_NO_PAD.decode(x).ok())
            .and_then(|b| <[u8; 32]>::try_from(b).ok())
            .and_then(|b| VerifyingKey::from_bytes(&b).ok())
            .ok_or_else(|| unusable(&format!("key {kid} is not an Ed25519 public key")))?;
        keys.insert(kid.to_owned(), key);
    }
    Ok(keys)
}

impl Verifier {
    /// Fetches the JWKS when it is still wanted once the fetch is ours: when stale, or (for
    /// `kid`, unknown) when none is held, else at most once per `kid_refetch_interval`, tried
    /// or not (a stream of made-up kids fetches no more while the service is down). A failure
    /// leaves the keys held.
    pub(crate) async fn load_keys(&self, kid: Option<&str>) -> Result<(), Error> {
        let want = |s: &State| {
            let stale = s.keys_fresh_until.map_or(true, |t| t <= Instant::now());
            let may = s
                .last_kid_fetch
                .map_or(true, |t| t.elapsed() >= self.inner.kid_refetch);
            match kid {
                Some(kid) => !s.keys.contains_key(kid) && (s.keys_fresh_until.is_none() || may),
                None => stale,
            }
        };
        let asked = Instant::now();
        let mut last_failure = self.inner.fetching_keys.lock().await;
        // A fetch that failed while this call waited for it answers this call too: calls that
        // came together do not each wait out a timeout in turn.
        if let Some((_, e)) = last_failure.as_ref().filter(|(at, _)| *at >= asked) {
            return Err(e.clone());
        }
        let etag = {
            let s = self.inner.state.lock();
            match want(&s) {
                true => s.keys_etag.clone(),
                false => return Ok(()),
            }
        };
        let fetched = self
            .fetch(
                format!("{}/.well-known/jwks.json", self.inner.base),
                "jwks",
                "application/json",
                etag,
            )
            .await;
        // A new JWKS (a 200) is read anew, with an ETag or without; a 304 keeps the keys held.
        let read = fetched.and_then(|f| {
            let keys = if f.status == 200 {
                Some(read_jwks(&f.body)?)
            } else {
                None
            };
            Ok((keys, f.etag, f.max_age))
        });
        if let Err(e) = &read {
            *last_failure = Some((Instant::now(), e.clone()));
        }
        let mut s = self.inner.state.lock();
        if kid.is_some() {
            s.last_kid_fetch = Some(Instant::now());
        }
        let (keys, etag, max_age) = read?;
        if let Some(keys) = keys {
            s.keys = keys;
            s.keys_etag = etag;
        }
        s.keys_fresh_until = Some(Instant::now() + cache_for(max_age));
        Ok(())
    }

    /// The key of `kid`: from the cached JWKS, refreshed behind when stale, or fetched when
    /// the kid is unknown (see [`Verifier::load_keys`]). While the JWKS cannot be had (or is
    /// unusable), the keys last read serve for the list grace past their freshness, as a
    /// status list does; then a check waits for a fetch, and fails closed.
    pub(crate) async fn key(&self, kid: &str) -> Result<VerifyingKey, Error> {
        let (known, stale, past_grace) = {
            let s = self.inner.state.lock();
            let now = Instant::now();
            (
                s.keys.contains_key(kid),
                s.keys_fresh_until.map_or(true, |t| t <= now),
                s.keys_fresh_until
                    .is_some_and(|t| t.checked_add(self.inner.list_grace).is_some_and(|g| g <= now)),
            )
        };
        if past_grace {
            // A key the service has dropped would verify for as long as it cannot be reached;
            // and what a kid it lacks is cannot be told from keys no longer trusted.
            self.load_keys(None).await?;
        }
        if !known {
            // Nothing held answers for this kid: it waits for the fetch (if one is due).
            if let Err(e) = self.load_keys(Some(kid)).await {
                if self.inner.state.lock().keys_fresh_until.is_none() {
                    return Err(e);
                }
            }
        }
        let stale = stale
            && self
                .inner
                .state
                .lock()
                .keys_fresh_until
                .map_or(true, |t| t <= Instant::now());
        if stale {
            // The keys held serve while one refresh runs behind.
            let this = self.clone();
            let url = format!("{}/.well-known/jwks.json", self.inner.base);
            self.refresh_later(url, async move { this.load_keys(None).await });
        }
        self.inner
            .state
            .lock()
            .keys
            .get(kid)
            .copied()
            .ok_or_else(|| invalid(format!("no key {kid} in the service's JWKS")))
    }
}

//! Token Status Lists: each list fetched from the service's origin, cached for its `ttl`,
//! refreshed behind the caller, used past it for `list_grace` while it cannot be had.

use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;

use crate::error::{invalid, unavailable};
use crate::tokens::numeric_date;
use crate::transport::Answer;
use crate::{now_secs, Error, Verifier, MAX_LIST_BYTES};

/// A status list as held: its bits, when it was fetched, its ttl, `exp` and ETag.
#[derive(Clone)]
pub(crate) struct HeldList {
    pub(crate) bits: Arc<Vec<u8>>,
    pub(crate) fetched: Instant,
    pub(crate) ttl: Duration,
    /// Its `exp` (Unix seconds), if it has one: past it (with the leeway), its bits say
    /// nothing of now, however lately a 304 said it is unchanged.
    pub(crate) exp: Option<i64>,
    pub(crate) etag: Option<String>,
}

impl HeldList {
    pub(crate) fn fresh(&self, leeway: i64) -> bool {
        self.fetched.elapsed() < self.ttl && !self.expired(leeway)
    }

    pub(crate) fn expired(&self, leeway: i64) -> bool {
        self.exp.is_some_and(|exp| crate::expired(exp, leeway))
    }
}

impl Verifier {
    /// The status at `idx` of the list at `uri` (1: revoked); `None` when the list cannot be
    /// had and `fail_open` is set.
    pub(crate) async fn status(&self, uri: &str, idx: u64) -> Result<Option<u8>, Error> {
        let prefix = format!("{}/v1/status/", self.inner.base);
        let rest = uri.strip_prefix(&prefix).unwrap_or("/");
        if rest.is_empty() || rest.contains(['/', '?', '#']) {
            return Err(invalid(format!(
                "status list {uri} is not one of {}",
                self.inner.base
            )));
        }
        let held = self.inner.state.lock().lists.get(uri).cloned();
        let (grace, leeway) = (self.inner.list_grace, self.inner.leeway);
        let bits = match held {
            Some(h) if h.fresh(leeway) => h.bits,
            Some(h) if !h.expired(leeway) && h.fetched.elapsed() <= h.ttl.saturating_add(grace) => {
                // Stale but usable: it serves while one refresh runs behind.
                let (this, at) = (self.clone(), uri.to_owned());
                self.refresh_later(uri.to_owned(), async move { this.load_list(&at).await.map(drop) });
                h.bits
            }
            _ => match self.load_list(uri).await {
                Ok(bits) => bits,
                Err(Error::Unavailable(_)) if self.inner.fail_open => return Ok(None),
                Err(e) => return Err(e),
            },
        };
        let byte = usize::try_from(idx / 8)
            .ok()
            .and_then(|i| bits.get(i))
            .ok_or_else(|| invalid(format!("index {idx} is outside the list")))?;
        Ok(Some((byte >> (idx % 8)) & 1))
    }

    /// The list at `uri`, fetched anew unless another caller did so while this one waited.
    pub(crate) async fn load_list(&self, uri: &str) -> Result<Arc<Vec<u8>>, Error> {
        let asked = Instant::now();
        let mut last_failure = self.inner.fetching_lists.lock().await;
        let held = self.inner.state.lock().lists.get(uri).cloned();
        if let Some(h) = held.as_ref().filter(|h| h.fresh(self.inner.leeway)) {
            return Ok(h.bits.clone());
        }
        // A fetch of this list that failed while this call waited answers this call too.
        if let Some((_, _, e)) = last_failure
            .as_ref()
            .filter(|(at, failed, _)| *at >= asked && failed == uri)
        {
            return Err(e.clone());
        }
        let list = match self.fetch_list(uri, held.as_ref()).await {
            Ok(list) => list,
            Err(e) => {
                *last_failure = Some((Instant::now(), uri.to_owned(), e.clone()));
                return Err(e);
            }
        };
        let bits = list.bits.clone();
        self.inner.state.lock().lists.insert(uri.to_owned(), list);
        Ok(bits)
    }

    /// Fetches the list at `uri` (revalidating what is held): fresh again on a 304, read anew
    /// on a 200 (`UNAVAILABLE` when it is not the signed list at `uri`). A held list past its
    /// `exp` is not revalidated: a 304 would keep it.
    pub(crate) async fn fetch_list(&self, uri: &str, held: Option<&HeldList>) -> Result<HeldList, Error> {
        let held = held.filter(|h| !h.expired(self.inner.leeway));
        let etag = held.and_then(|h| h.etag.clone());
        let f = self
            .fetch(uri.to_owned(), "status_list", "application/statuslist+jwt", etag)
            .await?;
        match (f.status, held) {
            (304, Some(h)) => Ok(HeldList {
                fetched: Instant::now(),
                ..h.clone()
            }),
            _ => self.read_list(uri, &f).await.map_err(|e| match e {
                Error::Unavailable(_) => e,
                e => unavailable(format!("the status list at {uri} is unusable: {e}")),
            }),
        }
    }

    /// The list in a 200 answer for `uri`.
    pub(crate) async fn read_list(&self, uri: &str, f: &Answer) -> Result<HeldList, Error> {
        let body = std::str::from_utf8(&f.body).map_err(|_| invalid("not UTF-8"))?;
        let claims = self.decode(body.trim(), "statuslist+jwt").await?;
        if claims["sub"] != uri {
            return Err(invalid(format!("the list at {uri} says it is {}", claims["sub"])));
        }
        // Its times, as a token's: an expired list (an old one replayed from a cache, from
        // before a revocation) says nothing of now.
        let now = now_secs();
        let Some(iat) = numeric_date(&claims["iat"]) else {
            return Err(invalid("iat is required (a NumericDate)"));
        };
        if iat > now.saturating_add(self.inner.leeway) {
            return Err(invalid("issued in the future"));
        }
        let exp = claims.get("exp").map(numeric_date);
        match exp {
            Some(None) => return Err(invalid("exp is not a NumericDate")),
            Some(Some(exp)) if crate::expired(exp, self.inner.leeway) => {
                return Err(invalid("the list has expired (exp)"))
            }
            _ => {}
        }
        if claims["status_list"]["bits"] != 1 {
            return Err(invalid("status lists of one bit only"));
        }
        let lst = claims["status_list"]["lst"]
            .as_str()
            .ok_or_else(|| invalid("no lst"))?;
        let compressed = URL_SAFE_NO_PAD
            .decode(lst)
            .map_err(|_| invalid("lst is not base64url"))?;
        let bits = miniz_oxide::inflate::decompress_to_vec_zlib_with_limit(&compressed, MAX_LIST_BYTES)
            .map_err(|_| invalid("lst is not zlib"))?;
        let ttl = match claims.get("ttl") {
            None => None,
            Some(t) => Some(
                t.as_u64()
                    .filter(|t| *t > 0)
                    .ok_or_else(|| invalid(format!("ttl {t} is not a positive number of seconds")))?,
            ),
        };
        Ok(HeldList {
            bits: Arc::new(bits),
            fetched: Instant::now(),
            // As a max-age: a day at most.
            ttl: crate::transport::cache_for(ttl),
            exp: exp.flatten(),
            etag: f.etag.clone(),
        })
    }
}

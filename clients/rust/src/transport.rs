//! The one way to the service: GETs with no redirect, a timeout and a bounded body, counted
//! fetches, and refreshes that run behind the caller.

use std::future::Future;
use std::io::Read as _;
use std::time::{Duration, Instant};

use crate::error::unavailable;
use crate::{Error, Verifier, FETCHES, MAX_BODY_BYTES};

/// An answer: its status and headers, and for a 200 its body (at most [`MAX_BODY_BYTES`]).
pub(crate) struct Answer {
    pub(crate) status: u16,
    pub(crate) body: Vec<u8>,
    pub(crate) etag: Option<String>,
    pub(crate) max_age: Option<u64>,
}

pub(crate) fn max_age(cache_control: Option<&str>) -> Option<u64> {
    cache_control?.split(',').find_map(|p| {
        let (name, value) = p.trim().split_once('=')?;
        name.eq_ignore_ascii_case("max-age").then(|| value.parse().ok())?
    })
}

/// How long to keep what the service sent with `max-age` (60 s without; a day at most).
pub(crate) fn cache_for(max_age: Option<u64>) -> Duration {
    Duration::from_secs(max_age.unwrap_or(60).min(86_400))
}

impl Verifier {
    /// GETs `url` on a blocking thread: no redirect followed (a 3xx is an answer like any
    /// other), the whole within the timeout, and of a 200 no more than [`MAX_BODY_BYTES`]
    /// read (more is `UNAVAILABLE`).
    pub(crate) async fn send(
        &self,
        url: String,
        accept: &'static str,
        etag: Option<String>,
        key: Option<String>,
    ) -> Result<Answer, Error> {
        let agent = self.inner.agent.clone();
        tokio::task::spawn_blocking(move || {
            let mut req = agent.get(&url).set("Accept", accept);
            if let Some(e) = &etag {
                req = req.set("If-None-Match", e);
            }
            if let Some(k) = &key {
                req = req.set("Authorization", &format!("Bearer {k}"));
            }
            let res = match req.call() {
                Ok(r) | Err(ureq::Error::Status(_, r)) => r,
                Err(e) => return Err(unavailable(format!("{url}: {e}"))),
            };
            let mut answer = Answer {
                status: res.status(),
                body: Vec::new(),
                etag: res.header("etag").map(str::to_owned),
                max_age: max_age(res.header("cache-control")),
            };
            if answer.status == 200 {
                res.into_reader()
                    .take(MAX_BODY_BYTES + 1)
                    .read_to_end(&mut answer.body)
                    .map_err(|e| unavailable(format!("{url}: {e}")))?;
                if answer.body.len() as u64 > MAX_BODY_BYTES {
                    return Err(unavailable(format!(
                        "{url}: an answer over {MAX_BODY_BYTES} bytes"
                    )));
                }
            }
            Ok(answer)
        })
        .await
        .map_err(|e| unavailable(e.to_string()))?
    }

    /// GETs a document, revalidating with `etag`: its answer, a 200 or (only when `etag` was
    /// sent) a 304. Any other answer is `UNAVAILABLE`. Counted by `document` and result.
    pub(crate) async fn fetch(
        &self,
        url: String,
        document: &'static str,
        accept: &'static str,
        etag: Option<String>,
    ) -> Result<Answer, Error> {
        let revalidating = etag.is_some();
        let answer = self.send(url.clone(), accept, etag, None).await;
        let (result, answer) = match answer {
            Ok(a) if a.status == 200 => ("fetched", Ok(a)),
            Ok(a) if a.status == 304 && revalidating => ("not_modified", Ok(a)),
            Ok(a) => ("failed", Err(unavailable(format!("{url}: {}", a.status)))),
            Err(e) => ("failed", Err(e)),
        };
        metrics::counter!(FETCHES, "document" => document, "result" => result).increment(1);
        answer
    }

    /// Runs `refresh` behind the caller, unless one runs for `url` already or `url` failed
    /// lately (then not before 1 s, doubling per failure up to 30 s): a request holding a
    /// usable answer never waits for the network.
    pub(crate) fn refresh_later(
        &self,
        url: String,
        refresh: impl Future<Output = Result<(), Error>> + Send + 'static,
    ) {
        {
            let mut s = self.inner.state.lock();
            if s.refreshing.contains(&url) || s.retry.get(&url).is_some_and(|(at, _)| *at > Instant::now()) {
                return;
            }
            s.refreshing.insert(url.clone());
        }
        let this = self.clone();
        tokio::spawn(async move {
            let done = refresh.await;
            let mut s = this.inner.state.lock();
            s.refreshing.remove(&url);
            if done.is_ok() {
                s.retry.remove(&url);
            } else {
                let failures = s.retry.get(&url).map_or(0, |r| r.1) + 1;
                let wait = Duration::from_secs(1 << (failures - 1).min(5)).min(Duration::from_secs(30));
                s.retry.insert(url, (Instant::now() + wait, failures));
            }
        });
    }
}

//! Key sets fetched at URLs that callers or rows name (identity providers' `jwks_uri`, third
//! parties' signature directories), each read once and kept: one fetch of a URL at a time,
//! revalidated with its `ETag`, a failure remembered so that the callers that waited for it,
//! and those after them, fail at once instead of each fetching again.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::outbound::{FetchError, Fetched, Outbound};

/// How one kind of document is fetched and kept.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Keeping {
    /// How long one is current, unless `max_age` bounds its own `Cache-Control: max-age`.
    pub(crate) fresh_for: Duration,
    /// The least and most seconds a document's `max-age` is taken at; `None`: not read.
    pub(crate) max_age: Option<(u64, u64)>,
    /// How long a failed fetch stands: callers get its reason without a fetch.
    pub(crate) failure_for: Duration,
    /// A caller that lacks a key fetches again at most this often (`Kept::get`'s `refresh`).
    pub(crate) refetch_after: Duration,
    pub(crate) timeout: Duration,
    pub(crate) max_bytes: usize,
}

/// Documents of one kind, by URL, each as `T` once read.
pub(crate) struct Kept<T> {
    outbound: Arc<Outbound>,
    /// `http://` and local addresses allowed: for development only.
    allow_local: bool,
    keeping: Keeping,
    held: quick_cache::sync::Cache<String, Arc<Held<T>>>,
    fetching: FetchLocks,
    /// This kind's share of the outbound fetches: URLs of one kind that hang (directories any
    /// caller with a publishable key can name) leave the other kind (providers' keys) its own.
    share: Arc<tokio::sync::Semaphore>,
}

/// The most fetches of one kind under way at once: half of what the outbound client takes.
const SHARE: usize = crate::outbound::MAX_FETCHES / 2;

/// What is held of a URL: the document as last fetched, and the last fetch's failure.
struct Held<T> {
    got: Option<Arc<T>>,
    etag: Option<String>,
    /// The document is current until then.
    until: Instant,
    /// When it was last fetched for a key a caller lacked.
    refreshed: Option<Instant>,
    /// The last fetch failed: when, and why. A current document still serves the callers
    /// that do not ask for a refresh, so that a refresh that fails (which any caller can
    /// ask for, naming a key the set lacks) takes nothing away.
    failed: Option<(Instant, String)>,
}

impl<T> Kept<T> {
    pub(crate) fn new(outbound: Arc<Outbound>, allow_local: bool, keeping: Keeping) -> Self {
        Kept {
            outbound,
            allow_local,
            keeping,
            held: quick_cache::sync::Cache::new(1000),
            fetching: FetchLocks::new(1000),
            share: Arc::new(tokio::sync::Semaphore::new(SHARE)),
        }
    }

    /// What `h` answers without a fetch, if anything.
    fn answer(&self, h: &Held<T>, refresh: bool) -> Option<Result<Arc<T>, String>> {
        let now = Instant::now();
        if let Some(got) = &h.got {
            let usable = if refresh {
                h.refreshed
                    .is_some_and(|at| now < at + self.keeping.refetch_after)
            } else {
                now < h.until
            };
            if usable {
                return Some(Ok(got.clone()));
            }
        }
        match &h.failed {
            Some((at, why)) if now < *at + self.keeping.failure_for => Some(Err(why.clone())),
            _ => None,
        }
    }

    /// The document at `url`, as `read` makes it of a body. `refresh`: the caller lacks a key
    /// it names, so one fetched more than `refetch_after` ago is fetched again.
    pub(crate) async fn get(
        &self,
        url: &str,
        refresh: bool,
        read: impl FnOnce(&[u8]) -> Result<T, String>,
    ) -> Result<Arc<T>, String> {
        self.get_as(url, url, refresh, read).await
    }

    /// [`Kept::get`], the document held under `key` (the URL, and what else makes it another
    /// one: a row that names the URL anew starts afresh).
    pub(crate) async fn get_as(
        &self,
        key: &str,
        url: &str,
        refresh: bool,
        read: impl FnOnce(&[u8]) -> Result<T, String>,
    ) -> Result<Arc<T>, String> {
        if let Some(answer) = self.held.get(key).and_then(|h| self.answer(&h, refresh)) {
            return answer;
        }
        let _one = self.fetching.lock(key).await;
        let held = self.held.get(key);
        if let Some(answer) = held.as_ref().and_then(|h| self.answer(h, refresh)) {
            return answer;
        }
        let last = held.as_ref().and_then(|h| Some((h.got.clone()?, h.etag.clone())));
        let now = Instant::now();
        let (kept, answer) = match self.fetch(url, last, read).await {
            // Not asked (too many fetches under way): nothing to remember of the URL, whose
            // next caller asks again.
            Err(FetchError::Busy(why)) => return Err(why),
            Ok((got, etag, fresh_for)) => {
                let refreshed = if refresh {
                    Some(now)
                } else {
                    held.as_ref().and_then(|h| h.refreshed)
                };
                let kept = Held {
                    got: Some(got.clone()),
                    etag,
                    until: now + fresh_for,
                    refreshed,
                    failed: None,
                };
                (kept, Ok(got))
            }
            Err(FetchError::Failed(why)) => {
                let kept = match held.as_deref() {
                    Some(h) => Held {
                        got: h.got.clone(),
                        etag: h.etag.clone(),
                        until: h.until,
                        refreshed: h.refreshed,
                        failed: Some((now, why.clone())),
                    },
                    None => Held {
                        got: None,
                        etag: None,
                        until: now,
                        refreshed: None,
                        failed: Some((now, why.clone())),
                    },
                };
                (kept, Err(why))
            }
        };
        self.held.insert(key.to_owned(), Arc::new(kept));
        answer
    }

    /// Fetches `url` (revalidating what was last had, with its ETag): the document, its ETag
    /// and how long it is current.
    async fn fetch(
        &self,
        url: &str,
        last: Option<(Arc<T>, Option<String>)>,
        read: impl FnOnce(&[u8]) -> Result<T, String>,
    ) -> Result<(Arc<T>, Option<String>, Duration), FetchError> {
        let k = &self.keeping;
        let etag = last.as_ref().and_then(|(_, etag)| etag.clone());
        let Ok(_share) = self.share.try_acquire() else {
            return Err(FetchError::Busy(format!(
                "cannot be fetched now: {SHARE} other fetches of its kind are under way"
            )));
        };
        let (fetched, caching) = self
            .outbound
            .fetch_revalidated(url, self.allow_local, etag, k.timeout, k.max_bytes)
            .await?;
        let failed = FetchError::Failed;
        let fresh_for = match (k.max_age, caching.max_age) {
            (Some((least, most)), Some(s)) => Duration::from_secs(s.clamp(least, most)),
            _ => k.fresh_for,
        };
        let got = match fetched {
            Fetched::NotModified => match last {
                Some((got, _)) => got,
                None => return Err(failed("answered 304 to a request without a validator".into())),
            },
            Fetched::Body(body) => Arc::new(read(&body).map_err(failed)?),
            Fetched::Failed(why) => return Err(failed(why)),
        };
        Ok((got, caching.etag, fresh_for))
    }
}

/// One fetch of a URL at a time, fetches of different URLs side by side: a caller that finds
/// what it holds of a URL stale waits for the one fetching it, and a server that answers
/// slowly holds up only its own URL's callers.
struct FetchLocks(quick_cache::sync::Cache<String, Arc<tokio::sync::Mutex<()>>>);

impl FetchLocks {
    fn new(urls: usize) -> Self {
        FetchLocks(quick_cache::sync::Cache::new(urls))
    }

    /// Waits for any fetch of `url` under way, and holds the URL until the guard drops.
    async fn lock(&self, url: &str) -> tokio::sync::OwnedMutexGuard<()> {
        let lock = match self
            .0
            .get_or_insert_with(url, || Ok::<_, std::convert::Infallible>(Arc::default()))
        {
            Ok(lock) => lock,
            Err(never) => match never {},
        };
        lock.lock_owned().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpListener;
    use std::sync::Mutex;

    /// A server on loopback that answers every request with the answer set last, and keeps
    /// each request's head.
    struct Server {
        url: String,
        answer: Arc<Mutex<String>>,
        heads: Arc<Mutex<Vec<String>>>,
    }

    impl Server {
        fn start(answer: &str) -> Server {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let url = format!("http://{}/keys", listener.local_addr().unwrap());
            let answer = Arc::new(Mutex::new(answer.to_owned()));
            let heads = Arc::new(Mutex::new(Vec::new()));
            let (a, h) = (answer.clone(), heads.clone());
            std::thread::spawn(move || {
                for mut conn in listener.incoming().flatten() {
                    let mut buf = [0u8; 4096];
                    let n = conn.read(&mut buf).unwrap_or(0);
                    h.lock()
                        .unwrap()
                        .push(String::from_utf8_lossy(&buf[..n]).to_ascii_lowercase());
                    let _ = conn.write_all(a.lock().unwrap().as_bytes());
                }
            });
            Server { url, answer, heads }
        }

        fn answer(&self, answer: &str) {
            *self.answer.lock().unwrap() = answer.to_owned();
        }

        fn hits(&self) -> usize {
            self.heads.lock().unwrap().len()
        }

        fn last_head(&self) -> String {
            self.heads.lock().unwrap().last().cloned().unwrap_or_default()
        }
    }

    fn ok(body: &str, headers: &str) -> String {
        format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n{headers}Connection: close\r\n\r\n{body}",
            body.len()
        )
    }

    const FAILING: &str =
        "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
    const NOT_MODIFIED: &str = "HTTP/1.1 304 Not Modified\r\nConnection: close\r\n\r\n";

    const KEEPING: Keeping = Keeping {
        fresh_for: Duration::from_secs(60),
        max_age: None,
        failure_for: Duration::from_secs(60),
        refetch_after: Duration::from_secs(60),
        timeout: Duration::from_secs(2),
        max_bytes: 1024,
    };

    fn kept(keeping: Keeping) -> Kept<String> {
        Kept::new(Arc::new(Outbound::new(Default::default())), true, keeping)
    }

    fn text(body: &[u8]) -> Result<String, String> {
        String::from_utf8(body.to_vec()).map_err(|_| "not text".into())
    }

    async fn get(k: &Kept<String>, s: &Server, refresh: bool) -> Result<String, String> {
        k.get(&s.url, refresh, text).await.map(|t| (*t).clone())
    }

    /// `n` fetches by `k` of URLs that take the connection and answer nothing for 1.5 s (as
    /// many as `k`'s share connect), under way half a second after this returns them.
    async fn hang(k: &Arc<Kept<String>>, n: usize) -> Vec<tokio::task::JoinHandle<()>> {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            let held: Vec<_> = listener.incoming().take(SHARE).collect();
            std::thread::sleep(Duration::from_millis(1500));
            drop(held);
        });
        let hanging = (0..n)
            .map(|i| {
                let k = k.clone();
                tokio::spawn(async move {
                    let _ = k.get(&format!("http://127.0.0.1:{port}/{i}"), false, text).await;
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(500)).await;
        hanging
    }

    /// Attack: filling every fetch slot of a kind a moment (URLs that never answer) made a document
    /// whose fetch fell in that moment fail as remembered for `failure_for` (minutes for
    /// directories). A fetch not made for want of a slot is remembered as nothing.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_fetch_refused_for_want_of_a_slot_is_not_remembered() {
        let k = Arc::new(kept(KEEPING));
        let hanging = hang(&k, SHARE).await;
        let s = Server::start(&ok("a", ""));
        let busy = get(&k, &s, false).await;
        assert!(busy.unwrap_err().contains("under way"));
        for h in hanging {
            h.await.unwrap();
        }
        assert_eq!(
            get(&k, &s, false).await.unwrap(),
            "a",
            "asked again, not its failure"
        );
    }

    /// Attack: URLs of one kind that never answer (third parties' directories, which any
    /// caller with a publishable key names) took every outbound fetch, and every token
    /// exchange whose provider's keys were due answered 503. Each kind has its share.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_kind_of_fetch_leaves_the_other_its_share() {
        let outbound = Arc::new(Outbound::new(Default::default()));
        let directories = Arc::new(Kept::<String>::new(outbound.clone(), true, KEEPING));
        let providers = Kept::<String>::new(outbound, true, KEEPING);
        let hanging = hang(&directories, crate::outbound::MAX_FETCHES).await;
        let s = Server::start(&ok("a", ""));
        assert_eq!(get(&providers, &s, false).await.unwrap(), "a");
        for h in hanging {
            h.await.unwrap();
        }
    }

    #[tokio::test]
    async fn a_document_is_kept_and_a_refresh_revalidates_it_at_most_so_often() {
        let s = Server::start(&ok("a", "ETag: \"v1\"\r\n"));
        let k = kept(KEEPING);
        assert_eq!(get(&k, &s, false).await.unwrap(), "a");
        assert_eq!(get(&k, &s, false).await.unwrap(), "a");
        assert_eq!(s.hits(), 1, "kept");
        s.answer(NOT_MODIFIED);
        assert_eq!(get(&k, &s, true).await.unwrap(), "a", "a 304 keeps what was held");
        assert_eq!(s.hits(), 2);
        assert!(
            s.last_head().contains("if-none-match: \"v1\""),
            "{}",
            s.last_head()
        );
        assert_eq!(get(&k, &s, true).await.unwrap(), "a");
        assert_eq!(s.hits(), 2, "refreshed a moment ago");
    }

    /// Anyone can ask for a refresh (a token naming a key the set lacks): one that fails
    /// takes the current document from no one, and stands for the refreshes after it.
    #[tokio::test]
    async fn a_failed_refresh_takes_nothing_away_and_stands() {
        let s = Server::start(&ok("a", ""));
        let k = kept(KEEPING);
        assert_eq!(get(&k, &s, false).await.unwrap(), "a");
        s.answer(FAILING);
        assert!(get(&k, &s, true).await.unwrap_err().contains("503"));
        assert_eq!(get(&k, &s, false).await.unwrap(), "a");
        assert!(get(&k, &s, true).await.unwrap_err().contains("503"));
        assert_eq!(s.hits(), 2, "the failure stands, unfetched");
    }

    #[tokio::test]
    async fn an_expired_document_is_not_served_after_a_failure_which_stands() {
        let s = Server::start(&ok("a", ""));
        let k = kept(Keeping {
            fresh_for: Duration::ZERO,
            ..KEEPING
        });
        assert_eq!(get(&k, &s, false).await.unwrap(), "a");
        s.answer(FAILING);
        assert!(get(&k, &s, false).await.is_err());
        assert!(get(&k, &s, false).await.is_err());
        assert_eq!(s.hits(), 2);
        assert!(get(&k, &s, false).await.is_err());
    }

    #[tokio::test]
    async fn max_age_counts_only_within_its_bounds() {
        let s = Server::start(&ok("a", "Cache-Control: max-age=1\r\n"));
        let bounded = kept(Keeping {
            fresh_for: Duration::ZERO,
            max_age: Some((60, 600)),
            ..KEEPING
        });
        get(&bounded, &s, false).await.unwrap();
        get(&bounded, &s, false).await.unwrap();
        assert_eq!(s.hits(), 1, "max-age=1 is taken as 60 s");
        let unread = kept(Keeping {
            fresh_for: Duration::ZERO,
            ..KEEPING
        });
        get(&unread, &s, false).await.unwrap();
        get(&unread, &s, false).await.unwrap();
        assert_eq!(s.hits(), 3, "max-age not read: fresh_for");
    }

    #[tokio::test]
    async fn a_304_to_a_request_without_a_validator_is_a_failure() {
        let s = Server::start(NOT_MODIFIED);
        let k = kept(KEEPING);
        assert!(get(&k, &s, false).await.unwrap_err().contains("304"));
    }
}

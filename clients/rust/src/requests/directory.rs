//! Signature directories as held: read once when fetched (at most [`MAX_DIRECTORY_KEYS`] keys,
//! by thumbprint), held while fresh (revalidated by ETag) and past that for the list grace
//! while they cannot be had. Fetched once for every request that needs one meanwhile (one
//! fetch per URL at a time); one not held whose fetch failed is `UNAVAILABLE` without another
//! fetch until its retry time (1 s, doubling per failure up to 30 s).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use web_bot_auth::keyring::{KeyRing, Thumbprintable};

use crate::error::unavailable;
use crate::transport::{cache_for, failed_again};
use crate::{Error, Verifier, MAX_DIRECTORIES, MAX_DIRECTORY_KEYS};

/// A directory as last fetched.
pub(crate) struct Directory {
    /// Its keys by thumbprint, read when it was fetched.
    keys: Arc<KeyRing>,
    etag: Option<String>,
    fresh_until: Instant,
    /// When it was last fetched (or revalidated).
    read_at: Instant,
    /// While its fetch fails: not fetched again before this, and the failures in a row.
    failing: Option<(Instant, u32)>,
}

/// A failed fetch of a directory none usable of which was held: not fetched again before
/// `retry_at`, `error` answering meanwhile.
struct Failed {
    retry_at: Instant,
    failures: u32,
    error: Error,
}

/// The lock the fetch of one URL holds, which the callers that need it meanwhile wait on.
type Gate = Arc<tokio::sync::Mutex<()>>;

/// Directories held, by URL, how many times a pushed revocation dropped each URL, the fetches
/// under way and the failures remembered.
#[derive(Default)]
pub(crate) struct Directories {
    held: HashMap<String, Directory>,
    dropped: HashMap<String, u64>,
    /// Each URL being fetched (or waited for): its gate, and how many callers hold it.
    fetching: HashMap<String, (Gate, usize)>,
    /// URLs whose last fetch failed with none usable held, at most [`MAX_DIRECTORIES`].
    failed: HashMap<String, Failed>,
}

impl Directories {
    /// Holds `directory` for `url`; past `most` directories, the one held longest goes.
    fn hold(&mut self, url: String, directory: Directory, most: usize) {
        self.failed.remove(&url);
        self.held.insert(url, directory);
        while self.held.len() > most.max(1) {
            let oldest = self
                .held
                .iter()
                .min_by_key(|(_, d)| d.read_at)
                .map(|(u, _)| u.clone());
            match oldest {
                Some(u) => self.held.remove(&u),
                None => break,
            };
        }
    }

    /// Remembers that fetching `url` failed with `error`, none usable held; past `most` URLs
    /// remembered, those whose retry time passed go, then the one retried soonest.
    fn failed(&mut self, url: &str, error: Error, most: usize) {
        let last = self.failed.remove(url).map(|f| (f.retry_at, f.failures));
        let (retry_at, failures) = failed_again(last);
        if self.failed.len() >= most.max(1) {
            let now = Instant::now();
            self.failed.retain(|_, f| f.retry_at > now);
        }
        while self.failed.len() >= most.max(1) {
            let soonest = self
                .failed
                .iter()
                .min_by_key(|(_, f)| f.retry_at)
                .map(|(u, _)| u.clone());
            match soonest {
                Some(u) => self.failed.remove(&u),
                None => break,
            };
        }
        let failed = Failed {
            retry_at,
            failures,
            error,
        };
        self.failed.insert(url.to_owned(), failed);
    }

    /// Forgets what is held of `url`: a fetch asked for before this stores nothing.
    pub(crate) fn drop_url(&mut self, url: String) {
        self.held.remove(&url);
        if self.dropped.len() >= crate::SEEN_SETS {
            // Every fetch across those drops is long done; one under way is asked again.
            self.dropped.clear();
        }
        *self.dropped.entry(url).or_default() += 1;
    }

    fn drops(&self, url: &str) -> u64 {
        self.dropped.get(url).copied().unwrap_or(0)
    }
}

/// A caller's hold on the gate of `url`'s fetch; the gate goes with its last caller (a URL
/// that fails, a made-up issuer's, leaves nothing).
struct Turn<'a> {
    verifier: &'a Verifier,
    url: &'a str,
    gate: Gate,
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        let mut s = self.verifier.inner.state.lock();
        if let Some((_, callers)) = s.directories.fetching.get_mut(self.url) {
            *callers -= 1;
            if *callers == 0 {
                s.directories.fetching.remove(self.url);
            }
        }
    }
}

/// The keys of a directory's JSON by RFC 7638 thumbprint: its first [`MAX_DIRECTORY_KEYS`]
/// (as the Python and TypeScript libraries read it), RFC 9421's test key (or its negation)
/// passed over. `UNAVAILABLE` when it is not a key set.
fn read_directory(url: &str, body: &[u8]) -> Result<KeyRing, Error> {
    #[derive(serde::Deserialize)]
    struct Listed {
        keys: Vec<serde_json::Value>,
    }
    let unusable = |e: serde_json::Error| unavailable(format!("{url}: not a key set ({e})"));
    let listed: Listed = serde_json::from_slice(body).map_err(unusable)?;
    let mut ring = KeyRing::default();
    for jwk in listed.keys.into_iter().take(MAX_DIRECTORY_KEYS) {
        // A key of a kind this crate cannot read is passed over, as the other libraries pass
        // it over: the rest of the directory still counts.
        let Ok(jwk) = serde_json::from_value::<Thumbprintable>(jwk) else {
            continue;
        };
        if matches!(&jwk, Thumbprintable::OKP { x, .. } if test_point(x)) {
            continue;
        }
        // Best effort, as `KeyRing::import_jwks`: a key of another kind is not imported.
        let _ = ring.try_import_jwk(&jwk);
    }
    Ok(ring)
}

/// Whether `x` is RFC 9421's Ed25519 test key or its negation (the sign bit flipped): a key
/// whose private half anyone has.
fn test_point(x: &str) -> bool {
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use base64::Engine as _;
    let (Ok(mine), Ok(test)) = (
        URL_SAFE_NO_PAD.decode(x),
        URL_SAFE_NO_PAD.decode("JrQLj5P_89iXES9-vFgrIy29clF9CC_oPPsw3c5D0bs"),
    ) else {
        return false;
    };
    mine.len() == 32 && mine[..31] == test[..31] && mine[31] & 0x7f == test[31] & 0x7f
}

impl Verifier {
    /// The keys of the directory at `url`, by thumbprint: held while fresh, else fetched
    /// (revalidated) once for every caller that needs them meanwhile; held past that for the
    /// list grace when the fetch fails; `UNAVAILABLE` until its retry time when the fetch
    /// failed with none usable held. Asked for again when a pushed revocation dropped the URL
    /// meanwhile: the answer may predate the revocation.
    pub(super) async fn key_ring(&self, url: &str) -> Result<Arc<KeyRing>, Error> {
        for _ in 0..3 {
            if let Some(answer) = self.held_directory(url) {
                return answer;
            }
            let turn = self.turn(url);
            let _fetching = turn.gate.lock().await;
            // What a fetch while this caller waited brought, or how it failed.
            if let Some(answer) = self.held_directory(url) {
                return answer;
            }
            let (held, epoch) = {
                let s = self.inner.state.lock();
                let held = s.directories.held.get(url);
                let held = held.map(|d| (d.keys.clone(), d.etag.clone()));
                (held, s.directories.drops(url))
            };
            let etag = held.as_ref().and_then(|(_, e)| e.clone());
            let answer = self
                .fetch(
                    url.to_owned(),
                    "directory",
                    "application/http-message-signatures-directory+json",
                    etag.clone(),
                )
                .await
                .and_then(|a| match (a.status, held) {
                    (304, Some((keys, _))) => Ok((keys, a.etag.or(etag), a.max_age)),
                    _ => Ok((Arc::new(read_directory(url, &a.body)?), a.etag, a.max_age)),
                });
            let mut s = self.inner.state.lock();
            let (keys, etag, max_age) = match answer {
                Ok(read) => read,
                Err(e) => {
                    let grace = self.inner.list_grace;
                    if let Some(d) = s.directories.held.get_mut(url).filter(|d| within(d, grace)) {
                        d.failing = Some(failed_again(d.failing));
                        return Ok(d.keys.clone());
                    }
                    s.directories.failed(url, e.clone(), MAX_DIRECTORIES);
                    return Err(e);
                }
            };
            if s.directories.drops(url) != epoch {
                continue;
            }
            let directory = Directory {
                keys: keys.clone(),
                etag,
                fresh_until: Instant::now() + cache_for(max_age),
                read_at: Instant::now(),
                failing: None,
            };
            s.directories.hold(url.to_owned(), directory, MAX_DIRECTORIES);
            return Ok(keys);
        }
        Err(unavailable(format!(
            "{url}: revocations keep coming while it is fetched"
        )))
    }

    /// What answers for `url` without a fetch: the directory held while fresh, or stale
    /// within the grace while its fetch fails; with none usable held, the failure of its last
    /// fetch until its retry time. None when it is to be fetched.
    fn held_directory(&self, url: &str) -> Option<Result<Arc<KeyRing>, Error>> {
        let s = self.inner.state.lock();
        let now = Instant::now();
        if let Some(d) = s.directories.held.get(url) {
            let failing = d.failing.is_some_and(|(at, _)| at > now);
            if d.fresh_until > now || (failing && within(d, self.inner.list_grace)) {
                return Some(Ok(d.keys.clone()));
            }
            if within(d, self.inner.list_grace) {
                return None;
            }
        }
        let failed = s.directories.failed.get(url)?;
        (failed.retry_at > now).then(|| Err(failed.error.clone()))
    }

    /// A hold on the gate of `url`'s fetch, made when none is.
    fn turn<'a>(&'a self, url: &'a str) -> Turn<'a> {
        let mut s = self.inner.state.lock();
        let (gate, callers) = s.directories.fetching.entry(url.to_owned()).or_default();
        *callers += 1;
        Turn {
            verifier: self,
            url,
            gate: gate.clone(),
        }
    }
}

/// Whether `held`, stale or not, may still serve: within `grace` past its freshness (a grace
/// past what an `Instant` holds is for ever).
fn within(held: &Directory, grace: std::time::Duration) -> bool {
    held.fresh_until
        .checked_add(grace)
        .map_or(true, |end| end > Instant::now())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// A directory served at a port of this machine for as long as the test runs, fresh for
    /// a minute.
    fn serve_directory() -> String {
        use std::io::{Read as _, Write as _};
        let key = ed25519_dalek::SigningKey::from_bytes(&[3; 32]);
        let x = base64::Engine::encode(
            &base64::engine::general_purpose::URL_SAFE_NO_PAD,
            key.verifying_key().as_bytes(),
        );
        let body = serde_json::json!({"keys": [{"kty": "OKP", "crv": "Ed25519", "x": x}]}).to_string();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/directory", listener.local_addr().unwrap());
        std::thread::spawn(move || {
            for mut conn in listener.incoming().flatten() {
                let _ = conn.read(&mut [0u8; 4096]);
                let _ = conn.write_all(
                    format!(
                        "HTTP/1.1 200 OK\r\nCache-Control: max-age=60\r\nContent-Length: {}\r\n\
                         Connection: close\r\n\r\n{body}",
                        body.len()
                    )
                    .as_bytes(),
                );
            }
        });
        url
    }

    /// A held directory answers with the keys read when it was fetched: a signed request
    /// used to copy its key set and read every key again (a thumbprint and a point
    /// decompression each).
    #[tokio::test]
    async fn a_held_directory_is_read_once() {
        let url = serve_directory();
        let v = Verifier::builder("http://127.0.0.1:9")
            .allow_local(true)
            .build()
            .unwrap();
        let first = v.key_ring(&url).await.unwrap();
        let again = v.key_ring(&url).await.unwrap();
        assert!(Arc::ptr_eq(&first, &again), "the held directory was read again");
    }

    /// Attack: without `issuers`, each made-up issuer a caller names is a directory fetched
    /// and held: the one held longest goes past the bound.
    #[test]
    fn the_directories_held_are_bounded() {
        let mut held = Directories::default();
        let start = Instant::now();
        for i in 0..6u64 {
            let at = start + Duration::from_secs(i);
            let directory = Directory {
                keys: Arc::new(KeyRing::default()),
                etag: None,
                fresh_until: at,
                read_at: at,
                failing: None,
            };
            held.hold(
                format!("https://id.example/v1/directories/d{i}.example"),
                directory,
                3,
            );
        }
        let mut urls: Vec<&String> = held.held.keys().collect();
        urls.sort();
        assert_eq!(
            urls,
            ["d3", "d4", "d5"]
                .map(|d| format!("https://id.example/v1/directories/{d}.example"))
                .iter()
                .collect::<Vec<_>>()
        );
    }

    /// A key of a kind the crate cannot read (an unknown `kty`, an OKP key without `x`) is
    /// passed over, and the directory's other keys still count.
    #[test]
    fn a_key_that_does_not_read_is_passed_over() {
        let key = ed25519_dalek::SigningKey::from_bytes(&[3; 32]);
        let x = base64::Engine::encode(
            &base64::engine::general_purpose::URL_SAFE_NO_PAD,
            key.verifying_key().as_bytes(),
        );
        let good = serde_json::json!({"kty": "OKP", "crv": "Ed25519", "x": x});
        let body = serde_json::json!({"keys": [{"kty": "XYZ"}, {"kty": "OKP", "crv": "Ed25519"}, good]});
        let ring = read_directory("https://d.example/", body.to_string().as_bytes()).unwrap();
        let thumbprint = serde_json::from_value::<Thumbprintable>(good)
            .unwrap()
            .b64_thumbprint();
        assert!(ring.get(&thumbprint).is_some());
        assert!(read_directory("https://d.example/", b"not json").is_err());
    }

    /// Attack: each made-up issuer whose directory fails is remembered, within the bound; a
    /// URL failing again waits longer.
    #[test]
    fn the_failures_remembered_are_bounded() {
        let mut held = Directories::default();
        for i in 0..6 {
            held.failed(&format!("https://d{i}.example/"), unavailable("down"), 3);
        }
        assert_eq!(held.failed.len(), 3);
        held.failed("https://d5.example/", unavailable("down"), 3);
        assert_eq!(held.failed.len(), 3);
        assert_eq!(held.failed["https://d5.example/"].failures, 2);
    }
}

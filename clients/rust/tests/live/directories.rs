//! Signature directories as a receiver holds them: one fetch per directory for the requests
//! that need it together, a failed fetch of one not held not asked again at once, at most
//! `MAX_DIRECTORY_KEYS` keys read of one, and no setting so large that it panics.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use agentid_verifier::{Verifier, MAX_DIRECTORY_KEYS};
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use ed25519_dalek::SigningKey;
use serde_json::json;

use super::requests::{signed, signing_agent};
use super::{code, proxied, Proxy};

const URL: &str = "https://shop.example/";

/// Counts the proxy's requests for paths under `/v1/directories/`, each held `delay` (and
/// answered as `answer` rewrites them).
fn count_directories(
    p: &Proxy,
    delay: Duration,
    answer: impl Fn(u16, super::Headers, Vec<u8>) -> (u16, super::Headers, Vec<u8>) + Send + Sync + 'static,
) -> Arc<AtomicUsize> {
    let fetches = Arc::new(AtomicUsize::new(0));
    let counted = fetches.clone();
    p.rewrite(move |path, status, headers, body| {
        if !path.starts_with("/v1/directories/") {
            return (status, headers, body);
        }
        counted.fetch_add(1, Ordering::SeqCst);
        std::thread::sleep(delay);
        answer(status, headers, body)
    });
    fetches
}

/// Attack: requests signed with a key in no directory, sent together while the directory is
/// not held. Each used to fetch it for itself (the service reads an address 20 directories a
/// minute): they share one fetch, and are refused at the signature.
#[tokio::test(flavor = "current_thread")]
async fn requests_that_need_a_directory_together_share_one_fetch() {
    let (_s, p) = proxied();
    let fetches = count_directories(&p, Duration::from_millis(300), |s, h, b| (s, h, b));
    let v = Verifier::builder(&p.url)
        .allow_local(true)
        .issuers(["example.com"])
        .build()
        .unwrap();
    let unlisted = SigningKey::from_bytes(&[21; 32]);
    let headers = signed(&unlisted, URL, &format!("{}/v1/directories/example.com", p.url));
    let checks: Vec<_> = (0..30)
        .map(|_| {
            let (v, headers) = (v.clone(), headers.clone());
            tokio::spawn(async move { code(v.verify_request("GET", URL, &headers, &[]).await) })
        })
        .collect();
    let mut got = Vec::new();
    for check in checks {
        got.push(check.await.unwrap());
    }
    assert_eq!(fetches.load(Ordering::SeqCst), 1, "directory fetches");
    assert_eq!(got, vec!["TOKEN_INVALID"; 30]);
}

/// A directory not held whose fetch failed (the service's 429, say) is UNAVAILABLE without
/// another fetch until its retry time (1 s, doubling): it used to be fetched for every request.
#[tokio::test(flavor = "current_thread")]
async fn a_failed_fetch_of_a_directory_not_held_is_not_repeated_at_once() {
    let (_s, p) = proxied();
    let fetches = count_directories(&p, Duration::ZERO, |_, _, _| (429, Vec::new(), Vec::new()));
    let v = Verifier::builder(&p.url)
        .allow_local(true)
        .issuers(["example.com"])
        .build()
        .unwrap();
    let unlisted = SigningKey::from_bytes(&[22; 32]);
    let headers = signed(&unlisted, URL, &format!("{}/v1/directories/example.com", p.url));
    for _ in 0..5 {
        assert_eq!(
            code(v.verify_request("GET", URL, &headers, &[]).await),
            "UNAVAILABLE"
        );
    }
    assert_eq!(fetches.load(Ordering::SeqCst), 1, "directory fetches");
    // Past the retry time it is asked again.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(
        code(v.verify_request("GET", URL, &headers, &[]).await),
        "UNAVAILABLE"
    );
    assert_eq!(fetches.load(Ordering::SeqCst), 2, "directory fetches");
}

/// A trusted directory of more than `MAX_DIRECTORY_KEYS` keys: its first ones are read, as the
/// Python and TypeScript libraries read them; a key past them signs nothing.
#[tokio::test(flavor = "current_thread")]
async fn a_directory_is_read_up_to_its_first_1000_keys() {
    let (_s, p) = proxied();
    let key = SigningKey::from_bytes(&[23; 32]);
    let jwk = |k: &SigningKey| json!({"kty": "OKP", "crv": "Ed25519", "x": URL_SAFE_NO_PAD.encode(k.verifying_key().as_bytes())});
    let others: Vec<_> = (0..MAX_DIRECTORY_KEYS as u16)
        .map(|i| {
            let mut seed = [24u8; 32];
            seed[..2].copy_from_slice(&i.to_be_bytes());
            jwk(&SigningKey::from_bytes(&seed))
        })
        .collect();
    // The key last of the first 1,000 (under /last), and first past them (under /past).
    let mut last = others[1..].to_vec();
    last.push(jwk(&key));
    let mut past = others.clone();
    past.push(jwk(&key));
    let (last, past) = (
        json!({ "keys": last }).to_string().into_bytes(),
        json!({ "keys": past }).to_string().into_bytes(),
    );
    p.rewrite(move |path, status, headers, body| {
        let body = match path {
            "/third-party/last" => last.clone(),
            "/third-party/past" => past.clone(),
            _ => return (status, headers, body),
        };
        let kind = "application/http-message-signatures-directory+json";
        (200, vec![("content-type".into(), kind.into())], body)
    });
    let v = Verifier::builder(&p.url).allow_local(true).build().unwrap();
    let mut got = Vec::new();
    for name in ["last", "past"] {
        let directory = format!("{}/third-party/{name}", p.url);
        let headers = signed(&key, URL, &directory);
        got.push(code(
            v.verify_request("GET", URL, &headers, &[directory.as_str()])
                .await,
        ));
    }
    assert_eq!(got, ["ok", "TOKEN_INVALID"]);
}

/// `list_grace(Duration::MAX)`: a directory past its max-age was held for "forever" past it,
/// an `Instant` that overflowed (a panic); it is fetched again and serves.
#[tokio::test(flavor = "current_thread")]
async fn an_endless_list_grace_holds_a_directory_without_panicking() {
    let (s, p) = proxied();
    count_directories(&p, Duration::ZERO, |status, mut headers, body| {
        headers.retain(|(name, _)| name != "cache-control");
        headers.push(("cache-control".into(), "max-age=1".into()));
        (status, headers, body)
    });
    let (_, key) = signing_agent(&s);
    let v = Verifier::builder(&p.url)
        .allow_local(true)
        .list_grace(Duration::MAX)
        .build()
        .unwrap();
    let directory = format!("{}/v1/directories/example.com", p.url);
    let first = signed(&key, URL, &directory);
    assert_eq!(code(v.verify_request("GET", URL, &first, &[]).await), "ok");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let next = signed(&key, URL, &directory);
    assert_eq!(code(v.verify_request("GET", URL, &next, &[]).await), "ok");
}

/// `leeway(Duration::MAX)`: a signature's `created` was held to now plus the leeway, which
/// overflowed (a panic); it is "any time", and the request passes.
#[tokio::test(flavor = "current_thread")]
async fn an_endless_leeway_takes_a_signed_request_without_panicking() {
    let (s, p) = proxied();
    let (_, key) = signing_agent(&s);
    let (_, token) = s.register(json!({}));
    let v = Verifier::builder(&p.url)
        .allow_local(true)
        .leeway(Duration::MAX)
        .list_grace(Duration::MAX)
        .build()
        .unwrap();
    let directory = format!("{}/v1/directories/example.com", p.url);
    let headers = signed(&key, URL, &directory);
    assert_eq!(code(v.verify_request("GET", URL, &headers, &[]).await), "ok");
    assert_eq!(code(v.verify(&token).await), "ok");
}

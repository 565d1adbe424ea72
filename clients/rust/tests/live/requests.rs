//! Signed requests (Web Bot Auth) checked offline: requests Cloudflare's `web-bot-auth` (npm,
//! unmodified) and Python's `http-message-signatures` signed with an agent's key, against the
//! directory of a real server.

use std::path::Path;
use std::process::Command;

use agentid_verifier::Verifier;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use ed25519_dalek::SigningKey;
use serde_json::{json, Value};

use super::{code, Server};

/// The headers a stock signer of `tests/offline` (`node sign.mjs`: Cloudflare's
/// `web-bot-auth`; `python3 sign.py`: Python's `http-message-signatures`) makes for a GET of
/// `url` signed by `key`, naming `agent`.
fn signed_by(signer: &[&str], key: &SigningKey, url: &str, agent: &str) -> Vec<(String, String)> {
    let offline = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/offline");
    let jwk = json!({"kty": "OKP", "crv": "Ed25519",
                     "x": URL_SAFE_NO_PAD.encode(key.verifying_key().as_bytes()),
                     "d": URL_SAFE_NO_PAD.encode(key.to_bytes())});
    let out = Command::new(signer[0])
        .args(&signer[1..])
        .current_dir(offline)
        .env("KEY", jwk.to_string())
        .env("URL", url)
        .env("AGENT", agent)
        .output()
        .expect("the signer runs (npm ci --prefix tests/offline first)");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let headers: Value = serde_json::from_slice(&out.stdout).unwrap();
    headers
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()))
        .collect()
}

/// An agent of example.com bound to a new Ed25519 key: its id and key.
pub(super) fn signing_agent(s: &Server) -> (String, SigningKey) {
    let mut seed = [0u8; 32];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut seed).unwrap();
    let key = SigningKey::from_bytes(&seed);
    let jwk =
        json!({"kty": "OKP", "crv": "Ed25519", "x": URL_SAFE_NO_PAD.encode(key.verifying_key().as_bytes())});
    let (id, _) = s.register(json!({"scopes": ["read:docs"], "jwk": jwk}));
    (id, key)
}

/// Signed by Cloudflare's `web-bot-auth` (see [`signed_by`]).
pub(super) fn signed(key: &SigningKey, url: &str, agent: &str) -> Vec<(String, String)> {
    signed_by(&["node", "sign.mjs"], key, url, agent)
}

#[tokio::test(flavor = "current_thread")]
async fn a_signed_request_is_checked_offline_against_the_agents_directory() {
    let s = Server::start();
    let (id, key) = signing_agent(&s);
    let v = Verifier::builder(&s.base).allow_local(true).build().unwrap();
    let directory = format!("{}/v1/directories/example.com", s.base);
    let url = "https://shop.example/products/1";
    let headers = signed(&key, url, &directory);
    let got = v.verify_request("GET", url, &headers, &[]).await.unwrap();
    assert_eq!(got.signature_agent, directory);
    assert_eq!(got.issuer.as_deref(), Some("example.com"));
    assert!(got.expires > got.created);
    // Signed by Python's http-message-signatures: verified as well.
    let python = signed_by(&["python3", "sign.py"], &key, url, &directory);
    v.verify_request("GET", url, &python, &[]).await.unwrap();
    // Replayed; presented for another host; unsigned; an untrusted directory.
    assert_eq!(
        code(v.verify_request("GET", url, &headers, &[]).await),
        "PROOF_REPLAYED"
    );
    let fresh = signed(&key, url, &directory);
    assert_eq!(
        code(
            v.verify_request("GET", "https://evil.example/products/1", &fresh, &[])
                .await
        ),
        "TOKEN_INVALID"
    );
    assert_eq!(
        code(v.verify_request("GET", url, &[], &[]).await),
        "TOKEN_INVALID"
    );
    let elsewhere = signed(
        &key,
        url,
        "https://bots.example/.well-known/http-message-signatures-directory",
    );
    assert_eq!(
        code(v.verify_request("GET", url, &elsewhere, &[]).await),
        "TOKEN_INVALID"
    );
    // Another spelling of the directory, which a pushed revocation would not drop.
    for alias in [
        format!("{}/v1/directories/EXAMPLE.COM", s.base),
        format!("{directory}?again"),
    ] {
        let aliased = signed(&key, url, &alias);
        assert_eq!(
            code(v.verify_request("GET", url, &aliased, &[]).await),
            "TOKEN_INVALID"
        );
    }
    // Revoked: gone from the directory, seen at the next fetch.
    s.revoke(&id);
    let later = Verifier::builder(&s.base).allow_local(true).build().unwrap();
    let headers = signed(&key, url, &directory);
    assert_eq!(
        code(later.verify_request("GET", url, &headers, &[]).await),
        "TOKEN_INVALID"
    );
}

/// RFC 9421's Ed25519 test key (the Web Bot Auth drafts sign with it) counts for nothing: a
/// request it signed is refused before any directory is asked.
#[tokio::test(flavor = "current_thread")]
async fn rfc_9421s_test_key_counts_for_nothing() {
    let d = URL_SAFE_NO_PAD
        .decode("n4Ni-HpISpVObnQMW0wOhCKROaIKqKtW_2ZYb2p9KcU")
        .unwrap();
    let key = SigningKey::from_bytes(&d.try_into().unwrap());
    let dead = "http://127.0.0.1:9/directory";
    let v = Verifier::builder("http://127.0.0.1:9")
        .allow_local(true)
        .build()
        .unwrap();
    let headers = signed(&key, "https://shop.example/", dead);
    let err = v
        .verify_request("GET", "https://shop.example/", &headers, &[dead])
        .await
        .unwrap_err();
    assert!(err.to_string().contains("published test keys"), "{err}");
}

/// A signature agent that is the service's directory of an issuer the receiver does not
/// accept is refused before anything is fetched (the service here is unreachable: a fetch
/// would be UNAVAILABLE).
#[tokio::test(flavor = "current_thread")]
async fn a_directory_of_an_issuer_not_accepted_is_never_fetched() {
    let base = "http://127.0.0.1:9";
    let key = SigningKey::from_bytes(&[5; 32]);
    let v = Verifier::builder(base)
        .allow_local(true)
        .issuers(["example.com"])
        .build()
        .unwrap();
    let headers = signed(
        &key,
        "https://shop.example/",
        &format!("{base}/v1/directories/other.example"),
    );
    let err = v
        .verify_request("GET", "https://shop.example/", &headers, &[])
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("issuer other.example is not accepted"),
        "{err}"
    );
}

/// A revocation's pushed event drops what the verifier holds of the issuer's directory: the
/// agent's next signed request, within the directory's minute, is refused.
#[tokio::test(flavor = "current_thread")]
async fn a_pushed_revocation_drops_the_issuers_directory_at_once() {
    let s = Server::start();
    let stream = s.set_stream(json!({}));
    let (id, key) = signing_agent(&s);
    let v = Verifier::builder(&s.base).allow_local(true).build().unwrap();
    let directory = format!("{}/v1/directories/example.com", s.base);
    let url = "https://shop.example/";
    let first = signed(&key, url, &directory);
    v.verify_request("GET", url, &first, &[]).await.unwrap(); // the directory is held, fresh
    s.revoke(&id);
    v.handle_set(&s.the_set(&stream)).await.unwrap();
    let next = signed(&key, url, &directory);
    assert_eq!(
        code(v.verify_request("GET", url, &next, &[]).await),
        "TOKEN_INVALID"
    );
}

/// The tower layer takes a signed request in place of a token: the signature goes to the
/// service in the request's extensions; without a public origin, or with scopes, refused.
#[cfg(feature = "tower")]
#[tokio::test(flavor = "current_thread")]
async fn the_tower_layer_takes_a_signed_request_in_place_of_a_token() {
    use agentid_verifier::tower::AgentIdLayer;
    use agentid_verifier::SignedRequest;
    use tower_layer::Layer;
    use tower_service::Service;

    let s = Server::start();
    let (_, key) = signing_agent(&s);
    let v = Verifier::builder(&s.base).allow_local(true).build().unwrap();
    let directory = format!("{}/v1/directories/example.com", s.base);
    // The service answers with the issuer of the signature the layer put in the extensions.
    let issuer = super::Reply(|req| {
        req.extensions()
            .get::<SignedRequest>()
            .unwrap()
            .issuer
            .clone()
            .unwrap_or_default()
    });
    let call = |layer: AgentIdLayer, path: &str| {
        let headers = signed(&key, &format!("https://shop.example{path}"), &directory);
        let mut req = http::Request::builder().uri(path);
        for (n, v) in &headers {
            req = req.header(n.as_str(), v.as_str());
        }
        let req = req.body(()).unwrap();
        let mut svc = layer.layer(issuer.clone());
        async move { svc.call(req).await.unwrap() }
    };
    let ok = call(
        AgentIdLayer::new(v.clone(), &[]).public_origin("https://shop.example"),
        "/products/1?page=2",
    )
    .await;
    assert_eq!((ok.status().as_u16(), ok.body().as_str()), (200, "example.com"));
    assert_eq!(call(AgentIdLayer::new(v.clone(), &[]), "/").await.status(), 401);
    let scoped = AgentIdLayer::new(v.clone(), &["read:docs"]).public_origin("https://shop.example");
    assert_eq!(call(scoped, "/").await.status(), 403);
}

/// While a directory's server does not answer, a stale directory (within the grace) is used
/// after one fetch fails, not after each request waits out its own fetch.
#[tokio::test(flavor = "current_thread")]
async fn a_stale_directory_whose_fetch_failed_lately_serves_at_once_within_the_grace() {
    use std::io::{Read as _, Write as _};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    let key = SigningKey::from_bytes(&[9; 32]);
    let x = URL_SAFE_NO_PAD.encode(key.verifying_key().as_bytes());
    let body = json!({"keys": [{"kty": "OKP", "crv": "Ed25519", "x": x}]}).to_string();
    let hang = Arc::new(AtomicBool::new(false));
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let directory = format!("http://{}/directory", listener.local_addr().unwrap());
    let hanging = hang.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let mut buf = [0u8; 4096];
            let _ = conn.read(&mut buf);
            if hanging.load(Ordering::SeqCst) {
                std::thread::spawn(move || {
                    std::thread::sleep(Duration::from_secs(3));
                    drop(conn);
                });
                continue;
            }
            let _ = conn.write_all(
                format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/http-message-signatures-directory+json\r\n\
                     Cache-Control: max-age=1\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                )
                .as_bytes(),
            );
        }
    });
    let v = Verifier::builder("http://127.0.0.1:9")
        .allow_local(true)
        .timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    let url = "https://shop.example/";
    let trusted = [directory.as_str()];
    let headers = signed(&key, url, &directory);
    assert_eq!(code(v.verify_request("GET", url, &headers, &trusted).await), "ok");
    // Signed ahead: the checks below run within the second the failed fetch is not
    // repeated for, however slow signing is on a loaded machine.
    let headers = signed(&key, url, &directory);
    let more: Vec<_> = (0..3).map(|_| signed(&key, url, &directory)).collect();
    hang.store(true, Ordering::SeqCst);
    std::thread::sleep(Duration::from_millis(1100));
    // The first finds the server failing (a whole timeout); the next wait for nothing.
    assert_eq!(code(v.verify_request("GET", url, &headers, &trusted).await), "ok");
    let started = Instant::now();
    for headers in &more {
        assert_eq!(code(v.verify_request("GET", url, headers, &trusted).await), "ok");
    }
    assert!(
        started.elapsed() < Duration::from_millis(400),
        "{:?}",
        started.elapsed()
    );
}

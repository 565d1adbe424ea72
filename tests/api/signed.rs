//! Signed requests (Web Bot Auth): an issuer's signature directory, and requests signed by
//! Cloudflare's `web-bot-auth` npm package (0.1.3, unmodified) and by Python's
//! `http-message-signatures` checked online, with each way a signed request should fail.

use std::path::Path;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use ed25519_dalek::SigningKey;
use serde_json::{json, Value};
use sha2::Sha256;

use crate::dpop::thumbprint;
use crate::helpers::{spawn_app, Resp, TestApp};

/// An agent's Ed25519 key as a private JWK, and its public one.
pub(crate) fn keypair() -> (Value, Value) {
    let key = SigningKey::from_bytes(&rand::random::<[u8; 32]>());
    let x = URL_SAFE_NO_PAD.encode(key.verifying_key().as_bytes());
    let public = json!({"kty": "OKP", "crv": "Ed25519", "x": x});
    let private =
        json!({"kty": "OKP", "crv": "Ed25519", "x": x, "d": URL_SAFE_NO_PAD.encode(key.to_bytes())});
    (private, public)
}

/// A crawler of example.com (`read:docs`) bound to a new key: its registration and its
/// private JWK.
async fn crawler(app: &TestApp) -> (Value, Value) {
    let (private, public) = keypair();
    let a = app
        .register(json!({"name": "crawler", "issuer_domain": "example.com", "scopes": ["read:docs"], "jwk": public}))
        .await;
    (a, private)
}

/// The headers a stock signer of `tests/offline` makes for a GET of `url` signed with `key`,
/// naming `agent`, valid for `valid` seconds: `sign.mjs` (Cloudflare's `web-bot-auth`) or
/// `sign.py` (Python's `http-message-signatures`).
async fn stock_signs(signer: &str, key: &Value, url: &str, agent: &str, valid: u32) -> Value {
    stock_signs_covering(signer, key, url, agent, valid, "@authority signature-agent").await
}

/// As [`stock_signs`], covering `components` (space-separated; `sign.py` alone takes them).
async fn stock_signs_covering(
    signer: &str,
    key: &Value,
    url: &str,
    agent: &str,
    valid: u32,
    components: &str,
) -> Value {
    let offline = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/offline");
    let mut cmd = crate::readme::shell(&offline, signer);
    cmd.env("COMPONENTS", components);
    cmd.env("KEY", key.to_string())
        .env("URL", url)
        .env("AGENT", agent)
        .env("VALID", valid.to_string());
    let out = tokio::task::spawn_blocking(move || cmd.output().unwrap())
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{signer}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The headers Cloudflare's `web-bot-auth` makes (see [`stock_signs`]).
pub(crate) async fn cloudflare_signs(key: &Value, url: &str, agent: &str, valid: u32) -> Value {
    stock_signs("node sign.mjs", key, url, agent, valid).await
}

impl TestApp {
    pub(crate) async fn check_request(&self, url: &str, headers: &Value) -> Value {
        let res = self
            .post(
                "/v1/verify/request",
                None,
                Some(&json!({"method": "GET", "url": url, "headers": headers})),
            )
            .await;
        assert_eq!(res.status, 200, "{}", res.text());
        res.json()
    }

    pub(crate) async fn directory(&self, domain: &str, etag: Option<&str>) -> Resp {
        let mut req = self.client.get(self.url(&format!("/v1/directories/{domain}")));
        if let Some(tag) = etag {
            req = req.insert_header(("If-None-Match", tag));
        }
        crate::helpers::read(req.send().await.unwrap()).await
    }
}

/// The directory lists the name's live agents' Ed25519 keys by thumbprint, cached a minute,
/// revalidated by its ETag; a revoked agent's key is gone at once, a test-mode one never there.
#[actix_web::test]
async fn a_directory_lists_the_names_live_agents_keys() {
    let app = spawn_app().await;
    let (_, public) = keypair();
    let a = app
        .register(json!({"name": "crawler", "issuer_domain": "example.com", "scopes": ["read:docs"], "jwk": public}))
        .await;
    let (_, test_key) = keypair();
    app.register_with(
        &app.org.keys.secret_test,
        json!({"name": "t", "issuer_domain": "example.com", "scopes": ["read:docs"], "jwk": test_key}),
    )
    .await;
    app.agent().await; // bound to no key
    let res = app.directory("example.com", None).await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(
        res.header("content-type").as_deref(),
        Some("application/http-message-signatures-directory+json")
    );
    assert_eq!(res.header("cache-control").as_deref(), Some("max-age=60"));
    let keys = res.json()["keys"].as_array().unwrap().clone();
    let mut want = public.clone();
    want["kid"] = thumbprint(&public).into();
    assert_eq!(keys, [want]);
    let etag = res.header("etag").unwrap();
    assert_eq!(app.directory("example.com", Some(&etag)).await.status, 304);
    assert_eq!(
        app.revoke(a["agent_id"].as_str().unwrap(), None).await.status,
        200
    );
    let res = app.directory("example.com", Some(&etag)).await;
    assert_eq!(res.status, 200, "changed: not 304");
    assert_eq!(res.json()["keys"], json!([]));
    assert_eq!(
        app.directory("nobody.example", None).await.json()["keys"],
        json!([])
    );
    app.directory("a..b", None)
        .await
        .assert_error(400, "VALIDATION_ERROR");
}

/// A request Cloudflare's signer signed with an agent's key, naming its directory, is
/// verified and names the agent; replayed, moved to another host, from a revoked agent, from a
/// key the directory lacks, naming another directory, or unsigned, it is not.
#[actix_web::test]
async fn a_request_signed_by_web_bot_auth_is_verified_online() {
    let app = spawn_app().await;
    let (private, public) = keypair();
    let a = app
        .register(json!({"name": "crawler", "issuer_domain": "example.com", "scopes": ["read:docs"], "jwk": public}))
        .await;
    let agent_id = a["agent_id"].as_str().unwrap().to_owned();
    let directory = format!("{}/v1/directories/example.com", app.base);
    let url = "https://shop.example/products/1";
    let headers = cloudflare_signs(&private, url, &directory, 300).await;

    let v = app.check_request(url, &headers).await;
    assert_eq!(v["result"], "verified", "{v}");
    assert_eq!(v["agent_id"], agent_id.as_str());
    assert_eq!(v["issuer"], "example.com");
    assert_eq!(v["scopes"], json!(["read:docs"]));
    assert_eq!(v["livemode"], true);
    assert_eq!(v["signature_agent"], directory.as_str());
    assert_eq!(v["keyid"], thumbprint(&public).as_str());
    assert_eq!(v["tag"], "web-bot-auth");
    assert!(v["created"].is_string() && v["expires"].is_string(), "{v}");
    // Python's http-message-signatures, the same key: verified as well.
    let python = stock_signs("python3 sign.py", &private, url, &directory, 300).await;
    let v = app.check_request(url, &python).await;
    assert_eq!(v["result"], "verified", "{v}");

    // The same signature again: its nonce was seen.
    let again = app.check_request(url, &headers).await;
    assert_eq!(again["result"], "invalid");
    assert!(again["reason"].as_str().unwrap().contains("nonce"), "{again}");
    // Presented for another host: @authority is covered.
    let fresh = cloudflare_signs(&private, url, &directory, 300).await;
    let moved = app.check_request("https://evil.example/products/1", &fresh).await;
    assert_eq!(moved["result"], "invalid", "{moved}");
    // Signature-Agent changed after signing.
    let mut swapped = fresh.clone();
    swapped["Signature-Agent"] = json!(format!("\"{}/v1/directories/a.io\"", app.base));
    assert_ne!(app.check_request(url, &swapped).await["result"], "verified");
    // Lying about the tag: another tag asked for.
    let res = app
        .post(
            "/v1/verify/request",
            None,
            Some(&json!({"method": "GET", "url": url, "headers": fresh, "required_tag": "other"})),
        )
        .await;
    assert_eq!(res.json()["result"], "unverified");

    // A key the directory does not hold (RFC 9421's test key, the draft's example).
    let rfc_key = json!({"kty": "OKP", "crv": "Ed25519", "d": "n4Ni-HpISpVObnQMW0wOhCKROaIKqKtW_2ZYb2p9KcU",
                         "x": "JrQLj5P_89iXES9-vFgrIy29clF9CC_oPPsw3c5D0bs"});
    let stranger = cloudflare_signs(&rfc_key, url, &directory, 300).await;
    let v = app.check_request(url, &stranger).await;
    assert_eq!(v["result"], "invalid", "{v}");
    assert_eq!(v["keyid"], "poqkLGiymh_W0uP6PZFw-dvez3QJT5SolqXBCW38r0U");
    // Naming a directory elsewhere: nothing this service can vouch for.
    let elsewhere = cloudflare_signs(
        &private,
        url,
        "https://bots.example/.well-known/http-message-signatures-directory",
        300,
    )
    .await;
    assert_eq!(app.check_request(url, &elsewhere).await["result"], "unverified");
    // No signature at all.
    let none = app.check_request(url, &json!({"Accept": "*/*"})).await;
    assert_eq!(none["result"], "unverified");
    // Valid for more than a day.
    let long = cloudflare_signs(&private, url, &directory, 2 * 86_400).await;
    assert_eq!(app.check_request(url, &long).await["result"], "invalid");

    // Revoked: its next signature fails at once.
    let last = cloudflare_signs(&private, url, &directory, 300).await;
    assert_eq!(app.revoke(&agent_id, None).await.status, 200);
    let v = app.check_request(url, &last).await;
    assert_eq!(v["result"], "invalid", "{v}");
    assert!(v.get("agent_id").is_none());

    // Every check is in the log, the verified one in the agent's ledger.
    let log = app.get("/v1/log?limit=50", Some(app.secret())).await.json();
    let mine: Vec<&Value> = log["data"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["agent_id"] == agent_id.as_str())
        .collect();
    assert!(mine.iter().any(|r| r["result"] == "valid"), "{log}");

    // The form: a relative URL, a missing method, a method that is no token (a request
    // line's method, as the document's pattern says), too many fields.
    for bad in [
        json!({"method": "GET", "url": "/x", "headers": {}}),
        json!({"url": url, "headers": {}}),
        json!({"method": "GET /x", "url": url, "headers": {}}),
        json!({"method": "", "url": url, "headers": {}}),
        json!({"method": "M".repeat(33), "url": url, "headers": {}}),
        json!({"method": "GET", "url": url, "headers": (0..65).map(|i| (format!("h{i}"), json!("v"))).collect::<serde_json::Map<_, _>>()}),
    ] {
        let res = app.post("/v1/verify/request", None, Some(&bad)).await;
        assert_eq!(res.status, 400, "{bad}: {}", res.text());
    }
}

/// "Signed requests" as written: the agent's key made by `sign_request.mjs`, its
/// registration and the name's directory, a request it signed checked, then refused once the
/// agent is revoked.
#[actix_web::test]
async fn the_signed_requests_page_runs_as_written() {
    let app = spawn_app().await;
    let dir = tempfile::tempdir().unwrap();
    for name in ["sign_request.mjs", "sign_request.py"] {
        let signer = crate::readme::snippet(name);
        std::fs::write(dir.path().join(&signer.name), &signer.text).unwrap();
    }
    let modules = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/offline/node_modules");
    std::os::unix::fs::symlink(modules, dir.path().join("node_modules")).unwrap();
    let script = [
        crate::readme::shell_blocks("An issuer's signature directory").concat(),
        crate::readme::shell_blocks("A receiver checks a signed request").concat(),
    ]
    .join("printf '\\n::block::\\n'\n");
    let mut cmd = crate::readme::shell(dir.path(), &script);
    cmd.env("BASE", &app.base).env("SK", app.secret());
    let stdout = crate::readme::output_of(cmd, "the signed requests page's commands").await;
    let parts: Vec<&str> = stdout.split("\n::block::\n").collect();
    let [listed, checked] = &parts[..] else {
        panic!("two blocks' output expected: {stdout}");
    };
    let listed: Value = serde_json::from_str(listed.trim()).unwrap_or_else(|e| panic!("{e}: {listed}"));
    let jwk: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("crawler-jwk.json")).unwrap()).unwrap();
    assert_eq!(listed["keys"][0]["kid"], thumbprint(&jwk).as_str(), "{listed}");
    let answers = crate::readme::json_answers(checked);
    assert_eq!(answers.len(), 3, "{checked}");
    assert_eq!(answers[0]["result"], "verified", "{checked}");
    assert_eq!(answers[0]["issuer"], "example.com");
    assert_eq!(answers[1]["result"], "verified", "the Python signer's: {checked}");
    assert_eq!(answers[2]["result"], "invalid", "{checked}");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(dir.path().join("crawler-key.json"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
}

/// The issuer's own origin serves its directory (the page's NGINX configuration, run with
/// Debian's NGINX), and a request whose Signature-Agent names that origin's well-known URL is
/// checked against agentid's state: verified, then refused once the agent is revoked.
#[actix_web::test]
async fn an_issuers_own_origin_serves_its_directory() {
    let app = spawn_app().await;
    let (private, public) = keypair();
    let a = app
        .register(json!({"name": "crawler", "issuer_domain": "example.com", "scopes": ["read:docs"], "jwk": public}))
        .await;
    let port = crate::gateways::free_port();
    let dir = tempfile::tempdir().unwrap();
    let servers = crate::readme::only_block("An issuer's signature directory", "nginx")
        .replace("127.0.0.1:8080", app.base.trim_start_matches("http://"))
        .replace("listen 8000;", &format!("listen 127.0.0.1:{port};"))
        .replace(
            "/var/cache/nginx/agentid-directory",
            &dir.path().join("cache").display().to_string(),
        );
    let _nginx = crate::gateways::nginx_serving(dir.path(), &servers, port).await;
    let fetch = || async {
        crate::helpers::read(
            app.client
                .get(format!(
                    "http://127.0.0.1:{port}/.well-known/http-message-signatures-directory"
                ))
                .send()
                .await
                .unwrap(),
        )
        .await
    };
    // Every receiver's fetch is answered, however many there are: past an anonymous caller's
    // 20 a minute, which all of them spend as one (the issuer's server).
    for _ in 0..25 {
        let res = fetch().await;
        assert_eq!(res.status, 200, "{}", res.text());
    }
    let res = fetch().await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(res.json()["keys"][0]["kid"], thumbprint(&public).as_str());
    assert_eq!(
        res.header("content-type").as_deref(),
        Some("application/http-message-signatures-directory+json")
    );

    let url = "https://shop.example/";
    let own = "https://example.com/.well-known/http-message-signatures-directory";
    let v = app
        .check_request(url, &cloudflare_signs(&private, url, own, 300).await)
        .await;
    assert_eq!(v["result"], "verified", "{v}");
    assert_eq!(v["signature_agent"], own);
    // A name with no agent here is no issuer of this service: not judged.
    let other = "https://bots.example/.well-known/http-message-signatures-directory";
    let v = app
        .check_request(url, &cloudflare_signs(&private, url, other, 300).await)
        .await;
    assert_eq!(v["result"], "unverified", "{v}");
    let later = cloudflare_signs(&private, url, own, 300).await;
    assert_eq!(
        app.revoke(a["agent_id"].as_str().unwrap(), None).await.status,
        200
    );
    assert_eq!(app.check_request(url, &later).await["result"], "invalid");
}

/// A gateway passes a signed request's headers to forward auth: verified for the guarded
/// request (the configuration's origin and the forwarded path), held to its issuers and
/// scopes, answered in `X-Agent-*`; replayed, unscoped, or without an origin, refused.
#[actix_web::test]
async fn forward_auth_takes_a_signed_request() {
    let app = spawn_app().await;
    let (a, private) = crawler(&app).await;
    let directory = format!("{}/v1/directories/example.com", app.base);
    let url = "https://shop.example/products/1";
    let gate = |query: &'static str, signed: Value| forward_signed(&app, query, signed);
    let signed = cloudflare_signs(&private, url, &directory, 300).await;
    let res = gate(
        "scope=read:docs&issuer=example.com&origin=https://shop.example",
        signed.clone(),
    )
    .await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(res.header("x-agent-id").as_deref(), a["agent_id"].as_str());
    assert_eq!(res.header("x-agent-issuer").as_deref(), Some("example.com"));
    assert_eq!(res.header("x-agent-scopes").as_deref(), Some("read:docs"));
    // The rest always, empty: a gateway copying them overwrites a caller's own.
    crate::forward_auth::agent_token_headers_are_empty(&res);
    // Signed by Python's http-message-signatures: the same.
    let python = stock_signs("python3 sign.py", &private, url, &directory, 300).await;
    let res = gate("origin=https://shop.example", python).await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(res.header("x-agent-id").as_deref(), a["agent_id"].as_str());
    // Replayed.
    let res = gate("origin=https://shop.example", signed).await;
    res.assert_error(401, "TOKEN_INVALID");
    // A scope the agent lacks; another issuer; no origin; another origin.
    let fresh = || cloudflare_signs(&private, url, &directory, 300);
    gate("scope=write:docs&origin=https://shop.example", fresh().await)
        .await
        .assert_error(403, "INSUFFICIENT_SCOPE");
    gate("issuer=a.io&origin=https://shop.example", fresh().await)
        .await
        .assert_error(401, "TOKEN_INVALID");
    gate("scope=read:docs", fresh().await)
        .await
        .assert_error(401, "TOKEN_INVALID");
    gate("origin=https://other.example", fresh().await)
        .await
        .assert_error(401, "TOKEN_INVALID");
}

/// `GET /v1/forward-auth?{query}` for a GET of `/products/1?page=2` with `signed`'s headers.
async fn forward_signed(app: &TestApp, query: &str, signed: Value) -> Resp {
    let mut req = app
        .client
        .get(app.url(&format!("/v1/forward-auth?{query}")))
        .insert_header(("X-Forwarded-Method", "GET"))
        .insert_header(("X-Forwarded-Uri", "/products/1?page=2"));
    for (name, value) in signed.as_object().unwrap() {
        req = req.insert_header((name.as_str(), value.as_str().unwrap()));
    }
    crate::helpers::read(req.send().await.unwrap()).await
}

/// Attack: a covered header sent again with a line that is not ASCII (which the upstream
/// sees) is checked over every line, and fails; forwarded headers of both families (the
/// client's passed on beside the gateway's) that disagree name no request.
#[actix_web::test]
async fn forward_auth_checks_every_line_of_what_a_signature_covers() {
    let app = spawn_app().await;
    let HandSigner {
        key,
        kid,
        directory,
        now,
    } = hand_signer(&app).await;
    let signed = || {
        let params = format!(
            ";created={now};expires={};keyid=\"{kid}\";nonce=\"{}\";tag=\"web-bot-auth\"",
            now + 300,
            URL_SAFE_NO_PAD.encode(rand::random::<[u8; 16]>())
        );
        hand_signed(
            &key,
            "https://shop.example/products/1",
            &directory,
            &["@authority", "signature-agent", "x-a"],
            &params,
            &[("X-A", "1")],
        )
    };
    let send = |headers: Value, extra: Vec<(&'static str, awc::http::header::HeaderValue)>| {
        let app = &app;
        async move {
            let mut req = app
                .client
                .get(app.url("/v1/forward-auth?origin=https://shop.example"))
                .insert_header(("X-Forwarded-Method", "GET"))
                .insert_header(("X-Forwarded-Uri", "/products/1"));
            for (name, value) in headers.as_object().unwrap() {
                req = req.insert_header((name.as_str(), value.as_str().unwrap()));
            }
            for (name, value) in extra {
                req = req.append_header((name, value));
            }
            crate::helpers::read(req.send().await.unwrap()).await
        }
    };
    let value = |b: &[u8]| awc::http::header::HeaderValue::from_bytes(b).unwrap();
    let res = send(signed(), vec![]).await;
    assert_eq!(res.status, 200, "{}", res.text());
    send(signed(), vec![("X-A", value(b"caf\xe9"))])
        .await
        .assert_error(401, "TOKEN_INVALID");
    // The other family, agreeing: the same request. Disagreeing, or a second line: none.
    let res = send(
        signed(),
        vec![
            ("X-Original-Method", value(b"GET")),
            ("X-Original-URL", value(b"/products/1")),
        ],
    )
    .await;
    assert_eq!(res.status, 200, "{}", res.text());
    for extra in [
        vec![("X-Original-Method", value(b"POST"))],
        vec![("X-Original-URL", value(b"/admin"))],
        vec![("X-Forwarded-Uri", value(b"/admin"))],
    ] {
        send(signed(), extra).await.assert_error(401, "TOKEN_INVALID");
    }
}

/// A signed request whose check cannot be recorded is answered 503 and not let through; its
/// nonce is given back, so the retry the answer asks for passes (it was refused as a replay).
#[actix_web::test]
async fn a_signed_request_whose_check_cannot_be_recorded_may_be_retried() {
    let app = spawn_app().await;
    let (_, private) = crawler(&app).await;
    let directory = format!("{}/v1/directories/example.com", app.base);
    let signed = cloudflare_signs(&private, "https://shop.example/products/1", &directory, 300).await;
    let query = "origin=https://shop.example";
    assert!(app.store.inject_write_fault(agentid::store::WriteFault::Panic));
    forward_signed(&app, query, signed.clone())
        .await
        .assert_error(503, "AUDIT_UNAVAILABLE");
    let res = forward_signed(&app, query, signed.clone()).await;
    assert_eq!(res.status, 200, "{}", res.text());
    forward_signed(&app, query, signed)
        .await
        .assert_error(401, "TOKEN_INVALID");
}

/// Attack: a signature over a request's path and query, replayed through the gateway with
/// another query. Forward auth checks it against the guarded request's whole target, the
/// query the gateway forwarded included: that query, and only that, verifies.
#[actix_web::test]
async fn forward_auth_checks_a_signed_query_against_the_forwarded_one() {
    let app = spawn_app().await;
    let (_, private) = crawler(&app).await;
    let directory = format!("{}/v1/directories/example.com", app.base);
    let gate = |uri: &'static str, signed: Value| {
        let app = &app;
        async move {
            let mut req = app
                .client
                .get(app.url("/v1/forward-auth?origin=https://shop.example"))
                .insert_header(("X-Forwarded-Method", "GET"))
                .insert_header(("X-Forwarded-Uri", uri));
            for (name, value) in signed.as_object().unwrap() {
                req = req.insert_header((name.as_str(), value.as_str().unwrap()));
            }
            crate::helpers::read(req.send().await.unwrap()).await
        }
    };
    let signs = |url: &'static str| {
        let (private, directory) = (&private, &directory);
        async move {
            let covered = "@authority @path @query signature-agent";
            stock_signs_covering("python3 sign.py", private, url, directory, 300, covered).await
        }
    };
    let res = gate(
        "/orders?page=2",
        signs("https://shop.example/orders?page=2").await,
    )
    .await;
    assert_eq!(res.status, 200, "{}", res.text());
    let res = gate(
        "/orders?page=2#top",
        signs("https://shop.example/orders?page=2").await,
    )
    .await;
    assert_eq!(res.status, 200, "a fragment is not the query: {}", res.text());
    gate("/orders?delete=1", signs("https://shop.example/orders").await)
        .await
        .assert_error(401, "TOKEN_INVALID");
    gate(
        "/orders?delete=1",
        signs("https://shop.example/orders?page=2").await,
    )
    .await
    .assert_error(401, "TOKEN_INVALID");
    let res = gate("/orders", signs("https://shop.example/orders").await).await;
    assert_eq!(res.status, 200, "{}", res.text());
}

/// A signature agent that is a third party's: fetched over TLS only when the receiver trusts
/// it, its keys taken by thumbprint, kept as its Cache-Control says; untrusted, unverified.
#[actix_web::test]
async fn a_trusted_third_partys_directory_is_fetched_and_kept() {
    use crate::domains::{Http, Pki};
    let pki = Pki::new("bots.example");
    let tls = Http::start_tls(&pki);
    let dns = crate::dns::TestDns::start().await;
    dns.addr("bots.example", "127.0.0.1".parse().unwrap());
    let app = crate::helpers::spawn_app_with(crate::helpers::Options {
        tweak: Box::new(|c| c.engine.signed.allow_local_directories = true),
        outbound: agentid::engine::outbound::OutboundConfig {
            dns_server: Some(dns.addr),
            extra_roots: vec![pki.root.clone()],
            https_port: tls.port,
            http_port: 80,
        },
        ..crate::helpers::Options::default()
    })
    .await;
    let (private, public) = keypair();
    let mut listed = public.clone();
    listed["kid"] = json!("whatever the directory calls it");
    let body = json!({"keys": [listed, {"kty": "RSA", "n": "AQAB", "e": "AQAB"}]}).to_string();
    tls.answer(format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/http-message-signatures-directory+json\r\n\
         Cache-Control: max-age=600\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    ));
    let agent_url = "https://bots.example/.well-known/http-message-signatures-directory";
    let url = "https://shop.example/";
    let check = |headers: Value, trusted: bool| {
        let app = &app;
        async move {
            let mut body = json!({"method": "GET", "url": url, "headers": headers});
            if trusted {
                body["trusted_signature_agents"] = json!([agent_url]);
            }
            let key = app.org.keys.publishable_live.as_str();
            app.post("/v1/verify/request", Some(key), Some(&body))
                .await
                .json()
        }
    };
    // Attack: a caller with no key making the service fetch a URL of its choosing.
    let res = app
        .post(
            "/v1/verify/request",
            None,
            Some(
                &json!({"method": "GET", "url": url, "headers": {}, "trusted_signature_agents": [agent_url]}),
            ),
        )
        .await;
    res.assert_error(401, "UNAUTHORIZED");
    assert_eq!(tls.hits(), 0);
    let v = check(cloudflare_signs(&private, url, agent_url, 300).await, false).await;
    assert_eq!(v["result"], "unverified", "{v}");
    assert_eq!(tls.hits(), 0, "an untrusted directory is never fetched");
    let v = check(cloudflare_signs(&private, url, agent_url, 300).await, true).await;
    assert_eq!(v["result"], "verified", "{v}");
    assert!(v.get("agent_id").is_none(), "no agentid agent: {v}");
    assert_eq!(v["keyid"], thumbprint(&public).as_str());
    // Kept: a second check asks nobody; another key is not in it.
    let (other, _) = keypair();
    let v = check(cloudflare_signs(&other, url, agent_url, 300).await, true).await;
    assert_eq!(v["result"], "invalid", "{v}");
    assert_eq!(tls.hits(), 1);
    // The form: too many trusted agents, or one that is no URL.
    let many: Vec<String> = (0..17).map(|i| format!("https://a{i}.example/d")).collect();
    let res = app
        .post(
            "/v1/verify/request",
            Some(&app.org.keys.publishable_live),
            Some(&json!({"method": "GET", "url": url, "headers": {}, "trusted_signature_agents": many})),
        )
        .await;
    res.assert_error(400, "VALIDATION_ERROR");
}

/// Attack: a signed request replayed to another instance of the fleet.
#[actix_web::test]
async fn a_signature_replayed_to_another_instance_is_refused() {
    // The second instance reaches the first one's directory as a trusted third party's (the
    // test's instances have each their own URL): the nonce is the fleet's either way.
    let fleet = crate::helpers::spawn_fleet(
        2,
        crate::helpers::Options {
            tweak: Box::new(|c| c.engine.signed.allow_local_directories = true),
            ..crate::helpers::Options::default()
        },
    )
    .await;
    let (private, public) = keypair();
    fleet[0]
        .register(json!({"name": "crawler", "issuer_domain": "example.com", "scopes": ["read:docs"], "jwk": public}))
        .await;
    let url = "https://shop.example/";
    let directory = format!("{}/v1/directories/example.com", fleet[0].base);
    let check = |app: &'static str, headers: Value| {
        let (fleet, directory) = (&fleet, directory.clone());
        async move {
            let app = &fleet[usize::from(app == "second")];
            let body = json!({"method": "GET", "url": url, "headers": headers,
                              "trusted_signature_agents": [directory]});
            let key = app.org.keys.publishable_live.as_str();
            app.post("/v1/verify/request", Some(key), Some(&body))
                .await
                .json()
        }
    };
    let headers = cloudflare_signs(&private, url, &directory, 300).await;
    assert_eq!(check("first", headers.clone()).await["result"], "verified");
    let replayed = check("second", headers).await;
    assert_eq!(replayed["result"], "invalid", "{replayed}");
    assert!(
        replayed["reason"].as_str().unwrap().contains("nonce"),
        "{replayed}"
    );
    // A fresh signature passes there.
    let fresh = cloudflare_signs(&private, url, &directory, 300).await;
    assert_eq!(check("second", fresh).await["result"], "verified");
}

/// Attack: an agent bound to RFC 9421's published test key (the Web Bot Auth drafts' example
/// key, whose private half everyone has) would let anyone sign as it; a request signed with
/// it, as the draft's appendix is, counts for nothing.
#[actix_web::test]
async fn the_rfc_9421_test_key_binds_no_agent() {
    let app = spawn_app().await;
    // Its Ed25519 key (B.1.4) and its P-256 key (B.1.3): no token may be bound to either.
    for jwk in [
        json!({"kty": "OKP", "crv": "Ed25519", "x": "JrQLj5P_89iXES9-vFgrIy29clF9CC_oPPsw3c5D0bs"}),
        json!({"kty": "EC", "crv": "P-256", "x": "qIVYZVLCrPZHGHjP17CTW0_-D9Lfw0EkjqF7xB4FivA",
               "y": "Mc4nN9LTDOBhfoUeg8Ye9WedFRhnZXZJA12Qp0zZ6F0"}),
    ] {
        let res = app
            .post(
                "/v1/agents/register",
                Some(app.secret()),
                Some(
                    &json!({"name": "copycat", "issuer_domain": "example.com", "scopes": ["read:docs"],
                             "jwk": jwk}),
                ),
            )
            .await;
        let body = res.assert_error(400, "VALIDATION_ERROR");
        assert!(
            body["error"]["message"].as_str().unwrap().contains("RFC 9421"),
            "{body}"
        );
    }
    // The Web Bot Auth draft's appendix example, as published: parsed, and refused for its key.
    let vector = json!({
        "Signature-Agent": "agent2=\"https://signature-agent.test\"",
        "Signature-Input": "sig2=(\"@authority\" \"signature-agent\";key=\"agent2\");created=1735689600;keyid=\"poqkLGiymh_W0uP6PZFw-dvez3QJT5SolqXBCW38r0U\";alg=\"ed25519\";expires=4889289600;nonce=\"n9p433xm+NJ3ph3upfBIGmsuwHw387YV7Q/F+6BSpGCVjYCqQw6rznNA8PVVLySrAWsv0hQtFioQb6E1YsauiA==\";tag=\"web-bot-auth\"",
        "Signature": "sig2=:RdNFx5Bj6au3YgAMQL/RzmUlZE8QZLIaXGRpw985hWnwPfMxT228NMk6ehRS1PSl4e8PhbNZACSanGdhEwYCCg==:",
    });
    let v = app
        .check_request("https://example.com/path/to/resource", &vector)
        .await;
    assert_eq!(v["result"], "invalid", "{v}");
    assert!(
        v["reason"].as_str().unwrap().contains("published test keys"),
        "{v}"
    );
}

/// A crawler of example.com whose key signs by hand: its key, its kid, its issuer's
/// directory, and the time now (Unix seconds).
struct HandSigner {
    key: SigningKey,
    kid: String,
    directory: String,
    now: i64,
}

async fn hand_signer(app: &TestApp) -> HandSigner {
    let key = SigningKey::from_bytes(&rand::random::<[u8; 32]>());
    let public =
        json!({"kty": "OKP", "crv": "Ed25519", "x": URL_SAFE_NO_PAD.encode(key.verifying_key().as_bytes())});
    app.register(
        json!({"name": "crawler", "issuer_domain": "example.com", "scopes": ["read:docs"], "jwk": public}),
    )
    .await;
    let directory = format!("{}/v1/directories/example.com", app.base);
    HandSigner {
        key,
        kid: thumbprint(&public),
        directory,
        now: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64,
    }
}

/// Attack: a stream of signed requests, each a nonce the fleet remembers until its signature
/// expires (up to a day ahead). A deployment that sees no token requests must still forget
/// them once expired: checking a signature deletes the expired ones too.
#[actix_web::test]
async fn nonces_past_their_expiry_are_forgotten_by_signed_requests_too() {
    let app = spawn_app().await;
    let signer = hand_signer(&app).await;
    let count = "UPDATE client_assertions SET expires_at = expires_at";
    app.raw_execute("INSERT INTO client_assertions (key, expires_at) VALUES ('long-expired', 1000)")
        .await
        .unwrap();
    assert_eq!(app.raw_execute(count).await.unwrap(), 1);
    let v = app
        .check_request(
            "https://shop.example/",
            &signed_now(&signer.key, &signer.directory),
        )
        .await;
    assert_eq!(v["result"], "verified", "{v}");
    // The expired row went; the new nonce stays until its signature expires.
    assert_eq!(app.raw_execute(count).await.unwrap(), 1);
    let left = app
        .raw_execute("UPDATE client_assertions SET expires_at = expires_at WHERE key = 'long-expired'")
        .await
        .unwrap();
    assert_eq!(left, 0);
}

/// A GET of `url` signed by hand, for what `web-bot-auth` will not sign: `covered` (each
/// `@authority`, `signature-agent` or a header of `extra`) then the parameters `params`
/// (`;created=…;…`), naming `agent`; the headers made, with `extra`'s.
fn hand_signed(
    key: &SigningKey,
    url: &str,
    agent: &str,
    covered: &[&str],
    params: &str,
    extra: &[(&str, &str)],
) -> Value {
    use ed25519_dalek::Signer;
    let agent_field = format!("\"{agent}\"");
    let mut headers = json!({"Signature-Agent": agent_field});
    for (name, value) in extra {
        headers[*name] = json!(value);
    }
    let mut lines: Vec<String> = covered
        .iter()
        .map(|c| {
            let value = match *c {
                "@authority" => url.split('/').nth(2).unwrap().to_owned(),
                "signature-agent" => agent_field.clone(),
                h => extra
                    .iter()
                    .find(|(n, _)| n.eq_ignore_ascii_case(h))
                    .unwrap()
                    .1
                    .to_owned(),
            };
            format!("\"{c}\": {value}")
        })
        .collect();
    let list: Vec<String> = covered.iter().map(|c| format!("\"{c}\"")).collect();
    let input = format!("({}){params}", list.join(" "));
    lines.push(format!("\"@signature-params\": {input}"));
    let signature = key.sign(lines.join("\n").as_bytes());
    headers["Signature-Input"] = json!(format!("sig1={input}"));
    headers["Signature"] = json!(format!(
        "sig1=:{}:",
        base64::engine::general_purpose::STANDARD.encode(signature.to_bytes())
    ));
    headers
}

/// Attacks a signer can make by hand: a signature over too little (no `@authority`), a covered
/// header changed after signing, out of its time (expired, or made in the future), an HMAC
/// signature keyed with the agent's public key, and a key of one name's directory presented
/// under another's. Each is refused, with its reason; the same request signed
/// soundly passes.
#[actix_web::test]
async fn hand_made_signatures_that_cover_too_little_or_lie_are_refused() {
    use hmac::{Hmac, Mac};
    let app = spawn_app().await;
    let HandSigner {
        key,
        kid,
        directory,
        now,
    } = hand_signer(&app).await;
    let url = "https://shop.example/products/1";
    let params = |created: i64, expires: i64, alg: &str| {
        format!(
            ";created={created};expires={expires};keyid=\"{kid}\"{alg};nonce=\"{}\";tag=\"web-bot-auth\"",
            URL_SAFE_NO_PAD.encode(rand::random::<[u8; 16]>())
        )
    };
    let sound = ["@authority", "signature-agent"];
    let refused = |v: Value, why: &str| {
        assert_eq!(v["result"], "invalid", "{v}");
        assert!(v["reason"].as_str().unwrap().contains(why), "{why}: {v}");
    };

    let ok = hand_signed(&key, url, &directory, &sound, &params(now, now + 300, ""), &[]);
    assert_eq!(app.check_request(url, &ok).await["result"], "verified");
    // No @authority: good for any host.
    let anywhere = hand_signed(
        &key,
        url,
        &directory,
        &["signature-agent"],
        &params(now, now + 300, ""),
        &[],
    );
    refused(app.check_request(url, &anywhere).await, "@authority");
    // A covered header changed after signing.
    let covered = ["@authority", "signature-agent", "accept"];
    let mut changed = hand_signed(
        &key,
        url,
        &directory,
        &covered,
        &params(now, now + 300, ""),
        &[("Accept", "text/html")],
    );
    changed["Accept"] = json!("application/json");
    refused(app.check_request(url, &changed).await, "does not verify");
    // Expired; made in the future.
    let old = hand_signed(
        &key,
        url,
        &directory,
        &sound,
        &params(now - 600, now - 300, ""),
        &[],
    );
    refused(app.check_request(url, &old).await, "expired");
    let ahead = hand_signed(
        &key,
        url,
        &directory,
        &sound,
        &params(now + 600, now + 900, ""),
        &[],
    );
    refused(app.check_request(url, &ahead).await, "future");
    // HMAC, keyed with the agent's public key (which anyone can read in its directory).
    let input = format!(
        "(\"@authority\" \"signature-agent\"){}",
        params(now, now + 300, ";alg=\"hmac-sha256\"")
    );
    let base = format!(
        "\"@authority\": shop.example\n\"signature-agent\": \"{directory}\"\n\"@signature-params\": {input}"
    );
    let mut mac = Hmac::<Sha256>::new_from_slice(key.verifying_key().as_bytes()).unwrap();
    mac.update(base.as_bytes());
    let hmac = json!({
        "Signature-Agent": format!("\"{directory}\""),
        "Signature-Input": format!("sig1={input}"),
        "Signature": format!("sig1=:{}:", base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes())),
    });
    refused(app.check_request(url, &hmac).await, "alg");
    // A key of another directory (the agent of another name), presented under example.com's.
    let stranger = SigningKey::from_bytes(&rand::random::<[u8; 32]>());
    let theirs = json!({"kty": "OKP", "crv": "Ed25519", "x": URL_SAFE_NO_PAD.encode(stranger.verifying_key().as_bytes())});
    app.register(json!({"name": "x", "issuer_domain": "a.io", "scopes": ["read:docs"], "jwk": theirs}))
        .await;
    let their_kid = thumbprint(&theirs);
    let borrowed = hand_signed(
        &stranger,
        url,
        &directory,
        &sound,
        &params(now, now + 300, "").replace(&kid, &their_kid),
        &[],
    );
    refused(
        app.check_request(url, &borrowed).await,
        "no live agent of example.com",
    );
}

impl TestApp {
    /// Checks a GET of `https://shop.example/` signed as `headers`, trusting `agent`.
    async fn check_trusting(&self, agent: &str, headers: &Value) -> Value {
        let body = json!({"method": "GET", "url": "https://shop.example/", "headers": headers,
                          "trusted_signature_agents": [agent]});
        let res = self
            .post(
                "/v1/verify/request",
                Some(&self.org.keys.publishable_live),
                Some(&body),
            )
            .await;
        assert_eq!(res.status, 200, "{}", res.text());
        res.json()
    }
}

/// A third party's directory and the outbound client that reaches it: `bots.example` at
/// 127.0.0.1, served over TLS by the tests' own root.
struct ThirdParty {
    tls: crate::domains::Http,
    _dns: crate::dns::TestDns,
    outbound: agentid::engine::outbound::OutboundConfig,
}

impl ThirdParty {
    async fn start() -> ThirdParty {
        use crate::domains::{Http, Pki};
        let pki = Pki::new("bots.example");
        let tls = Http::start_tls(&pki);
        let dns = crate::dns::TestDns::start().await;
        dns.addr("bots.example", "127.0.0.1".parse().unwrap());
        let outbound = agentid::engine::outbound::OutboundConfig {
            dns_server: Some(dns.addr),
            extra_roots: vec![pki.root.clone()],
            https_port: tls.port,
            http_port: 80,
        };
        ThirdParty {
            tls,
            _dns: dns,
            outbound,
        }
    }

    /// A service that reaches it, on a loopback address: local directories allowed.
    async fn service(&self) -> TestApp {
        crate::helpers::spawn_app_with(crate::helpers::Options {
            tweak: Box::new(|c| c.engine.signed.allow_local_directories = true),
            outbound: self.outbound.clone(),
            ..crate::helpers::Options::default()
        })
        .await
    }

    /// Serves `body` as a directory.
    fn serves(&self, body: &str) {
        self.tls.answer(format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/http-message-signatures-directory+json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        ));
    }
}

/// A soundly signed GET of `https://shop.example/` by `key`, naming `agent`.
fn signed_now(key: &SigningKey, agent: &str) -> Value {
    let public =
        json!({"kty": "OKP", "crv": "Ed25519", "x": URL_SAFE_NO_PAD.encode(key.verifying_key().as_bytes())});
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let params = format!(
        ";created={now};expires={};keyid=\"{}\";nonce=\"{}\";tag=\"web-bot-auth\"",
        now + 300,
        thumbprint(&public),
        URL_SAFE_NO_PAD.encode(rand::random::<[u8; 16]>())
    );
    hand_signed(
        key,
        "https://shop.example/",
        agent,
        &["@authority", "signature-agent"],
        &params,
        &[],
    )
}

/// Attacks through the directories a receiver trusts: one whose name resolves to a private
/// address (never dialled), one of 10 MB, one of 10,000 keys, one of more keys than are read,
/// and one that never answers, which holds up only its own callers: a sound directory's check
/// meanwhile answers at once.
#[actix_web::test]
async fn hostile_directories_are_refused_and_hold_up_no_one() {
    let third = ThirdParty::start().await;
    let key = SigningKey::from_bytes(&rand::random::<[u8; 32]>());
    let public =
        json!({"kty": "OKP", "crv": "Ed25519", "x": URL_SAFE_NO_PAD.encode(key.verifying_key().as_bytes())});
    let sound = json!({"keys": [public]}).to_string();
    third.serves(&sound);
    let unverified = |v: Value, why: &str| {
        assert_eq!(v["result"], "unverified", "{v}");
        assert!(v["reason"].as_str().unwrap().contains(why), "{why}: {v}");
    };

    // The outbound rule as deployed: bots.example is at 127.0.0.1, so it is never asked.
    let strict = crate::helpers::spawn_app_with(crate::helpers::Options {
        outbound: third.outbound.clone(),
        ..crate::helpers::Options::default()
    })
    .await;
    let agent = "https://bots.example/private";
    unverified(
        strict.check_trusting(agent, &signed_now(&key, agent)).await,
        "not globally reachable",
    );
    assert_eq!(third.tls.hits(), 0);

    let app = third.service().await;
    // 10 MB.
    third.serves(&format!(
        "{{\"keys\": [{public}], \"pad\": \"{}\"}}",
        "x".repeat(10 << 20)
    ));
    let agent = "https://bots.example/big";
    unverified(
        app.check_trusting(agent, &signed_now(&key, agent)).await,
        "larger than",
    );
    // 10,000 keys (over the size bound as well), and 101 within it.
    let keys = |n: usize| {
        let many: Vec<Value> = (0..n).map(|_| keypair().1).chain([public.clone()]).collect();
        json!({ "keys": many }).to_string()
    };
    third.serves(&keys(10_000));
    let agent = "https://bots.example/ten-thousand";
    unverified(
        app.check_trusting(agent, &signed_now(&key, agent)).await,
        "larger than",
    );
    third.serves(&keys(100));
    let agent = "https://bots.example/hundred-and-one";
    unverified(
        app.check_trusting(agent, &signed_now(&key, agent)).await,
        "more than 100 keys",
    );

    // One that takes the connection and never answers, asked while a sound one is.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let slow = format!("http://{}/directory", silent.local_addr().unwrap());
    std::thread::spawn(move || {
        let held: Vec<_> = silent.incoming().take(2).collect();
        std::thread::sleep(std::time::Duration::from_secs(15));
        drop(held);
    });
    third.serves(&sound);
    let good = "https://bots.example/good";
    let timed = |agent: String, delay: u64| {
        let (app, key) = (&app, &key);
        async move {
            actix_web::rt::time::sleep(std::time::Duration::from_millis(delay)).await;
            let start = std::time::Instant::now();
            let v = app.check_trusting(&agent, &signed_now(key, &agent)).await;
            (v, start.elapsed())
        }
    };
    let ((late, waited), (fine, took)) =
        futures_util::future::join(timed(slow.clone(), 0), timed(good.into(), 500)).await;
    assert_eq!(fine["result"], "verified", "{fine}");
    assert!(
        took < std::time::Duration::from_secs(3),
        "held up by the silent one: {took:?}"
    );
    unverified(late, "timed out");
    assert!(waited < std::time::Duration::from_secs(10), "{waited:?}");
}

/// A third party's RSA key (RSASSA-PSS with SHA-512, as Web Bot Auth allows beside Ed25519):
/// a request Cloudflare's signer signed with it verifies against the trusted directory listing
/// it, and not under another key's thumbprint.
#[actix_web::test]
async fn a_third_partys_rsa_pss_key_verifies() {
    let third = ThirdParty::start().await;
    let app = third.service().await;
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = crate::readme::shell(
        dir.path(),
        r#"node -e 'const { privateKey } = require("node:crypto").generateKeyPairSync("rsa", { modulusLength: 2048 });
console.log(JSON.stringify({ ...privateKey.export({ format: "jwk" }), alg: "PS512" }))'"#,
    );
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let private: Value = serde_json::from_slice(&out.stdout).unwrap();
    let public = json!({"kty": "RSA", "n": private["n"], "e": private["e"]});
    let (_, ed25519) = keypair();
    third.serves(&json!({"keys": [public, ed25519]}).to_string());
    let agent = "https://bots.example/.well-known/http-message-signatures-directory";
    let headers = cloudflare_signs(&private, "https://shop.example/", agent, 300).await;
    let v = app.check_trusting(agent, &headers).await;
    assert_eq!(v["result"], "verified", "{v}");
    assert_eq!(v["keyid"], thumbprint(&public).as_str());
    assert!(headers["Signature-Input"]
        .as_str()
        .unwrap()
        .contains("rsa-pss-sha512"));
    // The same signature under the Ed25519 key's thumbprint: that key does not verify it.
    let mut lying = cloudflare_signs(&private, "https://shop.example/", agent, 300).await;
    let input = lying["Signature-Input"].as_str().unwrap().to_owned();
    let kid = thumbprint(&public);
    lying["Signature-Input"] = json!(input.replace(&kid, &thumbprint(&ed25519)));
    let v = app.check_trusting(agent, &lying).await;
    assert_eq!(v["result"], "invalid", "{v}");
}

/// Attack (on the name's next owner): a name whose agents were registered here, then let go,
/// stayed agentid's to judge for good. Its new owner's own directory at the well-known URL was
/// never fetched, and every request its bots signed was refused as "no live agent", even by a
/// receiver that trusted that directory. Only a holder's agents make the origin agentid's.
#[actix_web::test]
async fn a_name_let_go_is_its_next_owners_origin_to_serve() {
    let third = ThirdParty::start().await;
    let app = third.service().await;
    app.grant(&app.org.org_id, "bots.example", false).await.unwrap();
    let (_, public) = keypair();
    app.register(json!({"name": "old bot", "issuer_domain": "bots.example",
                        "scopes": ["read:docs"], "jwk": public}))
        .await;
    let agent_url = "https://bots.example/.well-known/http-message-signatures-directory";
    let key = SigningKey::from_bytes(&rand::random::<[u8; 32]>());
    let theirs =
        json!({"kty": "OKP", "crv": "Ed25519", "x": URL_SAFE_NO_PAD.encode(key.verifying_key().as_bytes())});
    third.serves(&json!({"keys": [theirs]}).to_string());
    // Held, the name's origin is agentid's: a key none of its agents has is refused.
    let v = app.check_trusting(agent_url, &signed_now(&key, agent_url)).await;
    assert_eq!(v["result"], "invalid", "{v}");
    assert_eq!(third.tls.hits(), 0);
    let released = app
        .client
        .delete(app.url("/v1/domains/bots.example"))
        .insert_header(("Authorization", format!("Bearer {}", app.secret())))
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(released.as_u16(), 204);
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await; // held found lately
    let v = app.check_trusting(agent_url, &signed_now(&key, agent_url)).await;
    assert_eq!(v["result"], "verified", "{v}");
}

/// Attack: a key written into an agent's row with database access alone (its thumbprint
/// beside it, as anyone computes) signs for nobody: the key file did not seal it.
#[actix_web::test]
async fn a_key_written_into_an_agents_row_signs_for_nobody() {
    let app = spawn_app().await;
    let (a, _) = crawler(&app).await;
    let agent = a["agent_id"].as_str().unwrap();
    let (private, public) = keypair();
    let jwk = format!(
        r#"{{"crv":"Ed25519","kty":"OKP","x":"{}"}}"#,
        public["x"].as_str().unwrap()
    );
    let forged = format!(
        "UPDATE agents SET jwk = '{jwk}', jkt = '{}' WHERE id = '{agent}'",
        thumbprint(&public)
    );
    assert_eq!(app.raw_execute(&forged).await.unwrap(), 1);
    let directory = format!("{}/v1/directories/example.com", app.base);
    let url = "https://shop.example/products/1";
    let headers = cloudflare_signs(&private, url, &directory, 300).await;
    let v = app.check_request(url, &headers).await;
    assert_ne!(v["result"], "verified", "a key written into the row signed: {v}");
}

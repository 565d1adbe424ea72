//! Signed requests (Web Bot Auth): an issuer's signature directory, and requests signed by
//! Cloudflare's `web-bot-auth` npm package (0.1.3, unmodified) checked online, with each way a
//! signed request should fail.

use std::path::Path;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use ed25519_dalek::SigningKey;
use serde_json::{json, Value};

use crate::dpop::thumbprint;
use crate::helpers::{spawn_app, Resp, TestApp};

/// Cloudflare's signer: signs a GET of `URL` with the JWK in `KEY`, and `AGENT` as its
/// Signature-Agent (a bare string, as 0.1.3 sends it), valid for `VALID` seconds; prints the
/// headers it made.
const SIGNER: &str = r#"
import { signatureHeaders } from "web-bot-auth";
import { signerFromJWK } from "web-bot-auth/crypto";
const agent = JSON.stringify(process.env.AGENT);
const request = new Request(process.env.URL, { headers: { "Signature-Agent": agent } });
const now = new Date();
const headers = await signatureHeaders(request, await signerFromJWK(JSON.parse(process.env.KEY)), {
  created: now,
  expires: new Date(now.getTime() + Number(process.env.VALID) * 1000),
});
console.log(JSON.stringify({ ...headers, "Signature-Agent": agent }));
"#;

/// An agent's Ed25519 key as a private JWK, and its public one.
fn keypair() -> (Value, Value) {
    let key = SigningKey::from_bytes(&rand::random::<[u8; 32]>());
    let x = URL_SAFE_NO_PAD.encode(key.verifying_key().as_bytes());
    let public = json!({"kty": "OKP", "crv": "Ed25519", "x": x});
    let private =
        json!({"kty": "OKP", "crv": "Ed25519", "x": x, "d": URL_SAFE_NO_PAD.encode(key.to_bytes())});
    (private, public)
}

/// The headers `web-bot-auth` makes for a GET of `url` signed with `key`, naming `agent`.
async fn cloudflare_signs(key: &Value, url: &str, agent: &str, valid: u32) -> Value {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("sign.mjs"), SIGNER).unwrap();
    let modules = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/offline/node_modules");
    std::os::unix::fs::symlink(modules, dir.path().join("node_modules")).unwrap();
    let mut cmd = crate::readme::shell(dir.path(), "node sign.mjs");
    cmd.env("KEY", key.to_string())
        .env("URL", url)
        .env("AGENT", agent)
        .env("VALID", valid.to_string());
    let out = tokio::task::spawn_blocking(move || cmd.output().unwrap())
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "web-bot-auth: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

impl TestApp {
    async fn check_request(&self, url: &str, headers: &Value) -> Value {
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

    async fn directory(&self, domain: &str, etag: Option<&str>) -> Resp {
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

    // The form: a relative URL, a missing method, too many fields.
    for bad in [
        json!({"method": "GET", "url": "/x", "headers": {}}),
        json!({"url": url, "headers": {}}),
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
    let servers = crate::readme::only_block("An issuer's signature directory", "nginx")
        .replace("127.0.0.1:8080", app.base.trim_start_matches("http://"))
        .replace("listen 8000;", &format!("listen 127.0.0.1:{port};"));
    let dir = tempfile::tempdir().unwrap();
    let _nginx = crate::gateways::nginx_serving(dir.path(), &servers, port).await;
    let res = crate::helpers::read(
        app.client
            .get(format!(
                "http://127.0.0.1:{port}/.well-known/http-message-signatures-directory"
            ))
            .send()
            .await
            .unwrap(),
    )
    .await;
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
    let (private, public) = keypair();
    let a = app
        .register(json!({"name": "crawler", "issuer_domain": "example.com", "scopes": ["read:docs"], "jwk": public}))
        .await;
    let directory = format!("{}/v1/directories/example.com", app.base);
    let url = "https://shop.example/products/1";
    let gate = |query: &'static str, signed: Value| {
        let app = &app;
        async move {
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
    };
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
/// key, whose private half everyone has) would let anyone sign as it.
#[actix_web::test]
async fn the_rfc_9421_test_key_binds_no_agent() {
    let app = spawn_app().await;
    let res = app
        .post(
            "/v1/agents/register",
            Some(app.secret()),
            Some(&json!({"name": "copycat", "issuer_domain": "example.com", "scopes": ["read:docs"],
                         "jwk": {"kty": "OKP", "crv": "Ed25519", "x": "JrQLj5P_89iXES9-vFgrIy29clF9CC_oPPsw3c5D0bs"}})),
        )
        .await;
    let body = res.assert_error(400, "VALIDATION_ERROR");
    assert!(
        body["error"]["message"].as_str().unwrap().contains("RFC 9421"),
        "{body}"
    );
}

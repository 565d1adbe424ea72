//! Tokens bound to a key (DPoP): proofs made by panva's `dpop` (the docs' agent_dpop.mjs, with
//! Ed25519 and ES256 keys) pass `verify_dpop` and the tower layer, once; every forged, foreign,
//! stale or replayed proof, and a bound token sent as a bearer token, is refused.

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

use agentid_verifier::Verifier;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use ed25519_dalek::{Signer as _, SigningKey};
use ring::rand::SystemRandom;
use ring::signature::{EcdsaKeyPair, KeyPair as _, ECDSA_P256_SHA256_FIXED_SIGNING};
use serde_json::{json, Value};

use super::{code, now, Server};

pub(super) const URL: &str = "https://api.example/orders";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The docs' `agent_dpop.mjs`, in a folder of its own with the stock modules.
struct Panva {
    dir: PathBuf,
    alg: &'static str,
}

impl Panva {
    fn new(alg: &'static str) -> Panva {
        let modules = root().join("tests/offline/node_modules");
        if !modules.join("dpop").exists() {
            let ok = Command::new("npm")
                .args(["ci", "--no-audit", "--no-fund", "--loglevel=error", "--prefix"])
                .arg(root().join("tests/offline"))
                .status()
                .expect("npm");
            assert!(ok.success(), "npm ci --prefix tests/offline");
        }
        let page = std::fs::read_to_string(root().join("docs/receivers.md")).unwrap();
        let snippet = page
            .split("```js\n")
            .filter_map(|b| b.split("```").next())
            .find(|b| b.starts_with("// agent_dpop.mjs: "))
            .expect("docs/receivers.md shows agent_dpop.mjs");
        // A folder of its own: the tests run in parallel, in one process.
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("agentid-rs-dpop-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("agent_dpop.mjs"), snippet).unwrap();
        std::os::unix::fs::symlink(&modules, dir.join("node_modules")).unwrap();
        Panva { dir, alg }
    }

    fn run(&self, args: &[&str], token: &str) -> String {
        let out = Command::new("node")
            .arg("agent_dpop.mjs")
            .args(args)
            .current_dir(&self.dir)
            .env("DPOP_ALG", self.alg)
            .env("TOKEN", token)
            .output()
            .expect("node");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    }

    fn jwk(&self) -> Value {
        serde_json::from_str(&self.run(&["jwk"], "")).unwrap()
    }

    fn proof(&self, token: &str, method: &str) -> String {
        self.run(&["proof", method, URL], token)
    }
}

impl Drop for Panva {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn b64(v: &Value) -> String {
    URL_SAFE_NO_PAD.encode(serde_json::to_vec(v).unwrap())
}

/// An agent that makes proofs with any header and claims it likes.
pub(super) enum Agent {
    Ed(SigningKey),
    Es(EcdsaKeyPair),
}

impl Agent {
    pub(super) fn ed() -> Agent {
        let mut seed = [0u8; 32];
        ring::rand::SecureRandom::fill(&SystemRandom::new(), &mut seed).unwrap();
        Agent::Ed(SigningKey::from_bytes(&seed))
    }

    fn ed_from(seed: u8) -> Agent {
        Agent::Ed(SigningKey::from_bytes(&[seed; 32]))
    }

    fn es() -> Agent {
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
        Agent::Es(EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng).unwrap())
    }

    pub(super) fn jwk(&self) -> Value {
        match self {
            Agent::Ed(k) => {
                json!({"kty": "OKP", "crv": "Ed25519", "x": URL_SAFE_NO_PAD.encode(k.verifying_key().as_bytes())})
            }
            Agent::Es(k) => {
                let p = k.public_key().as_ref();
                json!({"kty": "EC", "crv": "P-256", "x": URL_SAFE_NO_PAD.encode(&p[1..33]), "y": URL_SAFE_NO_PAD.encode(&p[33..])})
            }
        }
    }

    fn alg(&self) -> &'static str {
        match self {
            Agent::Ed(_) => "EdDSA",
            Agent::Es(_) => "ES256",
        }
    }

    /// A proof for `GET URL` with `token`, its header and claims changed by `edit`.
    pub(super) fn proof_with(&self, token: &str, edit: impl FnOnce(&mut Value, &mut Value)) -> String {
        let ath = URL_SAFE_NO_PAD.encode(ring::digest::digest(&ring::digest::SHA256, token.as_bytes()));
        let mut header = json!({"typ": "dpop+jwt", "alg": self.alg(), "jwk": self.jwk()});
        let mut claims = json!({"jti": format!("{}-{}", now(), rand_id()), "htm": "GET", "htu": URL,
                                "iat": now(), "ath": ath});
        edit(&mut header, &mut claims);
        let input = format!("{}.{}", b64(&header), b64(&claims));
        let sig = match self {
            Agent::Ed(k) => k.sign(input.as_bytes()).to_bytes().to_vec(),
            Agent::Es(k) => k
                .sign(&SystemRandom::new(), input.as_bytes())
                .unwrap()
                .as_ref()
                .to_vec(),
        };
        format!("{input}.{}", URL_SAFE_NO_PAD.encode(sig))
    }

    fn proof(&self, token: &str) -> String {
        self.proof_with(token, |_, _| {})
    }
}

fn rand_id() -> u64 {
    let mut b = [0u8; 8];
    ring::rand::SecureRandom::fill(&SystemRandom::new(), &mut b).unwrap();
    u64::from_le_bytes(b)
}

pub(super) fn bound(s: &Server, jwk: Value) -> (String, String) {
    s.register(json!({ "jwk": jwk }))
}

#[tokio::test(flavor = "current_thread")]
async fn panva_proofs_pass_once_offline_and_online() {
    let s = Server::start();
    let v = Verifier::builder(&s.base).allow_local(true).build().unwrap();
    for alg in ["Ed25519", "ES256"] {
        let agent = Panva::new(alg);
        let (id, token) = bound(&s, agent.jwk());
        let proof = agent.proof(&token, "GET");
        let got = v
            .verify_dpop(&token, Some(&proof), "GET", URL, &[])
            .await
            .unwrap();
        assert_eq!(got.agent_id, id);
        assert_eq!(
            code(v.verify_dpop(&token, Some(&proof), "GET", URL, &[]).await),
            "PROOF_REPLAYED"
        );
        let answer = s.call(
            "POST",
            "/v1/verify",
            Some(json!({"token": token, "dpop": agent.proof(&token, "GET"), "htm": "GET", "htu": URL})),
            None,
        );
        assert_eq!(answer["valid"], true, "{answer}");
        assert!(answer["cnf"]["jkt"].is_string());
        // A bound token alone is worth nothing, offline or online.
        assert_eq!(code(v.verify(&token).await), "PROOF_INVALID");
        assert_eq!(code(v.verify_online(&token, None, &[]).await), "PROOF_INVALID");
        assert_eq!(
            code(v.verify_dpop(&token, None, "GET", URL, &[]).await),
            "PROOF_INVALID"
        );
    }
}

#[tokio::test(flavor = "current_thread")]
async fn forged_foreign_stale_and_oversized_proofs_are_refused() {
    let s = Server::start();
    let v = Verifier::builder(&s.base).allow_local(true).build().unwrap();
    let (agent, thief, es) = (Agent::ed(), Agent::ed_from(3), Agent::es());
    let (_, token) = bound(&s, agent.jwk());
    let (_, other) = bound(&s, agent.jwk());
    let (_, es_token) = bound(&s, es.jwk());
    let (_, bearer) = s.register(json!({}));
    let mut private = agent.jwk();
    private["d"] = json!(URL_SAFE_NO_PAD.encode([1u8; 32]));
    let late = now() as i64 - 600;
    let early = now() as i64 + 600;
    let unsigned = format!(
        "{}.{}.",
        b64(&json!({"typ": "dpop+jwt", "alg": "none", "jwk": agent.jwk()})),
        agent.proof(&token).split('.').nth(1).unwrap()
    );
    let cases: Vec<(&str, &str, String)> = vec![
        (
            "another method",
            &token,
            agent.proof_with(&token, |_, c| c["htm"] = json!("POST")),
        ),
        (
            "another URL",
            &token,
            agent.proof_with(&token, |_, c| c["htu"] = json!("https://api.example/admin")),
        ),
        ("another token", &token, agent.proof(&other)),
        ("the thief's key", &token, thief.proof(&token)),
        (
            "another key in jwk",
            &token,
            agent.proof_with(&token, |h, _| h["jwk"] = thief.jwk()),
        ),
        ("alg none", &token, unsigned),
        (
            "HS256",
            &token,
            agent.proof_with(&token, |h, _| h["alg"] = json!("HS256")),
        ),
        (
            "ES256 over an Ed25519 key",
            &token,
            es.proof_with(&token, |h, _| h["jwk"] = agent.jwk()),
        ),
        (
            "a private jwk",
            &token,
            agent.proof_with(&token, |h, _| h["jwk"] = private.clone()),
        ),
        (
            "typ JWT",
            &token,
            agent.proof_with(&token, |h, _| h["typ"] = json!("JWT")),
        ),
        (
            "10 minutes late",
            &token,
            agent.proof_with(&token, |_, c| c["iat"] = json!(late)),
        ),
        (
            "10 minutes early",
            &token,
            agent.proof_with(&token, |_, c| c["iat"] = json!(early)),
        ),
        ("64 KiB", &token, "e".repeat(64 * 1024)),
        (
            "an ES256-bound token, an Ed25519 proof",
            &es_token,
            agent.proof(&es_token),
        ),
        ("a bearer token with a proof", &bearer, agent.proof(&bearer)),
    ];
    for (what, tok, proof) in &cases {
        assert_eq!(
            code(v.verify_dpop(tok, Some(proof), "GET", URL, &[]).await),
            "PROOF_INVALID",
            "{what}"
        );
    }
    let query = format!("{URL}?page=2");
    assert_eq!(
        code(
            v.verify_dpop(&token, Some(&agent.proof(&token)), "GET", &query, &[])
                .await
        ),
        "ok"
    );
    assert_eq!(
        code(
            v.verify_dpop(&es_token, Some(&es.proof(&es_token)), "GET", URL, &[])
                .await
        ),
        "ok"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn a_revoked_agent_is_revoked_whatever_its_proof() {
    let s = Server::start();
    let v = Verifier::builder(&s.base).allow_local(true).build().unwrap();
    let agent = Agent::ed_from(9);
    let (id, token) = bound(&s, agent.jwk());
    v.verify_dpop(&token, Some(&agent.proof(&token)), "GET", URL, &[])
        .await
        .unwrap();
    s.call("POST", &format!("/v1/agents/{id}/revoke"), None, None);
    // The status list's ttl; then the stale list answers once more while it refreshes.
    tokio::time::sleep(std::time::Duration::from_millis(2500)).await;
    let (v, agent, token) = (&v, &agent, &token);
    let check = || async move {
        code(
            v.verify_dpop(token, Some(&agent.proof(token)), "GET", URL, &[])
                .await,
        )
    };
    super::until("TOKEN_REVOKED", std::time::Duration::from_secs(2), check).await;
}

#[cfg(feature = "tower")]
#[tokio::test(flavor = "current_thread")]
async fn the_tower_layer_takes_dpop_and_refuses_as_rfc_9449_says() {
    use agentid_verifier::tower::AgentIdLayer;
    use tower_layer::Layer;
    use tower_service::Service;

    use super::ECHO;

    let s = Server::start();
    let v = Verifier::builder(&s.base).allow_local(true).build().unwrap();
    let agent = Panva::new("ES256");
    let (id, token) = bound(&s, agent.jwk());
    let call = |uri: &str, headers: Vec<(&str, String)>, origin: Option<&str>| {
        let mut layer = AgentIdLayer::new(v.clone(), &[]);
        if let Some(o) = origin {
            layer = layer.public_origin(o);
        }
        let mut svc = layer.layer(ECHO);
        let mut req = http::Request::builder().uri(uri);
        for (k, val) in headers {
            req = req.header(k, val);
        }
        let req = req.body(()).unwrap();
        async move { svc.call(req).await.unwrap() }
    };
    let proof = agent.proof(&token, "GET");
    let dpop = |p: &str| vec![("Authorization", format!("DPoP {token}")), ("DPoP", p.to_owned())];
    let origin = Some("https://api.example");
    // Without a public origin, no bound token passes.
    let blind = call("/orders", dpop(&proof), None).await;
    assert_eq!(blind.status(), 401);
    let said = blind.headers()["www-authenticate"].to_str().unwrap().to_owned();
    assert!(
        said.starts_with("DPoP error=\"invalid_token\", error_description=")
            && said.contains("public_origin"),
        "{said}"
    );
    let ok = call("/orders?page=1", dpop(&proof), origin).await;
    assert_eq!((ok.status().as_u16(), ok.body().as_str()), (200, id.as_str()));
    let refused = |res: http::Response<String>, error: &str, challenge: &str| {
        assert_eq!(res.status(), 401);
        let body: serde_json::Value = serde_json::from_str(res.body()).unwrap();
        assert_eq!(body["error"], error, "{body}");
        assert!(body["message"].as_str().is_some_and(|m| !m.is_empty()), "{body}");
        assert_eq!(body.as_object().unwrap().len(), 2, "{body}");
        let got = res.headers()["www-authenticate"].to_str().unwrap().to_owned();
        assert!(got.starts_with(&format!("DPoP error=\"{challenge}\"")), "{got}");
    };
    refused(
        call(URL, dpop(&proof), origin).await,
        "PROOF_REPLAYED",
        "invalid_dpop_proof",
    );
    refused(
        call(URL, vec![("Authorization", format!("DPoP {token}"))], origin).await,
        "PROOF_INVALID",
        "invalid_dpop_proof",
    );
    refused(
        call(URL, vec![("Authorization", format!("Bearer {token}"))], origin).await,
        "PROOF_INVALID",
        "invalid_token",
    );
    refused(
        call(URL, dpop(&agent.proof(&token, "POST")), origin).await,
        "PROOF_INVALID",
        "invalid_dpop_proof",
    );
    // The URL is the public origin and the request's path, whatever the request's host.
    let inside = |p: &str| {
        let mut h = dpop(p);
        h.push(("Host", "10.0.0.7:8080".to_owned()));
        h
    };
    let ok = call("/orders", inside(&agent.proof(&token, "GET")), origin).await;
    assert_eq!(ok.status(), 200);
    // Attack: a proof made for receiver A, sent to receiver B with A's host, or with an
    // absolute-form target naming A.
    let for_a = |p: String| {
        let mut h = dpop(&p);
        h.push(("Host", "shop-a.example".to_owned()));
        h.push(("X-Forwarded-Host", "shop-a.example".to_owned()));
        h
    };
    for uri in ["/orders", "https://shop-a.example/orders"] {
        let proof = agent.run(&["proof", "GET", "https://shop-a.example/orders"], &token);
        refused(
            call(uri, for_a(proof), Some("https://shop-b.example")).await,
            "PROOF_INVALID",
            "invalid_dpop_proof",
        );
    }
    // A receiver that named no origin would have rebuilt A's URL from the request.
    let proof = agent.run(&["proof", "GET", "http://shop-a.example/orders"], &token);
    refused(
        call("/orders", for_a(proof), None).await,
        "TOKEN_INVALID",
        "invalid_token",
    );
}

/// Proofs that say they expired, are not valid yet, or name an extension nobody here
/// understands (`crit`), are refused.
#[tokio::test(flavor = "current_thread")]
async fn proofs_that_expired_or_name_critical_extensions_are_refused() {
    let s = Server::start();
    let v = Verifier::builder(&s.base).allow_local(true).build().unwrap();
    let agent = Agent::ed();
    let (_, token) = bound(&s, agent.jwk());
    let now = now() as i64;
    for (name, edit) in [
        ("exp", json!(now - 1)),
        ("nbf", json!(now + 120)),
        ("crit", json!(["x-ext"])),
    ] {
        let proof = agent.proof_with(&token, |header, claims| {
            if name == "crit" {
                header[name] = edit;
                header["x-ext"] = json!(1);
            } else {
                claims[name] = edit;
            }
        });
        let refused = v.verify_dpop(&token, Some(&proof), "GET", URL, &[]).await;
        assert_eq!(code(refused), "PROOF_INVALID", "{name}");
    }
    let fine = agent.proof_with(&token, |_, claims| claims["exp"] = json!(now + 60));
    assert_eq!(
        code(v.verify_dpop(&token, Some(&fine), "GET", URL, &[]).await),
        "ok"
    );
}

/// Attack: a proof whose jwk's kty carries a newline, an escape sequence, a C1 control and a
/// right-to-left override, which the refusal's reason names: the hook hears them escaped.
#[tokio::test(flavor = "current_thread")]
async fn the_refusal_hook_hears_no_raw_controls() {
    let s = Server::start();
    let heard = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let into = heard.clone();
    let v = Verifier::builder(&s.base)
        .allow_local(true)
        .on_refusal(move |_, reason| into.lock().unwrap().push(reason.to_owned()))
        .build()
        .unwrap();
    let agent = Agent::ed();
    let (_, token) = bound(&s, agent.jwk());
    let proof = agent.proof_with(&token, |header, _| {
        header["jwk"]["kty"] = json!("OKP\n\u{1b}[2J\u{9b}31m\u{202e}txt.exe");
    });
    assert_eq!(
        code(v.verify_dpop(&token, Some(&proof), "GET", URL, &[]).await),
        "PROOF_INVALID"
    );
    let heard = heard.lock().unwrap();
    assert!(heard[0].contains("\\u{001b}"), "{heard:?}");
    assert!(
        !heard[0].chars().any(|c| "\n\u{1b}\u{9b}\u{202e}".contains(c)),
        "{heard:?}"
    );
}

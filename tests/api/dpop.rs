//! Tokens bound to a key (DPoP, RFC 9449): binding at registration and issue, the proof
//! checked online by `POST /v1/verify`, and every way a stolen token or a forged, foreign or
//! replayed proof could try to pass.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use ed25519_dalek::{Signer, SigningKey};
use ring::rand::SystemRandom;
use ring::signature::{EcdsaKeyPair, KeyPair, ECDSA_P256_SHA256_FIXED_SIGNING};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::helpers::{spawn_app, spawn_app_with, Options, Resp, TestApp};

const HTU: &str = "https://api.example/orders";

/// An agent's key pair, as an agent would hold it.
pub(crate) enum AgentKey {
    Ed(SigningKey),
    Es(EcdsaKeyPair),
}

pub(crate) fn b64(v: &Value) -> String {
    URL_SAFE_NO_PAD.encode(serde_json::to_vec(v).unwrap())
}

pub(crate) fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

impl AgentKey {
    pub(crate) fn ed() -> Self {
        AgentKey::Ed(SigningKey::from_bytes(&rand::random::<[u8; 32]>()))
    }

    pub(crate) fn es() -> Self {
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
        AgentKey::Es(
            EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng).unwrap(),
        )
    }

    pub(crate) fn jwk(&self) -> Value {
        match self {
            AgentKey::Ed(k) => json!({"kty": "OKP", "crv": "Ed25519",
                                      "x": URL_SAFE_NO_PAD.encode(k.verifying_key().as_bytes())}),
            AgentKey::Es(k) => {
                let p = k.public_key().as_ref();
                json!({"kty": "EC", "crv": "P-256", "x": URL_SAFE_NO_PAD.encode(&p[1..33]),
                       "y": URL_SAFE_NO_PAD.encode(&p[33..])})
            }
        }
    }

    pub(crate) fn alg(&self) -> &'static str {
        match self {
            AgentKey::Ed(_) => "EdDSA",
            AgentKey::Es(_) => "ES256",
        }
    }

    pub(crate) fn sign(&self, input: &str) -> Vec<u8> {
        match self {
            AgentKey::Ed(k) => k.sign(input.as_bytes()).to_bytes().to_vec(),
            AgentKey::Es(k) => k
                .sign(&SystemRandom::new(), input.as_bytes())
                .unwrap()
                .as_ref()
                .to_vec(),
        }
    }

    /// A proof with this header and these claims, signed with this key.
    pub(crate) fn proof_with(&self, header: &Value, claims: &Value) -> String {
        let input = format!("{}.{}", b64(header), b64(claims));
        let sig = self.sign(&input);
        format!("{input}.{}", URL_SAFE_NO_PAD.encode(sig))
    }

    pub(crate) fn header(&self) -> Value {
        json!({"typ": "dpop+jwt", "alg": self.alg(), "jwk": self.jwk()})
    }

    /// A fresh proof for `GET HTU` with `token`.
    fn proof(&self, token: &str) -> String {
        self.proof_with(&self.header(), &claims(token))
    }
}

fn claims(token: &str) -> Value {
    json!({"jti": ulid::Ulid::new().to_string(), "htm": "GET", "htu": HTU, "iat": now(),
           "ath": URL_SAFE_NO_PAD.encode(Sha256::digest(token.as_bytes()))})
}

pub(crate) fn thumbprint(jwk: &Value) -> String {
    let canonical = match jwk["kty"].as_str().unwrap() {
        "OKP" => format!(
            r#"{{"crv":"Ed25519","kty":"OKP","x":"{}"}}"#,
            jwk["x"].as_str().unwrap()
        ),
        "RSA" => format!(
            r#"{{"e":"{}","kty":"RSA","n":"{}"}}"#,
            jwk["e"].as_str().unwrap(),
            jwk["n"].as_str().unwrap()
        ),
        _ => format!(
            r#"{{"crv":"P-256","kty":"EC","x":"{}","y":"{}"}}"#,
            jwk["x"].as_str().unwrap(),
            jwk["y"].as_str().unwrap()
        ),
    };
    URL_SAFE_NO_PAD.encode(Sha256::digest(canonical.as_bytes()))
}

pub(crate) fn payload(token: &str) -> Value {
    serde_json::from_slice(&URL_SAFE_NO_PAD.decode(token.split('.').nth(1).unwrap()).unwrap()).unwrap()
}

/// A bound agent: its id, token and key.
pub(crate) async fn bound(app: &TestApp, key: &AgentKey) -> (String, String) {
    let a = app
        .register(
            json!({"name": "bot", "issuer_domain": "example.com", "scopes": ["read:docs"],
                         "jwk": key.jwk()}),
        )
        .await;
    (
        a["agent_id"].as_str().unwrap().to_owned(),
        a["token"].as_str().unwrap().to_owned(),
    )
}

async fn check(app: &TestApp, body: Value) -> Resp {
    app.post("/v1/verify", None, Some(&body)).await
}

async fn answer(app: &TestApp, token: &str, proof: Option<&str>) -> Value {
    let mut body = json!({"token": token, "htm": "GET", "htu": HTU});
    if let Some(p) = proof {
        body["dpop"] = json!(p);
    }
    let res = check(app, body).await;
    assert_eq!(res.status, 200, "{}", res.text());
    res.json()
}

#[actix_web::test]
async fn tokens_are_bound_to_the_key_given_at_registration_or_issue() {
    let app = spawn_app().await;
    let ed = AgentKey::ed();
    let (id, token) = bound(&app, &ed).await;
    let jkt = thumbprint(&ed.jwk());
    assert_eq!(payload(&token)["cnf"], json!({"jkt": jkt}));
    let agent = |app: &TestApp| {
        let path = format!("/v1/agents/{id}");
        let (app, key) = (app.url(&path), app.secret().to_owned());
        async move {
            let res = crate::helpers::client()
                .get(app)
                .insert_header(("Authorization", format!("Bearer {key}")))
                .send()
                .await
                .unwrap();
            crate::helpers::read(res).await.json()
        }
    };
    assert_eq!(agent(&app).await["jkt"], jkt.as_str());

    // A new token bound to another key; one without a key named stays bound to it; then,
    // asked for by name, a bearer token: the agent shows its newest binding.
    let es = AgentKey::es();
    let issue = |body: Option<Value>| {
        let path = format!("/v1/agents/{id}/issue-token");
        let app = &app;
        async move { app.post(&path, Some(app.secret()), body.as_ref()).await }
    };
    let res = issue(Some(json!({"jwk": es.jwk()}))).await;
    assert_eq!(res.status, 201, "{}", res.text());
    let es_token = res.json()["token"].as_str().unwrap().to_owned();
    assert_eq!(payload(&es_token)["cnf"]["jkt"], thumbprint(&es.jwk()).as_str());
    assert_eq!(agent(&app).await["jkt"], thumbprint(&es.jwk()).as_str());
    for body in [None, Some(json!({}))] {
        let res = issue(body).await;
        assert_eq!(res.status, 201, "{}", res.text());
        let same = res.json()["token"].as_str().unwrap().to_owned();
        assert_eq!(payload(&same)["cnf"]["jkt"], thumbprint(&es.jwk()).as_str());
        assert_eq!(agent(&app).await["jkt"], thumbprint(&es.jwk()).as_str());
    }
    let res = issue(Some(json!({"jwk": null}))).await;
    assert_eq!(res.status, 201, "{}", res.text());
    let bearer = res.json()["token"].as_str().unwrap().to_owned();
    assert!(payload(&bearer).get("cnf").is_none());
    assert_eq!(agent(&app).await["jkt"], Value::Null);

    // Each token keeps its own binding; GET verify shows it, and the receiver must then ask
    // for a proof.
    let got = app.verify(&token).await;
    assert_eq!(
        (got["valid"].clone(), got["cnf"].clone()),
        (json!(true), json!({"jkt": jkt}))
    );
    assert!(app.verify(&bearer).await.get("cnf").is_none());
    // RFC 8037's example key binds as its thumbprint says.
    let rfc = json!({"kty": "OKP", "crv": "Ed25519", "x": "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"});
    let res = issue(Some(json!({"jwk": rfc}))).await;
    assert_eq!(
        payload(res.json()["token"].as_str().unwrap())["cnf"]["jkt"],
        "kPrK_qmxVWaYVA9wwBF6Iuo3vVzz7TxHCTwXBygrS4k"
    );
}

#[actix_web::test]
async fn private_foreign_and_malformed_keys_are_validation_errors() {
    let app = spawn_app().await;
    let (id, _) = app.agent().await;
    let x = "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo";
    for jwk in [
        json!({"kty": "OKP", "crv": "Ed25519", "x": x, "d": x}),
        json!({"kty": "EC", "crv": "P-256", "x": x, "y": x, "d": x}),
        json!({"kty": "RSA", "n": "AQAB", "e": "AQAB"}),
        json!({"kty": "EC", "crv": "P-384", "x": x, "y": x}),
        // Coordinates of the right length, of no point of the curve.
        json!({"kty": "EC", "crv": "P-256", "x": x, "y": x}),
        json!({"kty": "OKP", "crv": "X25519", "x": x}),
        json!({"kty": "oct", "k": "c2VjcmV0"}),
        json!({"kty": "OKP", "crv": "Ed25519", "x": "not base64url!"}),
        json!({"kty": "OKP", "crv": "Ed25519"}),
        json!("a string"),
        json!(7),
    ] {
        let res = app
            .post(
                "/v1/agents/register",
                Some(app.secret()),
                Some(&json!({"name": "b", "issuer_domain": "example.com", "scopes": ["read:x"], "jwk": jwk})),
            )
            .await;
        let body = res.assert_error(400, "VALIDATION_ERROR");
        assert!(
            body["error"]["message"].as_str().unwrap().starts_with("jwk"),
            "{jwk}: {body}"
        );
        let res = app
            .post(
                &format!("/v1/agents/{id}/issue-token"),
                Some(app.secret()),
                Some(&json!({"jwk": jwk})),
            )
            .await;
        res.assert_error(400, "VALIDATION_ERROR");
    }
    let res = app
        .post(
            &format!("/v1/agents/{id}/issue-token"),
            Some(app.secret()),
            Some(&json!({"other": 1})),
        )
        .await;
    res.assert_error(400, "VALIDATION_ERROR");
}

#[actix_web::test]
async fn a_bound_token_passes_online_only_with_a_fresh_proof_by_its_key() {
    let app = spawn_app().await;
    for key in [AgentKey::ed(), AgentKey::es()] {
        let (id, token) = bound(&app, &key).await;
        let got = answer(&app, &token, Some(&key.proof(&token))).await;
        assert_eq!(got["valid"], true, "{got}");
        assert_eq!(got["agent_id"], id.as_str());
        assert_eq!(got["cnf"]["jkt"], thumbprint(&key.jwk()).as_str());
        // A query on the request's URL is not compared.
        let mut c = claims(&token);
        c["htu"] = json!(format!("{HTU}?page=2"));
        let got = answer(&app, &token, Some(&key.proof_with(&key.header(), &c))).await;
        assert_eq!(got["valid"], true, "{got}");
        // Nor how the URL is written (RFC 9449 §4.3: compared after RFC 3986's normalization):
        // the receiver's default port, the signer's case and percent-encoding.
        c["jti"] = json!(ulid::Ulid::new().to_string());
        c["htu"] = json!("HTTPS://API.Example/%6Frders");
        let proof = key.proof_with(&key.header(), &c);
        let body =
            json!({"token": token, "dpop": proof, "htm": "GET", "htu": "https://api.example:443/orders"});
        let got = check(&app, body).await.json();
        assert_eq!(got["valid"], true, "{got}");
    }
    // A bearer token without a proof passes as with GET.
    let (_, bearer) = app.agent().await;
    let res = check(&app, json!({"token": bearer})).await;
    assert_eq!(res.json()["valid"], true);
    assert_eq!(res.header("cache-control").as_deref(), Some("no-store"));
    res.assert_rate_limit_headers("POST /v1/verify");
}

/// Each refusal is one audit record, whose reason names the part that failed.
#[actix_web::test]
async fn stolen_tokens_and_bad_proofs_are_refused_and_recorded() {
    let app = spawn_app().await;
    let key = AgentKey::ed();
    let (_, token) = bound(&app, &key).await;
    let (_, other_token) = bound(&app, &key).await;
    let (_, bearer) = app.agent().await;
    let thief = AgentKey::ed();
    let es = AgentKey::es();
    let (_, es_token) = bound(&app, &es).await;
    let with = |k: &str, v: Value| {
        let mut c = claims(&token);
        c[k] = v;
        key.proof_with(&key.header(), &c)
    };
    let header = |h: Value| key.proof_with(&h, &claims(&token));
    let mut private = key.jwk();
    private["d"] = json!(URL_SAFE_NO_PAD.encode([1u8; 32]));
    let unsigned = format!(
        "{}.{}.",
        b64(&json!({"typ": "dpop+jwt", "alg": "none", "jwk": key.jwk()})),
        b64(&claims(&token))
    );
    let cases: Vec<(&str, Value, &str)> = vec![
        // A stolen token, alone or with a proof by the thief's own key.
        ("alone", json!({"token": token}), "missing"),
        (
            "thief",
            json!({"token": token, "dpop": thief.proof(&token), "htm": "GET", "htu": HTU}),
            "key other than",
        ),
        (
            "bearer with proof",
            json!({"token": bearer, "dpop": key.proof(&bearer), "htm": "GET", "htu": HTU}),
            "not bound",
        ),
        // A proof for another method, URL or token.
        (
            "method",
            json!({"token": token, "dpop": key.proof(&token), "htm": "POST", "htu": HTU}),
            "htm",
        ),
        (
            "url",
            json!({"token": token, "dpop": key.proof(&token), "htm": "GET", "htu": "https://api.example/admin"}),
            "htu",
        ),
        (
            "token",
            json!({"token": token, "dpop": key.proof(&other_token), "htm": "GET", "htu": HTU}),
            "ath",
        ),
        (
            "claim htm",
            json!({"token": token, "dpop": with("htm", json!("DELETE")), "htm": "GET", "htu": HTU}),
            "htm",
        ),
        // Algorithms and keys that do not fit.
        (
            "none",
            json!({"token": token, "dpop": unsigned, "htm": "GET", "htu": HTU}),
            "alg",
        ),
        (
            "hs256",
            json!({"token": token, "dpop": header(json!({"typ": "dpop+jwt", "alg": "HS256", "jwk": key.jwk()})), "htm": "GET", "htu": HTU}),
            "alg",
        ),
        (
            "alg mismatch",
            json!({"token": token, "dpop": header(json!({"typ": "dpop+jwt", "alg": "ES256", "jwk": key.jwk()})), "htm": "GET", "htu": HTU}),
            "does not fit",
        ),
        (
            "typ",
            json!({"token": token, "dpop": header(json!({"typ": "JWT", "alg": "EdDSA", "jwk": key.jwk()})), "htm": "GET", "htu": HTU}),
            "typ",
        ),
        (
            "private jwk",
            json!({"token": token, "dpop": header(json!({"typ": "dpop+jwt", "alg": "EdDSA", "jwk": private})), "htm": "GET", "htu": HTU}),
            "private",
        ),
        (
            "es token, ed proof",
            json!({"token": es_token, "dpop": key.proof(&es_token), "htm": "GET", "htu": HTU}),
            "key other than",
        ),
        // Time.
        (
            "late",
            json!({"token": token, "dpop": with("iat", json!(now() - 600)), "htm": "GET", "htu": HTU}),
            "iat",
        ),
        (
            "early",
            json!({"token": token, "dpop": with("iat", json!(now() + 600)), "htm": "GET", "htu": HTU}),
            "iat",
        ),
        // Size: refused unread, and recorded.
        (
            "64 KiB",
            json!({"token": token, "dpop": "a".repeat(64 * 1024), "htm": "GET", "htu": HTU}),
            "longer than",
        ),
    ];
    for (i, (what, body, why)) in cases.iter().enumerate() {
        let res = check(&app, body.clone()).await;
        assert_eq!(res.status, 200, "{what}: {}", res.text());
        assert_eq!(
            res.json(),
            json!({"valid": false, "error": "PROOF_INVALID"}),
            "{what}"
        );
        let log = app.log("?limit=1").await;
        assert_eq!(log["pagination"]["total"], 1 + i, "{what}: one record each");
        let rec = &log["data"][0];
        assert_eq!(rec["result"], "invalid", "{what}");
        let reason = rec["failure_reason"].as_str().unwrap();
        assert!(
            reason.starts_with("DPoP proof") && reason.contains(why),
            "{what}: {reason}"
        );
    }

    // A replayed proof: refused however it comes back.
    let proof = key.proof(&token);
    assert_eq!(answer(&app, &token, Some(&proof)).await["valid"], true);
    assert_eq!(
        answer(&app, &token, Some(&proof)).await,
        json!({"valid": false, "error": "PROOF_REPLAYED"})
    );
    let log = app.log("?limit=1").await;
    assert!(log["data"][0]["failure_reason"]
        .as_str()
        .unwrap()
        .contains("replayed"));
}

#[actix_web::test]
async fn token_failures_come_before_the_proof() {
    let app = spawn_app().await;
    let key = AgentKey::ed();
    let (id, token) = bound(&app, &key).await;
    assert_eq!(app.revoke(&id, None).await.status, 200);
    assert_eq!(
        answer(&app, &token, Some(&key.proof(&token))).await,
        json!({"valid": false, "error": "TOKEN_REVOKED"})
    );
    assert_eq!(
        answer(&app, "eyJ.not.a-token", Some(&key.proof("eyJ.not.a-token"))).await,
        json!({"valid": false, "error": "TOKEN_INVALID"})
    );
}

#[actix_web::test]
async fn a_bad_verify_request_is_a_validation_error_naming_the_field() {
    let app = spawn_app().await;
    let key = AgentKey::ed();
    let (_, token) = bound(&app, &key).await;
    let proof = key.proof(&token);
    for (body, field) in [
        (json!({"dpop": proof, "htm": "GET", "htu": HTU}), "token"),
        (json!({"token": token, "dpop": proof, "htu": HTU}), "htm"),
        (json!({"token": token, "dpop": proof, "htm": "GET"}), "htu"),
        (
            json!({"token": token, "dpop": proof, "htm": "GET /", "htu": HTU}),
            "htm",
        ),
        (
            json!({"token": token, "dpop": proof, "htm": "GET", "htu": "/orders"}),
            "htu",
        ),
        (
            json!({"token": token, "dpop": proof, "htm": "GET", "htu": "ftp://x/"}),
            "htu",
        ),
        (
            json!({"token": token, "dpop": "", "htm": "GET", "htu": HTU}),
            "dpop",
        ),
        (
            json!({"token": token, "dpop": 7, "htm": "GET", "htu": HTU}),
            "dpop",
        ),
        (json!({"token": token, "extra": 1}), "extra"),
    ] {
        let res = check(&app, body.clone()).await;
        let err = res.assert_error(400, "VALIDATION_ERROR");
        assert!(
            err["error"]["message"].as_str().unwrap().contains(field),
            "{body}: {err}"
        );
    }
    // Nothing was recorded for a request that was not understood.
    assert_eq!(app.log("").await["pagination"]["total"], 0);
    let res = app
        .client
        .post(app.url("/v1/verify"))
        .send_body("{}")
        .await
        .unwrap();
    assert_eq!(res.status(), 415);
    // GET on the exact path is not verify.
    assert_eq!(app.get("/v1/verify", None).await.status, 405);
}

/// POST verify counts against the same bucket as GET verify.
#[actix_web::test]
async fn post_verify_is_rate_limited_like_get_verify() {
    let app = spawn_app_with(Options {
        verify_limit: Some(4),
        ..Options::unlimited()
    })
    .await;
    let (_, token) = app.agent().await;
    let sk = app.secret().to_owned();
    for _ in 0..2 {
        assert_eq!(
            app.get(&format!("/v1/verify/{token}"), Some(&sk)).await.status,
            200
        );
        let res = app
            .post("/v1/verify", Some(&sk), Some(&json!({"token": token})))
            .await;
        assert_eq!(res.status, 200, "{}", res.text());
    }
    app.post("/v1/verify", Some(&sk), Some(&json!({"token": token})))
        .await
        .assert_error(429, "RATE_LIMITED");
}

/// Someone who can write the database cannot unbind a token: the binding is read from the
/// signed token, never from `agents.jkt` (which only shows the issuer its newest binding).
#[actix_web::test]
async fn a_binding_erased_in_the_database_still_holds() {
    let app = spawn_app().await;
    let key = AgentKey::ed();
    let (id, token) = bound(&app, &key).await;
    crate::helpers::tamper(&app, &format!("UPDATE agents SET jkt = NULL WHERE id = '{id}'")).await;
    let app = app.restart().await;
    let got = app
        .get(&format!("/v1/agents/{id}"), Some(app.secret()))
        .await
        .json();
    assert_eq!(
        got["jkt"],
        Value::Null,
        "the tampered column is what the issuer sees"
    );
    assert_eq!(
        answer(&app, &token, None).await,
        json!({"valid": false, "error": "PROOF_INVALID"})
    );
    assert_eq!(
        answer(&app, &token, Some(&key.proof(&token))).await["valid"],
        true
    );
    assert!(app.verify(&token).await["cnf"]["jkt"].is_string());
}

/// Attack: an agent's key taken out of its row with database access alone. Its next token
/// would be a bearer token, good without the key; the key file sealed the binding, so the
/// agent gets no token (an integrity alarm) until its issuer binds a key again or drops it
/// by name. The seal cannot be taken out with the key, nor a keyless row written without
/// one.
#[actix_web::test]
async fn a_binding_taken_out_in_the_database_gets_no_bearer_token() {
    let app = spawn_app().await;
    let key = AgentKey::ed();
    let (id, _) = bound(&app, &key).await;
    let issue = |body: Option<Value>| {
        let path = format!("/v1/agents/{id}/issue-token");
        let app = &app;
        async move { app.post(&path, Some(app.secret()), body.as_ref()).await }
    };
    let unbind = format!("UPDATE agents SET jwk = NULL, jkt = NULL WHERE id = '{id}'");
    assert_eq!(app.raw_execute(&unbind).await.unwrap(), 1);
    let res = issue(None).await;
    assert_eq!(res.status, 500, "a bearer token: {}", res.text());
    assert!(!res.text().contains("sealed"), "no detail: {}", res.text());
    // The issuer binds the key again, by name: the agent renews as before.
    assert_eq!(issue(Some(json!({"jwk": key.jwk()}))).await.status, 201);
    let res = issue(None).await;
    assert_eq!(res.status, 201, "{}", res.text());
    assert!(payload(res.json()["token"].as_str().unwrap())["cnf"]["jkt"].is_string());

    for sql in [
        format!("UPDATE agents SET key_mac = NULL WHERE id = '{id}'"),
        format!(
            "INSERT INTO agents (id, org_id, mode, name, issuer_domain, description, scopes, created_at, \
             issued_at, expires_at) VALUES ('agt_01dddddddddddddddddddddd98', '{}', 'live', 'n', \
             'example.com', '', '[\"read:x\"]', 1, 1, 4102444800000)",
            app.org.org_id
        ),
    ] {
        let err = app.refused(&sql).await;
        assert!(err.contains("sealed"), "{err}");
    }
    // The agents the service writes carry a seal, bound or not, and renew as they were.
    let bearer = app
        .register(json!({"name": "b", "issuer_domain": "example.com", "scopes": ["read:docs"]}))
        .await;
    let bearer = bearer["agent_id"].as_str().unwrap();
    let res = app
        .post(
            &format!("/v1/agents/{bearer}/issue-token"),
            Some(app.secret()),
            None,
        )
        .await;
    assert_eq!(res.status, 201, "{}", res.text());
    assert!(payload(res.json()["token"].as_str().unwrap())
        .get("cnf")
        .is_none());
}

/// A proof whose verification could not be recorded (503, "retry shortly") was not used: the
/// receiver's retry with it passes. (It was taken before the record, and the retry was
/// refused as a replay.) A proof whose verification was answered stays used.
#[actix_web::test]
async fn a_proof_whose_check_cannot_be_recorded_may_be_sent_again() {
    let app = spawn_app().await;
    let key = AgentKey::ed();
    let (_, token) = bound(&app, &key).await;
    let proof = key.proof(&token);
    assert!(app.store.inject_write_fault(agentid::store::WriteFault::Panic));
    let res = check(
        &app,
        json!({"token": token, "dpop": proof, "htm": "GET", "htu": HTU}),
    )
    .await;
    res.assert_error(503, "AUDIT_UNAVAILABLE");
    assert_eq!(answer(&app, &token, Some(&proof)).await["valid"], true);
    assert_eq!(
        answer(&app, &token, Some(&proof)).await["error"],
        "PROOF_REPLAYED"
    );
}

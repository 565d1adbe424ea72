//! Strict token parsing: every forgery or oddity is TOKEN_INVALID (200), never a panic or 5xx,
//! and each attempt is recorded, in the named agent's organization when that agent exists.

use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine as _;
use ed25519_dalek::pkcs8::DecodePrivateKey;
use ed25519_dalek::{Signer, SigningKey};
use hmac::{Hmac, Mac};
use serde_json::{json, Value};
use sha2::Sha256;

use crate::helpers::{spawn_app, TestApp};

pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

pub fn header_of(token: &str) -> Value {
    let h = token.split('.').next().unwrap();
    serde_json::from_slice(&URL_SAFE_NO_PAD.decode(h).unwrap()).unwrap()
}

pub fn payload_of(token: &str) -> Value {
    let p = token.split('.').nth(1).unwrap();
    serde_json::from_slice(&URL_SAFE_NO_PAD.decode(p).unwrap()).unwrap()
}

/// The server's own signing key, read from the test's key file.
pub fn server_key(app: &TestApp) -> SigningKey {
    let pem = std::fs::read_to_string(&app.config.signing_key_file).unwrap();
    SigningKey::from_pkcs8_pem(&pem).unwrap()
}

/// Signs arbitrary header and payload text as EdDSA.
pub fn sign_raw(key: &SigningKey, header: &str, payload: &str) -> String {
    let input = format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(header),
        URL_SAFE_NO_PAD.encode(payload)
    );
    let sig = key.sign(input.as_bytes());
    format!("{input}.{}", URL_SAFE_NO_PAD.encode(sig.to_bytes()))
}

#[actix_web::test]
async fn issued_tokens_carry_the_designed_header_and_claims() {
    let app = spawn_app().await;
    let a = app
        .register(json!({"name": "n", "issuer_domain": "ex.com", "scopes": ["read:a", "write:b"]}))
        .await;
    let token = a["token"].as_str().unwrap();
    let h = header_of(token);
    assert_eq!(h["alg"], "EdDSA");
    assert_eq!(h["typ"], "JWT");
    assert!(h["kid"].as_str().is_some_and(|k| !k.is_empty()));
    let p = payload_of(token);
    assert_eq!(p["iss"], "ex.com");
    assert_eq!(p["sub"], a["agent_id"]);
    assert_eq!(p["scopes"], json!(["read:a", "write:b"]));
    assert!(p["jti"].is_string());
    let (iat, exp) = (p["iat"].as_i64().unwrap(), p["exp"].as_i64().unwrap());
    assert_eq!(exp - iat, 86_400);
    assert!((iat * 1000 - now_ms()).abs() < 5_000);
}

#[actix_web::test]
async fn forged_and_malformed_tokens_are_invalid_and_recorded() {
    let app = spawn_app().await;
    let (id, token) = app.agent().await;
    let kid = header_of(&token)["kid"].as_str().unwrap().to_owned();
    let mut parts = token.split('.');
    let (h, p, s) = (
        parts.next().unwrap(),
        parts.next().unwrap(),
        parts.next().unwrap(),
    );
    let payload = payload_of(&token);
    let payload_text = payload.to_string();
    let ours = server_key(&app);
    let header = |alg: &str| format!(r#"{{"alg":"{alg}","kid":"{kid}","typ":"JWT"}}"#);

    // Tokens that name our agent: each must land in the organization's log as invalid.
    let mut naming_agent: Vec<(&str, String)> = Vec::new();
    naming_agent.push((
        "alg none",
        format!("{}.{p}.", URL_SAFE_NO_PAD.encode(r#"{"alg":"none","typ":"JWT"}"#)),
    ));
    let hs_input = format!("{}.{p}", URL_SAFE_NO_PAD.encode(header("HS256")));
    let pem = app.get("/.well-known/public-key.pem", None).await.text();
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(pem.as_bytes()).unwrap();
    mac.update(hs_input.as_bytes());
    naming_agent.push((
        "HS256 keyed with the public key",
        format!(
            "{hs_input}.{}",
            URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes())
        ),
    ));
    let stranger = SigningKey::from_bytes(&[42u8; 32]);
    naming_agent.push((
        "other key under our kid",
        sign_raw(&stranger, &header("EdDSA"), &payload_text),
    ));
    let mut changed = payload.clone();
    changed["scopes"] = json!(["admin:*"]);
    naming_agent.push((
        "changed claim",
        format!("{h}.{}.{s}", URL_SAFE_NO_PAD.encode(changed.to_string())),
    ));
    // Non-canonical base64: same signature bytes, but the unused low bits of the last character set.
    let last = s.chars().last().unwrap();
    let alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let idx = alphabet.find(last).unwrap();
    let twin = alphabet.chars().nth(idx ^ 1).unwrap();
    naming_agent.push((
        "non-canonical signature",
        format!("{h}.{p}.{}{twin}", &s[..s.len() - 1]),
    ));
    naming_agent.push(("padded signature", format!("{h}.{p}.{s}==")));
    let sub = payload["sub"].as_str().unwrap();
    let dup = format!(
        r#"{{"iss":"example.com","sub":"{sub}","sub":"{sub}","jti":"j","iat":{},"exp":{},"scopes":["read:docs"]}}"#,
        payload["iat"], payload["exp"]
    );
    naming_agent.push((
        "duplicate claim, validly signed",
        sign_raw(&ours, &header("EdDSA"), &dup),
    ));
    let mut extra = payload.clone();
    extra["admin"] = json!(true);
    naming_agent.push((
        "unknown claim, validly signed",
        sign_raw(&ours, &header("EdDSA"), &extra.to_string()),
    ));
    let odd_header = format!(r#"{{"alg":"EdDSA","kid":"{kid}","typ":"JWT","jku":"https://evil.example"}}"#);
    naming_agent.push((
        "unknown header field, validly signed",
        sign_raw(&ours, &odd_header, &payload_text),
    ));
    let unknown_kid = r#"{"alg":"EdDSA","kid":"nope","typ":"JWT"}"#;
    naming_agent.push((
        "unknown kid, validly signed",
        sign_raw(&ours, unknown_kid, &payload_text),
    ));
    let mut float = payload.clone();
    float["exp"] = json!(payload["exp"].as_f64().unwrap() + 0.5);
    naming_agent.push((
        "fractional exp, validly signed",
        sign_raw(&ours, &header("EdDSA"), &float.to_string()),
    ));

    for (what, forged) in &naming_agent {
        let v = app.verify(forged).await;
        assert_eq!(v, json!({"valid": false, "error": "TOKEN_INVALID"}), "{what}");
    }

    // Tokens that name nobody, or cannot be read at all.
    let mut big = payload.clone();
    big["scopes"] = Value::Array((0..300).map(|i| json!(format!("read:r{i}"))).collect());
    let oversized = sign_raw(&ours, &header("EdDSA"), &big.to_string());
    assert!(oversized.len() > 4096);
    let nobody = {
        let mut p = payload.clone();
        p["sub"] = json!("agt_00000000000000000000000000");
        sign_raw(&ours, &header("EdDSA"), &p.to_string())
    };
    // Standard base64 with padding: a payload whose length is a multiple of 3 encodes the
    // same in both alphabets (of ASCII, only `>`, `?` and `~` give a `+` or `/`, and this
    // payload has none), and would name the agent; one space more makes its padding show.
    let mut padded_payload = payload_text.clone();
    if padded_payload.len().is_multiple_of(3) {
        padded_payload.push(' ');
    }
    let anonymous = [
        ("garbage", "garbage".to_owned()),
        ("two parts", format!("{h}.{p}")),
        ("four parts", format!("{token}.{s}")),
        ("empty parts", "..".to_owned()),
        (
            "standard base64",
            format!(
                "{}.{}.{}",
                STANDARD.encode(header("EdDSA")),
                STANDARD.encode(&padded_payload),
                s
            ),
        ),
        ("5000 bytes", "a".repeat(5000)),
        ("oversized but validly signed", oversized),
        ("validly signed for a missing agent", nobody),
        ("percent-encoded junk", "%00%ff%fe".to_owned()),
    ];
    for (what, forged) in &anonymous {
        let res = app.get(&format!("/v1/verify/{forged}"), None).await;
        assert_eq!(res.status, 200, "{what}: {}", res.text());
        assert_eq!(
            res.json(),
            json!({"valid": false, "error": "TOKEN_INVALID"}),
            "{what}"
        );
    }

    // The genuine token still verifies, and the organization saw every forgery naming its agent.
    assert_eq!(app.verify(&token).await["valid"], true);
    let log = app.log(&format!("?agent_id={id}&result=invalid&limit=200")).await;
    assert_eq!(log["pagination"]["total"], naming_agent.len());
    for rec in log["data"].as_array().unwrap() {
        assert!(rec["failure_reason"].as_str().is_some_and(|r| !r.is_empty()));
    }
    let all = app.log("").await;
    assert_eq!(
        all["pagination"]["total"],
        naming_agent.len() + 1,
        "anonymous attempts stay in the service log"
    );
}

/// Every token the service issues verifies: an agent whose token would exceed the decoder's
/// 4096-byte cap is refused at registration, naming the limit, and the largest agent it
/// takes verifies, as does a new token of it.
#[actix_web::test]
async fn the_largest_agent_the_service_registers_has_a_token_that_verifies() {
    let app = spawn_app().await;
    let scope = |i: usize| format!("s{i:03}:{}", "x".repeat(123));
    let body = |n: usize| {
        json!({
            "name": "n".repeat(100),
            "issuer_domain": format!("{}.example.com", "d".repeat(60)),
            "scopes": (0..n).map(scope).collect::<Vec<_>>(),
        })
    };
    let res = app
        .post("/v1/agents/register", Some(app.secret()), Some(&body(64)))
        .await;
    let err = res.assert_error(400, "VALIDATION_ERROR");
    assert!(
        err["error"]["message"].as_str().unwrap().contains("4096-byte"),
        "{err}"
    );
    let mut largest = None;
    for n in (1..64).rev() {
        let res = app
            .post("/v1/agents/register", Some(app.secret()), Some(&body(n)))
            .await;
        if res.status == 201 {
            largest = Some(res.json());
            break;
        }
        res.assert_error(400, "VALIDATION_ERROR");
    }
    let agent = largest.expect("some agent fits");
    let token = agent["token"].as_str().unwrap();
    assert!(token.len() > 3900 && token.len() <= 4096, "{}", token.len());
    assert_eq!(app.verify(token).await["valid"], true);
    let id = agent["agent_id"].as_str().unwrap();
    let res = app
        .post(&format!("/v1/agents/{id}/issue-token"), Some(app.secret()), None)
        .await;
    assert_eq!(res.status, 201, "{}", res.text());
    assert_eq!(
        app.verify(res.json()["token"].as_str().unwrap()).await["valid"],
        true
    );
}

//! Offline mode: a receiver validates a token with a stock JWT library (PyJWT, jose) and the
//! published keys alone, with the snippets of `docs/receivers.md` (see `readme`).

use std::process::Command;

use crate::helpers::spawn_app;
use crate::readme;

/// The PEM snippets of `docs/receivers.md`: what each says of `token`, with `agentid.pem` in
/// `dir`.
const PEM_SNIPPETS: [&str; 2] = ["verify_pem.py", "verify_pem.mjs"];

#[actix_web::test]
async fn pyjwt_and_jose_validate_tokens_with_the_pem_alone() {
    let app = spawn_app().await;
    let a = app
        .register(serde_json::json!({"name": "n", "issuer_domain": "example.com", "scopes": ["read:x"]}))
        .await;
    let pem = app.get("/.well-known/public-key.pem", None).await.text();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("agentid.pem"), &pem).unwrap();
    let token = a["token"].as_str().unwrap();

    for name in PEM_SNIPPETS {
        let claims = readme::run(name, dir.path(), token, &app.base)
            .unwrap_or_else(|e| panic!("{name} rejected the token: {e}"));
        assert_eq!(claims["sub"], a["agent_id"], "{name}");
        assert_eq!(claims["iss"], "example.com", "{name}");
    }

    // A token from another key must fail offline too.
    let other = agentid::keys::KeyRing::from_signing_key(ed25519_dalek::SigningKey::from_bytes(&[3; 32]));
    let foreign = other.sign(&agentid::token::Claims::agent(
        "example.com",
        a["agent_id"].as_str().unwrap(),
        "x",
        0,
        i64::MAX / 2000,
        vec!["read:x".into()],
    ));
    for name in PEM_SNIPPETS {
        let seen = readme::run(name, dir.path(), &foreign, &app.base);
        assert!(
            seen.is_err(),
            "{name} accepted a token signed by another key: {seen:?}"
        );
    }

    // Any organization can register agents: only the issuer the snippets trust passes, and
    // never a test-mode token.
    app.grant(&app.org.org_id, "other.example", false).await.unwrap();
    let stranger = app
        .register(serde_json::json!({"name": "n", "issuer_domain": "other.example", "scopes": ["read:x"]}))
        .await;
    let test_mode = app
        .register_with(
            &app.org.keys.secret_test,
            serde_json::json!({"name": "n", "issuer_domain": "example.com", "scopes": ["read:x"]}),
        )
        .await;
    for (what, refused) in [("another issuer", &stranger), ("test mode", &test_mode)] {
        let token = refused["token"].as_str().unwrap();
        for name in PEM_SNIPPETS {
            let seen = readme::run(name, dir.path(), token, &app.base);
            assert!(seen.is_err(), "{name} accepted a token of {what}: {seen:?}");
        }
    }
}

/// Online and offline never disagree, even on signatures the key holder made some other way
/// than RFC 8032 signing does: one with a random nonce is a valid Ed25519 signature for
/// both; one whose `R` is not the point of the nonce its `S` was made with is invalid for
/// both (`TOKEN_INVALID` online), whatever that nonce.
#[actix_web::test]
async fn online_and_offline_agree_on_signatures_made_with_any_nonce() {
    use curve25519_dalek::constants::ED25519_BASEPOINT_POINT;
    use curve25519_dalek::scalar::Scalar;
    use sha2::{Digest, Sha512};

    let app = spawn_app().await;
    let a = app
        .register(serde_json::json!({"name": "n", "issuer_domain": "example.com", "scopes": ["read:x"]}))
        .await;
    let token = a["token"].as_str().unwrap();
    let input = token.rsplit_once('.').unwrap().0;
    let key = crate::tokens::server_key(&app);
    let sign = |r: Scalar, big_r: [u8; 32]| {
        let k = Scalar::from_hash(
            Sha512::new()
                .chain_update(big_r)
                .chain_update(key.verifying_key().as_bytes())
                .chain_update(input.as_bytes()),
        );
        let s = r + k * key.to_scalar();
        let mut sig = big_r.to_vec();
        sig.extend_from_slice(s.as_bytes());
        use base64::Engine as _;
        let sig = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(sig);
        format!("{input}.{sig}")
    };
    let point = |r: Scalar| (ED25519_BASEPOINT_POINT * r).compress().to_bytes();
    let prefix = &Sha512::digest(key.as_bytes())[32..];
    let deterministic = Scalar::from_hash(Sha512::new().chain_update(prefix).chain_update(input));
    let random = Scalar::from_bytes_mod_order(rand::random());
    assert_eq!(sign(deterministic, point(deterministic)), token);
    let cases = [
        ("a random nonce", sign(random, point(random)), true),
        (
            "the deterministic nonce under another R",
            sign(deterministic, point(random)),
            false,
        ),
    ];

    let dir = tempfile::tempdir().unwrap();
    let pem = app.get("/.well-known/public-key.pem", None).await.text();
    std::fs::write(dir.path().join("agentid.pem"), &pem).unwrap();
    for (what, token, valid) in &cases {
        let online = app.verify_as_receiver(token).await.json();
        if *valid {
            assert_eq!(online["valid"], true, "{what}: {online}");
        } else {
            assert_eq!(
                online,
                serde_json::json!({"valid": false, "error": "TOKEN_INVALID"}),
                "{what}"
            );
        }
        for name in PEM_SNIPPETS {
            let offline = readme::run(name, dir.path(), token, &app.base);
            assert_eq!(offline.is_ok(), *valid, "{name}, {what}: {offline:?}");
        }
    }
}

/// The signing key file the service writes is PKCS#8 v1, which OpenSSL and Python's
/// `cryptography` read (both refuse the v2 form with the public key attached), and the key
/// they read is the one whose public half the service publishes.
#[actix_web::test]
async fn openssl_and_python_cryptography_read_the_key_file() {
    let app = spawn_app().await;
    let published = app.get("/.well-known/public-key.pem", None).await.text();
    let key_file = app.config.signing_key_file.clone();
    let script = "import sys\n\
        from cryptography.hazmat.primitives import serialization as s\n\
        k = s.load_pem_private_key(open(sys.argv[1], 'rb').read(), password=None)\n\
        print(k.public_key().public_bytes(s.Encoding.PEM, s.PublicFormat.SubjectPublicKeyInfo).decode(), end='')\n";
    let dir = tempfile::tempdir().unwrap();
    let out = readme::shell(dir.path(), r#"python3 -c "$SCRIPT" "$KEY""#)
        .env("SCRIPT", script)
        .env("KEY", &key_file)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), published);
    let out = Command::new("openssl")
        .args(["pkey", "-pubout", "-in"])
        .arg(&key_file)
        .output()
        .expect("this test needs the openssl command");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), published);
}

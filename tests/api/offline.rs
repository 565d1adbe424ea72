//! Offline mode: a receiver validates a token with a stock JWT library and the PEM key alone.
//! With CI=true the libraries must be present (.ci/run installs them); elsewhere a missing
//! library skips its check with a note.

use std::path::Path;
use std::process::Command;

use crate::helpers::{in_ci, spawn_app};

/// What `script` (run by `program`) says of the token in `token` with the key in `pem`: the
/// claims, or the library's complaint; `None` when the library is not installed here.
fn run(program: &str, script: &str, token: &Path, pem: &Path) -> Option<Result<serde_json::Value, String>> {
    run_with(program, script, &[token.as_os_str(), pem.as_os_str()])
}

/// What `script` (run by `program` with `args`) prints as JSON, or its complaint; `None`
/// when its library is not installed here (never in CI).
pub fn run_with(
    program: &str,
    script: &str,
    args: &[&std::ffi::OsStr],
) -> Option<Result<serde_json::Value, String>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    if script.ends_with(".mjs") && !root.join("tests/offline/node_modules/jose").exists() {
        assert!(!in_ci(), "jose is required in CI (npm ci --prefix tests/offline)");
        eprintln!("skipping jose: run `npm ci --prefix tests/offline`");
        return None;
    }
    let out = match Command::new(program).arg(root.join(script)).args(args).output() {
        Ok(o) => o,
        Err(e) => {
            assert!(!in_ci(), "{program} is required in CI: {e}");
            eprintln!("skipping {script}: {program} not found");
            return None;
        }
    };
    let stderr = String::from_utf8_lossy(&out.stderr);
    let missing = stderr.contains("No module named") || stderr.contains("Cannot find package");
    if missing {
        assert!(!in_ci(), "{script}: library missing in CI: {stderr}");
        eprintln!("skipping {script}: library not installed ({stderr})");
        return None;
    }
    if !out.status.success() {
        return Some(Err(stderr.into_owned()));
    }
    Some(Ok(serde_json::from_slice(&out.stdout).expect("JSON on stdout")))
}

const VALIDATORS: [(&str, &str); 2] = [
    ("python3", "tests/offline/verify_pyjwt.py"),
    ("node", "tests/offline/verify_jose.mjs"),
];

#[actix_web::test]
async fn pyjwt_and_jose_validate_tokens_with_the_pem_alone() {
    let app = spawn_app().await;
    let a = app
        .register(serde_json::json!({"name": "n", "issuer_domain": "offline.example", "scopes": ["read:x"]}))
        .await;
    let pem = app.get("/.well-known/public-key.pem", None).await.text();
    let dir = tempfile::tempdir().unwrap();
    let (token_file, pem_file) = (dir.path().join("token"), dir.path().join("key.pem"));
    std::fs::write(&token_file, a["token"].as_str().unwrap()).unwrap();
    std::fs::write(&pem_file, &pem).unwrap();

    let mut checked = 0;
    for (program, script) in VALIDATORS {
        if let Some(claims) = run(program, script, &token_file, &pem_file) {
            let claims = claims.unwrap_or_else(|e| panic!("{script} rejected the token: {e}"));
            assert_eq!(claims["sub"], a["agent_id"], "{script}");
            assert_eq!(claims["iss"], "offline.example", "{script}");
            checked += 1;
        }
    }

    // A token from another key must fail offline too.
    let other = agentid::keys::KeyRing::from_signing_key(ed25519_dalek::SigningKey::from_bytes(&[3; 32]));
    let foreign = other.sign(&agentid::token::Claims {
        iss: "offline.example".into(),
        sub: a["agent_id"].as_str().unwrap().into(),
        jti: "x".into(),
        iat: 0,
        exp: i64::MAX / 2000,
        scopes: vec![],
        status: None,
    });
    std::fs::write(&token_file, foreign).unwrap();
    let py = Command::new("python3")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/offline/verify_pyjwt.py"))
        .arg(&token_file)
        .arg(&pem_file)
        .output();
    if let Ok(out) = py {
        if checked > 0 {
            assert!(
                !out.status.success(),
                "PyJWT accepted a token signed by another key"
            );
        }
    }
    if in_ci() {
        assert_eq!(checked, 2, "both offline checks must run in CI");
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
        .register(serde_json::json!({"name": "n", "issuer_domain": "offline.example", "scopes": ["read:x"]}))
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
    let (token_file, pem_file) = (dir.path().join("token"), dir.path().join("key.pem"));
    let pem = app.get("/.well-known/public-key.pem", None).await.text();
    std::fs::write(&pem_file, &pem).unwrap();
    let mut checked = 0;
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
        std::fs::write(&token_file, token).unwrap();
        for (program, script) in VALIDATORS {
            if let Some(offline) = run(program, script, &token_file, &pem_file) {
                assert_eq!(offline.is_ok(), *valid, "{script}, {what}: {offline:?}");
                checked += 1;
            }
        }
    }
    if in_ci() {
        assert_eq!(checked, 4, "both offline checks must run in CI");
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
    let out = Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(&key_file)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    if stderr.contains("No module named") {
        assert!(!in_ci(), "cryptography is required in CI: {stderr}");
        eprintln!("skipping: Python's cryptography is not installed");
    } else {
        assert!(out.status.success(), "{stderr}");
        assert_eq!(String::from_utf8_lossy(&out.stdout), published);
    }
    match Command::new("openssl")
        .args(["pkey", "-pubout", "-in"])
        .arg(&key_file)
        .output()
    {
        Ok(out) => {
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            assert_eq!(String::from_utf8_lossy(&out.stdout), published);
        }
        Err(e) => assert!(!in_ci(), "openssl is required in CI: {e}"),
    }
}

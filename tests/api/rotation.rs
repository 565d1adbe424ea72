//! Signing-key rotation across a fleet: publish, activate, replace, retire; JWKS caching.

use std::time::Duration;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use serde_json::Value;

use crate::helpers::{spawn_fleet, Options, TestApp};

/// `agentid signing-key …` against the fleet's database, off the test's thread.
async fn signing_key(app: &TestApp, args: &[&str]) -> std::process::Output {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_agentid"));
    cmd.arg("signing-key")
        .args(args)
        .args(["--database-url", &app.db.url])
        .env("AGENTID_SIGNING_KEY_FILE", &app.config.signing_key_file);
    tokio::task::spawn_blocking(move || cmd.output().unwrap())
        .await
        .unwrap()
}

fn kid_of(token: &str) -> String {
    let header = token.split('.').next().unwrap();
    let header: Value = serde_json::from_slice(&URL_SAFE_NO_PAD.decode(header).unwrap()).unwrap();
    header["kid"].as_str().unwrap().to_owned()
}

async fn jwks_kids(app: &TestApp) -> Vec<String> {
    let jwks = app.get("/.well-known/jwks.json", None).await.json();
    let mut kids: Vec<String> = jwks["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["kid"].as_str().unwrap().to_owned())
        .collect();
    kids.sort();
    kids
}

/// Waits until `cond` holds on every instance (they read the keys every 100 ms here).
macro_rules! eventually {
    ($fleet:expr, $what:expr, |$app:ident| $cond:expr) => {{
        let mut done = false;
        for _ in 0..100 {
            let mut all = true;
            for $app in $fleet.iter() {
                all &= $cond;
            }
            if all {
                done = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(done, "never: {}", $what);
    }};
}

/// What the JWKS snippets of `docs/receivers.md` (PyJWT's `PyJWKClient`, jose's
/// `createRemoteJWKSet`) say of `token`: the claims, or their complaint, each.
async fn stock_jwks(app: &TestApp, token: &str) -> Vec<(&'static str, Result<Value, String>)> {
    let dir = tempfile::tempdir().unwrap();
    let mut seen = Vec::new();
    for name in ["verify_jwks.py", "verify_jwks.mjs"] {
        seen.push((
            name,
            crate::readme::run_beside(name, dir.path(), token, &app.base).await,
        ));
    }
    seen
}

#[actix_web::test]
async fn keys_rotate_across_the_fleet_and_retired_keys_stop_verifying() {
    let fleet = spawn_fleet(
        2,
        Options {
            tweak: Box::new(|c| c.engine.key_refresh = Duration::from_millis(100)),
            ..Options::unlimited()
        },
    )
    .await;
    let (a, b) = (&fleet[0], &fleet[1]);
    let (agent, old_token) = a.agent().await;
    let old_kid = kid_of(&old_token);
    // A cursor and the log key from before the rotation.
    for _ in 0..3 {
        a.verify(&old_token).await;
    }
    let cursor = a.log("?limit=1").await["pagination"]["cursor"]
        .as_str()
        .unwrap()
        .to_owned();
    let log_key = a.get("/.well-known/log-key", None).await.text();

    // Rotate, publishing the new key for a second before it signs.
    let out = signing_key(a, &["rotate", "--publish-for", "1s"]).await;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let new: Value = serde_json::from_slice(&out.stdout).unwrap();
    let new_kid = new["kid"].as_str().unwrap().to_owned();
    assert_eq!(new["state"], "next");
    assert!(new["activates_at"].is_string() && new["created_at"].is_string());
    let mut both = vec![old_kid.clone(), new_kid.clone()];
    both.sort();
    eventually!(fleet, "the new key is in every instance's JWKS", |app| jwks_kids(
        app
    )
    .await
        == both);
    // Published, not signing yet.
    let (_, t) = b.agent().await;
    assert_eq!(kid_of(&t), old_kid);

    // Once it activates every instance signs with it; the old key still validates.
    eventually!(fleet, "new tokens carry the new kid", |app| kid_of(
        &issue(app, &agent).await
    ) == new_kid);
    let new_token = issue(b, &agent).await;
    for app in &fleet {
        assert_eq!(app.verify(&old_token).await["valid"], true);
        assert_eq!(app.verify(&new_token).await["valid"], true);
        let pem = app.get("/.well-known/public-key.pem", None).await.text();
        let jwks = app.get("/.well-known/jwks.json", None).await.json();
        let x = jwks["keys"]
            .as_array()
            .unwrap()
            .iter()
            .find(|k| k["kid"] == new_kid.as_str())
            .unwrap()["x"]
            .clone();
        let der = pem_der(&pem);
        assert_eq!(
            URL_SAFE_NO_PAD.encode(&der[der.len() - 32..]),
            x.as_str().unwrap(),
            "PEM is the active key"
        );
    }
    for token in [&old_token, &new_token] {
        for (name, seen) in stock_jwks(a, token).await {
            let claims =
                seen.unwrap_or_else(|e| panic!("{name}: both keys validate offline through JWKS: {e}"));
            assert_eq!(claims["sub"], agent.as_str(), "{name}");
        }
    }

    let listed = signing_key(a, &["list"]).await;
    let listed: Value = serde_json::from_slice(&listed.stdout).unwrap();
    let states: Vec<(&str, &str)> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|k| (k["kid"].as_str().unwrap(), k["state"].as_str().unwrap()))
        .collect();
    assert_eq!(
        states,
        vec![(old_kid.as_str(), "replaced"), (new_kid.as_str(), "active")],
        "one key active at a time"
    );

    // Retire the old key: its tokens are refused online and it leaves JWKS everywhere.
    let out = signing_key(a, &["retire", &old_kid]).await;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    eventually!(fleet, "the old key left JWKS", |app| jwks_kids(app).await
        == [new_kid.clone()]);
    for app in &fleet {
        assert_eq!(app.verify(&old_token).await["error"], "TOKEN_INVALID");
        assert_eq!(app.verify(&new_token).await["valid"], true);
    }
    for (name, seen) in stock_jwks(a, &old_token).await {
        assert!(
            seen.is_err(),
            "{name}: JWKS no longer holds the retired key: {seen:?}"
        );
    }
    // The only active key cannot be retired.
    let out = signing_key(a, &["retire", &new_kid]).await;
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("only active key"));

    // Cursors and checkpoints do not depend on the token keys.
    let res = a
        .get(&format!("/v1/log?limit=1&cursor={cursor}"), Some(a.secret()))
        .await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(b.get("/.well-known/log-key", None).await.text(), log_key);
    let note = a.get("/v1/log/checkpoint", Some(a.secret())).await.text();
    agentid::tlog::note::LogVerifier::parse(&log_key)
        .unwrap()
        .open(&note)
        .unwrap();
}

async fn issue(app: &TestApp, agent: &str) -> String {
    let res = app
        .post(
            &format!("/v1/agents/{agent}/issue-token"),
            Some(app.secret()),
            None,
        )
        .await;
    assert_eq!(res.status, 201, "{}", res.text());
    res.json()["token"].as_str().unwrap().to_owned()
}

fn pem_der(pem: &str) -> Vec<u8> {
    use base64::engine::general_purpose::STANDARD;
    STANDARD
        .decode(
            pem.lines()
                .filter(|l| !l.starts_with("-----"))
                .collect::<String>(),
        )
        .unwrap()
}

/// JWKS answers HEAD and carries Cache-Control and an ETag that If-None-Match matches.
#[actix_web::test]
async fn jwks_is_cacheable_and_answers_head() {
    let app = crate::helpers::spawn_app().await;
    let res = app.get("/.well-known/jwks.json", None).await;
    assert_eq!(res.status, 200);
    let etag = res.header("etag").expect("ETag");
    assert!(res.header("cache-control").unwrap().contains("max-age"));
    let head = crate::helpers::read(
        app.client
            .head(app.url("/.well-known/jwks.json"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(head.status, 200);
    assert!(head.body.is_empty());
    assert_eq!(head.header("etag").as_deref(), Some(etag.as_str()));
    let again = crate::helpers::read(
        app.client
            .get(app.url("/.well-known/jwks.json"))
            .insert_header(("If-None-Match", etag.as_str()))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(again.status, 304);
    assert!(again.body.is_empty());
}

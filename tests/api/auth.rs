use serde_json::{json, Value};

use crate::helpers::{spawn_app, TestApp};

#[actix_web::test]
async fn missing_and_bad_keys_are_401_with_www_authenticate() {
    let app = spawn_app().await;
    let res = app.get("/v1/agents", None).await;
    res.assert_error(401, "UNAUTHORIZED");
    assert_eq!(res.header("www-authenticate").as_deref(), Some("Bearer"));

    for header in [
        "Basic dXNlcjpwYXNz".to_owned(),
        "Bearer".to_owned(),
        "Bearer ".to_owned(),
        "sk_live_x".to_owned(),
        format!("Bearer sk_live_{}", "A".repeat(40)),
        "Bearer xk_live_abc".to_owned(),
        format!("Bearer {}x", app.secret()),
    ] {
        let res = crate::helpers::read(
            app.client
                .get(app.url("/v1/agents"))
                .insert_header(("Authorization", header.clone()))
                .send()
                .await
                .unwrap(),
        )
        .await;
        res.assert_error(401, "UNAUTHORIZED");
        assert_eq!(
            res.header("www-authenticate").as_deref(),
            Some("Bearer"),
            "{header}"
        );
    }
}

#[actix_web::test]
async fn every_secret_endpoint_needs_a_key() {
    let app = spawn_app().await;
    let (id, _) = app.agent().await;
    for (method, path) in [
        ("POST", "/v1/agents/register".to_owned()),
        ("GET", "/v1/agents".to_owned()),
        ("GET", format!("/v1/agents/{id}")),
        ("POST", format!("/v1/agents/{id}/issue-token")),
        ("POST", format!("/v1/agents/{id}/revoke")),
        ("POST", format!("/v1/agents/{id}/client-secret")),
        ("POST", "/v1/identity-providers".to_owned()),
        ("GET", "/v1/identity-providers".to_owned()),
        ("POST", "/v1/subjects/revoke".to_owned()),
        ("GET", "/v1/log".to_owned()),
    ] {
        let res = if method == "GET" {
            app.get(&path, None).await
        } else {
            app.post(&path, None, Some(&json!({}))).await
        };
        res.assert_error(401, "UNAUTHORIZED");
        let pk = &app.org.keys.publishable_live;
        let res = if method == "GET" {
            app.get(&path, Some(pk)).await
        } else {
            app.post(&path, Some(pk), Some(&json!({}))).await
        };
        res.assert_error(403, "FORBIDDEN");
    }
    // Nothing was revoked by the refused calls.
    let got = app
        .get(&format!("/v1/agents/{id}"), Some(app.secret()))
        .await
        .json();
    assert_eq!(got["status"], "active");
}

#[actix_web::test]
async fn disabled_keys_are_refused() {
    let app = spawn_app().await;
    let (key, _) = agentid::engine::admin::create_key(
        &app.store,
        app.engine.keys(),
        &app.org.org_id,
        agentid::domain::ApiKeyKind::Secret,
        agentid::domain::KeyMode::Live,
        None,
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(app.get("/v1/agents", Some(&key)).await.status, 200);
    assert!(app
        .store
        .disable_key(&agentid::engine::hash_key(&key), agentid::domain::Millis::now())
        .await
        .unwrap());
    // A fresh server has no cached answer: the store's word counts.
    let app = app.restart().await;
    app.get("/v1/agents", Some(&key))
        .await
        .assert_error(401, "UNAUTHORIZED");
    assert_eq!(app.get("/v1/agents", Some(app.secret())).await.status, 200);
}

/// A key's cache entry counts from when the store was asked, not from when it answered: a slow
/// read does not stretch how long a disabled key keeps working past the cache's lifetime.
/// PostgreSQL only (the slow read is a read waiting on a table lock).
#[actix_web::test]
async fn a_slow_key_read_does_not_stretch_how_long_the_key_is_trusted() {
    use sqlx::Connection;
    use std::time::Duration;
    let app = crate::helpers::spawn_app_with(crate::helpers::Options {
        tweak: Box::new(|c| c.engine.key_cache_ttl = Duration::from_secs(1)),
        ..crate::helpers::Options::default()
    })
    .await;
    if !app.db.is_postgres() {
        return;
    }
    let (key, _) = agentid::engine::admin::create_key(
        &app.store,
        app.engine.keys(),
        &app.org.org_id,
        agentid::domain::ApiKeyKind::Secret,
        agentid::domain::KeyMode::Live,
        None,
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(app.get("/v1/agents", Some(&key)).await.status, 200);
    actix_web::rt::time::sleep(Duration::from_millis(1100)).await; // the entry expires
    let mut locker = sqlx::PgConnection::connect(&app.db.url).await.unwrap();
    let mut tx = locker.begin().await.unwrap();
    sqlx::query("LOCK TABLE api_keys IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *tx)
        .await
        .unwrap();
    // The refresh waits 1.5 s for the lock, longer than the entry lives.
    let (slow, ()) = tokio::join!(app.get("/v1/agents", Some(&key)), async {
        actix_web::rt::time::sleep(Duration::from_millis(1500)).await;
        tx.rollback().await.unwrap();
    });
    assert_eq!(slow.status, 200);
    assert!(app
        .store
        .disable_key(&agentid::engine::hash_key(&key), agentid::domain::Millis::now())
        .await
        .unwrap());
    app.get("/v1/agents", Some(&key))
        .await
        .assert_error(401, "UNAUTHORIZED");
}

/// A key is named, listed with when it was last used, and disabled by its id: a leaked key
/// its organization no longer holds can still be turned off.
#[actix_web::test]
async fn keys_are_named_seen_in_use_and_disabled_by_id() {
    use agentid::domain::{ApiKeyKind, KeyMode, Millis};
    let app = spawn_app().await;
    let create = |name: Option<&'static str>| {
        let app = &app;
        async move {
            agentid::engine::admin::create_key(
                &app.store,
                app.engine.keys(),
                &app.org.org_id,
                ApiKeyKind::Secret,
                KeyMode::Live,
                name,
            )
            .await
        }
    };
    for bad in ["", "  ", "a\nb", &"x".repeat(101)] {
        let bad: &'static str = Box::leak(bad.to_owned().into_boxed_str());
        assert!(create(Some(bad)).await.is_err(), "{bad:?}");
    }
    let (key, id) = create(Some("billing server")).await.unwrap().unwrap();
    assert!(id.starts_with("key_") && id.len() == 30, "{id}");
    let listed = |app: &TestApp| {
        let (store, org) = (app.store.clone(), crate::helpers::org_id(&app.org.org_id));
        let id = id.clone();
        async move {
            let all = serde_json::to_value(store.list_keys(&org).await.unwrap()).unwrap();
            all.as_array()
                .unwrap()
                .iter()
                .find(|k| k["id"] == id.as_str())
                .cloned()
                .unwrap()
        }
    };
    let before = listed(&app).await;
    assert_eq!(
        (&before["name"], &before["last_used_at"], &before["disabled"]),
        (&json!("billing server"), &Value::Null, &json!(false))
    );
    assert!(!before.to_string().contains(&key), "a key was shown: {before}");
    // Used: noted within moments (off the request's path), then at most once a minute.
    let started = Millis::now();
    assert_eq!(app.get("/v1/agents", Some(&key)).await.status, 200);
    let mut seen = Value::Null;
    for _ in 0..50 {
        seen = listed(&app).await["last_used_at"].clone();
        if !seen.is_null() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(seen.is_string(), "never noted: {seen}");
    app.store
        .note_key_used(
            &agentid::engine::hash_key(&key),
            Millis(Millis::now().0 + 30_000),
            Millis(60_000),
        )
        .await
        .unwrap();
    assert_eq!(
        listed(&app).await["last_used_at"],
        seen,
        "noted twice within a minute"
    );
    app.store
        .note_key_used(
            &agentid::engine::hash_key(&key),
            Millis(started.0 + 120_000),
            Millis(60_000),
        )
        .await
        .unwrap();
    assert_ne!(
        listed(&app).await["last_used_at"],
        seen,
        "a minute on, noted again"
    );
    // Disabled by id, without the key.
    assert!(!app.store.disable_key_id("key_nope", Millis::now()).await.unwrap());
    assert!(app.store.disable_key_id(&id, Millis::now()).await.unwrap());
    assert_eq!(listed(&app).await["disabled"], true);
    let app = app.restart().await;
    app.get("/v1/agents", Some(&key))
        .await
        .assert_error(401, "UNAUTHORIZED");
}

#[actix_web::test]
async fn keys_are_stored_only_as_hashes() {
    let app = spawn_app().await;
    let dump = if app.db.is_postgres() {
        let pool = sqlx::PgPool::connect(&app.db.url).await.unwrap();
        let rows: Vec<(String, String)> =
            sqlx::query_as("SELECT hint, encode(key_hash, 'hex') FROM api_keys")
                .fetch_all(&pool)
                .await
                .unwrap();
        rows
    } else {
        let pool = sqlx::SqlitePool::connect(&app.db.url).await.unwrap();
        let rows: Vec<(String, String)> = sqlx::query_as("SELECT hint, hex(key_hash) FROM api_keys")
            .fetch_all(&pool)
            .await
            .unwrap();
        rows
    };
    assert_eq!(dump.len(), 4);
    let all = format!("{dump:?}");
    for key in [
        &app.org.keys.secret_live,
        &app.org.keys.secret_test,
        &app.org.keys.publishable_live,
    ] {
        assert!(!all.contains(key.as_str()), "a key is stored in clear");
        assert!(!all.contains(&key[8..20]), "a key's secret part is stored");
    }
}

#[actix_web::test]
async fn verify_needs_no_key_but_refuses_a_bad_one() {
    let app = spawn_app().await;
    let (_, token) = app.agent().await;
    assert_eq!(app.verify(&token).await["valid"], true);
    let path = format!("/v1/verify/{token}");
    let with_pk = app.get(&path, Some(&app.org.keys.publishable_live)).await;
    assert_eq!(with_pk.status, 200);
    assert_eq!(with_pk.json()["valid"], true);
    app.get(&path, Some("pk_live_nonsense"))
        .await
        .assert_error(401, "UNAUTHORIZED");
}

/// A valid key sent without its scheme (or with another one) is told how to send it, not
/// called unknown; on verify too.
#[actix_web::test]
async fn a_key_sent_without_bearer_is_told_how_to_send_it() {
    let app = spawn_app().await;
    let (_, token) = app.agent().await;
    for (path, header) in [
        ("/v1/agents".to_owned(), app.secret().to_owned()),
        ("/v1/agents".to_owned(), format!("Token {}", app.secret())),
        (
            format!("/v1/verify/{token}"),
            app.org.keys.publishable_live.clone(),
        ),
    ] {
        let res = crate::helpers::read(
            app.client
                .get(app.url(&path))
                .insert_header(("Authorization", header.clone()))
                .send()
                .await
                .unwrap(),
        )
        .await;
        let body = res.assert_error(401, "UNAUTHORIZED");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("use Authorization: Bearer <key>"),
            "{header}: {message}"
        );
    }
}

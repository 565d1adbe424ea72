use crate::helpers::spawn_app;

#[actix_web::test]
async fn unknown_routes_and_methods_get_the_standard_body() {
    let app = spawn_app().await;
    app.get("/v1/nope", None).await.assert_error(404, "NOT_FOUND");
    app.get("/", None).await.assert_error(404, "NOT_FOUND");
    app.post("/v1/agents", Some(app.secret()), None)
        .await
        .assert_error(405, "METHOD_NOT_ALLOWED");
    app.post("/health", None, None)
        .await
        .assert_error(405, "METHOD_NOT_ALLOWED");
    let del = crate::helpers::read(app.client.delete(app.url("/v1/log")).send().await.unwrap()).await;
    del.assert_error(405, "METHOD_NOT_ALLOWED");
    // Verify is routed by its prefix: the same answers, and `Allow` on the 405.
    let post = app.post("/v1/verify/abc", None, None).await;
    post.assert_error(405, "METHOD_NOT_ALLOWED");
    assert_eq!(post.header("allow").as_deref(), Some("GET"));
    app.get("/v1/verify/", None).await.assert_error(404, "NOT_FOUND");
    app.get("/v1/verify/a/b", None)
        .await
        .assert_error(404, "NOT_FOUND");
}

#[actix_web::test]
async fn every_response_has_a_request_id_and_docs_urls_resolve() {
    let app = spawn_app().await;
    let ok = app.get("/health", None).await;
    let other = app.get("/health", None).await;
    let (a, b) = (
        ok.header("x-request-id").unwrap(),
        other.header("x-request-id").unwrap(),
    );
    assert!(a.starts_with("req_") && b.starts_with("req_") && a != b);

    let err = app
        .get("/v1/agents", None)
        .await
        .assert_error(401, "UNAUTHORIZED");
    let docs_url = err["error"]["docs_url"].as_str().unwrap();
    let (page, anchor) = docs_url.split_once('#').unwrap();
    assert!(page.starts_with(&app.base));
    let docs = crate::helpers::read(app.client.get(page).send().await.unwrap()).await;
    assert_eq!(docs.status, 200);
    assert!(docs.header("content-type").unwrap().starts_with("text/html"));
    let html = docs.text();
    for code in [
        "UNAUTHORIZED",
        "FORBIDDEN",
        "AGENT_NOT_FOUND",
        "INVALID_REQUEST",
        "VALIDATION_ERROR",
        "EXPIRY_TOO_LONG",
        "INVALID_CURSOR",
        "PAYLOAD_TOO_LARGE",
        "NOT_FOUND",
        "METHOD_NOT_ALLOWED",
        "RATE_LIMITED",
        "AUDIT_UNAVAILABLE",
        "INTERNAL_ERROR",
        "AGENT_REVOKED",
        "TOKEN_INVALID",
        "TOKEN_REVOKED",
        "TOKEN_EXPIRED",
    ] {
        assert!(html.contains(&format!("id=\"{code}\"")), "docs page lacks {code}");
    }
    assert!(html.contains(&format!("id=\"{anchor}\"")));
}

/// With the database unreachable, every endpoint that needs it answers 503 (verify with
/// `AUDIT_UNAVAILABLE`, the others with `SERVICE_UNAVAILABLE`, health with its own record),
/// whether or not the key was looked up before: never 500. PostgreSQL only (the outage is a
/// cut TCP proxy in front of it).
#[actix_web::test]
async fn every_endpoint_answers_503_while_the_database_is_down() {
    use std::time::Duration;
    let Some((proxy, app)) = crate::proxy::app_behind_proxy().await else {
        return;
    };
    let (id, token) = app.agent().await;
    // A second key of the organization the service has not looked up yet.
    let fresh = agentid::engine::admin::create_key(
        &app.store,
        app.engine.keys(),
        &app.org.org_id,
        agentid::domain::ApiKeyKind::Secret,
        agentid::domain::KeyMode::Live,
        None,
    )
    .await
    .unwrap()
    .unwrap()
    .0;
    proxy.cut();
    let body = serde_json::json!({"name": "n", "issuer_domain": "example.com", "scopes": ["read:x"]});
    for key in [app.secret().to_owned(), fresh] {
        let key = Some(key.as_str());
        let answers = [
            (
                "register",
                app.post("/v1/agents/register", key, Some(&body)).await,
            ),
            ("list", app.get("/v1/agents", key).await),
            ("get", app.get(&format!("/v1/agents/{id}"), key).await),
            (
                "issue-token",
                app.post(&format!("/v1/agents/{id}/issue-token"), key, None).await,
            ),
            (
                "revoke",
                app.post(&format!("/v1/agents/{id}/revoke"), key, None).await,
            ),
            ("log", app.get("/v1/log", key).await),
        ];
        for (what, res) in answers {
            assert_eq!(res.status, 503, "{what}: {}", res.text());
            res.assert_error(503, "SERVICE_UNAVAILABLE");
        }
        app.get(&format!("/v1/verify/{token}"), key)
            .await
            .assert_error(503, "AUDIT_UNAVAILABLE");
    }
    let health = app.get("/health", None).await;
    // A ping that succeeded less than a second ago still answers: wait it out.
    std::thread::sleep(Duration::from_millis(1100));
    let health = if health.status == 200 {
        app.get("/health", None).await
    } else {
        health
    };
    assert_eq!(health.status, 503, "{}", health.text());
    assert_eq!(health.json()["status"], "unavailable");
    proxy.restore();
}

/// A database that takes no writes (SQLSTATE 25006: a primary demoted in a failover, or a
/// standby a balancer still sends a connection to) is an outage, not a fault: every write
/// answers 503, never 500, while reads still answer. PostgreSQL only.
#[actix_web::test]
async fn a_read_only_database_answers_503_to_writes() {
    use sqlx::Connection as _;
    // Answered at once: a wait would retry each write until it ran out.
    let app = crate::helpers::spawn_app_with(crate::helpers::Options {
        tweak: Box::new(|c| c.store.outage_wait = std::time::Duration::ZERO),
        ..Default::default()
    })
    .await;
    if !app.db.is_postgres() {
        return;
    }
    let (id, token) = app.agent().await;
    let mut admin = sqlx::PgConnection::connect(&app.db.url).await.unwrap();
    sqlx::query("DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET default_transaction_read_only = on', current_database()); END $$")
        .execute(&mut admin)
        .await
        .unwrap();
    // The service's connections are cut, as a demotion cuts them; new ones are read-only.
    sqlx::query(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE datname = current_database() AND pid <> pg_backend_pid()",
    )
    .execute(&mut admin)
    .await
    .unwrap();
    let body = serde_json::json!({"name": "n", "issuer_domain": "example.com", "scopes": ["read:x"]});
    let mut read = 0;
    for _ in 0..20 {
        let res = app
            .post("/v1/agents/register", Some(app.secret()), Some(&body))
            .await;
        res.assert_error(503, "SERVICE_UNAVAILABLE");
        let res = app
            .post(&format!("/v1/agents/{id}/revoke"), Some(app.secret()), None)
            .await;
        res.assert_error(503, "SERVICE_UNAVAILABLE");
        app.get(&format!("/v1/verify/{token}"), None)
            .await
            .assert_error(503, "AUDIT_UNAVAILABLE");
        if app
            .get(&format!("/v1/agents/{id}"), Some(app.secret()))
            .await
            .status
            == 200
        {
            read += 1;
        }
    }
    assert!(read > 0, "no read answered on a read-only database");
    sqlx::query("DO $$ BEGIN EXECUTE format('ALTER DATABASE %I RESET default_transaction_read_only', current_database()); END $$")
        .execute(&mut admin)
        .await
        .unwrap();
}

/// A valid key whose cache entry expires while the database is down stays a known key: every
/// call answers 503 for the outage, never 429 because refreshing the key failed and it was
/// then charged as an unknown one (to the per-address budget of 60 look-ups a minute).
/// PostgreSQL only (the outage is a cut TCP proxy in front of it).
#[actix_web::test]
async fn a_known_key_is_never_throttled_while_the_database_is_down() {
    use std::time::Duration;
    let Some((proxy, app)) = crate::proxy::app_behind_proxy_with(|c| {
        c.engine.key_cache_ttl = Duration::from_millis(100);
    })
    .await
    else {
        return;
    };
    let (id, _) = app.agent().await;
    proxy.cut();
    actix_web::rt::time::sleep(Duration::from_millis(150)).await; // the key's entry expires
    for _ in 0..80 {
        app.get(&format!("/v1/agents/{id}"), Some(app.secret()))
            .await
            .assert_error(503, "SERVICE_UNAVAILABLE");
    }
    proxy.restore();
}

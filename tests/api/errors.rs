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
        &app.org.org_id,
        agentid::domain::ApiKeyKind::Secret,
        agentid::domain::KeyMode::Live,
    )
    .await
    .unwrap()
    .unwrap();
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

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

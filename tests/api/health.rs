use crate::helpers::spawn_app;

#[actix_web::test]
async fn health_reports_ok_version_and_time() {
    let app = spawn_app().await;
    let res = app.get("/health", None).await;
    assert_eq!(res.status, 200);
    let body = res.json();
    assert_eq!(body["status"], "ok");
    assert_eq!(body["version"], env!("CARGO_PKG_VERSION"));
    let ts = body["timestamp"].as_str().unwrap();
    assert!(
        ts.len() == 24 && ts.ends_with('Z') && ts.as_bytes()[19] == b'.',
        "{ts}"
    );
    assert!(res.header("x-request-id").unwrap().starts_with("req_"));
}

/// HEAD, which uptime monitors send (and RFC 9110 §9.1 asks of every general-purpose
/// server), answers as GET without the body: on the health check and every public document.
#[actix_web::test]
async fn health_and_public_documents_answer_head() {
    let app = spawn_app().await;
    for path in [
        "/health",
        "/.well-known/public-key.pem",
        "/.well-known/log-key",
        "/.well-known/oauth-authorization-server",
        "/.well-known/ssf-configuration",
        "/docs/errors",
        "/openapi.json",
    ] {
        let head = crate::helpers::read(app.client.head(app.url(path)).send().await.unwrap()).await;
        assert_eq!(head.status, 200, "{path}");
        assert!(head.body.is_empty(), "{path}");
        assert!(head.header("x-ratelimit-limit").is_some(), "{path}");
    }
}

#[actix_web::test]
async fn health_is_503_when_the_store_is_unreachable() {
    let app = spawn_app().await;
    assert_eq!(app.get("/health", None).await.status, 200);
    app.store.close().await;
    // A successful ping is reused for up to a second.
    actix_web::rt::time::sleep(std::time::Duration::from_millis(1100)).await;
    let res = app.get("/health", None).await;
    assert_eq!(res.status, 503);
    assert_eq!(res.json()["status"], "unavailable");
}

#[actix_web::test]
async fn public_endpoints_allow_any_origin_including_preflight() {
    let app = spawn_app().await;
    for path in [
        "/health",
        "/.well-known/public-key.pem",
        "/.well-known/jwks.json",
        "/v1/verify/abc",
    ] {
        let res = crate::helpers::read(
            app.client
                .get(app.url(path))
                .insert_header(("Origin", "https://receiver.example"))
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(
            res.header("access-control-allow-origin").as_deref(),
            Some("*"),
            "{path}"
        );
        assert_eq!(exposed(&res), EXPOSED, "{path}");

        let pre = preflight(&app, path, "GET", None).await;
        assert!(pre.status == 200 || pre.status == 204, "{path}: {}", pre.status);
        assert_eq!(
            pre.header("access-control-allow-origin").as_deref(),
            Some("*"),
            "{path}"
        );
        assert!(pre
            .header("access-control-allow-methods")
            .unwrap()
            .contains("GET"));
        // Every response carries the rate-limit headers, preflights included.
        res.assert_rate_limit_headers(path);
        pre.assert_rate_limit_headers(&format!("OPTIONS {path}"));
    }
}

/// A browser's preflight of `method` on `path`, asking for `headers`.
async fn preflight(
    app: &crate::helpers::TestApp,
    path: &str,
    method: &str,
    headers: Option<&str>,
) -> crate::helpers::Resp {
    let mut req = app
        .client
        .request(awc::http::Method::OPTIONS, app.url(path))
        .insert_header(("Origin", "https://receiver.example"))
        .insert_header(("Access-Control-Request-Method", method));
    if let Some(h) = headers {
        req = req.insert_header(("Access-Control-Request-Headers", h));
    }
    crate::helpers::read(req.send().await.unwrap()).await
}

/// A browser's POST of JSON to a verify route is preflighted: the preflight lets it through.
#[actix_web::test]
async fn a_browser_may_post_to_verify_after_its_preflight() {
    let app = spawn_app().await;
    for path in ["/v1/verify", "/v1/verify/request"] {
        let pre = preflight(&app, path, "POST", Some("content-type")).await;
        assert!(
            pre.status == 200 || pre.status == 204,
            "{path}: {} {}",
            pre.status,
            pre.text()
        );
        assert_eq!(pre.header("access-control-allow-origin").as_deref(), Some("*"));
        assert!(
            pre.header("access-control-allow-methods")
                .unwrap_or_default()
                .contains("POST"),
            "{path}"
        );
    }
}

/// A preflight is the browser's question, not a call: a page verifying many tokens (each
/// URL preflighted once) spends none of its address's calls on them.
#[actix_web::test]
async fn preflights_count_against_nothing() {
    let app = spawn_app().await;
    for i in 0..110 {
        let pre = preflight(&app, &format!("/v1/verify/t{i}"), "GET", Some("authorization")).await;
        assert!(
            pre.status == 200 || pre.status == 204,
            "{i}: {} {}",
            pre.status,
            pre.text()
        );
    }
    let (_, token) = app.agent().await;
    let res = app.get(&format!("/v1/verify/{token}"), None).await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(res.header("x-ratelimit-remaining").as_deref(), Some("99"));
}

/// Attack: an OPTIONS request dressed as a preflight on a route no CORS layer answers
/// (forward auth takes any method) would be a verification that counts against nothing. Only
/// a public route's preflight is uncounted: here the address's anonymous calls run out.
#[actix_web::test]
async fn a_preflight_only_counts_for_nothing_where_cors_answers_it() {
    let app = spawn_app().await;
    let (_, token) = app.agent().await;
    let bearer = format!("Bearer {token}");
    let mut statuses = std::collections::BTreeMap::new();
    for _ in 0..110 {
        let res = app
            .forward(
                "OPTIONS",
                "",
                &[
                    ("Authorization", &bearer),
                    ("Access-Control-Request-Method", "GET"),
                ],
            )
            .await;
        *statuses.entry(res.status).or_insert(0) += 1;
    }
    assert!(statuses.contains_key(&429), "{statuses:?}");
}

/// The headers a browser caller may read on every public answer.
pub const EXPOSED: [&str; 5] = [
    "retry-after",
    "x-ratelimit-limit",
    "x-ratelimit-remaining",
    "x-ratelimit-reset",
    "x-request-id",
];

/// `Access-Control-Expose-Headers`, as a sorted list of lowercase names.
pub fn exposed(res: &crate::helpers::Resp) -> Vec<String> {
    let mut names: Vec<String> = res
        .header("access-control-expose-headers")
        .unwrap_or_default()
        .split(',')
        .map(|h| h.trim().to_ascii_lowercase())
        .filter(|h| !h.is_empty())
        .collect();
    names.sort();
    names
}

#[actix_web::test]
async fn public_key_and_jwks_describe_the_signing_key() {
    let app = spawn_app().await;
    let pem = app.get("/.well-known/public-key.pem", None).await;
    assert_eq!(pem.status, 200);
    assert!(pem.text().starts_with("-----BEGIN PUBLIC KEY-----"));
    assert!(pem.header("cache-control").unwrap().contains("max-age"));
    let jwks = app.get("/.well-known/jwks.json", None).await.json();
    let key = &jwks["keys"][0];
    assert_eq!(key["kty"], "OKP");
    assert_eq!(key["crv"], "Ed25519");
    assert_eq!(key["alg"], "EdDSA");
    let (_, token) = app.agent().await;
    let header = crate::tokens::header_of(&token);
    assert_eq!(header["kid"], key["kid"]);
}

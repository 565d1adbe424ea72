//! What operators rely on: the OpenAPI document, metrics on their own listener (promtool-clean,
//! and every dashboard query backed by an exported series), secret-free logs, clean shutdown.

use std::collections::BTreeSet;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::helpers::{client, read, spawn_app, spawn_app_with, Options, TestApp};

#[actix_web::test]
async fn the_openapi_document_covers_every_route_schema_and_error() {
    let app = spawn_app().await;
    let res = app.get("/openapi.json", None).await;
    assert_eq!(res.status, 200);
    let doc = res.json();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    let paths: BTreeSet<&str> = doc["paths"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    let expected: BTreeSet<&str> = [
        "/health",
        "/.well-known/public-key.pem",
        "/.well-known/jwks.json",
        "/.well-known/log-key",
        "/docs/errors",
        "/openapi.json",
        "/v1/agents/register",
        "/v1/agents",
        "/v1/agents/{id}",
        "/v1/agents/{id}/issue-token",
        "/v1/agents/{id}/revoke",
        "/v1/agents/{id}/client-secret",
        "/v1/identity-providers",
        "/v1/identity-providers/{id}",
        "/v1/subjects/revoke",
        "/v1/directories/{issuer_domain}",
        "/v1/verify/request",
        "/v1/domains",
        "/v1/domains/{domain}",
        "/v1/domains/{domain}/verify",
        "/v1/verify/{token}",
        "/v1/verify",
        "/v1/forward-auth",
        "/v1/log",
        "/v1/log/checkpoint",
        "/v1/log/commitments",
        "/v1/status/{id}",
        "/.well-known/ssf-configuration",
        "/ssf/streams",
        "/ssf/status",
        "/ssf/subjects/add",
        "/ssf/subjects/remove",
        "/ssf/verify",
        "/ssf/poll/{stream_id}",
        "/v1/log/proof/inclusion",
        "/v1/log/proof/consistency",
        "/.well-known/oauth-authorization-server",
        "/oauth/authorize",
        "/oauth/token",
        "/oauth/introspect",
    ]
    .into_iter()
    .collect();
    assert_eq!(paths, expected);
    let text = res.text();
    for code in agentid::http::ErrorCode::ALL {
        assert!(
            text.contains(code.as_str()),
            "{} is not documented",
            code.as_str()
        );
    }
    for name in [
        "TOKEN_INVALID",
        "TOKEN_REVOKED",
        "TOKEN_EXPIRED",
        "PROOF_INVALID",
        "PROOF_REPLAYED",
        "X-RateLimit-Reset",
        "X-Request-Id",
    ] {
        assert!(text.contains(name), "{name} is not documented");
    }
    // Every $ref resolves to a schema in components.
    let schemas = doc["components"]["schemas"].as_object().unwrap();
    for reference in text.split("\"$ref\": \"#/components/schemas/").skip(1) {
        let name = reference.split('"').next().unwrap();
        assert!(schemas.contains_key(name), "dangling $ref {name}");
    }
    // Verify takes a key optionally: a bad one is refused (401), but no kind of key is
    // forbidden (no 403); the issuer's endpoints forbid publishable keys.
    let verify = &doc["paths"]["/v1/verify/{token}"]["get"]["responses"];
    assert!(verify.get("401").is_some() && verify.get("503").is_some());
    assert!(verify.get("403").is_none(), "verify never answers 403");
    assert!(doc["paths"]["/v1/agents/register"]["post"]["responses"]
        .get("403")
        .is_some());
    // A scope's schema is the rule the server checks: the whole string at most 128.
    assert_eq!(schemas["ScopeString"]["maxLength"], 128);
    assert_eq!(schemas["ScopeString"]["pattern"], "^[a-z0-9_.-]+:[a-z0-9_.*/-]+$");
    // A request's method, wherever a body names one, is the rule the server checks.
    for (schema, field) in [("VerifyRequest", "htm"), ("SignedRequest", "method")] {
        let method = &schemas[schema]["properties"][field];
        assert_eq!(
            method["pattern"], "^[!#$%&'*+.^_`|~0-9A-Za-z-]+$",
            "{schema}.{field}"
        );
        assert_eq!(
            (&method["minLength"], &method["maxLength"]),
            (&serde_json::json!(1), &serde_json::json!(32))
        );
    }
    // Every operation documents 429 and its success answer (but the OAuth authorization
    // endpoint, which refuses every request by design).
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let responses = op["responses"].as_object().unwrap();
            assert!(responses.contains_key("429"), "{method} {path} lacks 429");
            assert!(
                responses.keys().any(|k| k.starts_with('2')) || path == "/oauth/authorize",
                "{method} {path} lacks a success"
            );
        }
    }
}

fn metrics_app() -> Options {
    Options {
        tweak: Box::new(|c| c.metrics_bind = Some("127.0.0.1:0".into())),
        ..Options::default()
    }
}

async fn scrape(app: &TestApp) -> String {
    let url = app.metrics_url.as_ref().expect("metrics listener");
    let res = read(app.client.get(url).send().await.unwrap()).await;
    assert_eq!(res.status, 200);
    assert!(res.header("content-type").unwrap().starts_with("text/plain"));
    res.text()
}

#[actix_web::test]
async fn metrics_are_served_on_their_own_listener() {
    let app = spawn_app_with(metrics_app()).await;
    let (id, token) = app.agent().await;
    app.verify(&token).await;
    app.verify(&token).await;
    app.verify("garbage").await;
    app.revoke(&id, None).await;
    app.verify(&token).await;
    app.get("/v1/agents", Some("sk_live_nope")).await;
    app.get("/v1/verify/a/b", None)
        .await
        .assert_error(404, "NOT_FOUND");

    app.get("/metrics", None).await.assert_error(404, "NOT_FOUND");
    let text = scrape(&app).await;
    for series in [
        "agentid_http_requests_total{",
        "agentid_http_request_duration_seconds_bucket{",
        "agentid_verify_results_total{result=\"valid\"}",
        "agentid_verify_results_total{result=\"revoked\"}",
        "agentid_signed_request_results_total{result=\"verified\"}",
        "agentid_token_cache_requests_total{outcome=\"hit\"}",
        "agentid_audit_batch_size_bucket",
        "agentid_audit_flush_duration_seconds_bucket",
        "agentid_audit_queue_depth",
        "agentid_audit_records_total",
        "agentid_audit_flush_failures_total",
        "agentid_revocation_index_size",
        "agentid_registry_agents",
        "agentid_registry_bytes",
        "agentid_rate_limited_total{class=\"verify\"}",
        "agentid_store_connections{pool=\"main\",state=\"max\"}",
        "agentid_build_info{",
    ] {
        assert!(text.contains(series), "{series} missing from /metrics");
    }
    // The audit writer's own pool (PostgreSQL) is reported beside the API's.
    assert_eq!(
        text.contains("agentid_store_connections{pool=\"writer\",state=\"max\"}"),
        app.db.is_postgres()
    );
    assert!(
        text.contains("route=\"/v1/verify/{token}\""),
        "routes are patterns, never paths"
    );
    assert!(!text.contains(&token), "a token leaked into a metric label");
    // A path under /v1/verify/ that is not a token matched no route.
    assert!(text.contains(r#"route="unmatched",method="GET",status="404""#));
    assert!(!text.contains(r#"route="/v1/verify/{token}",method="GET",status="404""#));
}

/// promtool (Debian's `prometheus` package, which `.ci/run` installs) accepts the exposition.
/// Ignored by a plain `cargo test`, so a machine without promtool shows it as ignored;
/// CI runs it with `cargo test -- --ignored`.
#[actix_web::test]
#[ignore = "needs promtool (Debian package prometheus); CI runs it"]
async fn promtool_accepts_the_metrics() {
    let app = spawn_app_with(metrics_app()).await;
    let (_, token) = app.agent().await;
    app.verify(&token).await;
    app.verify("garbage").await;
    let text = scrape(&app).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("metrics.txt");
    std::fs::write(&file, &text).unwrap();
    let out = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::fs::File::open(&file).unwrap())
        .output()
        .expect("promtool is not installed (Debian: apt-get install prometheus)");
    assert!(
        out.status.success(),
        "promtool check metrics: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[actix_web::test]
async fn every_dashboard_query_uses_series_the_service_exports() {
    let app = spawn_app_with(metrics_app()).await;
    let (_, token) = app.agent().await;
    app.verify(&token).await;
    let exported: BTreeSet<String> = scrape(&app)
        .await
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| l.split(['{', ' ']).next().unwrap().to_owned())
        .collect();
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/grafana/dashboards/agentid.json");
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut exprs = Vec::new();
    collect_exprs(&dashboard, &mut exprs);
    assert!(exprs.len() >= 15, "the dashboard has its panels");
    for expr in exprs {
        let names: Vec<&str> = expr
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .filter(|w| w.starts_with("agentid_"))
            .collect();
        assert!(!names.is_empty(), "query uses no agentid series: {expr}");
        for name in names {
            assert!(
                exported.contains(name),
                "dashboard query uses {name}, which is not exported: {expr}"
            );
        }
    }
}

fn collect_exprs(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                match (k.as_str(), x) {
                    ("expr", Value::String(s)) => out.push(s.clone()),
                    _ => collect_exprs(x, out),
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|x| collect_exprs(x, out)),
        _ => {}
    }
}

#[actix_web::test]
async fn logs_are_json_with_request_facts_and_never_hold_a_secret() {
    let dir = tempfile::tempdir().unwrap();
    let db = crate::helpers::TestDb::new(dir.path()).await;
    let log_file = dir.path().join("stderr.log");
    let server = crate::cli::start_server_logging(
        dir.path(),
        Some(&db.url),
        &[("RUST_LOG", "debug"), ("AGENTID_LOG_FORMAT", "json")],
        &log_file,
    );
    let (sk, pk) = (
        server.printed_key("secret_live"),
        server.printed_key("publishable_live"),
    );
    let c = client();
    let base = &server.base;
    let (id, token) = server.register(&sk, "n").await;
    for auth in [None, Some(pk.as_str())] {
        let mut req = c.get(format!("{base}/v1/verify/{token}"));
        if let Some(k) = auth {
            req = req.insert_header(("Authorization", format!("Bearer {k}")));
        }
        read(req.send().await.unwrap()).await;
    }
    read(
        c.post(format!("{base}/v1/agents/{id}/issue-token"))
            .insert_header(("Authorization", format!("Bearer {sk}")))
            .send()
            .await
            .unwrap(),
    )
    .await;
    read(
        c.get(format!("{base}/v1/agents"))
            .insert_header(("Authorization", "Bearer sk_live_wrongwrongwrong"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    read(c.get(format!("{base}/v1/verify/{token}x")).send().await.unwrap()).await;
    drop(server);

    let logs = std::fs::read_to_string(&log_file).unwrap();
    let pem = std::fs::read_to_string(dir.path().join("data/signing-key.pem")).unwrap();
    let secret_line = pem.lines().nth(1).unwrap();
    let signature = token.rsplit('.').next().unwrap();
    for (what, secret) in [
        ("secret key", sk.as_str()),
        ("publishable key", pk.as_str()),
        ("secret part of a key", &sk[8..]),
        ("token", token.as_str()),
        ("token signature", signature),
        ("signing key", secret_line),
        ("bad key", "sk_live_wrongwrongwrong"),
    ] {
        assert!(!logs.contains(secret), "a {what} appears in the logs");
    }
    let requests: Vec<Value> = logs
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["message"] == "request")
        .collect();
    assert!(
        requests.len() >= 5,
        "one JSON line per request: {}",
        requests.len()
    );
    for r in &requests {
        assert!(
            r["route"].is_string() && r["status"].is_number() && r["latency_ms"].is_number(),
            "{r}"
        );
        let rid = r["span"]["request_id"]
            .as_str()
            .unwrap_or_else(|| panic!("no request id: {r}"));
        assert!(rid.starts_with("req_"));
    }
    assert!(requests.iter().any(|r| r["route"] == "/v1/verify/{token}"));
}

/// Sends the server SIGTERM; returns when.
fn sigterm(server: &crate::cli::Server) -> Instant {
    signal(server, "TERM")
}

/// Sends the server `signal` (`TERM`, `INT`, …); returns when.
fn signal(server: &crate::cli::Server, signal: &str) -> Instant {
    let pid = server.child.id().to_string();
    assert!(Command::new("kill")
        .args([&format!("-{signal}"), &pid])
        .status()
        .unwrap()
        .success());
    Instant::now()
}

/// A request whose body never finishes arriving holds up the graceful stop (up to 10 s); a
/// signal after the stop began ends the process at once. Before, every signal from the second
/// on went unheard, and only SIGKILL stopped an instance whose stop hung.
#[actix_web::test]
async fn a_signal_after_the_stop_began_exits_at_once() {
    use tokio::io::AsyncWriteExt;
    let dir = tempfile::tempdir().unwrap();
    let db = crate::helpers::TestDb::new(dir.path()).await;
    let drain = [("AGENTID_SHUTDOWN_DRAIN_SECONDS", "1")];
    let mut server = crate::cli::start_server(dir.path(), Some(&db.url), &drain);
    let sk = server.printed_key("secret_live");
    let addr = server.base.trim_start_matches("http://").to_owned();
    let mut held = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let head = format!(
        "POST /v1/agents/register HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {sk}\r\n\
         Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{{"
    );
    held.write_all(head.as_bytes()).await.unwrap();
    actix_web::rt::time::sleep(Duration::from_millis(300)).await;
    signal(&server, "TERM");
    actix_web::rt::time::sleep(Duration::from_millis(300)).await;
    signal(&server, "TERM"); // stop now: the held request is still under way
    actix_web::rt::time::sleep(Duration::from_millis(500)).await;
    assert!(
        server.child.try_wait().unwrap().is_none(),
        "waits for the held request"
    );
    let last = signal(&server, "INT");
    let status = exited(&mut server, last).await;
    assert!(
        last.elapsed() < Duration::from_secs(3),
        "exited {:?} after the last signal",
        last.elapsed()
    );
    assert_eq!(status.code(), Some(1));
    drop(held);
}

/// The server's exit status, failing the test if it has not exited 20 s after `signalled`.
async fn exited(server: &mut crate::cli::Server, signalled: Instant) -> std::process::ExitStatus {
    loop {
        if let Some(s) = server.child.try_wait().unwrap() {
            return s;
        }
        assert!(
            signalled.elapsed() < Duration::from_secs(20),
            "no exit within 20 s of SIGTERM"
        );
        actix_web::rt::time::sleep(Duration::from_millis(50)).await;
    }
}

#[actix_web::test]
async fn sigterm_drains_in_flight_work_and_exits_zero() {
    let dir = tempfile::tempdir().unwrap();
    let db = crate::helpers::TestDb::new(dir.path()).await;
    let drain = [("AGENTID_SHUTDOWN_DRAIN_SECONDS", "1")];
    let mut server = crate::cli::start_server(dir.path(), Some(&db.url), &drain);
    let (sk, pk) = (
        server.printed_key("secret_live"),
        server.printed_key("publishable_live"),
    );
    let (agent_id, token) = server.register(&sk, "n").await;
    let stop = Arc::new(AtomicBool::new(false));
    let answered = Arc::new(AtomicUsize::new(0));
    let loops: Vec<_> = (0..8)
        .map(|_| {
            crate::cli::hammer(
                server.base.clone(),
                token.clone(),
                pk.clone(),
                stop.clone(),
                answered.clone(),
            )
        })
        .collect();
    actix_web::rt::time::sleep(Duration::from_millis(800)).await;
    let signalled = sigterm(&server);
    let status = exited(&mut server, signalled).await;
    stop.store(true, Ordering::SeqCst);
    let mut unavailable = 0;
    for l in loops {
        unavailable += l.await.unwrap_or(0);
    }
    assert!(status.success(), "exit status {status:?}");
    // Every request in flight was answered: the writer drains only after the workers stop.
    assert_eq!(unavailable, 0, "503 answers while stopping");
    let answered = answered.load(Ordering::SeqCst) as i64;
    assert!(answered > 20, "the load ran: {answered}");

    let store = agentid::store::connect(&db.url, &Default::default())
        .await
        .unwrap();
    let agent = store
        .get_agent(&crate::helpers::agent_id(&agent_id))
        .await
        .unwrap()
        .unwrap();
    assert!(
        agent.verification_count >= answered,
        "{} records for {answered} answers",
        agent.verification_count
    );
    store.close().await;
}

#[test]
fn org_set_limits_changes_plan_and_limits() {
    let dir = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_agentid"))
            .args(args)
            .current_dir(dir.path())
            .env_remove("DATABASE_URL")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice::<Value>(&out.stdout).unwrap()
    };
    let migrated = Command::new(env!("CARGO_BIN_EXE_agentid"))
        .arg("migrate")
        .current_dir(dir.path())
        .env_remove("DATABASE_URL")
        .output()
        .unwrap();
    assert!(
        migrated.status.success(),
        "{}",
        String::from_utf8_lossy(&migrated.stderr)
    );
    let org = run(&["org", "create", "--name", "A", "--plan", "free"]);
    let id = org["org_id"].as_str().unwrap();
    let changed = run(&["org", "set-limits", "--org", id, "--plan", "growth"]);
    assert_eq!(
        (
            changed["plan"].as_str(),
            changed["verify_limit"].as_u64(),
            changed["other_limit"].as_u64()
        ),
        (Some("growth"), Some(50_000), Some(2_000))
    );
    let ent = run(&[
        "org",
        "set-limits",
        "--org",
        id,
        "--plan",
        "enterprise",
        "--verify-limit",
        "9",
        "--other-limit",
        "8",
    ]);
    assert_eq!(
        (
            ent["verify_limit"].as_u64(),
            ent["other_limit"].as_u64(),
            ent["max_expiry_seconds"].as_u64()
        ),
        (Some(9), Some(8), Some(31_536_000))
    );
    let tweak = run(&["org", "set-limits", "--org", id, "--verify-limit", "10"]);
    assert_eq!(
        (tweak["verify_limit"].as_u64(), tweak["other_limit"].as_u64()),
        (Some(10), Some(8))
    );
}

/// After SIGTERM the instance goes on serving for the drain time while `/health` answers
/// 503 `draining` (a balancer takes it out), every answer closing its connection; then it
/// stops accepting and exits 0.
#[actix_web::test]
async fn sigterm_drains_behind_a_health_check_that_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let db = crate::helpers::TestDb::new(dir.path()).await;
    let drain = [("AGENTID_SHUTDOWN_DRAIN_SECONDS", "2")];
    let mut server = crate::cli::start_server(dir.path(), Some(&db.url), &drain);
    let sk = server.printed_key("secret_live");
    let (_, token) = server.register(&sk, "n").await;
    let client = crate::helpers::client();
    let get = |path: String| {
        let client = client.clone();
        async move { crate::helpers::read(client.get(path).send().await.unwrap()).await }
    };
    let health = get(format!("{}/health", server.base)).await;
    assert_eq!(health.status, 200);
    assert_eq!(health.header("connection"), None);

    let signalled = sigterm(&server);
    actix_web::rt::time::sleep(Duration::from_millis(300)).await;
    let health = get(format!("{}/health", server.base)).await;
    assert_eq!(health.status, 503, "{}", health.text());
    assert_eq!(health.json()["status"], "draining");
    let verify = get(format!("{}/v1/verify/{token}", server.base)).await;
    assert_eq!(verify.status, 200, "still serving while draining");
    assert_eq!(verify.json()["valid"], true);
    assert_eq!(verify.header("connection").as_deref(), Some("close"));

    let status = exited(&mut server, signalled).await;
    assert!(status.success(), "exit status {status:?}");
    assert!(
        signalled.elapsed() >= Duration::from_secs(2),
        "served for the whole drain: {:?}",
        signalled.elapsed()
    );
}

//! The gateway configurations of docs/gateways.md, run as written with NGINX and Caddy from
//! Debian's packages (a machine without them fails here, saying so): a valid agent reaches an
//! upstream that never heard of agentid, with its facts in `X-Agent-*`; every refused one is
//! answered with agentid's status and challenge and never reaches the upstream; and a caller's
//! own `X-Agent-*`, `X-Forwarded-*` and `X-Original-*` headers change nothing.

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use serde_json::{json, Value};

use crate::dpop::AgentKey;
use crate::forward_auth::{proof, send};
use crate::helpers::{spawn_app, Resp, TestApp};

/// A free port on the loopback address.
pub(crate) fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The upstream: answers every request with what reached it, and counts them.
async fn upstream() -> (u16, Arc<AtomicUsize>) {
    let hits = Arc::new(AtomicUsize::new(0));
    let counted = hits.clone();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = HttpServer::new(move || {
        let hits = counted.clone();
        App::new().default_service(web::to(move |req: HttpRequest| {
            hits.fetch_add(1, Ordering::SeqCst);
            let agent: serde_json::Map<String, Value> = req
                .headers()
                .iter()
                .filter(|(n, _)| n.as_str().starts_with("x-agent-"))
                .map(|(n, v)| (n.as_str().to_owned(), json!(v.to_str().unwrap_or("?"))))
                .collect();
            let body =
                json!({"method": req.method().as_str(), "path": req.uri().to_string(), "agent": agent});
            async move { HttpResponse::Ok().json(body) }
        }))
    })
    .workers(1)
    .listen(listener)
    .unwrap()
    .run();
    actix_web::rt::spawn(server);
    (port, hits)
}

/// A gateway process, stopped when dropped.
pub(crate) struct Gateway {
    child: Child,
    pub(crate) port: u16,
}

impl Drop for Gateway {
    /// SIGTERM, so that NGINX's master stops its workers too (they outlive a SIGKILL).
    fn drop(&mut self) {
        let _ = Command::new("kill").arg(self.child.id().to_string()).status();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The documented configuration in `lang`, with the test's agentid, upstream and port.
fn documented(lang: &str, agentid: &str, upstream: u16, port: u16) -> String {
    let section = if lang == "nginx" { "NGINX" } else { "Caddy" };
    crate::readme::only_block(section, lang)
        .replace("127.0.0.1:8080", agentid)
        .replace("127.0.0.1:9000", &format!("127.0.0.1:{upstream}"))
        .replace("listen 8000;", &format!("listen 127.0.0.1:{port};"))
        .replace(":8000 {", &format!("http://127.0.0.1:{port} {{"))
}

fn installed(program: &str) -> Command {
    assert!(
        Command::new(program).arg("-v").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok()
            || Command::new(program).arg("version").stdout(Stdio::null()).status().is_ok(),
        "`{program}` is not installed: the gateway tests run Debian's nginx-light and caddy (apt-get install nginx-light caddy)"
    );
    Command::new(program)
}

async fn nginx(dir: &Path, agentid: &str, upstream: u16) -> Gateway {
    let port = free_port();
    nginx_serving(dir, &documented("nginx", agentid, upstream, port), port).await
}

/// NGINX with `servers` (its `server` blocks), listening on `port`.
pub(crate) async fn nginx_serving(dir: &Path, servers: &str, port: u16) -> Gateway {
    let d = dir.display();
    let conf = format!(
        "daemon off;\nworker_processes 1;\npid {d}/nginx.pid;\nerror_log {d}/error.log;\nevents {{}}\n\
         http {{\naccess_log off;\nclient_body_temp_path {d}/body;\nproxy_temp_path {d}/proxy;\n\
         fastcgi_temp_path {d}/fastcgi;\nuwsgi_temp_path {d}/uwsgi;\nscgi_temp_path {d}/scgi;\n{servers}\n}}\n"
    );
    std::fs::write(dir.join("nginx.conf"), conf).unwrap();
    let child = installed("nginx")
        .arg("-p")
        .arg(dir)
        .arg("-c")
        .arg(dir.join("nginx.conf"))
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    started(Gateway { child, port }, &dir.join("error.log")).await
}

async fn caddy(dir: &Path, agentid: &str, upstream: u16) -> Gateway {
    let port = free_port();
    // The test's own global options: no admin endpoint (tests run side by side), no storage
    // outside the test's directory.
    let conf = format!(
        "{{\n\tadmin off\n}}\n{}",
        documented("caddyfile", agentid, upstream, port)
    );
    std::fs::write(dir.join("Caddyfile"), conf).unwrap();
    let child = installed("caddy")
        .args(["run", "--adapter", "caddyfile", "--config"])
        .arg(dir.join("Caddyfile"))
        .env("XDG_DATA_HOME", dir)
        .env("XDG_CONFIG_HOME", dir)
        .env("HOME", dir)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("caddy.log")).unwrap())
        .spawn()
        .unwrap();
    started(Gateway { child, port }, &dir.join("caddy.log")).await
}

async fn started(mut gw: Gateway, log: &Path) -> Gateway {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if std::net::TcpStream::connect(("127.0.0.1", gw.port)).is_ok() {
            return gw;
        }
        if let Ok(Some(status)) = gw.child.try_wait() {
            panic!(
                "the gateway exited ({status}): {}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        assert!(
            Instant::now() < deadline,
            "the gateway did not listen: {}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        actix_web::rt::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A caller's request through the gateway.
async fn through(gw: &Gateway, method: &str, path: &str, headers: &[(&str, &str)]) -> Resp {
    let client = awc::Client::builder().timeout(Duration::from_secs(10)).finish();
    let url = format!("http://127.0.0.1:{}{path}", gw.port);
    send(&client, method, url, headers).await
}

/// Every case of docs/gateways.md's promise, through one gateway: the configurations take
/// access tokens for `https://api.example` with `read:docs`, from agents of example.com.
async fn the_gateway_holds(app: &TestApp, gw: &Gateway, hits: &AtomicUsize) {
    let key = AgentKey::ed();
    let agent = crate::oauth::client(app, &key).await;
    let access = |resource: &'static str, scope: &'static str| {
        let (key, agent) = (&key, agent.clone());
        async move {
            let t = crate::oauth::token(app, key, &agent, &[("resource", resource), ("scope", scope)]).await;
            format!("Bearer {}", t["access_token"].as_str().unwrap())
        }
    };
    let bearer = access("https://api.example", "read:docs").await;

    // A valid agent reaches the upstream, named by agentid, whatever the caller claims.
    let res = through(
        gw,
        "POST",
        "/docs/1?page=2",
        &[
            ("Authorization", &bearer),
            ("X-Agent-Id", "agt_forged"),
            ("X-Agent-Client-Id", "forged"),
            ("X-Agent-Subject", "mallory"),
            ("X-Agent-Subject-Issuer", "https://idp.example"),
            ("X-Agent-Signature-Agent", "https://forged.example/directory"),
        ],
    )
    .await;
    assert_eq!(res.status, 200, "{}", res.text());
    let seen = res.json();
    // A token that acts for nobody, signed by no third party: the caller's claims are gone.
    for forged in [
        "x-agent-subject",
        "x-agent-subject-issuer",
        "x-agent-signature-agent",
    ] {
        assert!(
            seen["agent"].get(forged).is_none_or(|v| v == ""),
            "{forged}: {seen}"
        );
    }
    assert_eq!(seen["path"], "/docs/1?page=2");
    assert_eq!(seen["method"], "POST");
    assert_eq!(seen["agent"]["x-agent-id"], agent.as_str(), "{seen}");
    assert_eq!(seen["agent"]["x-agent-issuer"], "example.com");
    assert_eq!(seen["agent"]["x-agent-scopes"], "read:docs");
    assert_eq!(seen["agent"]["x-agent-client-id"], agent.as_str(), "{seen}");

    let refused = |res: &Resp, status: u16, challenge: &str| {
        assert_eq!(res.status, status, "{}", res.text());
        let got = res.header("www-authenticate").unwrap_or_default();
        assert!(
            got.starts_with(challenge),
            "{got:?} does not start with {challenge:?}"
        );
    };
    let before = hits.load(Ordering::SeqCst);
    refused(&through(gw, "GET", "/docs/1", &[]).await, 401, "Bearer");
    let invalid = "Bearer error=\"invalid_token\"";

    // For another receiver, or for none (an agent token names no audience).
    let foreign = access("https://other.example", "read:docs").await;
    refused(
        &through(gw, "GET", "/docs/1", &[("Authorization", &foreign)]).await,
        401,
        invalid,
    );
    // An agent acting for a person: the upstream learns who, from agentid alone.
    let delegated = crate::delegation::person_token(app, "https://api.example", "read:docs").await;
    let res = through(
        gw,
        "GET",
        "/docs/2",
        &[
            ("Authorization", &format!("Bearer {}", delegated.token)),
            ("X-Agent-Subject", "mallory"),
        ],
    )
    .await;
    assert_eq!(res.status, 200, "{}", res.text());
    let seen = res.json();
    assert_eq!(seen["agent"]["x-agent-subject"], "alice", "{seen}");
    assert_eq!(seen["agent"]["x-agent-subject-issuer"], "https://idp.example");
    assert_eq!(seen["agent"]["x-agent-id"], delegated.agent.as_str());
    let before = before + 1;
    let (_, agent_token) = app.agent().await;
    let agent_token = format!("Bearer {agent_token}");
    refused(
        &through(gw, "GET", "/docs/1", &[("Authorization", &agent_token)]).await,
        401,
        invalid,
    );

    // Not enough scope (the configuration asks for read:docs).
    let caller = access("https://api.example", "tools:call").await;
    refused(
        &through(gw, "GET", "/docs/1", &[("Authorization", &caller)]).await,
        403,
        "Bearer error=\"insufficient_scope\", scope=\"read:docs\"",
    );

    // A bound token: only with a fresh proof for this origin, method and path.
    let dpop_key = AgentKey::es();
    let bound_token = crate::oauth::bound_token(app, &key, &agent, "https://api.example", &dpop_key).await;
    let dpop = format!("DPoP {bound_token}");
    refused(
        &through(
            gw,
            "GET",
            "/docs/1",
            &[("Authorization", &format!("Bearer {bound_token}"))],
        )
        .await,
        401,
        "DPoP",
    );
    let good = proof(&dpop_key, &bound_token, "GET", "https://api.example/docs/1");
    let res = through(gw, "GET", "/docs/1", &[("Authorization", &dpop), ("DPoP", &good)]).await;
    assert_eq!(res.status, 200, "{}", res.text());
    let after_dpop = hits.load(Ordering::SeqCst);
    refused(
        &through(gw, "GET", "/docs/1", &[("Authorization", &dpop), ("DPoP", &good)]).await,
        401,
        "DPoP error=\"invalid_dpop_proof\"",
    );
    let other_origin = proof(&dpop_key, &bound_token, "GET", "https://shop-b.example/docs/1");
    refused(
        &through(
            gw,
            "GET",
            "/docs/1",
            &[("Authorization", &dpop), ("DPoP", &other_origin)],
        )
        .await,
        401,
        "DPoP error=\"invalid_dpop_proof\"",
    );
    // A proof for another request, with forwarded headers that name it: the gateway names
    // the request it guards, overwriting the caller's.
    let elsewhere = proof(&dpop_key, &bound_token, "DELETE", "https://api.example/admin");
    let forged = [
        ("Authorization", dpop.as_str()),
        ("DPoP", elsewhere.as_str()),
        ("X-Original-Method", "DELETE"),
        ("X-Original-URL", "/admin"),
        ("X-Forwarded-Method", "DELETE"),
        ("X-Forwarded-Uri", "/admin"),
    ];
    refused(
        &through(gw, "GET", "/docs/1", &forged).await,
        401,
        "DPoP error=\"invalid_dpop_proof\"",
    );
    // The guarded request's query is not the policy.
    refused(
        &through(
            gw,
            "GET",
            "/docs/1?audience=https://other.example&scope=tools:call",
            &[("Authorization", &foreign)],
        )
        .await,
        401,
        invalid,
    );

    // Revoked: refused at once.
    assert_eq!(app.revoke(&agent, None).await.status, 200);
    refused(
        &through(gw, "GET", "/docs/1", &[("Authorization", &bearer)]).await,
        401,
        invalid,
    );
    assert_eq!(
        hits.load(Ordering::SeqCst),
        after_dpop,
        "a refused request reached the upstream"
    );
    assert_eq!(after_dpop, before + 1);
}

#[actix_web::test]
async fn the_documented_nginx_configuration_holds() {
    let app = spawn_app().await;
    let (port, hits) = upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let agentid = app.base.trim_start_matches("http://").to_owned();
    let gw = nginx(dir.path(), &agentid, port).await;
    the_gateway_holds(&app, &gw, &hits).await;
}

#[actix_web::test]
async fn the_documented_caddy_configuration_holds() {
    let app = spawn_app().await;
    let (port, hits) = upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let agentid = app.base.trim_start_matches("http://").to_owned();
    let gw = caddy(dir.path(), &agentid, port).await;
    the_gateway_holds(&app, &gw, &hits).await;
}

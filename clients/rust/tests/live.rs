//! agentid-verifier against a real server: the binary the repository builds (or
//! $AGENTID_BIN), on a fresh SQLite database, with status lists of a 2 s ttl.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use agentid_verifier::{Error, Verifier};
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use serde_json::{json, Value};

struct Server {
    child: Child,
    base: String,
    sk: String,
    sk_test: String,
    pk: String,
    _dir: PathBuf,
    env: Vec<(String, String)>,
}

fn bin() -> PathBuf {
    std::env::var_os("AGENTID_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/debug/agentid"))
}

impl Server {
    fn start() -> Server {
        let dir =
            std::env::temp_dir().join(format!("agentid-rs-{}-{:?}", std::process::id(), Instant::now()));
        std::fs::create_dir_all(&dir).unwrap();
        let env = vec![
            (
                "DATABASE_URL".to_owned(),
                format!("sqlite://{}/agentid.db", dir.display()),
            ),
            (
                "AGENTID_SIGNING_KEY_FILE".to_owned(),
                dir.join("key.pem").display().to_string(),
            ),
        ];
        let mut s = Server {
            child: Command::new("true").spawn().unwrap(),
            base: String::new(),
            sk: String::new(),
            sk_test: String::new(),
            pk: String::new(),
            _dir: dir,
            env,
        };
        s.cli(&["migrate"]); // only serve and migrate create a database
        let org: Value =
            serde_json::from_str(&s.cli(&["org", "create", "--name", "rs", "--plan", "growth"])).unwrap();
        s.sk = org["keys"]["secret_live"].as_str().unwrap().to_owned();
        s.sk_test = org["keys"]["secret_test"].as_str().unwrap().to_owned();
        s.pk = org["keys"]["publishable_live"].as_str().unwrap().to_owned();
        let mut child = Command::new(bin())
            .arg("serve")
            .envs(s.env.iter().cloned())
            .env("AGENTID_BIND", "127.0.0.1:0")
            .env("AGENTID_METRICS_BIND", "off")
            .env("AGENTID_STATUS_LIST_TTL", "2")
            .env("RUST_LOG", "warn")
            .current_dir(&s._dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start agentid (cargo build first)");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        s.base = loop {
            let line = lines.next().expect("agentid exited").unwrap();
            if let Some(rest) = line.strip_prefix("agentid: listening on ") {
                break rest.split_whitespace().next().unwrap().to_owned();
            }
        };
        std::thread::spawn(move || for _ in lines {});
        s.child = child;
        // The organization issues under example.com (the serve above made the key file).
        s.cli(&[
            "domain",
            "approve",
            "--org",
            org["org_id"].as_str().unwrap(),
            "example.com",
        ]);
        s
    }

    fn cli(&self, args: &[&str]) -> String {
        let out = Command::new(bin())
            .args(args)
            .envs(self.env.iter().cloned())
            .current_dir(&self._dir)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    }

    fn call(&self, method: &str, path: &str, body: Option<Value>, key: Option<&str>) -> Value {
        let req = ureq::request(method, &format!("{}{path}", self.base))
            .set("Authorization", &format!("Bearer {}", key.unwrap_or(&self.sk)));
        let res = match body {
            Some(b) => req
                .set("Content-Type", "application/json")
                .send_string(&b.to_string()),
            None => req.call(),
        }
        .unwrap();
        let text = res.into_string().unwrap();
        if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap()
        }
    }

    fn register(&self, extra: Value) -> (String, String) {
        self.register_with(extra, None)
    }

    fn register_with(&self, extra: Value, key: Option<&str>) -> (String, String) {
        let mut body = json!({"name": "bot", "issuer_domain": "example.com", "scopes": ["read:orders"]});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let a = self.call("POST", "/v1/agents/register", Some(body), key);
        (
            a["agent_id"].as_str().unwrap().to_owned(),
            a["token"].as_str().unwrap().to_owned(),
        )
    }

    fn revoke(&self, id: &str) {
        self.call("POST", &format!("/v1/agents/{id}/revoke"), None, None);
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn kid(token: &str) -> String {
    let h: Value =
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(token.split('.').next().unwrap()).unwrap()).unwrap();
    h["kid"].as_str().unwrap().to_owned()
}

fn code<T>(r: Result<T, Error>) -> &'static str {
    r.map_or_else(|e| e.code(), |_| "ok")
}

#[tokio::test(flavor = "current_thread")]
async fn the_receiver_contract_against_a_real_server() {
    let s = Server::start();
    let (id, token) = s.register(json!({}));
    let v = Verifier::builder(&s.base)
        .issuers(["example.com"])
        .build()
        .unwrap();
    let agent = v.verify_with_scopes(&token, &["read:orders"]).await.unwrap();
    assert_eq!(
        (agent.agent_id.as_str(), agent.issuer.as_str()),
        (id.as_str(), "example.com")
    );
    assert_eq!(agent.scopes, ["read:orders"]);

    // Tampered, alg and kid tricks, another issuer, a missing scope.
    let parts: Vec<&str> = token.split('.').collect();
    let mut claims: Value = serde_json::from_slice(&URL_SAFE_NO_PAD.decode(parts[1]).unwrap()).unwrap();
    claims["scopes"] = json!(["admin:x"]);
    let forged = URL_SAFE_NO_PAD.encode(claims.to_string());
    let none = URL_SAFE_NO_PAD.encode(json!({"alg": "none", "kid": kid(&token)}).to_string());
    let hs = URL_SAFE_NO_PAD.encode(json!({"alg": "HS256", "kid": kid(&token)}).to_string());
    let nokid = URL_SAFE_NO_PAD.encode(json!({"alg": "EdDSA"}).to_string());
    for bad in [
        format!("{}.{forged}.{}", parts[0], parts[2]),
        format!("{none}.{}.", parts[1]),
        format!("{hs}.{}.{}", parts[1], parts[2]),
        format!("{nokid}.{}.{}", parts[1], parts[2]),
        "not a token".to_owned(),
    ] {
        assert_eq!(code(v.verify(&bad).await), "TOKEN_INVALID", "{bad}");
    }
    let other = Verifier::builder(&s.base)
        .issuers(["other.example"])
        .build()
        .unwrap();
    assert_eq!(code(other.verify(&token).await), "TOKEN_INVALID");
    assert_eq!(
        code(v.verify_with_scopes(&token, &["write:x"]).await),
        "INSUFFICIENT_SCOPE"
    );

    // Expired, and within the leeway.
    let (_, short) = s.register(json!({"expiry_seconds": 1}));
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let strict = Verifier::builder(&s.base).leeway(Duration::ZERO).build().unwrap();
    assert_eq!(code(strict.verify(&short).await), "TOKEN_EXPIRED");
    assert_eq!(code(v.verify(&short).await), "ok");

    // Revoked: through the status list within its ttl.
    s.revoke(&id);
    let started = Instant::now();
    while code(v.verify(&token).await) != "TOKEN_REVOKED" {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "not seen within ttl + 2 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Revoked at once through a SET from a real (poll) stream.
    let stream = s.call(
        "POST",
        "/ssf/streams",
        Some(json!({"delivery": {"method": "urn:ietf:rfc:8936"},
        "events_requested": ["https://schemas.openid.net/secevent/caep/event-type/session-revoked"]})),
        None,
    );
    let (id2, token2) = s.register(json!({}));
    let w = Verifier::builder(&s.base).build().unwrap();
    w.verify(&token2).await.unwrap();
    s.revoke(&id2);
    let polled = s.call(
        "POST",
        &format!("/ssf/poll/{}", stream["stream_id"].as_str().unwrap()),
        Some(json!({"returnImmediately": true})),
        stream["poll_token"].as_str(),
    );
    let set = polled["sets"]
        .as_object()
        .unwrap()
        .values()
        .next()
        .unwrap()
        .as_str()
        .unwrap()
        .to_owned();
    w.handle_set(&set).await.unwrap();
    assert_eq!(code(w.verify(&token2).await), "TOKEN_REVOKED");
    assert_eq!(code(w.handle_set(&token2).await), "TOKEN_INVALID");

    // Online.
    let (id3, token3) = s.register(json!({}));
    assert_eq!(v.verify_online(&token3, Some(&s.pk)).await.unwrap().agent_id, id3);
    s.revoke(&id3);
    assert_eq!(code(v.verify_online(&token3, None).await), "TOKEN_REVOKED");

    // A rotated key (a new kid), then the old one retired.
    let (_, old) = s.register(json!({}));
    let r = Verifier::builder(&s.base)
        .kid_refetch_interval(Duration::ZERO)
        .build()
        .unwrap();
    r.verify(&old).await.unwrap();
    let rotated: Value =
        serde_json::from_str(&s.cli(&["signing-key", "rotate", "--publish-for", "0s"])).unwrap();
    tokio::time::sleep(Duration::from_secs(6)).await;
    let (_, fresh) = s.register(json!({}));
    assert_eq!(kid(&fresh), rotated["kid"].as_str().unwrap());
    assert_eq!(code(r.verify(&fresh).await), "ok");
    s.cli(&["signing-key", "retire", &kid(&old)]);
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(
        code(Verifier::builder(&s.base).build().unwrap().verify(&old).await),
        "TOKEN_INVALID"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn an_unreachable_list_fails_closed_or_open() {
    let s = Server::start();
    let (id, token) = s.register(json!({}));
    let closed = Verifier::builder(&s.base)
        .list_grace(Duration::ZERO)
        .build()
        .unwrap();
    let open = Verifier::builder(&s.base)
        .list_grace(Duration::ZERO)
        .fail_open(true)
        .build()
        .unwrap();
    closed.verify(&token).await.unwrap();
    open.verify(&token).await.unwrap();
    drop(s);
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(code(closed.verify(&token).await), "UNAVAILABLE");
    assert_eq!(open.verify(&token).await.unwrap().agent_id, id);
}

#[cfg(feature = "tower")]
#[tokio::test(flavor = "current_thread")]
async fn the_tower_layer_answers_401_403_and_200() {
    use std::future::{ready, Ready};
    use std::task::{Context, Poll};

    use agentid_verifier::tower::AgentIdLayer;
    use tower_layer::Layer;
    use tower_service::Service;

    /// Answers with the agent id the layer put in the extensions.
    #[derive(Clone)]
    struct Echo;
    impl Service<http::Request<()>> for Echo {
        type Response = http::Response<String>;
        type Error = std::convert::Infallible;
        type Future = Ready<Result<Self::Response, Self::Error>>;
        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }
        fn call(&mut self, req: http::Request<()>) -> Self::Future {
            let agent = req.extensions().get::<agentid_verifier::Agent>().unwrap();
            ready(Ok(http::Response::new(agent.agent_id.clone())))
        }
    }

    let s = Server::start();
    let (id, token) = s.register(json!({}));
    let v = Verifier::builder(&s.base).build().unwrap();
    let call = |scopes: &[&str], auth: Option<String>| {
        let mut svc = AgentIdLayer::new(v.clone(), scopes).layer(Echo);
        let mut req = http::Request::builder();
        if let Some(a) = auth {
            req = req.header("Authorization", a);
        }
        let req = req.body(()).unwrap();
        async move { svc.call(req).await.unwrap() }
    };
    let res = call(&[], None).await;
    assert_eq!(res.status(), 401);
    assert_eq!(res.body(), r#"{"error":"TOKEN_INVALID"}"#);
    assert_eq!(
        res.headers()["www-authenticate"],
        r#"Bearer error="invalid_token""#
    );
    assert_eq!(
        call(&["admin:x"], Some(format!("Bearer {token}"))).await.status(),
        403
    );
    let ok = call(&["read:orders"], Some(format!("Bearer {token}"))).await;
    assert_eq!((ok.status().as_u16(), ok.body().as_str()), (200, id.as_str()));
}

/// Attack: a test-mode token offered to a default verifier.
#[tokio::test(flavor = "current_thread")]
async fn a_test_mode_token_is_refused_unless_allowed() {
    let s = Server::start();
    let sk_test = s.sk_test.clone();
    let (_, token) = s.register_with(json!({}), Some(&sk_test));
    let strict = Verifier::builder(&s.base).build().unwrap();
    assert_eq!(code(strict.verify(&token).await), "TOKEN_INVALID");
    assert_eq!(code(strict.verify_online(&token, None).await), "TOKEN_INVALID");
    let allowed = Verifier::builder(&s.base).allow_test(true).build().unwrap();
    assert!(!allowed.verify(&token).await.unwrap().livemode);
    assert!(!allowed.verify_online(&token, None).await.unwrap().livemode);
    let (_, live) = s.register(json!({}));
    assert!(strict.verify(&live).await.unwrap().livemode);
    assert!(strict.verify_online(&live, None).await.unwrap().livemode);
}

//! agentid-verifier against a real server: the binary the repository builds (or
//! $AGENTID_BIN), on a fresh SQLite database, with status lists of a 2 s ttl; and a proxy of
//! our own to put in front of it.

use std::io::{BufRead, BufReader, Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use agentid_verifier::{Error, Verifier};
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine as _;
use ed25519_dalek::{Signer as _, SigningKey};
use serde_json::{json, Value};

#[path = "live/counters.rs"]
mod counters;
#[path = "live/delegation.rs"]
mod delegation;
#[path = "live/directories.rs"]
mod directories;
#[path = "live/dpop.rs"]
mod dpop;
#[path = "live/examples.rs"]
mod examples;
#[path = "live/oauth.rs"]
mod oauth;
#[path = "live/requests.rs"]
mod requests;
#[path = "live/times.rs"]
mod times;

const SESSION_REVOKED: &str = "https://schemas.openid.net/secevent/caep/event-type/session-revoked";

struct Server {
    child: Child,
    base: String,
    sk: String,
    sk_test: String,
    pk: String,
    org_id: String,
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
        Server::start_with(&[])
    }

    /// A server with more of its environment, e.g. `AGENTID_PUBLIC_URL`.
    fn start_with(extra: &[(&str, &str)]) -> Server {
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
            org_id: String::new(),
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
            .envs(extra.iter().copied())
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
        // The organization issues under example.com (`org create` above made the key file).
        s.org_id = org["org_id"].as_str().unwrap().to_owned();
        s.approve("example.com");
        s
    }

    /// The operator grants `domain` to the test's organization.
    fn approve(&self, domain: &str) {
        self.cli(&["domain", "approve", "--org", &self.org_id, domain]);
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

    /// A JWS of `claims` signed with the key of the server's key file (the key that signs
    /// until a rotation): what only the service could sign.
    fn sign(&self, claims: &Value, typ: &str) -> String {
        self.sign_with(claims, json!({"typ": typ}))
    }

    /// As [`Server::sign`], the header's members beside `alg` and `kid` being `header`'s.
    fn sign_with(&self, claims: &Value, header: Value) -> String {
        let pem = std::fs::read_to_string(self._dir.join("key.pem")).unwrap();
        let der = STANDARD
            .decode(
                pem.lines()
                    .filter(|l| !l.starts_with("-----"))
                    .collect::<String>(),
            )
            .unwrap();
        assert_eq!(
            der.len(),
            48,
            "a PKCS#8 v1 Ed25519 key: its seed is the last 32 bytes"
        );
        let key = SigningKey::from_bytes(der[16..].try_into().unwrap());
        let x = URL_SAFE_NO_PAD.encode(key.verifying_key().as_bytes());
        let jwks: Value = serde_json::from_str(
            &ureq::get(&format!("{}/.well-known/jwks.json", self.base))
                .call()
                .unwrap()
                .into_string()
                .unwrap(),
        )
        .unwrap();
        let jwk = jwks["keys"]
            .as_array()
            .unwrap()
            .iter()
            .find(|k| k["x"] == x.as_str());
        let mut header = header;
        header["alg"] = json!("EdDSA");
        header["kid"] = jwk.unwrap()["kid"].clone();
        jws(&key, &header, claims)
    }

    /// The SET of a revocation, polled from a new poll stream (created with `stream`'s extra
    /// fields): the SET and the stream.
    /// A new poll stream of revocations (`stream`'s members added to its request).
    fn set_stream(&self, stream: Value) -> Value {
        let mut body =
            json!({"delivery": {"method": "urn:ietf:rfc:8936"}, "events_requested": [SESSION_REVOKED]});
        body.as_object_mut()
            .unwrap()
            .extend(stream.as_object().unwrap().clone());
        self.call("POST", "/ssf/streams", Some(body), None)
    }

    /// The one SET a poll of `stream` gives.
    fn the_set(&self, stream: &Value) -> String {
        let polled = self.call(
            "POST",
            &format!("/ssf/poll/{}", stream["stream_id"].as_str().unwrap()),
            Some(json!({"returnImmediately": true})),
            stream["poll_token"].as_str(),
        );
        let sets: Vec<&Value> = polled["sets"].as_object().unwrap().values().collect();
        assert_eq!(sets.len(), 1, "{polled}");
        sets[0].as_str().unwrap().to_owned()
    }

    /// The SET of a revocation, polled from a new stream: the SET and the stream.
    fn polled_set(&self, stream: Value) -> (String, Value) {
        let created = self.set_stream(stream);
        let (id, _) = self.register(json!({}));
        self.revoke(&id);
        (self.the_set(&created), created)
    }
}

type Headers = Vec<(String, String)>;
type Rewrite = dyn Fn(&str, u16, Headers, Vec<u8>) -> (u16, Headers, Vec<u8>) + Send + Sync;

/// What the proxy does with a request.
#[derive(Clone, Copy, PartialEq)]
enum Mode {
    /// Passes it to the upstream, and its answer through the rewrite.
    Pass,
    /// Never answers.
    Silent,
    /// Answers a head, then never the body it announces.
    Stall,
}

#[derive(Default)]
struct ProxyState {
    upstream: String,
    rewrite: Option<Arc<Rewrite>>,
    mode: Option<Mode>,
}

/// An HTTP proxy on a port of its own: each GET goes to `upstream`, and its answer back
/// through the rewrite, if any.
struct Proxy {
    url: String,
    state: Arc<Mutex<ProxyState>>,
}

impl Proxy {
    fn start() -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let state = Arc::new(Mutex::new(ProxyState::default()));
        let shared = state.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let state = shared.clone();
                std::thread::spawn(move || {
                    let _ = Proxy::serve(&state, conn);
                });
            }
        });
        Proxy { url, state }
    }

    fn rewrite(
        &self,
        f: impl Fn(&str, u16, Headers, Vec<u8>) -> (u16, Headers, Vec<u8>) + Send + Sync + 'static,
    ) {
        self.state.lock().unwrap().rewrite = Some(Arc::new(f));
    }

    /// Answers `status` with `body` (and `headers`) for the paths under `prefix`.
    fn answer_under(&self, prefix: &'static str, status: u16, headers: Headers, body: Vec<u8>) {
        self.rewrite(move |path, s, h, b| {
            if path.starts_with(prefix) {
                (status, headers.clone(), body.clone())
            } else {
                (s, h, b)
            }
        });
    }

    fn mode(&self, mode: Mode) {
        self.state.lock().unwrap().mode = Some(mode);
    }

    /// Back to passing everything unchanged.
    fn pass(&self) {
        let mut s = self.state.lock().unwrap();
        s.rewrite = None;
        s.mode = None;
    }

    fn serve(state: &Mutex<ProxyState>, mut conn: TcpStream) -> std::io::Result<()> {
        let mut reader = BufReader::new(conn.try_clone()?);
        let mut line = String::new();
        reader.read_line(&mut line)?;
        let path = line.split_whitespace().nth(1).unwrap_or("/").to_owned();
        let mut sent = Vec::new();
        loop {
            let mut h = String::new();
            reader.read_line(&mut h)?;
            let Some((name, value)) = h.trim_end().split_once(':') else {
                break;
            };
            let name = name.trim().to_ascii_lowercase();
            if ["accept", "authorization", "if-none-match"].contains(&name.as_str()) {
                sent.push((name, value.trim().to_owned()));
            }
        }
        let (upstream, rewrite, mode) = {
            let s = state.lock().unwrap();
            (
                s.upstream.clone(),
                s.rewrite.clone(),
                s.mode.unwrap_or(Mode::Pass),
            )
        };
        match mode {
            Mode::Pass => {}
            Mode::Silent => {
                std::thread::sleep(Duration::from_secs(5));
                return Ok(());
            }
            Mode::Stall => {
                conn.write_all(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{",
                )?;
                std::thread::sleep(Duration::from_secs(5));
                return Ok(());
            }
        }
        let agent = ureq::AgentBuilder::new()
            .redirects(0)
            .timeout(Duration::from_secs(10))
            .build();
        let mut req = agent.get(&format!("{upstream}{path}"));
        for (name, value) in &sent {
            req = req.set(name, value);
        }
        let res = match req.call() {
            Ok(r) | Err(ureq::Error::Status(_, r)) => r,
            Err(e) => {
                return conn.write_all(
                    format!("HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\n\r\n{e}").as_bytes(),
                )
            }
        };
        let status = res.status();
        let headers: Headers = res
            .headers_names()
            .into_iter()
            .filter_map(|n| res.header(&n).map(|v| (n.to_ascii_lowercase(), v.to_owned())))
            .collect();
        let mut body = Vec::new();
        res.into_reader().read_to_end(&mut body)?;
        let (status, headers, body) = match rewrite {
            Some(f) => f(&path, status, headers, body),
            None => (status, headers, body),
        };
        let mut head = format!("HTTP/1.1 {status} Proxied\r\n");
        for (name, value) in headers {
            if ![
                "content-length",
                "transfer-encoding",
                "connection",
                "date",
                "keep-alive",
            ]
            .contains(&name.as_str())
            {
                head += &format!("{name}: {value}\r\n");
            }
        }
        head += &format!("content-length: {}\r\nconnection: close\r\n\r\n", body.len());
        conn.write_all(head.as_bytes())?;
        conn.write_all(&body)
    }
}

/// A server whose public URL (the base of its status lists, the `iss` of its SETs) is a
/// proxy in front of it.
fn proxied() -> (Server, Proxy) {
    let proxy = Proxy::start();
    let s = Server::start_with(&[("AGENTID_PUBLIC_URL", &proxy.url)]);
    proxy.state.lock().unwrap().upstream = s.base.clone();
    (s, proxy)
}

/// A compact JWS of `claims` under `header`, signed with the Ed25519 `key`.
fn jws(key: &SigningKey, header: &Value, claims: &Value) -> String {
    let signed = format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(header.to_string()),
        URL_SAFE_NO_PAD.encode(claims.to_string())
    );
    let sig = key.sign(signed.as_bytes());
    format!("{signed}.{}", URL_SAFE_NO_PAD.encode(sig.to_bytes()))
}

fn claims_of(token: &str) -> Value {
    serde_json::from_slice(&URL_SAFE_NO_PAD.decode(token.split('.').nth(1).unwrap()).unwrap()).unwrap()
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs()
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

/// A service that answers with the agent id the tower layer put in the extensions.
/// A service behind the tower layer answering each request with what its function reads of
/// it (the extensions the layer set).
#[cfg(feature = "tower")]
#[derive(Clone)]
struct Reply(fn(&http::Request<()>) -> String);

/// Answers with the id of the agent the layer verified.
#[cfg(feature = "tower")]
const ECHO: Reply = Reply(|req| {
    req.extensions()
        .get::<agentid_verifier::Agent>()
        .unwrap()
        .agent_id
        .clone()
});

#[cfg(feature = "tower")]
impl tower_service::Service<http::Request<()>> for Reply {
    type Response = http::Response<String>;
    type Error = std::convert::Infallible;
    type Future = std::future::Ready<Result<Self::Response, Self::Error>>;
    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }
    fn call(&mut self, req: http::Request<()>) -> Self::Future {
        std::future::ready(Ok(http::Response::new((self.0)(&req))))
    }
}

fn code<T>(r: Result<T, Error>) -> &'static str {
    r.map_or_else(|e| e.code(), |_| "ok")
}

/// Calls `check` until it answers `want`, failing once `within` has passed.
async fn until<F, Fut>(want: &str, within: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = &'static str>,
{
    let started = Instant::now();
    loop {
        let got = check().await;
        if got == want {
            return;
        }
        assert!(
            started.elapsed() < within,
            "{want} not seen within {within:?}: {got}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "current_thread")]
async fn the_receiver_contract_against_a_real_server() {
    let s = Server::start();
    let (id, token) = s.register(json!({}));
    let v = Verifier::builder(&s.base)
        .allow_local(true)
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
        .allow_local(true)
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
    let strict = Verifier::builder(&s.base)
        .allow_local(true)
        .leeway(Duration::ZERO)
        .build()
        .unwrap();
    assert_eq!(code(strict.verify(&short).await), "TOKEN_EXPIRED");
    assert_eq!(code(v.verify(&short).await), "ok");

    // Revoked: through the status list within its ttl and one fetch.
    s.revoke(&id);
    let (vr, t) = (&v, &token);
    until("TOKEN_REVOKED", Duration::from_secs(5), || async move {
        code(vr.verify(t).await)
    })
    .await;

    // Revoked at once through a SET from a real (poll) stream.
    let stream = s.call(
        "POST",
        "/ssf/streams",
        Some(json!({"delivery": {"method": "urn:ietf:rfc:8936"},
        "events_requested": ["https://schemas.openid.net/secevent/caep/event-type/session-revoked"]})),
        None,
    );
    let (id2, token2) = s.register(json!({}));
    let w = Verifier::builder(&s.base).allow_local(true).build().unwrap();
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
    assert_eq!(
        v.verify_online(&token3, Some(&s.pk), &[]).await.unwrap().agent_id,
        id3
    );
    s.revoke(&id3);
    assert_eq!(code(v.verify_online(&token3, None, &[]).await), "TOKEN_REVOKED");

    // A rotated key (a new kid), then the old one retired.
    let (_, old) = s.register(json!({}));
    let r = Verifier::builder(&s.base)
        .allow_local(true)
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
        code(
            Verifier::builder(&s.base)
                .allow_local(true)
                .build()
                .unwrap()
                .verify(&old)
                .await
        ),
        "TOKEN_INVALID"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn an_unreachable_list_fails_closed_or_open() {
    let s = Server::start();
    let (id, token) = s.register(json!({}));
    let closed = Verifier::builder(&s.base)
        .allow_local(true)
        .list_grace(Duration::ZERO)
        .build()
        .unwrap();
    let open = Verifier::builder(&s.base)
        .allow_local(true)
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
    use agentid_verifier::tower::AgentIdLayer;
    use tower_layer::Layer;
    use tower_service::Service;

    let s = Server::start();
    let (id, token) = s.register(json!({}));
    let v = Verifier::builder(&s.base).allow_local(true).build().unwrap();
    let call = |scopes: &[&str], auth: Option<String>| {
        let mut svc = AgentIdLayer::new(v.clone(), scopes).layer(ECHO);
        let mut req = http::Request::builder();
        if let Some(a) = auth {
            req = req.header("Authorization", a);
        }
        let req = req.body(()).unwrap();
        async move { svc.call(req).await.unwrap() }
    };
    let res = call(&[], None).await;
    assert_eq!(res.status(), 401);
    assert_eq!(
        res.body(),
        r#"{"error":"TOKEN_INVALID","message":"no Authorization header"}"#
    );
    // No credentials: no error code, and both schemes (RFC 6750 §3.1, RFC 9449 §7.1).
    assert_eq!(
        res.headers()["www-authenticate"],
        r#"Bearer, DPoP algs="EdDSA Ed25519 ES256""#
    );
    let res = call(&[], Some("Bearer nope".into())).await;
    assert_eq!(
        res.headers()["www-authenticate"],
        r#"Bearer error="invalid_token""#
    );
    let res = call(&["admin:x"], Some(format!("Bearer {token}"))).await;
    assert_eq!(res.status(), 403);
    assert_eq!(
        res.headers()["www-authenticate"],
        r#"Bearer error="insufficient_scope", scope="admin:x""#
    );
    let ok = call(&["read:orders"], Some(format!("Bearer {token}"))).await;
    assert_eq!((ok.status().as_u16(), ok.body().as_str()), (200, id.as_str()));
    // Two Authorization headers: the application behind might read the other one.
    let mut svc = AgentIdLayer::new(v.clone(), &[]).layer(ECHO);
    let req = http::Request::builder()
        .header("Authorization", format!("Bearer {token}"))
        .header("Authorization", "Bearer someone-else")
        .body(())
        .unwrap();
    assert_eq!(svc.call(req).await.unwrap().status(), 401);
}

/// Attack: a test-mode token offered to a default verifier.
#[tokio::test(flavor = "current_thread")]
async fn a_test_mode_token_is_refused_unless_allowed() {
    let s = Server::start();
    let sk_test = s.sk_test.clone();
    let (_, token) = s.register_with(json!({}), Some(&sk_test));
    let strict = Verifier::builder(&s.base).allow_local(true).build().unwrap();
    assert_eq!(code(strict.verify(&token).await), "TOKEN_INVALID");
    assert_eq!(
        code(strict.verify_online(&token, None, &[]).await),
        "TOKEN_INVALID"
    );
    let allowed = Verifier::builder(&s.base)
        .allow_local(true)
        .allow_test(true)
        .build()
        .unwrap();
    assert!(!allowed.verify(&token).await.unwrap().livemode);
    assert!(!allowed.verify_online(&token, None, &[]).await.unwrap().livemode);
    let (_, live) = s.register(json!({}));
    assert!(strict.verify(&live).await.unwrap().livemode);
    assert!(strict.verify_online(&live, None, &[]).await.unwrap().livemode);
}

// -- keys and fetches ------------------------------------------------------------------------

/// Behind a proxy that strips ETags (and keeps nothing past 1 s), a rotation is seen: the
/// new key is trusted and the retired one no longer; a revocation shows in the list.
#[tokio::test(flavor = "current_thread")]
async fn a_key_set_served_without_an_etag_still_refreshes() {
    let (s, p) = proxied();
    p.rewrite(|_, status, mut headers, body| {
        headers.retain(|(name, _)| name != "etag" && name != "cache-control");
        headers.push(("cache-control".into(), "max-age=1".into()));
        (status, headers, body)
    });
    let (id, old) = s.register(json!({}));
    let v = Verifier::builder(&p.url)
        .allow_local(true)
        .kid_refetch_interval(Duration::ZERO)
        .build()
        .unwrap();
    v.verify(&old).await.unwrap();
    let rotated: Value =
        serde_json::from_str(&s.cli(&["signing-key", "rotate", "--publish-for", "0s"])).unwrap();
    tokio::time::sleep(Duration::from_secs(6)).await; // every instance reads the keys every 5 s
    let (_, fresh) = s.register(json!({}));
    assert_eq!(kid(&fresh), rotated["kid"].as_str().unwrap());
    assert_eq!(code(v.verify(&fresh).await), "ok");
    s.revoke(&id);
    let (vr, o) = (&v, &old);
    until("TOKEN_REVOKED", Duration::from_secs(5), || async move {
        code(vr.verify(o).await)
    })
    .await;
    s.cli(&["signing-key", "retire", &kid(&old)]);
    tokio::time::sleep(Duration::from_secs(6)).await;
    // The stale keys answer while one refresh runs behind; then the retired key is gone.
    until("TOKEN_INVALID", Duration::from_secs(2), || async move {
        code(vr.verify(o).await)
    })
    .await;
}

/// Attack: a cache on the path answering every fetch of a status list 304 kept the list held
/// in use for good, its bits from before every revocation since. Past its `exp` a held list
/// answers nothing, whatever a 304 says.
#[tokio::test(flavor = "current_thread")]
async fn a_status_list_past_its_exp_is_not_kept_by_304s() {
    let (s, p) = proxied();
    let (id, token) = s.register(json!({}));
    let v = Verifier::builder(&p.url)
        .allow_local(true)
        .leeway(Duration::ZERO)
        .list_grace(Duration::from_secs(30))
        .build()
        .unwrap();
    v.verify(&token).await.unwrap();
    p.answer_under("/v1/status/", 304, Vec::new(), Vec::new());
    s.revoke(&id);
    // The list lives 2 s (its ttl) and expires 2 ttls after it was made (whole seconds).
    tokio::time::sleep(Duration::from_millis(5100)).await;
    let got = code(v.verify(&token).await);
    assert!(got == "UNAVAILABLE" || got == "TOKEN_REVOKED", "{got}");
    p.pass();
    let (vr, t) = (&v, &token);
    until("TOKEN_REVOKED", Duration::from_secs(5), || async move {
        code(vr.verify(t).await)
    })
    .await;
}

/// The key set through `p` says it is fresh for `secs` seconds.
fn keys_fresh_for(p: &Proxy, secs: u64) {
    p.rewrite(move |path, status, mut headers, body| {
        if path.ends_with("jwks.json") {
            headers.retain(|(name, _)| name != "cache-control");
            headers.push(("cache-control".into(), format!("max-age={secs}")));
        }
        (status, headers, body)
    });
}

/// Stale keys and a stale list serve at once while one refresh waits behind, until the
/// list's ttl + list_grace; then the check waits for a fetch, and fails closed.
#[tokio::test(flavor = "current_thread")]
async fn a_hung_issuer_stalls_no_warm_check_until_the_grace_runs_out() {
    let (s, p) = proxied();
    // The keys go stale after two seconds, as the list does: both serve through the grace
    // that follows.
    keys_fresh_for(&p, 2);
    let (_, token) = s.register(json!({}));
    let v = Verifier::builder(&p.url)
        .allow_local(true)
        .list_grace(Duration::from_secs(3))
        .timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    v.verify(&token).await.unwrap();
    p.mode(Mode::Silent);
    tokio::time::sleep(Duration::from_millis(2200)).await; // the keys and the list (ttl 2 s) are stale
    let end = Instant::now() + Duration::from_secs(2);
    let mut slowest = Duration::ZERO;
    while Instant::now() < end {
        let started = Instant::now();
        assert_eq!(code(v.verify(&token).await), "ok");
        slowest = slowest.max(started.elapsed());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        slowest < Duration::from_millis(250),
        "a warm check waited {slowest:?} for a hung issuer"
    );
    tokio::time::sleep(Duration::from_millis(1200)).await; // past ttl + list_grace (5 s)
    assert_eq!(code(v.verify(&token).await), "UNAVAILABLE");
    p.pass();
}

/// Attack: a key the service has dropped would verify for as long as the service cannot be
/// reached: keys serve past their freshness only for the list grace, as a list does.
#[tokio::test(flavor = "current_thread")]
async fn keys_past_the_grace_serve_no_more_while_the_service_cannot_be_reached() {
    let (s, p) = proxied();
    keys_fresh_for(&p, 1);
    let (_, token) = s.register(json!({}));
    // Open on lists: only the keys decide.
    let v = Verifier::builder(&p.url)
        .allow_local(true)
        .fail_open(true)
        .list_grace(Duration::from_secs(1))
        .timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    v.verify(&token).await.unwrap();
    p.answer_under("/", 503, Vec::new(), Vec::new());
    tokio::time::sleep(Duration::from_millis(1300)).await; // stale, within the grace
    assert_eq!(code(v.verify(&token).await), "ok");
    tokio::time::sleep(Duration::from_millis(1000)).await; // past freshness + grace (2 s)
    assert_eq!(code(v.verify(&token).await), "UNAVAILABLE");
    p.pass();
    assert_eq!(code(v.verify(&token).await), "ok");
}

/// Attack: tokens naming kids nobody has, while the key set is stale and the service answers
/// 503: the key set is asked for once per `kid_refetch_interval`, not once a token.
#[tokio::test(flavor = "current_thread")]
async fn made_up_kids_fetch_the_key_set_no_more_while_the_service_is_down() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
    let (s, p) = proxied();
    let (asked, down) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicBool::new(false)));
    let (a, d) = (asked.clone(), down.clone());
    p.rewrite(move |path, status, mut headers, body| {
        if !path.ends_with("jwks.json") {
            return (status, headers, body);
        }
        if d.load(SeqCst) {
            a.fetch_add(1, SeqCst);
            return (503, Vec::new(), Vec::new());
        }
        headers.retain(|(name, _)| name != "cache-control");
        headers.push(("cache-control".into(), "max-age=1".into()));
        (status, headers, body)
    });
    let (_, token) = s.register(json!({}));
    let v = Verifier::builder(&p.url).allow_local(true).build().unwrap();
    v.verify(&token).await.unwrap();
    down.store(true, SeqCst);
    tokio::time::sleep(Duration::from_millis(1200)).await;
    for i in 0..20 {
        let header = json!({"alg": "EdDSA", "kid": format!("k{i}"), "typ": "JWT"});
        let forged = format!(
            "{}.e30.{}",
            URL_SAFE_NO_PAD.encode(header.to_string()),
            URL_SAFE_NO_PAD.encode([0u8; 64])
        );
        assert_eq!(code(v.verify(&forged).await), "TOKEN_INVALID");
    }
    assert!(
        asked.load(SeqCst) <= 3,
        "{} fetches of the key set",
        asked.load(SeqCst)
    );
    p.pass();
}

/// After a rotation, a token of the old key (still held, fresh) whose list is now signed by
/// the new key: reading the list fetches the keys, and must not wait on itself. (No grace:
/// the list is read, not the one held.)
#[tokio::test(flavor = "current_thread")]
async fn a_list_signed_by_a_new_key_is_read() {
    let s = Server::start();
    let (_, old) = s.register(json!({}));
    let v = Verifier::builder(&s.base)
        .allow_local(true)
        .kid_refetch_interval(Duration::ZERO)
        .list_grace(Duration::ZERO)
        .build()
        .unwrap();
    v.verify(&old).await.unwrap();
    s.cli(&["signing-key", "rotate", "--publish-for", "0s"]);
    tokio::time::sleep(Duration::from_secs(6)).await;
    let verified = tokio::time::timeout(Duration::from_secs(10), v.verify(&old))
        .await
        .expect("a verification that never ends");
    assert_eq!(code(verified), "ok");
}

/// A redirect (to the very service, with the very body) or any answer but a 200 (or a 304 to
/// a revalidation) is UNAVAILABLE: for keys, status lists and online verification.
#[tokio::test(flavor = "current_thread")]
async fn no_redirect_is_followed() {
    let (s, p) = proxied();
    let (_, token) = s.register(json!({}));
    for (prefix, online) in [
        ("/.well-known/jwks.json", false),
        ("/v1/status/", false),
        ("/v1/verify/", true),
    ] {
        for status in [301, 302, 307, 308, 203, 304] {
            let upstream = s.base.clone();
            p.rewrite(move |path, s, mut headers, body| {
                if !path.starts_with(prefix) {
                    return (s, headers, body);
                }
                headers.push(("location".into(), format!("{upstream}{path}")));
                (status, headers, if status == 304 { Vec::new() } else { body })
            });
            let v = Verifier::builder(&p.url).allow_local(true).build().unwrap();
            let got = if online {
                v.verify_online(&token, None, &[]).await
            } else {
                v.verify(&token).await
            };
            assert_eq!(code(got), "UNAVAILABLE", "{prefix} answered {status}");
        }
    }
    p.pass();
    let v = Verifier::builder(&p.url).allow_local(true).build().unwrap();
    assert_eq!(code(v.verify(&token).await), "ok");
    assert_eq!(code(v.verify_online(&token, None, &[]).await), "ok");
}

/// A JWKS, status list or verify answer that is not what it should be (or is over 1 MiB) is
/// UNAVAILABLE, never another error (and the tower layer answers 503).
#[tokio::test(flavor = "current_thread")]
async fn a_broken_or_oversized_answer_is_unavailable() {
    let (s, p) = proxied();
    let (_, token) = s.register(json!({}));
    let jwks = ureq::get(&format!("{}/.well-known/jwks.json", s.base))
        .call()
        .unwrap()
        .into_string()
        .unwrap();
    let uri = claims_of(&token)["status"]["status_list"]["uri"]
        .as_str()
        .unwrap()
        .to_owned();
    let list_of = |status_list: Value, ttl: Value| {
        s.sign(
            &json!({"sub": uri, "iat": now(), "ttl": ttl, "status_list": status_list}),
            "statuslist+jwt",
        )
    };
    let zeros = URL_SAFE_NO_PAD.encode(miniz_oxide::deflate::compress_to_vec_zlib(&[0; 1 << 17], 6));
    let good = list_of(json!({"bits": 1, "lst": zeros}), json!(60));
    // The list as signed here passes.
    p.answer_under("/v1/status/", 200, vec![], good.clone().into_bytes());
    assert_eq!(
        code(
            Verifier::builder(&p.url)
                .allow_local(true)
                .build()
                .unwrap()
                .verify(&token)
                .await
        ),
        "ok"
    );
    let cases: Vec<(&'static str, String)> = vec![
        ("/.well-known/jwks.json", "<html>gateway</html>".into()),
        ("/.well-known/jwks.json", "[]".into()),
        ("/.well-known/jwks.json", r#"{"keys": "none"}"#.into()),
        (
            "/.well-known/jwks.json",
            json!({"keys": [{"kty": "OKP", "crv": "Ed25519", "kid": kid(&token), "x": "!!"}]}).to_string(),
        ),
        (
            "/.well-known/jwks.json",
            json!({"keys": [{"kty": "OKP", "crv": "Ed25519", "kid": kid(&token)}]}).to_string(),
        ),
        ("/.well-known/jwks.json", format!("{jwks}{}", " ".repeat(1 << 20))), // valid JSON, over 1 MiB
        ("/v1/status/", "not a list".into()),
        (
            "/v1/status/",
            list_of(json!({"bits": 1, "lst": "bm90IHpsaWI"}), json!(60)),
        ),
        (
            "/v1/status/",
            list_of(json!({"bits": 1, "lst": "%%%"}), json!(60)),
        ),
        (
            "/v1/status/",
            list_of(json!({"bits": 2, "lst": zeros}), json!(60)),
        ),
        (
            "/v1/status/",
            list_of(json!({"bits": 1, "lst": zeros}), json!(-1)),
        ),
        // A ttl of 0 would have the list fetched again at every check.
        (
            "/v1/status/",
            list_of(json!({"bits": 1, "lst": zeros}), json!(0)),
        ),
        (
            "/v1/status/",
            list_of(json!({"bits": 1, "lst": zeros}), json!("60")),
        ),
        ("/v1/status/", format!("{good}{}", " ".repeat(1 << 20))),
        // Expired (an old list replayed from a cache, from before a revocation), issued in
        // the future, or undated.
        (
            "/v1/status/",
            s.sign(
                &json!({"sub": uri, "iat": now() - 7200, "exp": now() - 3600, "ttl": 60,
                        "status_list": {"bits": 1, "lst": zeros}}),
                "statuslist+jwt",
            ),
        ),
        (
            "/v1/status/",
            s.sign(
                &json!({"sub": uri, "iat": now() + 3600, "ttl": 60, "status_list": {"bits": 1, "lst": zeros}}),
                "statuslist+jwt",
            ),
        ),
        (
            "/v1/status/",
            s.sign(
                &json!({"sub": uri, "ttl": 60, "status_list": {"bits": 1, "lst": zeros}}),
                "statuslist+jwt",
            ),
        ),
        ("/v1/verify/", "<html>gateway</html>".into()),
        ("/v1/verify/", r#"{"valid": true}"#.into()),
        ("/v1/verify/", r#"{"error": "TOKEN_INVALID"}"#.into()),
    ];
    for (prefix, body) in cases {
        let headers = vec![("content-type".to_owned(), "application/json".to_owned())];
        p.answer_under(prefix, 200, headers, body.clone().into_bytes());
        let v = Verifier::builder(&p.url).allow_local(true).build().unwrap();
        for attempt in [1, 2] {
            let got = if prefix == "/v1/verify/" {
                v.verify_online(&token, None, &[]).await
            } else {
                v.verify(&token).await
            };
            assert_eq!(code(got), "UNAVAILABLE", "{prefix} ({attempt}): {:.80}", body);
        }
    }
    #[cfg(feature = "tower")]
    {
        use agentid_verifier::tower::refusal;
        p.answer_under(
            "/.well-known/jwks.json",
            200,
            vec![],
            b"<html>gateway</html>".to_vec(),
        );
        let e = Verifier::builder(&p.url)
            .allow_local(true)
            .build()
            .unwrap()
            .verify(&token)
            .await
            .unwrap_err();
        let res = refusal::<String>(&e, false);
        assert_eq!(
            (res.status().as_u16(), res.body().as_str()),
            (
                503,
                r#"{"error":"UNAVAILABLE","message":"the agent cannot be verified now: try again shortly"}"#
            )
        );
        assert_eq!(res.headers()["retry-after"], "5", "a 503 says when to try again");
        assert!(
            res.headers().get("www-authenticate").is_none(),
            "not the token's fault"
        );
    }
}

/// A service that does not answer (or never sends the body it announces) is UNAVAILABLE
/// within the timeout.
#[tokio::test(flavor = "current_thread")]
async fn a_request_that_does_not_answer_in_time_is_unavailable() {
    let (s, p) = proxied();
    let (_, token) = s.register(json!({}));
    for mode in [Mode::Silent, Mode::Stall] {
        p.mode(mode);
        let v = Verifier::builder(&p.url)
            .allow_local(true)
            .timeout(Duration::from_millis(500))
            .build()
            .unwrap();
        let started = Instant::now();
        assert_eq!(code(v.verify(&token).await), "UNAVAILABLE");
        assert_eq!(code(v.verify_online(&token, None, &[]).await), "UNAVAILABLE");
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "{:?}",
            started.elapsed()
        );
    }
    assert_eq!(
        code(
            Verifier::builder(&p.url)
                .allow_local(true)
                .timeout(Duration::ZERO)
                .build()
        ),
        "MISCONFIGURED"
    );
}

/// While the service does not answer and nothing is held, checks that arrive together wait for
/// one fetch and end with it: each used to fetch again in turn (the eighth after eight timeouts).
#[tokio::test(flavor = "current_thread")]
async fn checks_waiting_for_one_fetch_that_fails_all_end_with_it() {
    let (s, p) = proxied();
    let (_, token) = s.register(json!({}));
    p.mode(Mode::Silent);
    let v = Verifier::builder(&p.url)
        .allow_local(true)
        .timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    let started = Instant::now();
    let checks: Vec<_> = (0..8)
        .map(|_| {
            let (v, token) = (v.clone(), token.clone());
            tokio::spawn(async move { code(v.verify(&token).await) })
        })
        .collect();
    for c in checks {
        assert_eq!(c.await.unwrap(), "UNAVAILABLE");
    }
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "{:?}",
        started.elapsed()
    );
}

/// Attack: a signed token whose status index is negative, or not an integer.
#[tokio::test(flavor = "current_thread")]
async fn a_negative_or_malformed_status_index_is_invalid() {
    let (s, p) = proxied();
    let (_, token) = s.register(json!({}));
    let mut claims = claims_of(&token);
    let v = Verifier::builder(&p.url).allow_local(true).build().unwrap();
    assert_eq!(code(v.verify(&s.sign(&claims, "JWT")).await), "ok"); // the signer is the service's
    for idx in [
        json!(-1),
        json!(-8),
        json!("3"),
        json!(1.5),
        json!(3.0),
        json!(true),
        json!(u64::MAX),
    ] {
        claims["status"]["status_list"]["idx"] = idx.clone();
        assert_eq!(
            code(v.verify(&s.sign(&claims, "JWT")).await),
            "TOKEN_INVALID",
            "idx {idx}"
        );
    }
}

/// Attack: times out of any clock's reach, a null where a claim should be, an extension the
/// verifier must understand (`crit`); and a fractional time, which RFC 7519 allows.
#[tokio::test(flavor = "current_thread")]
async fn claims_and_headers_are_what_they_should_be() {
    let (s, p) = proxied();
    let (_, token) = s.register(json!({}));
    let claims = claims_of(&token);
    let v = Verifier::builder(&p.url).allow_local(true).build().unwrap();
    let exp = claims["exp"].as_i64().unwrap();
    let with = |claim: &str, value: Value| {
        let mut c = claims.clone();
        c[claim] = value;
        s.sign(&c, "JWT")
    };
    for (claim, value) in [
        ("exp", json!(1e18)),
        ("exp", json!(-1)),
        ("iat", json!(-1)),
        ("exp", json!(9_007_199_254_740_993_u64)),
        ("nbf", json!(-5)),
        ("aud", Value::Null),
        ("scopes", Value::Null),
    ] {
        assert_eq!(
            code(v.verify(&with(claim, value.clone())).await),
            "TOKEN_INVALID",
            "{claim}: {value}"
        );
    }
    assert_eq!(code(v.verify(&with("exp", json!(exp as f64 + 0.5))).await), "ok");
    assert_eq!(
        code(
            v.verify(&with("iat", json!(claims["iat"].as_i64().unwrap() as f64 - 0.5)))
                .await
        ),
        "ok"
    );
    let crit = s.sign_with(&claims, json!({"typ": "JWT", "crit": ["exp"]}));
    assert_eq!(code(v.verify(&crit).await), "TOKEN_INVALID");
}

#[tokio::test(flavor = "current_thread")]
async fn a_token_over_4096_bytes_is_refused_unparsed() {
    let (s, p) = proxied();
    let (_, token) = s.register(json!({}));
    let mut claims = claims_of(&token);
    let v = Verifier::builder(&p.url).allow_local(true).build().unwrap();
    v.verify(&token).await.unwrap();
    claims["pad"] = json!("x".repeat(4096));
    let big = s.sign(&claims, "JWT"); // signed by the service, and too long
    assert_eq!(code(v.verify(&big).await), "TOKEN_INVALID");
    // No request is made: the service is not even reachable.
    let nowhere = Verifier::builder("http://127.0.0.1:9")
        .allow_local(true)
        .build()
        .unwrap();
    assert_eq!(
        code(nowhere.verify_online(&big, None, &[]).await),
        "TOKEN_INVALID"
    );
    assert_eq!(code(nowhere.verify(&big).await), "TOKEN_INVALID");
    let parts: Vec<&str> = token.split('.').collect();
    let long_set = format!("{}.{}{}.{}", parts[0], parts[1], "x".repeat(16_384), parts[2]);
    // Parsed, it would need the keys: UNAVAILABLE.
    assert_eq!(code(nowhere.handle_set(&long_set).await), "TOKEN_INVALID");
}

// -- online verification ---------------------------------------------------------------------

/// Attack: a token of an issuer the receiver does not accept, offered for online
/// verification; and the scopes and the mode, as offline.
#[tokio::test(flavor = "current_thread")]
async fn online_verify_checks_issuers_scopes_and_mode() {
    let s = Server::start();
    let (id, token) = s.register(json!({}));
    let only = |issuer: &str| {
        Verifier::builder(&s.base)
            .allow_local(true)
            .issuers([issuer])
            .build()
            .unwrap()
    };
    assert_eq!(
        code(only("other.example").verify_online(&token, None, &[]).await),
        "TOKEN_INVALID"
    );
    assert_eq!(
        only("example.com")
            .verify_online(&token, None, &[])
            .await
            .unwrap()
            .agent_id,
        id
    );
    let v = Verifier::builder(&s.base).allow_local(true).build().unwrap();
    assert_eq!(
        code(v.verify_online(&token, None, &["write:orders"]).await),
        "INSUFFICIENT_SCOPE"
    );
    let agent = v.verify_online(&token, None, &["read:orders"]).await.unwrap();
    assert_eq!(agent.scopes, ["read:orders"]);
    let sk_test = s.sk_test.clone();
    let (_, test_mode) = s.register_with(json!({}), Some(&sk_test));
    assert_eq!(
        code(v.verify_online(&test_mode, None, &[]).await),
        "TOKEN_INVALID"
    );
}

/// The service refuses the receiver's API key: the receiver's fault (500), not the
/// service's (503).
#[tokio::test(flavor = "current_thread")]
async fn a_refused_api_key_is_misconfigured() {
    let s = Server::start();
    let (_, token) = s.register(json!({}));
    let v = Verifier::builder(&s.base).allow_local(true).build().unwrap();
    let refused = v.verify_online(&token, Some("pk_live_not_a_key"), &[]).await;
    assert_eq!(code(refused.clone()), "MISCONFIGURED");
    let agent = v.verify_online(&token, Some(&s.pk), &[]).await.unwrap();
    assert_eq!(agent.issuer, "example.com");
    #[cfg(feature = "tower")]
    {
        let res = agentid_verifier::tower::refusal::<String>(&refused.unwrap_err(), false);
        assert_eq!(
            (res.status().as_u16(), res.body().as_str()),
            (
                500,
                r#"{"error":"MISCONFIGURED","message":"this receiver cannot verify agents: its configuration is wrong"}"#
            )
        );
    }
    assert_eq!(
        code(Verifier::builder("ftp://x").allow_local(true).build()),
        "MISCONFIGURED"
    );
}

// -- Shared Signals --------------------------------------------------------------------------

#[tokio::test(flavor = "current_thread")]
async fn a_set_for_another_audience_is_refused() {
    let (s, p) = proxied();
    let for_aud = |aud: &str| {
        Verifier::builder(&p.url)
            .allow_local(true)
            .set_audience(aud)
            .build()
            .unwrap()
    };
    let (set, _) = s.polled_set(json!({"aud": "https://receiver.example"}));
    assert_eq!(
        code(for_aud("https://other.example").handle_set(&set).await),
        "TOKEN_INVALID"
    );
    assert_eq!(
        code(for_aud("https://receiver.example").handle_set(&set).await),
        "ok"
    );
    let (set, stream) = s.polled_set(json!({})); // a poll stream's aud is by default its id
    let stream_id = stream["stream_id"].as_str().unwrap();
    assert_eq!(claims_of(&set)["aud"], stream_id);
    assert_eq!(code(for_aud(stream_id).handle_set(&set).await), "ok");
    // An array aud holds it or not.
    let mut claims = claims_of(&set);
    for (aud, want) in [
        (json!(["https://a.example", stream_id]), "ok"),
        (json!(["https://a.example"]), "TOKEN_INVALID"),
        (json!(null), "TOKEN_INVALID"),
    ] {
        claims["aud"] = aud;
        claims["jti"] = json!(format!("jti-{want}-{}", claims["aud"]));
        let signed = s.sign(&claims, "secevent+jwt");
        assert_eq!(
            code(for_aud(stream_id).handle_set(&signed).await),
            want,
            "{}",
            claims["aud"]
        );
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_replayed_set_is_refused() {
    let (s, p) = proxied();
    let (set, _) = s.polled_set(json!({}));
    let v = Verifier::builder(&p.url).allow_local(true).build().unwrap();
    assert_eq!(code(v.handle_set(&set).await), "ok");
    assert_eq!(code(v.handle_set(&set).await), "TOKEN_INVALID");
    // The last 10,000 taken are remembered: the first of 10,001 is forgotten, the last not.
    let mut claims = claims_of(&set);
    let sets: Vec<String> = (0..=10_000)
        .map(|i| {
            claims["jti"] = json!(format!("replay-{i}"));
            s.sign(&claims, "secevent+jwt")
        })
        .collect();
    for set in &sets {
        v.handle_set(set).await.unwrap();
    }
    assert_eq!(code(v.handle_set(&sets[10_000]).await), "TOKEN_INVALID");
    assert_eq!(code(v.handle_set(&sets[0]).await), "ok");
}

/// A SET issued in the future, or past its `exp`, is refused, as the other libraries refuse
/// it; and a token is not taken before its `nbf`.
#[tokio::test(flavor = "current_thread")]
async fn times_out_of_bounds_are_refused_in_sets_and_tokens() {
    let (s, p) = proxied();
    let (set, _) = s.polled_set(json!({}));
    let v = Verifier::builder(&p.url).allow_local(true).build().unwrap();
    let mut claims = claims_of(&set);
    let now = now() as i64;
    for (extra, want) in [
        (json!({"iat": now + 3600}), "TOKEN_INVALID"),
        (json!({"exp": now - 3600}), "TOKEN_EXPIRED"),
        (json!({"exp": "soon"}), "TOKEN_INVALID"),
        (json!({"exp": now + 3600}), "ok"),
        // Attack: an aud of another shape passed when no audience was asked for, and a
        // revocation dated by a timestamp of any shape fell back to iat.
        (json!({"aud": null}), "TOKEN_INVALID"),
        (json!({"aud": 7}), "TOKEN_INVALID"),
        (json!({"aud": ["x", 1]}), "TOKEN_INVALID"),
        (
            json!({"events": {SESSION_REVOKED: {"event_timestamp": 1e18}}}),
            "TOKEN_INVALID",
        ),
        (
            json!({"events": {SESSION_REVOKED: {"event_timestamp": -1}}}),
            "TOKEN_INVALID",
        ),
    ] {
        for (k, val) in extra.as_object().unwrap() {
            claims[k] = val.clone();
        }
        claims["jti"] = json!(format!("times-{extra}"));
        let signed = s.sign(&claims, "secevent+jwt");
        assert_eq!(code(v.handle_set(&signed).await), want, "{extra}");
        claims = claims_of(&set);
    }
    let (_, token) = s.register(json!({}));
    let mut claims = claims_of(&token);
    for (nbf, want) in [
        (json!(now + 3600), "TOKEN_INVALID"),
        (json!("x"), "TOKEN_INVALID"),
        (json!(now - 10), "ok"),
    ] {
        claims["nbf"] = nbf.clone();
        assert_eq!(code(v.verify(&s.sign(&claims, "JWT")).await), want, "nbf {nbf}");
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_set_of_another_service_or_issuer_is_refused() {
    let (s, p) = proxied();
    let (set, _) = s.polled_set(json!({}));
    // The same keys, but not the base URL the SET names.
    let direct = Verifier::builder(&s.base).allow_local(true).build().unwrap();
    assert_eq!(code(direct.handle_set(&set).await), "TOKEN_INVALID");
    let mut claims = claims_of(&set);
    claims["iss"] = json!("https://evil.example");
    let forged = s.sign(&claims, "secevent+jwt");
    let v = Verifier::builder(&p.url).allow_local(true).build().unwrap();
    assert_eq!(code(v.handle_set(&forged).await), "TOKEN_INVALID");
    // Its agent is of example.com.
    let only = |issuer: &str| {
        Verifier::builder(&p.url)
            .allow_local(true)
            .issuers([issuer])
            .build()
            .unwrap()
    };
    assert_eq!(
        code(only("other.example").handle_set(&set).await),
        "TOKEN_INVALID"
    );
    assert_eq!(code(only("example.com").handle_set(&set).await), "ok");
}

/// The on_refusal hook hears every refusal of the three checks, with its code and reason.
#[tokio::test(flavor = "current_thread")]
async fn on_refusal_hears_every_refusal() {
    let s = Server::start();
    let (_, token) = s.register(json!({}));
    let heard = Arc::new(Mutex::new(Vec::<(String, String)>::new()));
    let sink = heard.clone();
    let v = Verifier::builder(&s.base)
        .allow_local(true)
        .issuers(["other.example"])
        .on_refusal(move |code, why| sink.lock().unwrap().push((code.to_owned(), why.to_owned())))
        .build()
        .unwrap();
    assert_eq!(code(v.verify(&token).await), "TOKEN_INVALID");
    assert_eq!(code(v.verify_online(&token, None, &[]).await), "TOKEN_INVALID");
    assert_eq!(
        code(
            v.verify_dpop(&token, None, "GET", "https://a.example/", &[])
                .await
        ),
        "TOKEN_INVALID"
    );
    let heard = heard.lock().unwrap();
    assert_eq!(
        heard.iter().map(|(c, _)| c.as_str()).collect::<Vec<_>>(),
        ["TOKEN_INVALID"; 3]
    );
    assert!(
        heard[0].1.contains("issuer example.com is not accepted"),
        "{heard:?}"
    );
}

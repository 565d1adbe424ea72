//! Test harness: each test gets its own database (a temp SQLite file, or a fresh PostgreSQL
//! database when AGENTID_TEST_DATABASE_URL points at a server) and its own server on port 0.

use std::path::PathBuf;
use std::time::Duration;

use actix_web::dev::ServerHandle;
use agentid::config::Config;
use agentid::domain::{OrgLimits, Plan};
use agentid::engine::admin::{self, CreatedOrg};
use agentid::engine::grants;
use agentid::engine::outbound::{Outbound, OutboundConfig};
use agentid::keys::KeyRing;
use agentid::store::SharedStore;
use agentid::Application;
use serde_json::Value;

/// Where the tests' PostgreSQL server is, if they use one.
pub fn postgres_admin_url() -> Option<String> {
    std::env::var("AGENTID_TEST_DATABASE_URL")
        .ok()
        .filter(|u| u.starts_with("postgres"))
}

/// A database that exists for one test.
pub struct TestDb {
    pub url: String,
    pg: Option<(String, String)>, // (admin url, database name)
    /// Another instance of a fleet owns the database: dropping this leaves it.
    borrowed: bool,
}

impl TestDb {
    /// Brings the database to the schema of its first `migrations` migrations only (an older
    /// version's), then runs `stmts` on it: what an upgrade finds.
    pub async fn at_schema(&self, migrations: usize, stmts: &[String]) {
        use agentid::store::migrate;
        macro_rules! at_schema {
            ($pool:expr, $set:expr) => {{
                let pool = $pool;
                migrate::migrator(&$set[..migrations])
                    .await
                    .unwrap()
                    .run(&pool)
                    .await
                    .unwrap();
                for s in stmts {
                    sqlx::query(s).execute(&pool).await.unwrap();
                }
                pool.close().await;
            }};
        }
        if self.is_postgres() {
            at_schema!(sqlx::PgPool::connect(&self.url).await.unwrap(), migrate::POSTGRES);
        } else {
            let opts = self.url.parse::<sqlx::sqlite::SqliteConnectOptions>().unwrap();
            let pool = sqlx::SqlitePool::connect_with(opts.create_if_missing(true))
                .await
                .unwrap();
            at_schema!(pool, migrate::SQLITE);
        }
    }

    pub async fn new(dir: &std::path::Path) -> TestDb {
        match postgres_admin_url() {
            None => TestDb {
                url: format!("sqlite://{}", dir.join("agentid.db").display()),
                pg: None,
                borrowed: false,
            },
            Some(admin) => {
                use sqlx::Connection;
                let name = format!("agentid_t_{}", ulid::Ulid::new().to_string().to_lowercase());
                let mut conn = sqlx::PgConnection::connect(&admin).await.unwrap_or_else(|e| {
                    panic!("PostgreSQL at AGENTID_TEST_DATABASE_URL is unreachable: {e}")
                });
                sqlx::query(&format!("CREATE DATABASE {name}"))
                    .execute(&mut conn)
                    .await
                    .expect("create test database");
                let base = admin.rsplit_once('/').map_or(admin.as_str(), |(b, _)| b);
                TestDb {
                    url: format!("{base}/{name}"),
                    pg: Some((admin.clone(), name)),
                    borrowed: false,
                }
            }
        }
    }

    pub fn is_postgres(&self) -> bool {
        self.pg.is_some()
    }

    /// The same database, for another instance; the original drops it.
    fn borrow(&self) -> TestDb {
        TestDb {
            url: self.url.clone(),
            pg: self.pg.clone(),
            borrowed: true,
        }
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if self.borrowed {
            return;
        }
        if let Some((admin, name)) = self.pg.take() {
            // Drop runs inside the test's runtime: do the blocking clean-up on a thread of its own.
            let _ = std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async {
                    use sqlx::Connection;
                    if let Ok(mut c) = sqlx::PgConnection::connect(&admin).await {
                        let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                            .execute(&mut c)
                            .await;
                    }
                });
            })
            .join();
        }
    }
}

/// A running server with its own database and an organization to call it with.
pub struct TestApp {
    pub base: String,
    /// `http://addr/metrics` when the test asked for a metrics listener.
    pub metrics_url: Option<String>,
    pub client: awc::Client,
    pub org: CreatedOrg,
    pub store: SharedStore,
    pub engine: std::sync::Arc<agentid::engine::Engine>,
    pub db: TestDb,
    _dir: std::sync::Arc<tempfile::TempDir>,
    pub config: Config,
    /// The outbound client's configuration (a restart makes the client anew).
    outbound: OutboundConfig,
    handle: ServerHandle,
    task: Option<actix_web::rt::task::JoinHandle<std::io::Result<()>>>,
}

pub struct Options {
    pub plan: Plan,
    pub verify_limit: Option<u32>,
    pub other_limit: Option<u32>,
    /// The issuer domains the operator grants the test organization.
    pub domains: &'static [&'static str],
    pub tweak: Box<dyn FnOnce(&mut Config)>,
    /// The outbound client: the tests' DNS server, TLS roots and ports.
    pub outbound: OutboundConfig,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            plan: Plan::Developer,
            verify_limit: None,
            other_limit: None,
            domains: &TEST_DOMAINS,
            tweak: Box::new(|_| {}),
            outbound: OutboundConfig::default(),
        }
    }
}

impl Options {
    /// An enterprise organization with limits no test reaches.
    pub fn unlimited() -> Self {
        Options {
            plan: Plan::Enterprise,
            verify_limit: Some(10_000_000),
            other_limit: Some(10_000_000),
            ..Options::default()
        }
    }
}

pub async fn spawn_app() -> TestApp {
    spawn_app_with(Options::default()).await
}

pub async fn spawn_app_with(opts: Options) -> TestApp {
    spawn_fleet(1, opts).await.pop().expect("one instance")
}

/// `n` instances on one database with one signing key file and one organization (made as
/// `opts` says; `opts.tweak` applies to each instance's configuration). The last instance
/// owns the database, so that it goes after the others.
pub async fn spawn_fleet(n: usize, opts: Options) -> Vec<TestApp> {
    let dir = std::sync::Arc::new(tempfile::tempdir().unwrap());
    let db = TestDb::new(dir.path()).await;
    let key = dir.path().join("signing-key.pem");
    let mut config = test_config(&db.url, key.clone());
    (opts.tweak)(&mut config);
    let configs = vec![config; n];
    let mut apps = Vec::with_capacity(n);
    for config in &configs {
        // One after the other: the first start makes the key file the others use.
        let outbound = Outbound::new(opts.outbound.clone());
        apps.push(
            Application::build_with(config.clone(), outbound)
                .await
                .expect("app starts"),
        );
    }
    let store = apps[0].engine().store().clone();
    let limits = OrgLimits::resolve(opts.plan, opts.verify_limit, opts.other_limit, None).unwrap();
    let keys = KeyRing::load(&key)
        .unwrap()
        .expect("the first start made the key file");
    let org = admin::create_org(&store, &keys, "test org", opts.plan, limits)
        .await
        .unwrap();
    // The names the tests register agents under are the test organization's.
    let record = store.get_org(&org_id(&org.org_id)).await.unwrap().unwrap();
    for domain in opts.domains {
        grants::approve(&store, &keys, &record, domain, false)
            .await
            .unwrap();
    }
    settled_domain_list(&store).await;
    let opts_outbound = opts.outbound;
    let mut dbs: Vec<TestDb> = (1..n).map(|_| db.borrow()).collect();
    dbs.push(db);
    apps.into_iter()
        .zip(configs)
        .zip(dbs)
        .map(|((app, config), db)| {
            let base = app.public_url().to_owned();
            let metrics_url = app.metrics_addr().map(|a| format!("http://{a}/metrics"));
            let handle = app.handle();
            let store = app.engine().store().clone();
            let engine = app.engine().clone();
            let task = actix_web::rt::spawn(app.run_until_stopped());
            TestApp {
                base,
                metrics_url,
                client: client(),
                org: org.clone(),
                store,
                engine,
                db,
                _dir: dir.clone(),
                config,
                outbound: opts_outbound.clone(),
                handle,
                task: Some(task),
            }
        })
        .collect()
}

/// Waits until the instances have recorded the grown issuer-domain list in the service's
/// ledger (within a tick of its growth): the ledger keeps its size for 250 ms. Their records
/// would otherwise land in the middle of a test's own.
async fn settled_domain_list(store: &SharedStore) {
    let service = agentid::domain::Ledger::service();
    let (mut size, mut still) = (u64::MAX, 0);
    while still < 5 {
        let now = store.ledger_size(&service).await.unwrap();
        still = if now == size { still + 1 } else { 0 };
        size = now;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The issuer domains the test organization holds (by the operator's grant, so with every
/// name below them).
pub const TEST_DOMAINS: [&str; 5] = [
    "example.com",
    "offline.example",
    "a.io",
    "scouts.example",
    "ex.com",
];

pub fn test_config(url: &str, key: PathBuf) -> Config {
    let mut c = Config::new(url);
    c.bind = "127.0.0.1:0".into();
    c.signing_key_file = key;
    c.metrics_bind = None;
    c.workers = Some(2);
    c.bootstrap = false;
    c.handle_signals = false;
    c.store.max_connections = 5;
    // Checkpoints come quickly, so that tests need not wait long for one.
    c.engine.checkpoint_interval = Duration::from_millis(200);
    // Receivers in the tests listen on 127.0.0.1 over plain HTTP.
    c.engine.ssf.allow_insecure_endpoints = true;
    c
}

pub fn client() -> awc::Client {
    awc::Client::builder().timeout(Duration::from_secs(30)).finish()
}

/// A response, read whole.
pub struct Resp {
    pub status: u16,
    pub headers: awc::http::header::HeaderMap,
    pub body: Vec<u8>,
}

impl Resp {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    pub fn header(&self, name: &str) -> Option<String> {
        self.headers.get(name).map(|v| v.to_str().unwrap().to_owned())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The spec: every response carries the rate-limit headers, as numbers.
    pub fn assert_rate_limit_headers(&self, what: &str) {
        for name in ["x-ratelimit-limit", "x-ratelimit-remaining", "x-ratelimit-reset"] {
            let value = self.header(name);
            assert!(
                value.as_deref().is_some_and(|v| v.parse::<u64>().is_ok()),
                "{what} ({}): {name} is {value:?}",
                self.status
            );
        }
    }

    /// Asserts the standard error body, its agreement with X-Request-Id, and the rate-limit
    /// headers.
    pub fn assert_error(&self, status: u16, code: &str) -> Value {
        assert_eq!(self.status, status, "status for {code}: {}", self.text());
        let body = self.json();
        let err = &body["error"];
        assert_eq!(err["code"], code, "{body}");
        assert!(err["message"].as_str().is_some_and(|m| !m.is_empty()), "{body}");
        let rid = err["request_id"].as_str().unwrap();
        assert!(rid.starts_with("req_"), "{rid}");
        assert_eq!(self.header("x-request-id").as_deref(), Some(rid));
        self.assert_rate_limit_headers(code);
        assert!(err["docs_url"]
            .as_str()
            .unwrap()
            .ends_with(&format!("/docs/errors#{code}")));
        body
    }
}

pub async fn read(
    res: awc::ClientResponse<
        impl futures_util::Stream<Item = Result<actix_web::web::Bytes, awc::error::PayloadError>> + Unpin,
    >,
) -> Resp {
    let mut res = res;
    let status = res.status().as_u16();
    let headers = res.headers().clone();
    let body = res.body().limit(16 * 1024 * 1024).await.expect("body").to_vec();
    Resp {
        status,
        headers,
        body,
    }
}

/// Checks every ledger with `audit verify`'s own checker (chains, blocks, checkpoints) and
/// fails the test on any finding.
pub async fn log_holds(
    store: &SharedStore,
    verifier: &agentid::tlog::note::LogVerifier,
    keys: Option<&agentid::keys::KeyRing>,
) -> agentid::engine::transparency::check::Report {
    let report =
        agentid::engine::transparency::check::check(store, verifier, keys, &[], Duration::from_secs(3600))
            .await
            .unwrap();
    assert!(report.ok(), "{:?}", report.failures);
    report
}

impl TestApp {
    /// [`log_holds`] on this instance's store, with its log key.
    pub async fn log_holds(&self) -> agentid::engine::transparency::check::Report {
        let keys = agentid::keys::KeyRing::load(&self.config.signing_key_file).unwrap();
        log_holds(&self.store, self.engine.transparency().verifier(), keys.as_ref()).await
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub fn secret(&self) -> &str {
        &self.org.keys.secret_live
    }

    pub async fn get(&self, path: &str, key: Option<&str>) -> Resp {
        let mut req = self.client.get(self.url(path));
        if let Some(k) = key {
            req = req.insert_header(("Authorization", format!("Bearer {k}")));
        }
        read(req.send().await.expect("request")).await
    }

    pub async fn post(&self, path: &str, key: Option<&str>, body: Option<&Value>) -> Resp {
        let mut req = self.client.post(self.url(path));
        if let Some(k) = key {
            req = req.insert_header(("Authorization", format!("Bearer {k}")));
        }
        let res = match body {
            Some(b) => req.send_json(b).await,
            None => req.send().await,
        };
        read(res.expect("request")).await
    }

    /// Registers an agent with the live secret key; asserts 201.
    pub async fn register(&self, body: Value) -> Value {
        self.register_with(self.secret(), body).await
    }

    pub async fn register_with(&self, key: &str, body: Value) -> Value {
        let res = self.post("/v1/agents/register", Some(key), Some(&body)).await;
        assert_eq!(res.status, 201, "{}", res.text());
        res.json()
    }

    /// A minimal valid agent.
    pub async fn agent(&self) -> (String, String) {
        let a = self
            .register(
                serde_json::json!({"name": "bot", "issuer_domain": "example.com", "scopes": ["read:docs"]}),
            )
            .await;
        (
            a["agent_id"].as_str().unwrap().to_owned(),
            a["token"].as_str().unwrap().to_owned(),
        )
    }

    pub async fn verify(&self, token: &str) -> Value {
        let res = self.get(&format!("/v1/verify/{token}"), None).await;
        assert_eq!(res.status, 200, "{}", res.text());
        res.json()
    }

    /// Verify as a receiver identifying itself with the organization's publishable key.
    pub async fn verify_as_receiver(&self, token: &str) -> Resp {
        self.get(
            &format!("/v1/verify/{token}"),
            Some(&self.org.keys.publishable_live),
        )
        .await
    }

    pub async fn revoke(&self, agent_id: &str, reason: Option<&str>) -> Resp {
        let body = reason.map(|r| serde_json::json!({"reason": r}));
        self.post(
            &format!("/v1/agents/{agent_id}/revoke"),
            Some(self.secret()),
            body.as_ref(),
        )
        .await
    }

    pub async fn log(&self, query: &str) -> Value {
        let res = self.get(&format!("/v1/log{query}"), Some(self.secret())).await;
        assert_eq!(res.status, 200, "{}", res.text());
        res.json()
    }

    /// Stops the server gracefully (the audit writer drains) and waits for it.
    pub async fn stop(&mut self) {
        self.handle.stop(true).await;
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }

    /// Stops and starts again on the same database and signing key.
    pub async fn restart(mut self) -> TestApp {
        self.stop().await;
        let app = Application::build_with(self.config.clone(), Outbound::new(self.outbound.clone()))
            .await
            .expect("app restarts");
        self.store = app.engine().store().clone();
        self.engine = app.engine().clone();
        self.base = app.public_url().to_owned();
        self.handle = app.handle();
        self.task = Some(actix_web::rt::spawn(app.run_until_stopped()));
        self
    }

    /// The key file's key ring (what seals who holds a name).
    pub fn key_ring(&self) -> KeyRing {
        KeyRing::load(&self.config.signing_key_file).unwrap().unwrap()
    }

    /// The operator grants `domain` to organization `org_id` (`agentid domain approve`).
    pub async fn grant(
        &self,
        org_id: &str,
        domain: &str,
        force: bool,
    ) -> Result<agentid::store::Held, admin::AdminError> {
        let org = self
            .store
            .get_org(&crate::helpers::org_id(org_id))
            .await
            .unwrap()
            .unwrap();
        grants::approve(&self.store, &self.key_ring(), &org, domain, force).await
    }

    /// `sqls` in order on one connection (one session: a temporary table one of them makes is
    /// what the next ones see); the first error.
    pub async fn raw_session(&self, sqls: &[&str]) -> Result<(), sqlx::Error> {
        use sqlx::Connection as _;
        if self.db.is_postgres() {
            let mut c = sqlx::PgConnection::connect(&self.db.url).await?;
            for sql in sqls {
                sqlx::query(sql).execute(&mut c).await?;
            }
            c.close().await
        } else {
            let mut c = sqlx::SqliteConnection::connect(&self.db.url).await?;
            for sql in sqls {
                sqlx::query(sql).execute(&mut c).await?;
            }
            c.close().await
        }
    }

    /// Why the test database refuses `sql`, which it must (a trigger, a constraint).
    pub async fn refused(&self, sql: &str) -> String {
        match self.raw_execute(sql).await {
            Ok(n) => panic!("the database took {sql} ({n} rows)"),
            Err(e) => e.to_string(),
        }
    }

    /// A direct connection to the test database, for what the API cannot do.
    pub async fn raw_execute(&self, sql: &str) -> Result<u64, sqlx::Error> {
        if self.db.is_postgres() {
            let pool = sqlx::PgPool::connect(&self.db.url).await?;
            let r = sqlx::query(sql).execute(&pool).await.map(|r| r.rows_affected());
            pool.close().await;
            r
        } else {
            let pool = sqlx::SqlitePool::connect(&self.db.url).await?;
            let r = sqlx::query(sql).execute(&pool).await.map(|r| r.rows_affected());
            pool.close().await;
            r
        }
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        if self.task.is_some() {
            let h = self.handle.clone();
            actix_web::rt::spawn(async move { h.stop(false).await });
        }
    }
}

/// Runs `agentid audit witness` for `app`'s live ledger off the test's thread (the service's
/// tasks run there), with `extra` arguments.
pub async fn witness(app: &TestApp, state: &std::path::Path, extra: &[&str]) -> std::process::Output {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_agentid"));
    cmd.args(["audit", "witness", "--url", &app.base, "--state"])
        .arg(state)
        .args(extra)
        .env("AGENTID_WITNESS_KEY", app.secret());
    tokio::task::spawn_blocking(move || cmd.output().unwrap())
        .await
        .unwrap()
}

/// Runs SQL past the log's protections, as someone holding the database would: on
/// PostgreSQL as superuser with triggers off for the session, on SQLite with them dropped.
pub async fn tamper(app: &TestApp, sql: &str) {
    if app.db.is_postgres() {
        let pool = sqlx::PgPool::connect(&app.db.url).await.unwrap();
        let mut c = pool.acquire().await.unwrap();
        sqlx::raw_sql(&format!("SET session_replication_role = replica; {sql}"))
            .execute(&mut *c)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
        drop(c);
        pool.close().await;
    } else {
        let pool = sqlx::SqlitePool::connect(&app.db.url).await.unwrap();
        let triggers: Vec<(String,)> =
            sqlx::query_as("SELECT name FROM sqlite_master WHERE type = 'trigger'")
                .fetch_all(&pool)
                .await
                .unwrap();
        let mut script = String::new();
        for (t,) in triggers {
            script.push_str(&format!("DROP TRIGGER {t};"));
        }
        sqlx::raw_sql(&format!("{script} {sql}"))
            .execute(&pool)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
        pool.close().await;
    }
}

/// Checks a compact JWS's EdDSA signature with the key its `kid` names in the app's JWKS (as
/// a receiver would); returns its header and claims.
pub async fn checked_with_jwks(app: &TestApp, jws: &str) -> (Value, Value) {
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use base64::Engine as _;
    let part = |i: usize| -> Value {
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(jws.split('.').nth(i).unwrap()).unwrap()).unwrap()
    };
    let header = part(0);
    assert_eq!(header["alg"], "EdDSA");
    let jwks = app.get("/.well-known/jwks.json", None).await.json();
    let jwk = jwks["keys"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["kid"] == header["kid"])
        .unwrap_or_else(|| panic!("kid {} is not in JWKS", header["kid"]));
    let x: [u8; 32] = URL_SAFE_NO_PAD
        .decode(jwk["x"].as_str().unwrap())
        .unwrap()
        .try_into()
        .unwrap();
    let (input, sig) = jws.rsplit_once('.').unwrap();
    let sig = ed25519_dalek::Signature::from_slice(&URL_SAFE_NO_PAD.decode(sig).unwrap()).unwrap();
    ed25519_dalek::VerifyingKey::from_bytes(&x)
        .unwrap()
        .verify_strict(input.as_bytes(), &sig)
        .expect("the signature checks with its kid in JWKS");
    (header, part(1))
}

/// Inserts an agent row as it is, without drawing it a status place: what another instance or
/// an earlier build could have written. The store has no such door; the tests of what it reads
/// write the row themselves.
pub async fn insert_agent(url: &str, a: &agentid::store::AgentRecord) -> Result<(), sqlx::Error> {
    macro_rules! insert {
        ($pool:expr) => {{
            let pool = $pool;
            let scopes = serde_json::to_string(&a.scopes).unwrap();
            let done = sqlx::query(
                "INSERT INTO agents (id, org_id, mode, name, issuer_domain, description, scopes, \
                 created_at, issued_at, expires_at, revoked_at, revocation_reason, status_list, status_idx, \
                 jkt, jwk, key_mac, key_sealed_at) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18)",
            )
            .bind(a.id.as_str())
            .bind(a.org_id.as_str())
            .bind(a.mode.as_str())
            .bind(a.name.as_str())
            .bind(a.issuer_domain.as_str())
            .bind(a.description.as_str())
            .bind(scopes.as_str())
            .bind(a.created_at.0)
            .bind(a.issued_at.0)
            .bind(a.expires_at.0)
            .bind(a.revoked_at.map(|m| m.0))
            .bind(a.revocation_reason.as_deref())
            .bind(a.status.as_ref().map(|p| p.list.as_str()))
            .bind(a.status.as_ref().map(|p| p.idx as i64))
            .bind(a.jkt.as_deref())
            .bind(a.jwk.as_deref())
            .bind(a.key_mac.map(Vec::from))
            .bind(a.key_sealed_at.map(|m| m.0))
            .execute(&pool)
            .await
            .map(drop);
            pool.close().await;
            done
        }};
    }
    if url.starts_with("postgres") {
        insert!(sqlx::PgPool::connect(url).await?)
    } else {
        insert!(sqlx::SqlitePool::connect(url).await?)
    }
}

/// A byte string as an SQL literal of the test's backend.
pub fn blob(app: &TestApp, bytes: &[u8]) -> String {
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    if app.db.is_postgres() {
        format!("'\\x{hex}'::bytea")
    } else {
        format!("X'{hex}'")
    }
}

/// Identifiers as the tests write them, decoded as the store's edge decodes them: an id
/// the service would never issue is a bug in the test.
pub fn org_id(s: &str) -> agentid::domain::OrgId {
    agentid::domain::OrgId::parse(s).unwrap_or_else(|| panic!("{s:?} is no organization id"))
}

pub fn agent_id(s: &str) -> agentid::domain::AgentId {
    agentid::domain::AgentId::parse(s).unwrap_or_else(|| panic!("{s:?} is no agent id"))
}

/// A stream id made of a name (`ssf_paused`): its letters and digits, padded to an id.
pub fn stream_id(name: &str) -> agentid::domain::StreamId {
    let body: String = name
        .trim_start_matches("ssf_")
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .collect();
    let id = format!("ssf_{body:0<26}");
    agentid::domain::StreamId::parse(&id).unwrap_or_else(|| panic!("{name:?} makes no stream id"))
}

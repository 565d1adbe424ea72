//! Verify agentid agent tokens in a receiver: offline against the service's JWKS, with
//! revocation seen through Token Status Lists and pushed Shared Signals events, or online.
//!
//! ```no_run
//! # async fn f(token: &str) -> Result<(), agentid_verifier::Error> {
//! use std::time::Duration;
//! let verifier = agentid_verifier::Verifier::builder("https://id.example.com")
//!     .issuers(["example.com"])
//!     .leeway(Duration::from_secs(30))
//!     .build()?;
//! let agent = verifier.verify_with_scopes(token, &["read:orders"]).await?;
//! println!("{} of {}", agent.agent_id, agent.issuer);
//! # Ok(()) }
//! ```
//!
//! Keys and lists come only from the base URL's origin and are cached for as long as the
//! service says (`Cache-Control`, a list's `ttl`), so a warm verification makes no network
//! call. Signatures are checked with `ed25519-dalek`'s strict verification; the algorithm is
//! pinned to EdDSA and a `kid` is required.
#![forbid(unsafe_code)]

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use ed25519_dalek::{Signature, VerifyingKey};
use parking_lot::Mutex;
use serde_json::Value;

const SESSION_REVOKED: &str = "https://schemas.openid.net/secevent/caep/event-type/session-revoked";

/// Why a token may not be trusted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("TOKEN_INVALID: {0}")]
    Invalid(String),
    #[error("TOKEN_EXPIRED")]
    Expired,
    #[error("TOKEN_REVOKED")]
    Revoked,
    #[error("INSUFFICIENT_SCOPE: missing {0:?}")]
    InsufficientScope(Vec<String>),
    #[error("UNAVAILABLE: {0}")]
    Unavailable(String),
}

impl Error {
    /// The service's code: `TOKEN_INVALID`, `TOKEN_EXPIRED`, `TOKEN_REVOKED`,
    /// `INSUFFICIENT_SCOPE` or `UNAVAILABLE`.
    pub fn code(&self) -> &'static str {
        match self {
            Error::Invalid(_) => "TOKEN_INVALID",
            Error::Expired => "TOKEN_EXPIRED",
            Error::Revoked => "TOKEN_REVOKED",
            Error::InsufficientScope(_) => "INSUFFICIENT_SCOPE",
            Error::Unavailable(_) => "UNAVAILABLE",
        }
    }
}

fn invalid(why: impl Into<String>) -> Error {
    Error::Invalid(why.into())
}

/// A verified agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Agent {
    pub agent_id: String,
    pub issuer: String,
    pub scopes: Vec<String>,
    pub issued_at: SystemTime,
    pub expires_at: SystemTime,
    /// False for a test-mode token (accepted only with [`Builder::allow_test`]).
    pub livemode: bool,
}

/// How a [`Verifier`] is made.
pub struct Builder {
    base_url: String,
    issuers: Option<HashSet<String>>,
    leeway: Duration,
    list_grace: Duration,
    fail_open: bool,
    allow_test: bool,
    kid_refetch: Duration,
    timeout: Duration,
}

impl Builder {
    /// Accepted `iss` values (any when not set).
    pub fn issuers<I: IntoIterator<Item = S>, S: Into<String>>(mut self, issuers: I) -> Self {
        self.issuers = Some(issuers.into_iter().map(Into::into).collect());
        self
    }
    /// Tolerance on `exp` and `iat` (30 s).
    pub fn leeway(mut self, d: Duration) -> Self {
        self.leeway = d;
        self
    }
    /// How long past its `ttl` a status list that cannot be refetched is still used (300 s).
    pub fn list_grace(mut self, d: Duration) -> Self {
        self.list_grace = d;
        self
    }
    /// Judge a token on signature and claims alone when its list cannot be had (false).
    pub fn fail_open(mut self, yes: bool) -> Self {
        self.fail_open = yes;
        self
    }
    /// Accept test-mode tokens (`"livemode": false`, issued with an `sk_test_` key); refused
    /// as `TOKEN_INVALID` otherwise (false).
    pub fn allow_test(mut self, yes: bool) -> Self {
        self.allow_test = yes;
        self
    }
    /// Least time between refetches of the keys for unknown kids (60 s).
    pub fn kid_refetch_interval(mut self, d: Duration) -> Self {
        self.kid_refetch = d;
        self
    }
    pub fn build(self) -> Result<Verifier, Error> {
        let base = self.base_url.trim_end_matches('/').to_owned();
        if !(base.starts_with("https://") || base.starts_with("http://")) {
            return Err(invalid("the base URL must be http(s)://"));
        }
        Ok(Verifier {
            inner: Arc::new(Inner {
                agent: ureq::AgentBuilder::new()
                    .timeout(self.timeout)
                    .redirects(0)
                    .build(),
                base,
                issuers: self.issuers,
                leeway: self.leeway.as_secs() as i64,
                list_grace: self.list_grace,
                fail_open: self.fail_open,
                allow_test: self.allow_test,
                kid_refetch: self.kid_refetch,
                state: Mutex::default(),
                fetching: tokio::sync::Mutex::default(),
            }),
        })
    }
}

/// A status list as held: its bits, when it was fetched, its ttl and ETag.
#[derive(Clone)]
struct HeldList {
    bits: Arc<Vec<u8>>,
    fetched: Instant,
    ttl: Duration,
    etag: Option<String>,
}

impl HeldList {
    fn fresh(&self) -> bool {
        self.fetched.elapsed() < self.ttl
    }
}

#[derive(Default)]
struct State {
    keys: HashMap<String, VerifyingKey>,
    keys_etag: Option<String>,
    keys_fresh_until: Option<Instant>,
    last_kid_fetch: Option<Instant>,
    lists: HashMap<String, HeldList>,
    revoked: HashSet<String>,
}

struct Inner {
    agent: ureq::Agent,
    base: String,
    issuers: Option<HashSet<String>>,
    leeway: i64,
    list_grace: Duration,
    fail_open: bool,
    allow_test: bool,
    kid_refetch: Duration,
    state: Mutex<State>,
    /// Held while fetching: concurrent verifications share one fetch.
    fetching: tokio::sync::Mutex<()>,
}

/// Verifies tokens of one agentid service. Cheap to clone.
#[derive(Clone)]
pub struct Verifier {
    inner: Arc<Inner>,
}

struct Fetched {
    status: u16,
    body: String,
    etag: Option<String>,
    max_age: Option<u64>,
}

fn max_age(cache_control: Option<&str>) -> Option<u64> {
    cache_control?.split(',').find_map(|p| {
        let (name, value) = p.trim().split_once('=')?;
        name.eq_ignore_ascii_case("max-age").then(|| value.parse().ok())?
    })
}

fn now_secs() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

fn b64_json(part: &str) -> Result<Value, Error> {
    let bytes = URL_SAFE_NO_PAD.decode(part).map_err(|_| invalid("malformed"))?;
    serde_json::from_slice(&bytes).map_err(|_| invalid("malformed"))
}

impl Verifier {
    pub fn builder(base_url: impl Into<String>) -> Builder {
        Builder {
            base_url: base_url.into(),
            issuers: None,
            leeway: Duration::from_secs(30),
            list_grace: Duration::from_secs(300),
            fail_open: false,
            allow_test: false,
            kid_refetch: Duration::from_secs(60),
            timeout: Duration::from_secs(5),
        }
    }

    async fn get(&self, url: String, accept: &'static str, etag: Option<String>) -> Result<Fetched, Error> {
        let agent = self.inner.agent.clone();
        tokio::task::spawn_blocking(move || {
            let mut req = agent.get(&url).set("Accept", accept);
            if let Some(e) = &etag {
                req = req.set("If-None-Match", e);
            }
            let res = match req.call() {
                Ok(r) => r,
                Err(ureq::Error::Status(304, r)) => r,
                Err(e) => return Err(Error::Unavailable(format!("{url}: {e}"))),
            };
            Ok(Fetched {
                status: res.status(),
                etag: res.header("etag").map(str::to_owned),
                max_age: max_age(res.header("cache-control")),
                body: res.into_string().map_err(|e| Error::Unavailable(e.to_string()))?,
            })
        })
        .await
        .map_err(|e| Error::Unavailable(e.to_string()))?
    }

    /// The key of `kid`: from the cached JWKS, refetched when stale, or (at most once per
    /// `kid_refetch_interval`) when the kid is unknown.
    async fn key(&self, kid: &str) -> Result<VerifyingKey, Error> {
        let want = |s: &State| {
            let stale = s.keys_fresh_until.map_or(true, |t| t <= Instant::now());
            let unknown = !s.keys.contains_key(kid);
            let may = s
                .last_kid_fetch
                .map_or(true, |t| t.elapsed() >= self.inner.kid_refetch);
            stale || (unknown && may)
        };
        if want(&self.inner.state.lock()) {
            let _one = self.inner.fetching.lock().await;
            let etag = {
                let s = self.inner.state.lock();
                want(&s).then(|| s.keys_etag.clone())
            };
            if let Some(etag) = etag {
                let fetched = self
                    .get(
                        format!("{}/.well-known/jwks.json", self.inner.base),
                        "application/json",
                        etag,
                    )
                    .await;
                let mut s = self.inner.state.lock();
                if !s.keys.contains_key(kid) {
                    s.last_kid_fetch = Some(Instant::now());
                }
                match fetched {
                    Ok(f) => {
                        if f.status != 304 {
                            let doc: Value = serde_json::from_str(&f.body)
                                .map_err(|_| Error::Unavailable("JWKS is not JSON".into()))?;
                            let mut keys = HashMap::new();
                            for jwk in doc["keys"].as_array().into_iter().flatten() {
                                let (Some(kid), Some(x)) = (jwk["kid"].as_str(), jwk["x"].as_str()) else {
                                    continue;
                                };
                                if jwk["kty"] != "OKP" || jwk["crv"] != "Ed25519" {
                                    continue;
                                }
                                let Some(k) = URL_SAFE_NO_PAD
                                    .decode(x)
                                    .ok()
                                    .and_then(|b| <[u8; 32]>::try_from(b).ok())
                                    .and_then(|b| VerifyingKey::from_bytes(&b).ok())
                                else {
                                    continue;
                                };
                                keys.insert(kid.to_owned(), k);
                            }
                            s.keys = keys;
                            s.keys_etag = f.etag;
                        }
                        s.keys_fresh_until =
                            Some(Instant::now() + Duration::from_secs(f.max_age.unwrap_or(60)));
                    }
                    Err(e) if s.keys.is_empty() => return Err(e),
                    Err(_) => {} // keep the keys held
                }
            }
        }
        self.inner
            .state
            .lock()
            .keys
            .get(kid)
            .copied()
            .ok_or_else(|| invalid(format!("no key {kid} in the service's JWKS")))
    }

    /// Checks a compact JWS's header (EdDSA, a kid, `typ`) and strict signature; its claims.
    async fn decode(&self, jws: &str, typ: &str) -> Result<Value, Error> {
        let mut parts = jws.split('.');
        let (Some(h), Some(p), Some(s), None) = (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(invalid("malformed"));
        };
        let header = b64_json(h)?;
        let kid = match (&header["alg"], &header["kid"]) {
            (Value::String(alg), Value::String(kid)) if alg == "EdDSA" => kid.clone(),
            _ => return Err(invalid("only alg EdDSA with a kid")),
        };
        if header.get("typ").is_some_and(|t| t != typ) {
            return Err(invalid(format!("typ is not {typ}")));
        }
        let sig: [u8; 64] = URL_SAFE_NO_PAD
            .decode(s)
            .ok()
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| invalid("malformed signature"))?;
        let key = self.key(&kid).await?;
        key.verify_strict(
            &jws.as_bytes()[..h.len() + 1 + p.len()],
            &Signature::from_bytes(&sig),
        )
        .map_err(|_| invalid("signature verification failed"))?;
        let claims = b64_json(p)?;
        if !claims.is_object() {
            return Err(invalid("claims are not an object"));
        }
        Ok(claims)
    }

    /// The status at `idx` of the list at `uri` (1: revoked); `None` when the list cannot be
    /// had and `fail_open` is set.
    async fn status(&self, uri: &str, idx: u64) -> Result<Option<u8>, Error> {
        let prefix = format!("{}/v1/status/", self.inner.base);
        let rest = uri.strip_prefix(&prefix).unwrap_or("/");
        if rest.is_empty() || rest.contains(['/', '?', '#']) {
            return Err(invalid(format!(
                "status list {uri} is not one of {}",
                self.inner.base
            )));
        }
        let held = self.inner.state.lock().lists.get(uri).cloned();
        let bits = match held {
            Some(h) if h.fresh() => h.bits,
            _ => {
                let _one = self.inner.fetching.lock().await;
                let held = self.inner.state.lock().lists.get(uri).cloned();
                match held {
                    Some(h) if h.fresh() => h.bits,
                    _ => match self
                        .fetch_list(uri, held.as_ref().and_then(|h| h.etag.clone()))
                        .await
                    {
                        Ok(fetched) => {
                            // None: 304, what is held is fresh again.
                            let list = match (fetched, held) {
                                (Some(list), _) => list,
                                (None, Some(h)) => HeldList {
                                    fetched: Instant::now(),
                                    ..h
                                },
                                (None, None) => return Err(invalid("304 for a list not held")),
                            };
                            let bits = list.bits.clone();
                            self.inner.state.lock().lists.insert(uri.to_owned(), list);
                            bits
                        }
                        Err(Error::Unavailable(why)) => match held {
                            Some(h) if h.fetched.elapsed() <= h.ttl + self.inner.list_grace => h.bits,
                            _ if self.inner.fail_open => return Ok(None),
                            _ => return Err(Error::Unavailable(why)),
                        },
                        Err(e) => return Err(e),
                    },
                }
            }
        };
        let byte = usize::try_from(idx / 8)
            .ok()
            .and_then(|i| bits.get(i))
            .ok_or_else(|| invalid(format!("index {idx} is outside the list")))?;
        Ok(Some((byte >> (idx % 8)) & 1))
    }

    /// Fetches and checks a list; `None` on 304.
    async fn fetch_list(&self, uri: &str, etag: Option<String>) -> Result<Option<HeldList>, Error> {
        let f = self
            .get(uri.to_owned(), "application/statuslist+jwt", etag)
            .await?;
        if f.status == 304 {
            return Ok(None);
        }
        let claims = self.decode(f.body.trim(), "statuslist+jwt").await?;
        if claims["sub"] != uri {
            return Err(invalid(format!("the list at {uri} says it is {}", claims["sub"])));
        }
        if claims["status_list"]["bits"] != 1 {
            return Err(invalid("status lists of one bit only"));
        }
        let lst = claims["status_list"]["lst"]
            .as_str()
            .ok_or_else(|| invalid("no lst"))?;
        let compressed = URL_SAFE_NO_PAD
            .decode(lst)
            .map_err(|_| invalid("lst is not base64url"))?;
        let bits = miniz_oxide::inflate::decompress_to_vec_zlib_with_limit(&compressed, 16 << 20)
            .map_err(|_| invalid("lst is not zlib"))?;
        Ok(Some(HeldList {
            bits: Arc::new(bits),
            fetched: Instant::now(),
            ttl: Duration::from_secs(claims["ttl"].as_u64().unwrap_or(60)),
            etag: f.etag,
        }))
    }

    /// Verifies `token` offline: signature, claims and revocation.
    pub async fn verify(&self, token: &str) -> Result<Agent, Error> {
        self.verify_with_scopes(token, &[]).await
    }

    /// Verifies `token` offline, and that it grants every one of `scopes`.
    pub async fn verify_with_scopes(&self, token: &str, scopes: &[&str]) -> Result<Agent, Error> {
        let c = self.decode(token, "JWT").await?;
        let (Some(sub), Some(iss), Some(iat), Some(exp)) = (
            c["sub"].as_str(),
            c["iss"].as_str(),
            c["iat"].as_i64(),
            c["exp"].as_i64(),
        ) else {
            return Err(invalid("sub, iss, iat and exp are required"));
        };
        let now = now_secs();
        if exp + self.inner.leeway < now {
            return Err(Error::Expired);
        }
        if iat > now + self.inner.leeway {
            return Err(invalid("issued in the future"));
        }
        if self.inner.issuers.as_ref().is_some_and(|i| !i.contains(iss)) {
            return Err(invalid(format!("issuer {iss} is not accepted")));
        }
        let livemode = self.livemode(c.get("livemode"))?;
        if self.inner.state.lock().revoked.contains(sub) {
            return Err(Error::Revoked);
        }
        if let Some(status) = c.get("status") {
            let r = &status["status_list"];
            let (Some(idx), Some(uri)) = (r["idx"].as_u64(), r["uri"].as_str()) else {
                return Err(invalid("malformed status claim"));
            };
            if self.status(uri, idx).await? == Some(1) {
                return Err(Error::Revoked);
            }
        }
        let granted: Vec<String> = c["scopes"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| s.as_str().map(str::to_owned))
            .collect();
        let missing: Vec<String> = scopes
            .iter()
            .filter(|s| !granted.iter().any(|g| g == *s))
            .map(|s| s.to_string())
            .collect();
        if !missing.is_empty() {
            return Err(Error::InsufficientScope(missing));
        }
        Ok(Agent {
            agent_id: sub.to_owned(),
            issuer: iss.to_owned(),
            scopes: granted,
            issued_at: UNIX_EPOCH + Duration::from_secs(iat.max(0) as u64),
            expires_at: UNIX_EPOCH + Duration::from_secs(exp.max(0) as u64),
            livemode,
        })
    }

    /// Whether a token is live (no `livemode`, or `true`); a test-mode one is refused
    /// unless `allow_test`.
    fn livemode(&self, value: Option<&Value>) -> Result<bool, Error> {
        match value {
            None | Some(Value::Bool(true)) => Ok(true),
            Some(Value::Bool(false)) if self.inner.allow_test => Ok(false),
            Some(Value::Bool(false)) => Err(invalid(
                "a test-mode token (livemode false); build the Verifier with .allow_test(true) to accept it",
            )),
            Some(_) => Err(invalid("malformed livemode claim")),
        }
    }

    /// Asks the service (`GET /v1/verify/:token`), which sees revocation at once.
    pub async fn verify_online(&self, token: &str, key: Option<&str>) -> Result<Agent, Error> {
        if !token
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        {
            return Err(invalid("malformed"));
        }
        let (agent, url, key) = (
            self.inner.agent.clone(),
            format!("{}/v1/verify/{token}", self.inner.base),
            key.map(str::to_owned),
        );
        let answer: Value = tokio::task::spawn_blocking(move || {
            let mut req = agent.get(&url);
            if let Some(k) = &key {
                req = req.set("Authorization", &format!("Bearer {k}"));
            }
            let text = req
                .call()
                .map_err(|e| Error::Unavailable(e.to_string()))?
                .into_string()
                .map_err(|e| Error::Unavailable(e.to_string()))?;
            serde_json::from_str::<Value>(&text).map_err(|e| Error::Unavailable(e.to_string()))
        })
        .await
        .map_err(|e| Error::Unavailable(e.to_string()))??;
        if answer["valid"] != true {
            return Err(match answer["error"].as_str() {
                Some("TOKEN_REVOKED") => Error::Revoked,
                Some("TOKEN_EXPIRED") => Error::Expired,
                other => invalid(other.unwrap_or("TOKEN_INVALID")),
            });
        }
        let livemode = self.livemode(answer.get("livemode"))?;
        // The answer's times are RFC 3339; the token's own claims hold them as seconds.
        let claims = token
            .split('.')
            .nth(1)
            .map(b64_json)
            .transpose()?
            .unwrap_or_default();
        let secs = |v: &Value| UNIX_EPOCH + Duration::from_secs(v.as_u64().unwrap_or(0));
        Ok(Agent {
            agent_id: answer["agent_id"].as_str().unwrap_or_default().to_owned(),
            issuer: answer["issuer"].as_str().unwrap_or_default().to_owned(),
            scopes: answer["scopes"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|s| s.as_str().map(str::to_owned))
                .collect(),
            issued_at: secs(&claims["iat"]),
            expires_at: secs(&claims["exp"]),
            livemode,
        })
    }

    /// Takes a Security Event Token the service pushed (or a poll gave): verified through the
    /// JWKS, from this service; a revocation marks its agent revoked at once.
    pub async fn handle_set(&self, set_jwt: &str) -> Result<(), Error> {
        let c = self.decode(set_jwt, "secevent+jwt").await?;
        if c["iss"] != self.inner.base.as_str() {
            return Err(invalid(format!(
                "a SET of {}, not of {}",
                c["iss"], self.inner.base
            )));
        }
        if c["jti"].as_str().is_none() || c["iat"].as_i64().is_none() {
            return Err(invalid("a SET needs jti and iat"));
        }
        if c["events"].get(SESSION_REVOKED).is_some() {
            let s = &c["sub_id"];
            match (s["format"].as_str(), s["sub"].as_str()) {
                (Some("iss_sub"), Some(sub)) => {
                    self.inner.state.lock().revoked.insert(sub.to_owned());
                }
                _ => return Err(invalid("a revocation without an iss_sub subject")),
            }
        }
        Ok(())
    }
}

/// A tower layer (axum and other tower services) that verifies the request's agent token.
#[cfg(feature = "tower")]
pub mod tower {
    use std::future::Future;
    use std::pin::Pin;
    use std::sync::Arc;
    use std::task::{Context, Poll};

    use super::{Error, Verifier};

    /// Verifies `Authorization: Bearer <token>` (with these `scopes`) before the inner
    /// service sees the request. On success the [`super::Agent`] is in the request's
    /// extensions; otherwise the answer is 401 (403 for `INSUFFICIENT_SCOPE`, 503 for
    /// `UNAVAILABLE`) with `{"error": code}` and `WWW-Authenticate: Bearer
    /// error="invalid_token"`.
    #[derive(Clone)]
    pub struct AgentIdLayer {
        verifier: Verifier,
        scopes: Arc<Vec<String>>,
    }

    impl AgentIdLayer {
        pub fn new(verifier: Verifier, scopes: &[&str]) -> Self {
            AgentIdLayer {
                verifier,
                scopes: Arc::new(scopes.iter().map(|s| s.to_string()).collect()),
            }
        }
    }

    impl<S> tower_layer::Layer<S> for AgentIdLayer {
        type Service = AgentId<S>;

        fn layer(&self, inner: S) -> AgentId<S> {
            AgentId {
                inner,
                layer: self.clone(),
            }
        }
    }

    #[derive(Clone)]
    pub struct AgentId<S> {
        inner: S,
        layer: AgentIdLayer,
    }

    /// The answer to a refused token.
    pub fn refusal<B: From<String>>(e: &Error) -> http::Response<B> {
        let status = match e {
            Error::InsufficientScope(_) => 403,
            Error::Unavailable(_) => 503,
            _ => 401,
        };
        http::Response::builder()
            .status(status)
            .header(http::header::CONTENT_TYPE, "application/json")
            .header(http::header::WWW_AUTHENTICATE, "Bearer error=\"invalid_token\"")
            .body(B::from(format!("{{\"error\":\"{}\"}}", e.code())))
            .expect("a valid response")
    }

    impl<S, B, R> tower_service::Service<http::Request<B>> for AgentId<S>
    where
        S: tower_service::Service<http::Request<B>, Response = http::Response<R>> + Clone + Send + 'static,
        S::Future: Send + 'static,
        B: Send + 'static,
        R: From<String> + 'static,
    {
        type Response = http::Response<R>;
        type Error = S::Error;
        type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

        fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            self.inner.poll_ready(cx)
        }

        fn call(&mut self, mut req: http::Request<B>) -> Self::Future {
            // The service that was polled ready answers; a clone takes its place.
            let clone = self.inner.clone();
            let mut inner = std::mem::replace(&mut self.inner, clone);
            let layer = self.layer.clone();
            Box::pin(async move {
                let token = req
                    .headers()
                    .get(http::header::AUTHORIZATION)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| {
                        v.get(..7)
                            .filter(|p| p.eq_ignore_ascii_case("bearer "))
                            .map(|_| v[7..].trim())
                    })
                    .filter(|t| !t.is_empty())
                    .map(str::to_owned);
                let scopes: Vec<&str> = layer.scopes.iter().map(String::as_str).collect();
                let verified = match token {
                    Some(t) => layer.verifier.verify_with_scopes(&t, &scopes).await,
                    None => Err(Error::Invalid("no bearer token".into())),
                };
                match verified {
                    Ok(agent) => {
                        req.extensions_mut().insert(agent);
                        inner.call(req).await
                    }
                    Err(e) => Ok(refusal(&e)),
                }
            })
        }
    }
}

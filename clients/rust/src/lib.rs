//! Verify agentid tokens in a receiver: offline against the service's JWKS, with revocation
//! seen through Token Status Lists and pushed Shared Signals events, or online. Agent tokens
//! (minted by the agent's organization) and OAuth access tokens (RFC 9068, `typ` `at+jwt`,
//! which an agent gets itself for the resources in their `aud`) verify alike; a receiver that
//! names its [`Builder::audience`] accepts only access tokens for it.
//!
//! ```no_run
//! # async fn f(token: &str, set_jwt: &str) -> Result<(), agentid_verifier::Error> {
//! use std::time::Duration;
//! let verifier = agentid_verifier::Verifier::builder("https://id.example.com")
//!     .issuers(["example.com"])
//!     .leeway(Duration::from_secs(30))
//!     .timeout(Duration::from_secs(5))
//!     .set_audience("https://receiver.example.com")
//!     .build()?;
//! let agent = verifier.verify_with_scopes(token, &["read:orders"]).await?;
//! println!("{} of {}", agent.agent_id, agent.issuer);
//! // Online: the service sees a revocation at once; the same issuer, mode and scope checks.
//! let agent = verifier.verify_online(token, None, &["read:orders"]).await?;
//! // A token bound to the agent's key, with the DPoP proof of its request.
//! # let proof = "";
//! let agent = verifier.verify_dpop(token, Some(proof), "GET", "https://api.example/orders", &[]).await?;
//! // A Security Event Token pushed to (or polled by) this receiver.
//! verifier.handle_set(set_jwt).await?;
//! # Ok(()) }
//! ```
//!
//! Keys and lists come only from the base URL's origin and are cached for as long as the
//! service says (`Cache-Control`, a list's `ttl`), so a warm verification makes no network
//! call. No redirect is followed, no answer is read past 1 MiB ([`MAX_BODY_BYTES`]), and each
//! request, its answer included, takes at most [`Builder::timeout`] (5 s). Keys are read again
//! from every new JWKS (a 200), whether or not it carries an `ETag`. Signatures are checked
//! with `ed25519-dalek`'s strict verification; the algorithm is pinned to EdDSA and a `kid` is
//! required. A token over 4096 bytes ([`MAX_TOKEN_BYTES`]) is `TOKEN_INVALID`, unparsed.
//!
//! [`Verifier::verify_online`] applies the checks of [`Verifier::verify_with_scopes`]: the
//! [`Builder::issuers`] allow-list, the test-mode rule ([`Builder::allow_test`]) and the
//! scopes. [`Verifier::handle_set`] takes a SET only if its `iss` is the base URL, its `jti`
//! is not one of the last 10,000 taken ([`SEEN_SETS`]), its subject's issuer (`sub_id.iss`) is
//! one of [`Builder::issuers`] (when set) and, with [`Builder::set_audience`], its `aud` holds
//! that audience.
//!
//! A token bound to a key (its `cnf`, DPoP) passes only through [`Verifier::verify_dpop`],
//! with a proof made with that key for the request (RFC 9449), each proof once.
//!
//! Every failure is an [`Error`] whose [`Error::code`] is `TOKEN_INVALID`, `TOKEN_EXPIRED`,
//! `TOKEN_REVOKED`, `INSUFFICIENT_SCOPE`, `PROOF_INVALID`, `PROOF_REPLAYED` (the token's fault), `UNAVAILABLE` (the service's:
//! unreachable, a redirect, or an answer that is not what it should be) or `MISCONFIGURED`
//! (the receiver's own: the service refused the API key given to `verify_online`, or the
//! builder was given a bad base URL or timeout). The `tower` feature's `tower::AgentIdLayer`
//! answers 401, 403 (`INSUFFICIENT_SCOPE`), 503 (`UNAVAILABLE`) and 500 (`MISCONFIGURED`).
//!
//! What a verifier does is counted through the [`metrics`] facade, for whichever recorder the
//! application installs (`metrics-exporter-prometheus`, say); with none, counting costs next
//! to nothing:
//! - `agentid_verifier_verifications_total{outcome}`: every verification of
//!   [`Verifier::verify`], [`Verifier::verify_with_scopes`], [`Verifier::verify_dpop`] and
//!   [`Verifier::verify_online`], by `outcome`: `valid` or the refusal's [`Error::code`];
//! - `agentid_verifier_fetches_total{document,result}`: every fetch of the key set (`jwks`)
//!   or a status list (`status_list`), by `result`: `fetched` (a new body), `not_modified`
//!   (a 304) or `failed` (no answer in time, another status, an oversized body).
#![forbid(unsafe_code)]

use std::collections::{HashMap, HashSet, VecDeque};
use std::future::Future;
use std::io::Read as _;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use ed25519_dalek::{Signature, VerifyingKey};
use parking_lot::Mutex;
use serde_json::Value;

mod dpop;
mod resource;
pub use dpop::{MAX_PROOF_BYTES, SEEN_PROOFS};
pub use resource::ResourceMetadata;

/// The crate's README, whose example compiles as a doctest.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

/// The repository's page on receivers, whose Rust block compiles as a doctest (in the
/// repository only: the page is not in the package).
#[cfg(all(doctest, feature = "tower"))]
#[doc = include_str!("../../../docs/receivers.md")]
pub struct ReceiversPageDoctests;

const SESSION_REVOKED: &str = "https://schemas.openid.net/secevent/caep/event-type/session-revoked";
/// The header `typ` of an OAuth access token (RFC 9068).
const ACCESS_TOKEN_TYP: &str = "at+jwt";
/// The longest token accepted (the service issues none longer); a longer one is not parsed.
pub const MAX_TOKEN_BYTES: usize = 4096;
/// The most read of any answer of the service.
pub const MAX_BODY_BYTES: u64 = 1 << 20;
/// The longest SET [`Verifier::handle_set`] takes (the service's are under 4 KiB); a longer one
/// is `TOKEN_INVALID`, unparsed.
pub const MAX_SET_BYTES: usize = 16_384;
/// How many SET `jti`s are remembered to refuse a replay.
pub const SEEN_SETS: usize = 10_000;
/// The most an inflated status list may hold.
const MAX_LIST_BYTES: usize = 16 << 20;
/// The counter of verifications, by `outcome` (see the crate's documentation).
pub const VERIFICATIONS: &str = "agentid_verifier_verifications_total";
/// The counter of fetches, by `document` and `result` (see the crate's documentation).
pub const FETCHES: &str = "agentid_verifier_fetches_total";

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
    /// A token bound to a key without a proof made with that key for this request, a proof
    /// with a bearer token, or a proof that does not check.
    #[error("PROOF_INVALID: {0}")]
    ProofInvalid(String),
    /// A proof already taken (its `jti`, with its key).
    #[error("PROOF_REPLAYED: {0}")]
    ProofReplayed(String),
    /// The service cannot be reached, redirects, or answers something unusable.
    #[error("UNAVAILABLE: {0}")]
    Unavailable(String),
    /// The receiver's own configuration is wrong: the service refused the API key given to
    /// [`Verifier::verify_online`] (401, 403), or the [`Builder`] was given a bad value.
    #[error("MISCONFIGURED: {0}")]
    Misconfigured(String),
}

impl Error {
    /// The service's code: `TOKEN_INVALID`, `TOKEN_EXPIRED`, `TOKEN_REVOKED`,
    /// `INSUFFICIENT_SCOPE` or `UNAVAILABLE`; `MISCONFIGURED` for the receiver's own fault.
    pub fn code(&self) -> &'static str {
        match self {
            Error::Invalid(_) => "TOKEN_INVALID",
            Error::Expired => "TOKEN_EXPIRED",
            Error::Revoked => "TOKEN_REVOKED",
            Error::InsufficientScope(_) => "INSUFFICIENT_SCOPE",
            Error::ProofInvalid(_) => "PROOF_INVALID",
            Error::ProofReplayed(_) => "PROOF_REPLAYED",
            Error::Unavailable(_) => "UNAVAILABLE",
            Error::Misconfigured(_) => "MISCONFIGURED",
        }
    }
}

fn bound_as_bearer() -> Error {
    Error::ProofInvalid("the token is bound to a key: it passes only with a DPoP proof (verify_dpop)".into())
}

fn invalid(why: impl Into<String>) -> Error {
    Error::Invalid(why.into())
}

fn unavailable(why: impl Into<String>) -> Error {
    Error::Unavailable(why.into())
}

/// `jws` (a `what`), refused unparsed when longer than any the service issues (`limit` bytes).
fn sized<'a>(jws: &'a str, limit: usize, what: &str) -> Result<&'a str, Error> {
    if jws.len() > limit {
        return Err(invalid(format!("not a {what} of at most {limit} bytes")));
    }
    Ok(jws)
}

/// A verified agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Agent {
    pub agent_id: String,
    /// The name the agent's organization proved (an access token's `issuer_domain`).
    pub issuer: String,
    /// The scopes granted (an access token's `scope`, split).
    pub scopes: Vec<String>,
    pub issued_at: SystemTime,
    pub expires_at: SystemTime,
    /// False for a test-mode token (accepted only with [`Builder::allow_test`]).
    pub livemode: bool,
    /// The resources an access token is for (its `aud`); empty for an agent token.
    pub audience: Vec<String>,
    /// An access token's OAuth client: the agent itself. None for an agent token.
    pub client_id: Option<String>,
    /// The token's claims, as verified (the online answer's members for
    /// [`Verifier::verify_online`]).
    pub claims: Value,
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
    set_audience: Option<String>,
    dpop_max_skew: Duration,
    on_refusal: Option<RefusalHook>,
    audience: Option<Vec<String>>,
}

/// What [`Builder::on_refusal`] is given.
type RefusalHook = Arc<dyn Fn(&str, &str) + Send + Sync>;

impl Builder {
    /// Accepted `iss` values of tokens, and of the subjects of SETs (`sub_id.iss`); any when
    /// not set.
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
    /// The most a request to the service may take, its answer (at most 1 MiB) included (5 s).
    /// Zero is `MISCONFIGURED` at [`Builder::build`].
    pub fn timeout(mut self, d: Duration) -> Self {
        self.timeout = d;
        self
    }
    /// The `aud` of this receiver's Shared Signals stream: what the stream was created with,
    /// by default the push endpoint's origin (push) or the stream id (poll). When set,
    /// [`Verifier::handle_set`] refuses a SET whose `aud` (a string or an array) does not
    /// hold it.
    pub fn set_audience(mut self, aud: impl Into<String>) -> Self {
        self.set_audience = Some(aud.into());
        self
    }
    /// Told of every refusal of [`Verifier::verify_with_scopes`] (and `verify`),
    /// [`Verifier::verify_dpop`] and [`Verifier::verify_online`]: its code and its reason,
    /// whose controls, separators and bidirectional overrides come escaped ([`printable`]).
    pub fn on_refusal(mut self, hook: impl Fn(&str, &str) + Send + Sync + 'static) -> Self {
        self.on_refusal = Some(Arc::new(hook));
        self
    }
    /// How far a DPoP proof's `iat` may be from now, either way (60 s).
    pub fn dpop_max_skew(mut self, d: Duration) -> Self {
        self.dpop_max_skew = d;
        self
    }
    /// This receiver's resource identifier (a URI; call again to add another). When set, a
    /// token is accepted only when its `aud` names one of them: an agent token (which names
    /// none) and an access token for another receiver are `TOKEN_INVALID`.
    pub fn audience(mut self, resource: impl Into<String>) -> Self {
        self.audience.get_or_insert_with(Vec::new).push(resource.into());
        self
    }
    /// The verifier; `MISCONFIGURED` for a base URL that is not http(s) or a zero timeout.
    pub fn build(self) -> Result<Verifier, Error> {
        let base = self.base_url.trim_end_matches('/').to_owned();
        let host = base
            .strip_prefix("https://")
            .or_else(|| base.strip_prefix("http://"));
        if host.map_or(true, str::is_empty) {
            return Err(Error::Misconfigured(format!(
                "the base URL {base:?} is not http(s)://"
            )));
        }
        if self.timeout.is_zero() {
            return Err(Error::Misconfigured("the timeout must be more than zero".into()));
        }
        if self
            .audience
            .as_ref()
            .is_some_and(|a| a.iter().any(String::is_empty))
        {
            return Err(Error::Misconfigured("an audience must be a URI".into()));
        }
        metrics::describe_counter!(
            VERIFICATIONS,
            "Verifications by outcome: valid, or the refusal's code."
        );
        metrics::describe_counter!(FETCHES, "Fetches of the key set and status lists by result.");
        Ok(Verifier {
            inner: Arc::new(Inner {
                agent: ureq::AgentBuilder::new()
                    .timeout(self.timeout)
                    .redirects(0)
                    .build(),
                base,
                issuers: self.issuers,
                leeway: i64::try_from(self.leeway.as_secs()).unwrap_or(i64::MAX),
                list_grace: self.list_grace,
                fail_open: self.fail_open,
                allow_test: self.allow_test,
                kid_refetch: self.kid_refetch,
                set_audience: self.set_audience,
                dpop_max_skew: i64::try_from(self.dpop_max_skew.as_secs()).unwrap_or(i64::MAX),
                on_refusal: self.on_refusal,
                audience: self.audience,
                state: Mutex::default(),
                fetching_keys: tokio::sync::Mutex::default(),
                fetching_lists: tokio::sync::Mutex::default(),
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
    /// Set once a usable JWKS was read.
    keys_fresh_until: Option<Instant>,
    last_kid_fetch: Option<Instant>,
    lists: HashMap<String, HeldList>,
    revoked: HashSet<String>,
    /// The `jti`s of the last [`SEEN_SETS`] SETs taken, and their order (oldest first).
    seen_sets: HashSet<String>,
    seen_order: VecDeque<String>,
    proofs: dpop::Replays,
    /// URLs a background refresh is fetching.
    refreshing: HashSet<String>,
    /// URL -> (no background refresh before, failures in a row).
    retry: HashMap<String, (Instant, u32)>,
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
    set_audience: Option<String>,
    dpop_max_skew: i64,
    on_refusal: Option<RefusalHook>,
    audience: Option<Vec<String>>,
    state: Mutex<State>,
    /// Held while fetching the keys, and the lists: concurrent verifications share one
    /// fetch. Two locks, as reading a list may need the keys.
    fetching_keys: tokio::sync::Mutex<()>,
    fetching_lists: tokio::sync::Mutex<()>,
}

/// Verifies tokens of one agentid service. Cheap to clone.
#[derive(Clone)]
pub struct Verifier {
    inner: Arc<Inner>,
}

/// An answer: its status and headers, and for a 200 its body (at most [`MAX_BODY_BYTES`]).
struct Answer {
    status: u16,
    body: Vec<u8>,
    etag: Option<String>,
    max_age: Option<u64>,
}

fn max_age(cache_control: Option<&str>) -> Option<u64> {
    cache_control?.split(',').find_map(|p| {
        let (name, value) = p.trim().split_once('=')?;
        name.eq_ignore_ascii_case("max-age").then(|| value.parse().ok())?
    })
}

/// How long to keep what the service sent with `max-age` (60 s without; a day at most).
fn cache_for(max_age: Option<u64>) -> Duration {
    Duration::from_secs(max_age.unwrap_or(60).min(86_400))
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

/// The Ed25519 keys of a JWKS, by `kid`; `UNAVAILABLE` when it is not one.
fn read_jwks(body: &[u8]) -> Result<HashMap<String, VerifyingKey>, Error> {
    let unusable = |why: &str| unavailable(format!("the service's JWKS is unusable: {why}"));
    let doc: Value = serde_json::from_slice(body).map_err(|_| unusable("not JSON"))?;
    let Some(jwks) = doc.get("keys").and_then(Value::as_array) else {
        return Err(unusable("no keys array"));
    };
    let mut keys = HashMap::new();
    for jwk in jwks {
        if jwk["kty"] != "OKP" || jwk["crv"] != "Ed25519" {
            continue;
        }
        let Some(kid) = jwk["kid"].as_str() else {
            continue;
        };
        let key = jwk["x"]
            .as_str()
            .and_then(|x| URL_SAFE_NO_PAD.decode(x).ok())
            .and_then(|b| <[u8; 32]>::try_from(b).ok())
            .and_then(|b| VerifyingKey::from_bytes(&b).ok())
            .ok_or_else(|| unusable(&format!("key {kid} is not an Ed25519 public key")))?;
        keys.insert(kid.to_owned(), key);
    }
    Ok(keys)
}

/// The scopes a token grants: its (or the answer's) `scopes`, an array of strings; none when
/// absent.
fn granted(scopes: Option<&Value>) -> Result<Vec<String>, Error> {
    match scopes {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(a)) => a
            .iter()
            .map(|s| s.as_str().map(str::to_owned))
            .collect::<Option<_>>()
            .ok_or_else(|| invalid("malformed scopes")),
        Some(_) => Err(invalid("malformed scopes")),
    }
}

/// `text` with every character a token's or a proof's fields could plant in a log or a
/// terminal written as `\u{…}`: controls (C0, DEL, C1), line and paragraph separators and
/// bidirectional overrides.
pub fn printable(text: &str) -> String {
    let unsafe_char = |c: char| {
        c.is_control()
            || matches!(c, '\u{2028}' | '\u{2029}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    };
    if !text.chars().any(unsafe_char) {
        return text.to_owned();
    }
    text.chars()
        .map(|c| {
            if unsafe_char(c) {
                format!("\\u{{{:04x}}}", c as u32)
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// What the kind of a token (an agent token, an access token) says of it.
struct Kind {
    issuer: String,
    granted: Vec<String>,
    audience: Vec<String>,
    client_id: Option<String>,
}

/// A JWT's `aud` (absent, a string, or an array of strings) as a list; `None` when malformed.
fn audience_of(aud: Option<&Value>) -> Option<Vec<String>> {
    match aud {
        None | Some(Value::Null) => Some(Vec::new()),
        Some(Value::String(one)) => Some(vec![one.clone()]),
        Some(Value::Array(many)) => many.iter().map(|a| a.as_str().map(str::to_owned)).collect(),
        Some(_) => None,
    }
}

/// `INSUFFICIENT_SCOPE` unless `granted` holds every one of `scopes`.
fn scoped(granted: &[String], scopes: &[&str]) -> Result<(), Error> {
    let missing: Vec<String> = scopes
        .iter()
        .filter(|s| !granted.iter().any(|g| g == *s))
        .map(|s| s.to_string())
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(Error::InsufficientScope(missing))
    }
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
            set_audience: None,
            dpop_max_skew: Duration::from_secs(60),
            on_refusal: None,
            audience: None,
        }
    }

    /// The service's URL, without a trailing slash: the `iss` of its access tokens.
    pub fn base_url(&self) -> &str {
        &self.inner.base
    }

    /// The receiver's [`Builder::audience`], if it named one.
    pub fn audience(&self) -> Option<&[String]> {
        self.inner.audience.as_deref()
    }

    /// GETs `url` on a blocking thread: no redirect followed (a 3xx is an answer like any
    /// other), the whole within the timeout, and of a 200 no more than [`MAX_BODY_BYTES`]
    /// read (more is `UNAVAILABLE`).
    async fn send(
        &self,
        url: String,
        accept: &'static str,
        etag: Option<String>,
        key: Option<String>,
    ) -> Result<Answer, Error> {
        let agent = self.inner.agent.clone();
        tokio::task::spawn_blocking(move || {
            let mut req = agent.get(&url).set("Accept", accept);
            if let Some(e) = &etag {
                req = req.set("If-None-Match", e);
            }
            if let Some(k) = &key {
                req = req.set("Authorization", &format!("Bearer {k}"));
            }
            let res = match req.call() {
                Ok(r) | Err(ureq::Error::Status(_, r)) => r,
                Err(e) => return Err(unavailable(format!("{url}: {e}"))),
            };
            let mut answer = Answer {
                status: res.status(),
                body: Vec::new(),
                etag: res.header("etag").map(str::to_owned),
                max_age: max_age(res.header("cache-control")),
            };
            if answer.status == 200 {
                res.into_reader()
                    .take(MAX_BODY_BYTES + 1)
                    .read_to_end(&mut answer.body)
                    .map_err(|e| unavailable(format!("{url}: {e}")))?;
                if answer.body.len() as u64 > MAX_BODY_BYTES {
                    return Err(unavailable(format!(
                        "{url}: an answer over {MAX_BODY_BYTES} bytes"
                    )));
                }
            }
            Ok(answer)
        })
        .await
        .map_err(|e| unavailable(e.to_string()))?
    }

    /// GETs a document, revalidating with `etag`: its answer, a 200 or (only when `etag` was
    /// sent) a 304. Any other answer is `UNAVAILABLE`. Counted by `document` and result.
    async fn fetch(
        &self,
        url: String,
        document: &'static str,
        accept: &'static str,
        etag: Option<String>,
    ) -> Result<Answer, Error> {
        let revalidating = etag.is_some();
        let answer = self.send(url.clone(), accept, etag, None).await;
        let (result, answer) = match answer {
            Ok(a) if a.status == 200 => ("fetched", Ok(a)),
            Ok(a) if a.status == 304 && revalidating => ("not_modified", Ok(a)),
            Ok(a) => ("failed", Err(unavailable(format!("{url}: {}", a.status)))),
            Err(e) => ("failed", Err(e)),
        };
        metrics::counter!(FETCHES, "document" => document, "result" => result).increment(1);
        answer
    }

    /// Runs `refresh` behind the caller, unless one runs for `url` already or `url` failed
    /// lately (then not before 1 s, doubling per failure up to 30 s): a request holding a
    /// usable answer never waits for the network.
    fn refresh_later(&self, url: String, refresh: impl Future<Output = Result<(), Error>> + Send + 'static) {
        {
            let mut s = self.inner.state.lock();
            if s.refreshing.contains(&url) || s.retry.get(&url).is_some_and(|(at, _)| *at > Instant::now()) {
                return;
            }
            s.refreshing.insert(url.clone());
        }
        let this = self.clone();
        tokio::spawn(async move {
            let done = refresh.await;
            let mut s = this.inner.state.lock();
            s.refreshing.remove(&url);
            if done.is_ok() {
                s.retry.remove(&url);
            } else {
                let failures = s.retry.get(&url).map_or(0, |r| r.1) + 1;
                let wait = Duration::from_secs(1 << (failures - 1).min(5)).min(Duration::from_secs(30));
                s.retry.insert(url, (Instant::now() + wait, failures));
            }
        });
    }

    /// Fetches the JWKS when it is still wanted once the fetch is ours: when stale, or (for
    /// `kid`, unknown) at most once per `kid_refetch_interval`. A failure leaves the keys held.
    async fn load_keys(&self, kid: Option<&str>) -> Result<(), Error> {
        let want = |s: &State| {
            let stale = s.keys_fresh_until.map_or(true, |t| t <= Instant::now());
            let may = s
                .last_kid_fetch
                .map_or(true, |t| t.elapsed() >= self.inner.kid_refetch);
            match kid {
                Some(kid) => !s.keys.contains_key(kid) && (stale || may),
                None => stale,
            }
        };
        let _one = self.inner.fetching_keys.lock().await;
        let etag = {
            let s = self.inner.state.lock();
            match want(&s) {
                true => s.keys_etag.clone(),
                false => return Ok(()),
            }
        };
        let fetched = self
            .fetch(
                format!("{}/.well-known/jwks.json", self.inner.base),
                "jwks",
                "application/json",
                etag,
            )
            .await;
        // A new JWKS (a 200) is read anew, with an ETag or without; a 304 keeps the keys held.
        let read = fetched.and_then(|f| {
            let keys = if f.status == 200 {
                Some(read_jwks(&f.body)?)
            } else {
                None
            };
            Ok((keys, f.etag, f.max_age))
        });
        let mut s = self.inner.state.lock();
        if kid.is_some() {
            s.last_kid_fetch = Some(Instant::now());
        }
        let (keys, etag, max_age) = read?;
        if let Some(keys) = keys {
            s.keys = keys;
            s.keys_etag = etag;
        }
        s.keys_fresh_until = Some(Instant::now() + cache_for(max_age));
        Ok(())
    }

    /// The key of `kid`: from the cached JWKS, refreshed behind when stale, or fetched (when
    /// stale, else at most once per `kid_refetch_interval`) when the kid is unknown. While the
    /// JWKS cannot be had (or is unusable), the keys last read serve.
    async fn key(&self, kid: &str) -> Result<VerifyingKey, Error> {
        let (known, stale) = {
            let s = self.inner.state.lock();
            (
                s.keys.contains_key(kid),
                s.keys_fresh_until.map_or(true, |t| t <= Instant::now()),
            )
        };
        if !known {
            // Nothing held answers for this kid: it waits for the fetch.
            if let Err(e) = self.load_keys(Some(kid)).await {
                if self.inner.state.lock().keys_fresh_until.is_none() {
                    return Err(e);
                }
            }
        } else if stale {
            // The keys held serve while one refresh runs behind.
            let this = self.clone();
            let url = format!("{}/.well-known/jwks.json", self.inner.base);
            self.refresh_later(url, async move { this.load_keys(None).await });
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
        Ok(self.decode_typed(jws, &[typ]).await?.1)
    }

    /// Checks a compact JWS's header (EdDSA, a kid, a `typ` of `typs`, absent meaning the
    /// first) and strict signature; its `typ` and claims.
    async fn decode_typed<'t>(&self, jws: &str, typs: &[&'t str]) -> Result<(&'t str, Value), Error> {
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
        let typ = match header.get("typ") {
            None => typs[0],
            Some(Value::String(t)) => {
                let t = if t == "application/at+jwt" {
                    ACCESS_TOKEN_TYP
                } else {
                    t.as_str()
                };
                *typs
                    .iter()
                    .find(|want| **want == t)
                    .ok_or_else(|| invalid(format!("typ {t} is not one of {typs:?}")))?
            }
            Some(_) => return Err(invalid("malformed typ")),
        };
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
        Ok((typ, claims))
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
        let grace = self.inner.list_grace;
        let bits = match held {
            Some(h) if h.fresh() => h.bits,
            Some(h) if h.fetched.elapsed() <= h.ttl.saturating_add(grace) => {
                // Stale but usable: it serves while one refresh runs behind.
                let (this, at) = (self.clone(), uri.to_owned());
                self.refresh_later(uri.to_owned(), async move { this.load_list(&at).await.map(drop) });
                h.bits
            }
            _ => match self.load_list(uri).await {
                Ok(bits) => bits,
                Err(Error::Unavailable(_)) if self.inner.fail_open => return Ok(None),
                Err(e) => return Err(e),
            },
        };
        let byte = usize::try_from(idx / 8)
            .ok()
            .and_then(|i| bits.get(i))
            .ok_or_else(|| invalid(format!("index {idx} is outside the list")))?;
        Ok(Some((byte >> (idx % 8)) & 1))
    }

    /// The list at `uri`, fetched anew unless another caller did so while this one waited.
    async fn load_list(&self, uri: &str) -> Result<Arc<Vec<u8>>, Error> {
        let _one = self.inner.fetching_lists.lock().await;
        let held = self.inner.state.lock().lists.get(uri).cloned();
        if let Some(h) = held.as_ref().filter(|h| h.fresh()) {
            return Ok(h.bits.clone());
        }
        let list = self.fetch_list(uri, held.as_ref()).await?;
        let bits = list.bits.clone();
        self.inner.state.lock().lists.insert(uri.to_owned(), list);
        Ok(bits)
    }

    /// Fetches the list at `uri` (revalidating what is held): fresh again on a 304, read anew
    /// on a 200 (`UNAVAILABLE` when it is not the signed list at `uri`).
    async fn fetch_list(&self, uri: &str, held: Option<&HeldList>) -> Result<HeldList, Error> {
        let etag = held.and_then(|h| h.etag.clone());
        let f = self
            .fetch(uri.to_owned(), "status_list", "application/statuslist+jwt", etag)
            .await?;
        match (f.status, held) {
            (304, Some(h)) => Ok(HeldList {
                fetched: Instant::now(),
                ..h.clone()
            }),
            _ => self.read_list(uri, &f).await.map_err(|e| match e {
                Error::Unavailable(_) => e,
                e => unavailable(format!("the status list at {uri} is unusable: {e}")),
            }),
        }
    }

    /// The list in a 200 answer for `uri`.
    async fn read_list(&self, uri: &str, f: &Answer) -> Result<HeldList, Error> {
        let body = std::str::from_utf8(&f.body).map_err(|_| invalid("not UTF-8"))?;
        let claims = self.decode(body.trim(), "statuslist+jwt").await?;
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
        let bits = miniz_oxide::inflate::decompress_to_vec_zlib_with_limit(&compressed, MAX_LIST_BYTES)
            .map_err(|_| invalid("lst is not zlib"))?;
        let ttl = match claims.get("ttl") {
            None => 60,
            Some(t) => t.as_u64().ok_or_else(|| invalid(format!("ttl {t}")))?,
        };
        Ok(HeldList {
            bits: Arc::new(bits),
            fetched: Instant::now(),
            ttl: Duration::from_secs(ttl),
            etag: f.etag.clone(),
        })
    }

    /// Verifies `token` offline: signature, claims and revocation.
    pub async fn verify(&self, token: &str) -> Result<Agent, Error> {
        self.verify_with_scopes(token, &[]).await
    }

    /// Verifies `token` offline, and that it grants every one of `scopes`. A token bound to a
    /// key is `PROOF_INVALID` here: it needs [`Verifier::verify_dpop`].
    pub async fn verify_with_scopes(&self, token: &str, scopes: &[&str]) -> Result<Agent, Error> {
        self.told(self.bearer(token, scopes).await)
    }

    /// `result`, counted by outcome and told to the [`Builder::on_refusal`] hook when it is a
    /// refusal.
    fn told<T>(&self, result: Result<T, Error>) -> Result<T, Error> {
        let outcome = result.as_ref().map_or_else(Error::code, |_| "valid");
        metrics::counter!(VERIFICATIONS, "outcome" => outcome).increment(1);
        if let (Err(e), Some(hook)) = (&result, &self.inner.on_refusal) {
            hook(e.code(), &printable(&e.to_string()));
        }
        result
    }

    async fn bearer(&self, token: &str, scopes: &[&str]) -> Result<Agent, Error> {
        let agent = self.checked(token, scopes).await?;
        if agent.claims.get("cnf").is_some() {
            return Err(bound_as_bearer());
        }
        Ok(agent)
    }

    /// Verifies a token bound to a key with the DPoP `proof` that came with it, for a
    /// `method` request to `url` (as the agent addressed it: the receiver's public origin):
    /// the token as [`Verifier::verify_with_scopes`] does, then the proof (its signature by
    /// the token's key, `typ`, `alg`, `htm`, `htu`, `ath`, `iat` within
    /// [`Builder::dpop_max_skew`]), which passes once (`PROOF_REPLAYED` after). A token that is
    /// not bound, or a missing proof, is `PROOF_INVALID`.
    pub async fn verify_dpop(
        &self,
        token: &str,
        proof: Option<&str>,
        method: &str,
        url: &str,
        scopes: &[&str],
    ) -> Result<Agent, Error> {
        self.told(self.dpop(token, proof, method, url, scopes).await)
    }

    async fn dpop(
        &self,
        token: &str,
        proof: Option<&str>,
        method: &str,
        url: &str,
        scopes: &[&str],
    ) -> Result<Agent, Error> {
        let agent = self.checked(token, scopes).await?;
        let Some(bound) = agent.claims["cnf"]["jkt"].as_str() else {
            return Err(Error::ProofInvalid(
                "the token is not bound to a key: send it as a Bearer token".into(),
            ));
        };
        let Some(proof) = proof else {
            return Err(Error::ProofInvalid(
                "no DPoP proof came with a token bound to a key".into(),
            ));
        };
        let now = now_secs();
        let skew = self.inner.dpop_max_skew;
        let checked = dpop::check_proof(proof, method, url, token, now, skew)?;
        if checked.jkt != bound {
            return Err(Error::ProofInvalid(
                "DPoP proof signed by a key other than the one the token is bound to".into(),
            ));
        }
        self.inner
            .state
            .lock()
            .proofs
            .admit(&checked, now.saturating_sub(skew))?;
        Ok(agent)
    }

    /// The agent of `token`, with its claims, checked offline.
    async fn checked(&self, token: &str, scopes: &[&str]) -> Result<Agent, Error> {
        let (typ, c) = self
            .decode_typed(
                sized(token, MAX_TOKEN_BYTES, "token")?,
                &["JWT", ACCESS_TOKEN_TYP],
            )
            .await?;
        let (Some(sub), Some(_), Some(iat), Some(exp)) = (
            c["sub"].as_str(),
            c["iss"].as_str(),
            c["iat"].as_i64(),
            c["exp"].as_i64(),
        ) else {
            return Err(invalid("sub, iss, iat and exp are required"));
        };
        let now = now_secs();
        if exp.saturating_add(self.inner.leeway) < now {
            return Err(Error::Expired);
        }
        if iat > now.saturating_add(self.inner.leeway) {
            return Err(invalid("issued in the future"));
        }
        let kind = self.kind(typ == ACCESS_TOKEN_TYP, &c)?;
        let livemode = self.admit(sub, &kind.issuer, c.get("livemode"))?;
        if let Some(status) = c.get("status") {
            let r = &status["status_list"];
            // A non-negative integer: -1, 1.5, "3" or true are not indices.
            let (Some(idx), Some(uri)) = (r["idx"].as_u64(), r["uri"].as_str()) else {
                return Err(invalid("malformed status claim"));
            };
            if self.status(uri, idx).await? == Some(1) {
                return Err(Error::Revoked);
            }
        }
        scoped(&kind.granted, scopes)?;
        let agent = Agent {
            agent_id: sub.to_owned(),
            issuer: kind.issuer,
            scopes: kind.granted,
            issued_at: UNIX_EPOCH + Duration::from_secs(iat.max(0) as u64),
            expires_at: UNIX_EPOCH + Duration::from_secs(exp.max(0) as u64),
            livemode,
            audience: kind.audience,
            client_id: kind.client_id,
            claims: c,
        };
        Ok(agent)
    }

    /// The issuer domain, scopes, audience and client of an agent token's or an access
    /// token's claims (an access token is one of this service, for its agent); the audience
    /// held to [`Builder::audience`].
    fn kind(&self, access: bool, c: &Value) -> Result<Kind, Error> {
        let audience = audience_of(c.get("aud")).ok_or_else(|| invalid("malformed aud"))?;
        let kind = if access {
            if c["iss"] != self.inner.base.as_str() {
                return Err(invalid(format!(
                    "an access token of {}, not of {}",
                    c["iss"], self.inner.base
                )));
            }
            let (Some(scope), Some(client), Some(domain)) = (
                c["scope"].as_str(),
                c["client_id"].as_str(),
                c["issuer_domain"].as_str(),
            ) else {
                return Err(invalid(
                    "an access token needs scope, client_id and issuer_domain",
                ));
            };
            if scope.is_empty() || c["sub"] != client || audience.is_empty() {
                return Err(invalid(
                    "an access token needs aud, scope and client_id (its sub)",
                ));
            }
            Kind {
                issuer: domain.to_owned(),
                granted: scope.split(' ').map(str::to_owned).collect(),
                client_id: Some(client.to_owned()),
                audience,
            }
        } else {
            if c.get("client_id").is_some() || c.get("scope").is_some() {
                return Err(invalid("an agent token with an access token's claims"));
            }
            Kind {
                issuer: c["iss"].as_str().unwrap_or_default().to_owned(),
                granted: granted(c.get("scopes"))?,
                client_id: None,
                audience,
            }
        };
        self.held_to_audience(&kind.audience)?;
        Ok(kind)
    }

    /// `TOKEN_INVALID` for a token whose audience names none of [`Builder::audience`] (when
    /// the receiver named one).
    fn held_to_audience(&self, audience: &[String]) -> Result<(), Error> {
        match &self.inner.audience {
            Some(ours) if !audience.iter().any(|a| ours.contains(a)) => {
                Err(invalid(format!("a token for {audience:?}, not for {ours:?}")))
            }
            _ => Ok(()),
        }
    }

    /// What offline and online verification both check: the issuer, the mode, a pushed
    /// revocation (the scopes are checked last, by [`scoped`]). Whether the token is live.
    fn admit(&self, agent_id: &str, issuer: &str, livemode: Option<&Value>) -> Result<bool, Error> {
        if self.inner.issuers.as_ref().is_some_and(|i| !i.contains(issuer)) {
            return Err(invalid(format!("issuer {issuer} is not accepted")));
        }
        let live = self.livemode(livemode)?;
        if self.inner.state.lock().revoked.contains(agent_id) {
            return Err(Error::Revoked);
        }
        Ok(live)
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

    /// Asks the service (`GET /v1/verify/:token`, with the API `key` if given), which sees
    /// revocation at once and records the verification; then checks the issuer, the mode and
    /// `scopes` as [`Verifier::verify_with_scopes`] does. A `key` the service refuses (401,
    /// 403) is [`Error::Misconfigured`]; any other answer but a 200 is `UNAVAILABLE`.
    pub async fn verify_online(
        &self,
        token: &str,
        key: Option<&str>,
        scopes: &[&str],
    ) -> Result<Agent, Error> {
        self.told(self.online(token, key, scopes).await)
    }

    async fn online(&self, token: &str, key: Option<&str>, scopes: &[&str]) -> Result<Agent, Error> {
        if !sized(token, MAX_TOKEN_BYTES, "token")?
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        {
            return Err(invalid("malformed"));
        }
        let url = format!("{}/v1/verify/{token}", self.inner.base);
        let answer = self
            .send(url, "application/json", None, key.map(str::to_owned))
            .await?;
        match answer.status {
            200 => {}
            401 | 403 => {
                return Err(Error::Misconfigured(format!(
                    "the service refused the API key ({})",
                    answer.status
                )))
            }
            status => return Err(unavailable(format!("verify answered {status}"))),
        }
        let malformed = |why: &str| unavailable(format!("verify gave a malformed answer: {why}"));
        let answer: Value = serde_json::from_slice(&answer.body).map_err(|_| malformed("not JSON"))?;
        match answer.get("valid") {
            Some(Value::Bool(true)) => {}
            Some(Value::Bool(false)) => {
                return Err(match answer["error"].as_str() {
                    Some("TOKEN_REVOKED") => Error::Revoked,
                    Some("TOKEN_EXPIRED") => Error::Expired,
                    other => invalid(other.unwrap_or("TOKEN_INVALID")),
                })
            }
            _ => return Err(malformed("no valid")),
        }
        let (Some(agent_id), Some(issuer)) = (answer["agent_id"].as_str(), answer["issuer"].as_str()) else {
            return Err(malformed("no agent_id or issuer"));
        };
        // The answer's times are RFC 3339; the token's own claims (which the service just
        // verified) hold them as seconds.
        let claims = token.split('.').nth(1).and_then(|p| b64_json(p).ok());
        let (Some(iat), Some(exp)) = (
            claims.as_ref().and_then(|c| c["iat"].as_i64()),
            claims.as_ref().and_then(|c| c["exp"].as_i64()),
        ) else {
            return Err(malformed("a valid token without iat and exp"));
        };
        let granted = granted(answer.get("scopes"))?;
        let audience = audience_of(answer.get("aud")).ok_or_else(|| malformed("aud"))?;
        self.held_to_audience(&audience)?;
        let livemode = self.admit(agent_id, issuer, answer.get("livemode"))?;
        if answer.get("cnf").is_some() {
            return Err(bound_as_bearer());
        }
        scoped(&granted, scopes)?;
        Ok(Agent {
            agent_id: agent_id.to_owned(),
            issuer: issuer.to_owned(),
            scopes: granted,
            issued_at: UNIX_EPOCH + Duration::from_secs(iat.max(0) as u64),
            expires_at: UNIX_EPOCH + Duration::from_secs(exp.max(0) as u64),
            livemode,
            audience,
            client_id: answer["client_id"].as_str().map(str::to_owned),
            claims: answer.clone(),
        })
    }

    /// Takes a Security Event Token the service pushed (or a poll gave): verified through the
    /// JWKS; issued by this service (`iss` is the base URL); for this receiver (its `aud`
    /// holds [`Builder::set_audience`], when set); not seen before (its `jti` is not one of the
    /// last [`SEEN_SETS`] taken); of a subject of an accepted issuer (`sub_id.iss` is one of
    /// [`Builder::issuers`], when set). A revocation marks its agent revoked at once. Every
    /// refusal is `TOKEN_INVALID`.
    pub async fn handle_set(&self, set_jwt: &str) -> Result<(), Error> {
        let c = self
            .decode(sized(set_jwt, MAX_SET_BYTES, "SET")?, "secevent+jwt")
            .await?;
        if c["iss"] != self.inner.base.as_str() {
            return Err(invalid(format!(
                "a SET of {}, not of {}",
                c["iss"], self.inner.base
            )));
        }
        if let Some(want) = &self.inner.set_audience {
            let aud = &c["aud"];
            let ours = match aud {
                Value::String(a) => a == want,
                Value::Array(a) => a.iter().any(|a| a == want.as_str()),
                _ => false,
            };
            if !ours {
                return Err(invalid(format!("a SET for {aud}, not for {want}")));
            }
        }
        let (Some(jti), Some(_), Some(events)) =
            (c["jti"].as_str(), c["iat"].as_i64(), c["events"].as_object())
        else {
            return Err(invalid("a SET needs jti, iat and events"));
        };
        let revoked = if events.contains_key(SESSION_REVOKED) {
            let s = &c["sub_id"];
            let (Some("iss_sub"), Some(iss), Some(sub)) =
                (s["format"].as_str(), s["iss"].as_str(), s["sub"].as_str())
            else {
                return Err(invalid("a revocation without an iss_sub subject"));
            };
            if self.inner.issuers.as_ref().is_some_and(|i| !i.contains(iss)) {
                return Err(invalid(format!(
                    "a revocation of an agent of {iss}, not an accepted issuer"
                )));
            }
            Some(sub)
        } else {
            None
        };
        let mut s = self.inner.state.lock();
        if !s.seen_sets.insert(jti.to_owned()) {
            return Err(invalid(format!("SET {jti} was taken already (a replay)")));
        }
        s.seen_order.push_back(jti.to_owned());
        if s.seen_order.len() > SEEN_SETS {
            if let Some(oldest) = s.seen_order.pop_front() {
                s.seen_sets.remove(&oldest);
            }
        }
        if let Some(sub) = revoked {
            s.revoked.insert(sub.to_owned());
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

    use super::{Error, ResourceMetadata, Verifier};

    /// Verifies `Authorization: Bearer <token>`, or a token bound to a key as
    /// `Authorization: DPoP <token>` with its proof in the `DPoP` header (checked for the
    /// request's method and its URL: the receiver's [`AgentIdLayer::public_origin`] and the
    /// request's path; without a public origin every DPoP-bound token is refused, and a
    /// warning says so when the layer is applied), with these `scopes`, before the inner
    /// service sees the request. On success the [`super::Agent`] is in the request's extensions; otherwise the
    /// answer is 401 (403 for `INSUFFICIENT_SCOPE`, 503 for `UNAVAILABLE`, 500 for
    /// `MISCONFIGURED`: the receiver's own configuration) with `{"error": code}` and a
    /// `WWW-Authenticate` challenge (RFC 6750, RFC 9449 §7.1).
    #[derive(Clone)]
    pub struct AgentIdLayer {
        verifier: Verifier,
        scopes: Arc<Vec<String>>,
        public_origin: Option<Arc<str>>,
        metadata_url: Option<Arc<str>>,
        warned: Arc<std::sync::Once>,
    }

    impl AgentIdLayer {
        pub fn new(verifier: Verifier, scopes: &[&str]) -> Self {
            AgentIdLayer {
                verifier,
                scopes: Arc::new(scopes.iter().map(|s| s.to_string()).collect()),
                public_origin: None,
                metadata_url: None,
                warned: Arc::new(std::sync::Once::new()),
            }
        }

        /// Names the receiver's protected resource metadata (RFC 9728) in the challenge of
        /// every 401 (`WWW-Authenticate: Bearer resource_metadata="…"`); serve the document
        /// with [`ResourceMetadataService`].
        pub fn resource_metadata(mut self, metadata: &ResourceMetadata) -> Self {
            self.metadata_url = Some(metadata.url().into());
            self
        }

        /// The origin agents address (`https://api.example`): a DPoP proof's URL is this
        /// origin and the request's path, never the request's `Host`, forwarded headers or an
        /// absolute-form target (the caller chooses those, so a proof made for another
        /// receiver would pass). Without it, every DPoP-bound token is refused.
        pub fn public_origin(mut self, origin: &str) -> Self {
            self.public_origin = Some(origin.trim_end_matches('/').into());
            self
        }
    }

    /// What a DPoP-bound token meets at a receiver that named no public origin.
    const NO_ORIGIN: &str = "this receiver takes no DPoP-bound token: its public_origin is not configured";

    /// Seconds a client is asked to wait after a 503 (the service could not be reached).
    const RETRY_AFTER: &str = "5";

    /// How a refused request came: with DPoP or not, without any credentials (`bare`), and
    /// the scopes its route needs.
    struct Came<'a> {
        dpop: bool,
        bare: bool,
        scopes: &'a [String],
        metadata_url: Option<&'a str>,
        /// A DPoP-bound token, at a receiver without a public origin.
        no_origin: bool,
    }

    /// The `WWW-Authenticate` value for `e` (RFC 6750 §3.1, RFC 9449 §7.1), or none for a
    /// refusal that is not the credentials' fault (503, 500).
    fn challenge(e: &Error, came: &Came<'_>) -> Option<String> {
        if matches!(e, Error::Unavailable(_) | Error::Misconfigured(_)) {
            return None;
        }
        if came.no_origin {
            return Some(format!(
                "DPoP error=\"invalid_token\", error_description=\"{NO_ORIGIN}\", algs=\"EdDSA Ed25519 ES256\""
            ));
        }
        let with_metadata = |challenge: String| match came.metadata_url {
            Some(url) if challenge == "Bearer" => format!("Bearer resource_metadata=\"{url}\""),
            Some(url) => format!("{challenge}, resource_metadata=\"{url}\""),
            None => challenge,
        };
        if came.bare {
            return Some(with_metadata("Bearer".to_owned()));
        }
        let proof = matches!(e, Error::ProofInvalid(_) | Error::ProofReplayed(_));
        let (code, extra) = match e {
            Error::InsufficientScope(_) => (
                "insufficient_scope",
                format!(", scope=\"{}\"", came.scopes.join(" ")),
            ),
            _ if came.dpop && proof => ("invalid_dpop_proof", String::new()),
            _ => ("invalid_token", String::new()),
        };
        Some(if came.dpop || proof {
            format!("DPoP error=\"{code}\"{extra}, algs=\"EdDSA Ed25519 ES256\"")
        } else {
            with_metadata(format!("Bearer error=\"{code}\"{extra}"))
        })
    }

    impl<S> tower_layer::Layer<S> for AgentIdLayer {
        type Service = AgentId<S>;

        fn layer(&self, inner: S) -> AgentId<S> {
            if self.public_origin.is_none() {
                self.warned.call_once(|| {
                    log::warn!(
                        "AgentIdLayer has no public_origin: every DPoP-bound token is refused (set \
                         .public_origin(\"https://api.example\"), the origin agents address)"
                    )
                });
            }
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

    /// The answer to a refused token: 401, 403 for `INSUFFICIENT_SCOPE`, 503 with
    /// `Retry-After` for `UNAVAILABLE`, 500 for `MISCONFIGURED`, with `{"error": code}` and,
    /// on a 401 or 403, the challenge of a request that used DPoP (`dpop`) or a bearer token.
    pub fn refusal<B: From<String>>(e: &Error, dpop: bool) -> http::Response<B> {
        let missing = match e {
            Error::InsufficientScope(m) => m.clone(),
            _ => Vec::new(),
        };
        answer(
            e,
            &Came {
                dpop,
                bare: false,
                scopes: &missing,
                metadata_url: None,
                no_origin: false,
            },
        )
    }

    fn answer<B: From<String>>(e: &Error, came: &Came<'_>) -> http::Response<B> {
        let status = match e {
            Error::InsufficientScope(_) => 403,
            Error::Unavailable(_) => 503,
            Error::Misconfigured(_) => 500,
            _ => 401,
        };
        let mut res = http::Response::builder()
            .status(status)
            .header(http::header::CONTENT_TYPE, "application/json");
        if let Some(value) = challenge(e, came) {
            res = res.header(http::header::WWW_AUTHENTICATE, value);
        }
        if let Error::Unavailable(_) = e {
            res = res.header(http::header::RETRY_AFTER, RETRY_AFTER);
        }
        res.body(B::from(format!("{{\"error\":\"{}\"}}", e.code())))
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
                let authorization = req
                    .headers()
                    .get(http::header::AUTHORIZATION)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default();
                let scheme = |s: &str| {
                    authorization
                        .get(..s.len())
                        .filter(|p| p.eq_ignore_ascii_case(s))
                        .map(|_| authorization[s.len()..].trim())
                        .filter(|t| !t.is_empty())
                        .map(str::to_owned)
                };
                let (bearer, dpop) = (scheme("bearer "), scheme("dpop "));
                let is_dpop = authorization
                    .get(..5)
                    .is_some_and(|p| p.eq_ignore_ascii_case("dpop "));
                let scopes: Vec<&str> = layer.scopes.iter().map(String::as_str).collect();
                let bare = authorization.trim().is_empty();
                let verified = if is_dpop {
                    let proofs: Vec<&str> = req
                        .headers()
                        .get_all("dpop")
                        .iter()
                        .filter_map(|v| v.to_str().ok())
                        .collect();
                    let url = layer
                        .public_origin
                        .as_deref()
                        .map(|o| format!("{o}{}", req.uri().path()));
                    match (dpop, proofs.as_slice(), url) {
                        (None, _, _) => Err(Error::Invalid("no token".into())),
                        (Some(_), _, None) => Err(Error::Invalid(NO_ORIGIN.into())),
                        (Some(_), [_, _, ..], _) => {
                            Err(Error::ProofInvalid("more than one DPoP header".into()))
                        }
                        (Some(t), proofs, Some(url)) => {
                            let method = req.method().as_str().to_owned();
                            layer
                                .verifier
                                .verify_dpop(&t, proofs.first().copied(), &method, &url, &scopes)
                                .await
                        }
                    }
                } else {
                    match bearer {
                        Some(t) => layer.verifier.verify_with_scopes(&t, &scopes).await,
                        None => Err(Error::Invalid("no bearer token".into())),
                    }
                };
                match verified {
                    Ok(agent) => {
                        req.extensions_mut().insert(agent);
                        inner.call(req).await
                    }
                    Err(e) => Ok(answer(
                        &e,
                        &Came {
                            dpop: is_dpop,
                            bare,
                            scopes: &layer.scopes,
                            metadata_url: layer.metadata_url.as_deref(),
                            no_origin: matches!(&e, Error::Invalid(m) if m == NO_ORIGIN),
                        },
                    )),
                }
            })
        }
    }

    /// A tower service answering every request with a receiver's protected resource
    /// metadata (RFC 9728): mount it at [`ResourceMetadata::path`]
    /// (`Router::new().route_service(metadata.path(), ResourceMetadataService::<Body>::new(&metadata))`
    /// in axum), its answers' body of type `R`.
    pub struct ResourceMetadataService<R> {
        body: Arc<str>,
        answers: std::marker::PhantomData<fn() -> R>,
    }

    impl<R> Clone for ResourceMetadataService<R> {
        fn clone(&self) -> Self {
            ResourceMetadataService {
                body: self.body.clone(),
                answers: std::marker::PhantomData,
            }
        }
    }

    impl<R> ResourceMetadataService<R> {
        pub fn new(metadata: &ResourceMetadata) -> Self {
            ResourceMetadataService {
                body: metadata.document().to_string().into(),
                answers: std::marker::PhantomData,
            }
        }
    }

    impl<B, R: From<String>> tower_service::Service<http::Request<B>> for ResourceMetadataService<R> {
        type Response = http::Response<R>;
        type Error = std::convert::Infallible;
        type Future = std::future::Ready<Result<Self::Response, Self::Error>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: http::Request<B>) -> Self::Future {
            std::future::ready(Ok(http::Response::builder()
                .header(http::header::CONTENT_TYPE, "application/json")
                .header(http::header::CACHE_CONTROL, "public, max-age=3600")
                .header(http::header::ACCESS_CONTROL_ALLOW_ORIGIN, "*")
                .body(R::from(self.body.to_string()))
                .expect("a valid response")))
        }
    }
}

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
//! request, its answer included, takes at most [`Builder::timeout`] (5 s). Every fetch is
//! `https://` to a host whose every address is globally reachable, connected to at the
//! addresses checked ([`Builder::allow_local`] allows plain http and local addresses, for
//! development). Keys are read again
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
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ed25519_dalek::VerifyingKey;
use parking_lot::Mutex;
use serde_json::Value;

mod builder;
mod delegation;
mod dpop;
mod error;
mod keys;
mod lists;
mod online;
mod reach;
mod requests;
mod resource;
mod sets;
mod tokens;
#[cfg(feature = "tower")]
pub mod tower;
mod transport;

pub use builder::Builder;
use builder::RefusalHook;
pub use delegation::{Actor, Subject, MAX_CHAIN};
pub use dpop::{MAX_PROOF_BYTES, SEEN_PROOFS};
pub use error::{printable, Error};
use lists::HeldList;
pub use requests::SignedRequest;
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
/// How many signature directories are held (past that, the one held longest goes): a
/// verifier without `issuers` takes any issuer's, which a caller names.
pub const MAX_DIRECTORIES: usize = 1_000;
/// The most keys read of a signature directory (its first; as many as the service lists in
/// one): the Python and TypeScript libraries read as many.
pub const MAX_DIRECTORY_KEYS: usize = 1_000;
/// The most an inflated status list may hold.
const MAX_LIST_BYTES: usize = 16 << 20;
/// The counter of verifications, by `outcome` (see the crate's documentation).
pub const VERIFICATIONS: &str = "agentid_verifier_verifications_total";
/// The counter of fetches, by `document` and `result` (see the crate's documentation).
pub const FETCHES: &str = "agentid_verifier_fetches_total";

/// A verified agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Agent {
    /// The agent: the one acting, for a delegated token.
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
    /// The person a delegated token acts for; None for a token that acts for nobody.
    pub subject: Option<Subject>,
    /// A delegated token's chain of agents, the one acting first. Offline, only the first
    /// one's revocation is seen (its status list, or a pushed event for any of them);
    /// [`Verifier::verify_online`] sees every link.
    pub actors: Vec<Actor>,
}

impl Agent {
    /// Whether the agent acts for a person.
    pub fn delegated(&self) -> bool {
        self.subject.is_some()
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
    /// (provider, person) -> when the organization revoked them (Unix s), from pushed events.
    revoked_subjects: HashMap<(String, String), i64>,
    /// The latest revocation forgotten for want of room (Unix s): every person's delegated
    /// token from then or before is refused.
    subjects_floor: i64,
    /// Signature directories held, by URL.
    directories: requests::Directories,
    /// The nonces of signed requests taken (by `keyid`), each kept until its signature
    /// expires: the memory DPoP proofs have, keyed by expiry instead of `iat`.
    nonces: dpop::Replays,
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
    /// The TLS of every fetch (its roots), and how long a fetch may take in all.
    tls: Arc<rustls::ClientConfig>,
    timeout: Duration,
    base: String,
    issuers: Option<HashSet<String>>,
    leeway: i64,
    list_grace: Duration,
    fail_open: bool,
    allow_test: bool,
    /// Plain http and addresses that are not globally reachable allowed ([`Builder::allow_local`]).
    allow_local: bool,
    kid_refetch: Duration,
    set_audience: Option<String>,
    dpop_max_skew: i64,
    on_refusal: Option<RefusalHook>,
    audience: Option<Vec<String>>,
    state: Mutex<State>,
    /// Held while fetching the keys, and the lists: concurrent verifications share one
    /// fetch (two locks, as reading a list may need the keys). Each holds when the last fetch
    /// failed, and why (for a list, which).
    fetching_keys: tokio::sync::Mutex<Option<(Instant, Error)>>,
    fetching_lists: tokio::sync::Mutex<Option<(Instant, String, Error)>>,
}

/// Verifies tokens of one agentid service. Cheap to clone.
#[derive(Clone)]
pub struct Verifier {
    inner: Arc<Inner>,
}

/// Now, in whole seconds since the Unix epoch (rounded down).
fn now_secs() -> i64 {
    now_millis().div_euclid(1000)
}

/// Now, in milliseconds since the Unix epoch.
fn now_millis() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Whether a time of `exp` (Unix seconds) is past, `leeway` seconds allowed: from the instant
/// `exp + leeway` on, to the millisecond (without leeway, the very second of `exp` is past), as
/// the Python and TypeScript libraries judge it (`exp <= now - leeway`, now fractional).
fn expired(exp: i64, leeway: i64) -> bool {
    exp.saturating_add(leeway).saturating_mul(1000) <= now_millis()
}

impl Verifier {
    /// The service's URL, without a trailing slash: the `iss` of its access tokens.
    pub fn base_url(&self) -> &str {
        &self.inner.base
    }

    /// The receiver's [`Builder::audience`], if it named one.
    pub fn audience(&self) -> Option<&[String]> {
        self.inner.audience.as_deref()
    }
}

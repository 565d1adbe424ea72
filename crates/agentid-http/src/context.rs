//! What every handler can reach: the application's state, and what the gate learned about
//! the request and left in its extensions.

use std::sync::Arc;
use std::time::Instant;

use actix_web::{HttpMessage, HttpRequest};

use agentid_engine::{Caller, Engine};

/// What every handler can reach.
pub struct AppState {
    pub engine: Arc<Engine>,
    /// `{base_url}` of the spec, without a trailing slash.
    pub public_url: String,
    /// Peers whose forwarding headers say who the client is (see `http::client`).
    pub trusted_proxies: Vec<ipnet::IpNet>,
    /// Gateways whose forwarded headers name the request a forward-auth call checks.
    pub forward_auth_peers: Vec<ipnet::IpNet>,
    /// A stop signal came: `/health` answers 503 `draining`, and every answer closes its
    /// connection, until the instance stops accepting.
    pub draining: Arc<std::sync::atomic::AtomicBool>,
}

impl AppState {
    pub(crate) fn is_draining(&self) -> bool {
        self.draining.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl AppState {
    pub(crate) fn verify_url(&self, token: &str) -> String {
        format!("{}/v1/verify/{token}", self.public_url)
    }

    pub(crate) fn public_key_url(&self) -> String {
        format!("{}/.well-known/public-key.pem", self.public_url)
    }
}

/// What the gate learned about the caller's credentials.
#[derive(Debug, Clone)]
pub(crate) enum Auth {
    /// No `Authorization` header.
    Anonymous,
    Key(Arc<Caller>),
    /// A key that names no usable key (unknown, disabled, malformed).
    Rejected,
    /// An `Authorization` header that is not `Bearer <key>` (a bare key, another scheme).
    NotBearer,
    /// The key could not be checked (store unreachable).
    Unverifiable,
}

/// Per-request facts the gate puts into the request extensions.
#[derive(Debug, Clone)]
pub(crate) struct RequestCtx {
    pub(crate) received: Instant,
    pub(crate) auth: Auth,
    /// The client's address (behind trusted proxies, the one they name).
    pub(crate) ip: std::net::IpAddr,
}

/// Set on a response by a handler that charged a rate-limit bucket itself (the token
/// endpoint charges the client's organization once it knows it): its headers describe that
/// bucket.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Charged(pub(crate) agentid_engine::ratelimit::Decision);

/// Set on a response whose error status comes with its own documented body (health).
#[derive(Debug, Clone, Copy)]
pub(crate) struct KeepBody;

pub(crate) fn auth(req: &HttpRequest) -> Auth {
    req.extensions()
        .get::<RequestCtx>()
        .map_or(Auth::Anonymous, |c| c.auth.clone())
}

/// The client's address, as the gate saw it.
pub(crate) fn client_ip(req: &HttpRequest) -> std::net::IpAddr {
    req.extensions()
        .get::<RequestCtx>()
        .map_or(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), |c| c.ip)
}

/// When the request arrived (as the gate saw it).
pub(crate) fn received(req: &HttpRequest) -> Instant {
    req.extensions()
        .get::<RequestCtx>()
        .map_or_else(Instant::now, |c| c.received)
}

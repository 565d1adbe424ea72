//! Extractors for the caller's identity, from what the gate resolved.

use std::future::{ready, Ready};
use std::sync::Arc;

use actix_web::dev::Payload;
use actix_web::{FromRequest, HttpRequest};

use super::context::{auth, Auth};
use super::error::{ApiError, ErrorCode};
use agentid_core::domain::{ApiKeyKind, KeyMode};
use agentid_engine::Caller;

/// What a key sent without its scheme (or with another one) is told.
pub(crate) const NOT_BEARER: &str =
    "the Authorization header must be `Bearer <key>`: use Authorization: Bearer <key>";

/// A caller holding a secret key (`sk_live_`, `sk_test_`): the issuer side of the API.
pub(crate) struct Issuer(pub Arc<Caller>);

impl FromRequest for Issuer {
    type Error = ApiError;
    type Future = Ready<Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        ready(issuer(req))
    }
}

/// A caller holding a live secret key (`sk_live_`): what changes who may issue under a name
/// (claiming, proving, releasing one) takes one; a test key only reads names.
pub(crate) struct LiveIssuer(pub Arc<Caller>);

impl FromRequest for LiveIssuer {
    type Error = ApiError;
    type Future = Ready<Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        ready(issuer(req).and_then(|Issuer(c)| match c.mode {
            KeyMode::Live => Ok(LiveIssuer(c)),
            KeyMode::Test => Err(ApiError::new(
                ErrorCode::Forbidden,
                "issuer domains are claimed, proved and released with a live secret key (sk_live_): a test \
                 key only reads them (a name is its organization's in both modes)",
            )),
        }))
    }
}

fn issuer(req: &HttpRequest) -> Result<Issuer, ApiError> {
    match auth(req) {
        Auth::Key(c) if c.kind == ApiKeyKind::Secret => Ok(Issuer(c)),
        Auth::Key(_) => Err(ApiError::new(
            ErrorCode::Forbidden,
            "publishable keys (pk_) only identify receivers on GET /v1/verify; use a secret key (sk_)",
        )),
        Auth::Anonymous => Err(ApiError::unauthorized(
            "missing API key: send Authorization: Bearer <secret key>",
        )),
        Auth::Rejected => Err(ApiError::unauthorized("invalid, unknown or disabled API key")),
        Auth::NotBearer => Err(ApiError::unauthorized(NOT_BEARER)),
        Auth::Unverifiable => Err(ApiError::new(
            ErrorCode::ServiceUnavailable,
            "the API key cannot be checked right now; retry shortly",
        )),
    }
}

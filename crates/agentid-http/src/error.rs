//! The one place where failures become HTTP: each `ErrorCode` has its status, and the
//! standard error body (`error.code`, `message`, `request_id`, `docs_url`) is written by the
//! gate middleware for every error response, whatever produced it.

use actix_web::http::header::{self, HeaderName, HeaderValue};
use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError};

use agentid_core::domain::ValidationError;
use agentid_engine::StoreError;
use agentid_engine::{AuditError, EngineError, VerifyError};

/// Declares every error code once: its variant, its `error.code`, its status and its line on
/// the error documentation page.
macro_rules! error_codes {
    ($($(#[$doc:meta])* $name:ident = ($code:literal, $status:ident, $describe:literal),)*) => {
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum ErrorCode {
            $($(#[$doc])* $name,)*
        }

        impl ErrorCode {
            pub const ALL: [ErrorCode; [$(ErrorCode::$name),*].len()] = [$(ErrorCode::$name),*];

            pub fn as_str(self) -> &'static str {
                match self {
                    $(ErrorCode::$name => $code,)*
                }
            }

            pub(crate) fn status(self) -> StatusCode {
                match self {
                    $(ErrorCode::$name => StatusCode::$status,)*
                }
            }

            /// One line for the error documentation page.
            pub fn describe(self) -> &'static str {
                match self {
                    $(ErrorCode::$name => $describe,)*
                }
            }
        }
    };
}

error_codes! {
    InvalidRequest = ("INVALID_REQUEST", BAD_REQUEST, "The body is not valid JSON, is not a JSON object, or the request is otherwise malformed (400). A wrong Content-Type answers 415 with this code."),
    ValidationError = ("VALIDATION_ERROR", BAD_REQUEST, "A field breaks a rule; the message names the field (400). Also a log `limit` outside 1..=200 or an unknown `result` filter."),
    ExpiryTooLong = ("EXPIRY_TOO_LONG", BAD_REQUEST, "`expiry_seconds` is above the maximum token lifetime of the organization's plan (400)."),
    InvalidCursor = ("INVALID_CURSOR", BAD_REQUEST, "The `cursor` was not issued by this service for this query (400)."),
    Unauthorized = ("UNAUTHORIZED", UNAUTHORIZED, "The API key is missing, malformed, unknown or disabled, or a poll request's `poll_token` is not its stream's (401, with `WWW-Authenticate: Bearer`)."),
    Forbidden = ("FORBIDDEN", FORBIDDEN, "A publishable key (`pk_`) was used on an endpoint that needs a secret key (`sk_`), or a test key (`sk_test_`) on one that needs a live one: claiming, proving or releasing a domain, the identity-provider endpoints, or revoking a person (403)."),
    AgentNotFound = ("AGENT_NOT_FOUND", NOT_FOUND, "No agent with this id exists for the calling organization and mode (404)."),
    NotFound = ("NOT_FOUND", NOT_FOUND, "No such route, status list, stream, stream subject or identity provider of the calling organization (404)."),
    MethodNotAllowed = ("METHOD_NOT_ALLOWED", METHOD_NOT_ALLOWED, "The route exists but not for this HTTP method (405)."),
    NotAcceptable = ("NOT_ACCEPTABLE", NOT_ACCEPTABLE, "The `Accept` header allows no form the resource has: a status list is served only as `application/statuslist+jwt` (406)."),
    AgentRevoked = ("AGENT_REVOKED", CONFLICT, "The agent is revoked; revocation is permanent, so no new token can be issued. Register a new agent instead (409)."),
    DomainNotFound = ("DOMAIN_NOT_FOUND", NOT_FOUND, "The organization has neither claimed nor holds this domain (404). Claim it with `POST /v1/domains`."),
    DomainNotVerified = ("DOMAIN_NOT_VERIFIED", UNPROCESSABLE_ENTITY, "The domain's proof was not found, or cannot take the name: the message says what each lookup (the TXT record, the HTTPS file) found (422)."),
    IssuerDomainNotVerified = ("ISSUER_DOMAIN_NOT_VERIFIED", FORBIDDEN, "The organization does not hold the `issuer_domain` (nor a name above it by DNS), or another organization does: claim it with `POST /v1/domains` and prove it with `POST /v1/domains/{domain}/verify` (403)."),
    TooManyDomains = ("TOO_MANY_DOMAINS", CONFLICT, "The organization has as many pending domain claims as it may (100), or holds and claims as many names as it may (1000 together): verify or release some first (409)."),
    TokenInvalid = ("TOKEN_INVALID", UNAUTHORIZED, "Forward auth: the agent's token is malformed, forged, unknown, or not for this receiver (its audience or issuer), or a bound token came without its proof (401, with `WWW-Authenticate`)."),
    TokenExpired = ("TOKEN_EXPIRED", UNAUTHORIZED, "Forward auth: the agent's token has expired (401, with `WWW-Authenticate`)."),
    TokenRevoked = ("TOKEN_REVOKED", UNAUTHORIZED, "Forward auth: the agent is revoked (401, with `WWW-Authenticate`)."),
    ProofInvalid = ("PROOF_INVALID", UNAUTHORIZED, "Forward auth: the DPoP proof is missing, malformed, not made with the token's key, or not for this request's method and URL (401, with `WWW-Authenticate: DPoP`)."),
    ProofReplayed = ("PROOF_REPLAYED", UNAUTHORIZED, "Forward auth: the DPoP proof was used before (401, with `WWW-Authenticate: DPoP`)."),
    InsufficientScope = ("INSUFFICIENT_SCOPE", FORBIDDEN, "Forward auth: the token does not grant every scope the gateway requires (403, with `WWW-Authenticate` naming them)."),
    PayloadTooLarge = ("PAYLOAD_TOO_LARGE", PAYLOAD_TOO_LARGE, "The request body is over its route's limit: 64 KiB, 128 KiB on POST /v1/verify and POST /v1/verify/request (413)."),
    /// A wrong content type: an INVALID_REQUEST with status 415.
    UnsupportedMediaType = ("INVALID_REQUEST", UNSUPPORTED_MEDIA_TYPE, "The body must be sent with `Content-Type: application/json` (415, code INVALID_REQUEST)."),
    RateLimited = ("RATE_LIMITED", TOO_MANY_REQUESTS, "The rate limit of this key's organization or of this client address is used up, or the organization's unpaged agent lists being sent hold as many bytes of pages as they may (16 MiB); retry after `Retry-After` seconds (429)."),
    InternalError = ("INTERNAL_ERROR", INTERNAL_SERVER_ERROR, "Something unexpected failed; the request id identifies it in the service's logs (500)."),
    AuditUnavailable = ("AUDIT_UNAVAILABLE", SERVICE_UNAVAILABLE, "The audit log cannot record right now (or the store cannot give the agent a token names), so no verification is answered (fail closed). Retry shortly (503)."),
    ServiceUnavailable = ("SERVICE_UNAVAILABLE", SERVICE_UNAVAILABLE, "The database cannot be reached right now. Retry shortly (503)."),
}

impl ErrorCode {
    /// The message of an error the service answers without more to say (an error actix
    /// produced, or a routing error a handler answers itself).
    pub(crate) fn default_message(self) -> &'static str {
        match self {
            ErrorCode::NotFound => "no such route",
            ErrorCode::MethodNotAllowed => "this route does not accept that method",
            ErrorCode::PayloadTooLarge => "the request body is over the route's limit",
            ErrorCode::UnsupportedMediaType => "unsupported content type",
            ErrorCode::InternalError => "an unexpected error occurred",
            _ => "the request could not be processed",
        }
    }
}

/// An API error. The gate middleware turns it into the standard body.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub(crate) code: ErrorCode,
    pub(crate) message: String,
    pub(crate) headers: Vec<(HeaderName, HeaderValue)>,
}

/// The standard error body.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub(crate) struct ErrorBody {
    pub(crate) error: ErrorDetail,
}

#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub(crate) struct ErrorDetail {
    /// Machine-readable code, e.g. AGENT_NOT_FOUND.
    pub(crate) code: String,
    /// Human-readable text.
    pub(crate) message: String,
    /// The request's id, also in the X-Request-Id header.
    #[schema(pattern = "^req_[0-9a-z]{26}$")]
    pub(crate) request_id: String,
    /// A page on the error: {base_url}/docs/errors#CODE.
    pub(crate) docs_url: String,
}

/// Marker left in the response extensions for the gate to render.
#[derive(Debug, Clone)]
pub(crate) struct ErrorInfo {
    pub(crate) code: &'static str,
    pub(crate) message: String,
}

impl ApiError {
    pub(crate) fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ApiError {
            code,
            message: message.into(),
            headers: Vec::new(),
        }
    }

    pub(crate) fn with_header(mut self, name: HeaderName, value: HeaderValue) -> Self {
        self.headers.push((name, value));
        self
    }

    pub(crate) fn unauthorized(message: impl Into<String>) -> Self {
        ApiError::new(ErrorCode::Unauthorized, message).with_header(
            actix_web::http::header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Bearer"),
        )
    }

    pub(crate) fn internal(err: &dyn std::error::Error) -> Self {
        tracing::error!(error = %err, "internal error");
        ApiError::new(ErrorCode::InternalError, "an unexpected error occurred")
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code.as_str(), self.message)
    }
}

/// Seconds a caller is asked to wait after a 503 that says to retry shortly.
pub(crate) const RETRY_AFTER_SECONDS: &str = "1";

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        self.code.status()
    }

    fn error_response(&self) -> HttpResponse {
        let mut res = HttpResponse::build(self.code.status());
        // Every 503 that says "retry shortly" says when: verify's receivers, gateways and
        // stock HTTP clients retry on it.
        if self.code == ErrorCode::AuditUnavailable {
            res.insert_header((header::RETRY_AFTER, RETRY_AFTER_SECONDS));
        }
        for (name, value) in &self.headers {
            res.insert_header((name.clone(), value.clone()));
        }
        let mut res = res.finish();
        res.extensions_mut().insert(ErrorInfo {
            code: self.code.as_str(),
            message: self.message.clone(),
        });
        res
    }
}

impl From<ValidationError> for ApiError {
    fn from(e: ValidationError) -> Self {
        ApiError::new(ErrorCode::ValidationError, e.to_string())
    }
}

/// An organization that may not issue under `domain` (`elsewhere`: another one holds it).
fn not_held(domain: &str, elsewhere: bool) -> ApiError {
    let whose = if elsewhere {
        "another organization holds it"
    } else {
        "this organization has not verified it, nor a name above it by DNS"
    };
    ApiError::new(
        ErrorCode::IssuerDomainNotVerified,
        format!(
            "issuer_domain {domain}: {whose}. Claim it with POST /v1/domains {{\"domain\":\"{domain}\"}}, \
             publish the challenge it answers (a TXT record or an HTTPS file), then POST \
             /v1/domains/{domain}/verify"
        ),
    )
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        if matches!(e, StoreError::Busy) {
            tracing::warn!(error = %e, "store busy");
            return ApiError::new(
                ErrorCode::ServiceUnavailable,
                "every database connection is in use; retry shortly",
            );
        }
        if e.is_unavailable() {
            tracing::warn!(error = %e, "store unavailable");
            ApiError::new(
                ErrorCode::ServiceUnavailable,
                "the database is unavailable; retry shortly",
            )
        } else {
            ApiError::internal(&e)
        }
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> Self {
        match e {
            EngineError::AgentNotFound => ApiError::new(ErrorCode::AgentNotFound, "no agent with this id"),
            EngineError::AgentRevoked => ApiError::new(
                ErrorCode::AgentRevoked,
                "the agent is revoked; register a new agent instead",
            ),
            EngineError::ExpiryTooLong { max } => ApiError::new(
                ErrorCode::ExpiryTooLong,
                format!("expiry_seconds: the plan allows at most {max} seconds"),
            ),
            EngineError::TokenTooLong { len, max } => ApiError::new(
                ErrorCode::ValidationError,
                format!(
                    "scopes: the agent's token would be {len} bytes, over the {max}-byte limit of a \
                     token (it travels in the verify URL); use fewer or shorter scopes"
                ),
            ),
            EngineError::NotHeld { domain, elsewhere } => not_held(&domain, elsewhere),
            e @ EngineError::TooManyListings { .. } => ApiError::new(ErrorCode::RateLimited, e.to_string())
                .with_header(header::RETRY_AFTER, HeaderValue::from_static(RETRY_AFTER_SECONDS)),
            e @ EngineError::BindingContended => ApiError::new(ErrorCode::ServiceUnavailable, e.to_string()),
            EngineError::Store(s) => s.into(),
        }
    }
}

impl From<AuditError> for ApiError {
    fn from(e: AuditError) -> Self {
        ApiError::new(
            ErrorCode::AuditUnavailable,
            format!("the verification could not be recorded ({e}); retry shortly"),
        )
    }
}

/// Verify has one 503 code for receivers to retry on: a store that cannot be reached cannot
/// record the verification either, whichever part of it failed first.
impl From<VerifyError> for ApiError {
    fn from(e: VerifyError) -> Self {
        match e {
            VerifyError::Unrecorded(a) => a.into(),
            VerifyError::AgentUnreadable(s) if s.is_transient() => {
                tracing::warn!(error = %s, "verify: the token's agent could not be read");
                ApiError::new(
                    ErrorCode::AuditUnavailable,
                    "the store cannot be reached, so the verification can be neither checked nor recorded; retry shortly",
                )
            }
            VerifyError::AgentUnreadable(s) => ApiError::internal(&s),
        }
    }
}

/// The code for an error response that did not come from an `ApiError` (actix itself).
pub(crate) fn code_for_status(status: StatusCode) -> ErrorCode {
    match status.as_u16() {
        400 => ErrorCode::InvalidRequest,
        401 => ErrorCode::Unauthorized,
        403 => ErrorCode::Forbidden,
        404 => ErrorCode::NotFound,
        405 => ErrorCode::MethodNotAllowed,
        406 => ErrorCode::NotAcceptable,
        413 => ErrorCode::PayloadTooLarge,
        415 => ErrorCode::UnsupportedMediaType,
        429 => ErrorCode::RateLimited,
        503 => ErrorCode::ServiceUnavailable,
        s if s < 500 => ErrorCode::InvalidRequest,
        _ => ErrorCode::InternalError,
    }
}

/// Text for HTML: escaped, with `backticked` spans as `<code>`.
fn inline_code(text: &str) -> String {
    let escaped = text
        .replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;");
    let mut out = String::with_capacity(escaped.len() + 16);
    for (i, part) in escaped.split('`').enumerate() {
        if i % 2 == 1 {
            out.push_str("<code>");
            out.push_str(part);
            out.push_str("</code>");
        } else {
            out.push_str(part);
        }
    }
    out
}

/// The HTML page `error.docs_url` points into (`/docs/errors#CODE`).
pub(crate) fn docs_page() -> String {
    let mut html = String::from(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>agentid error codes</title></head>\
         <body><h1>agentid error codes</h1><p>Every error answer has the body \
         <code>{\"error\":{\"code\",\"message\",\"request_id\",\"docs_url\"}}</code>. \
         Token failures of <code>GET /v1/verify/{token}</code> and <code>POST /v1/verify</code> are not \
         errors: they answer 200 with <code>valid:false</code> and one of TOKEN_INVALID, TOKEN_REVOKED, \
         TOKEN_EXPIRED, PROOF_INVALID, PROOF_REPLAYED.</p>",
    );
    let mut seen = Vec::new();
    for code in ErrorCode::ALL {
        let name = code.as_str();
        let anchor = if seen.contains(&name) {
            String::new()
        } else {
            format!(" id=\"{name}\"")
        };
        seen.push(name);
        html.push_str(&format!(
            "<h2{anchor}>{name} <small>({})</small></h2><p>{}</p>",
            code.status().as_u16(),
            inline_code(code.describe())
        ));
    }
    for (name, text) in [
        ("TOKEN_INVALID", "Verify answer: the token is malformed, over 4 KiB, not EdDSA, signed by an unknown key, has a bad signature, or names no agent."),
        ("TOKEN_REVOKED", "Verify answer: the token's agent is revoked."),
        ("TOKEN_EXPIRED", "Verify answer: the token's exp has passed."),
        ("PROOF_INVALID", "Verify answer (POST /v1/verify): the token is bound to a key and no DPoP proof came with it, or a proof came with a bearer token, or the proof does not check: its signature, typ, alg, htm, htu or ath does not match, its key is not the token's (cnf.jkt), or its iat is too far from now."),
        ("PROOF_REPLAYED", "Verify answer (POST /v1/verify): the DPoP proof's jti was already used with its key."),
    ] {
        html.push_str(&format!("<h2 id=\"{name}\">{name}</h2><p>{text}</p>"));
    }
    html.push_str("</body></html>");
    html
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unexpected_errors_are_500_without_detail() {
        let e: ApiError = StoreError::Corrupt("secret table detail".into()).into();
        assert_eq!(e.code, ErrorCode::InternalError);
        assert_eq!(e.code.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert!(!e.message.contains("secret"));
        let res = e.error_response();
        assert_eq!(res.status(), 500);
        assert_eq!(
            res.extensions().get::<ErrorInfo>().unwrap().code,
            "INTERNAL_ERROR"
        );
    }

    /// The page is HTML: no Markdown backticks show, markup in a description is escaped.
    #[test]
    fn the_error_page_renders_code_spans_as_html() {
        let page = docs_page();
        assert!(!page.contains('`'), "a backtick shows literally");
        assert!(page.contains("<code>Content-Type: application/json</code>"));
        assert_eq!(inline_code("a `<b>` & c"), "a <code>&lt;b&gt;</code> &amp; c");
    }

    #[test]
    fn every_code_has_a_status_and_a_description() {
        for code in ErrorCode::ALL {
            assert!(code.status().is_client_error() || code.status().is_server_error());
            assert!(!code.describe().is_empty());
        }
    }
}

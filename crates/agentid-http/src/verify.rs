//! `GET /v1/verify/{token}` and `POST /v1/verify` (a token with its DPoP proof): the
//! receivers' endpoints. Token and proof failures are answers (200, `valid:false`), not
//! errors; only a bad request or an unrecordable verification is an error.

use actix_web::http::{header, Method};
use actix_web::web::Bytes;
use actix_web::{web, HttpRequest, HttpResponse};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::context::AppState;
use super::context::{self, Auth};
use super::error::{ApiError, ErrorBody, ErrorCode};
use super::input::json_body;
use super::schema::Timestamp;
use agentid_core::domain::{is_http_method, KeyMode, Millis, ValidationError, VerifyResult};
use agentid_engine::{Presentation, Presented, ProofError, ValidToken, Verification};

/// A valid token.
// `verified_at` stays the last member: the rest is rendered once per cached token
// (`VerifiedToken::valid_answer`) and each answer appends its own `verified_at` (serializing
// all of it on every call was about a third of the handler's time under hot load, by perf);
// a test holds the two ways to one JSON.
#[derive(Serialize, ToSchema)]
pub(crate) struct ValidBody<'a> {
    /// Always true.
    valid: bool,
    agent_id: &'a str,
    name: &'a str,
    /// The name the agent's organization proved (an agent token's iss, an access token's
    /// issuer_domain).
    issuer: &'a str,
    scopes: Vec<&'a str>,
    description: &'a str,
    #[schema(value_type = Timestamp)]
    issued_at: Millis,
    #[schema(value_type = Timestamp)]
    expires_at: Millis,
    /// False for a token issued in test mode (with an sk_test_ key).
    livemode: bool,
    /// An access token's audience (the resources it is for): a string, or an array of
    /// several. Absent for an agent token, which names none.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>, nullable = false)]
    aud: Option<&'a agentid_core::token::Audience>,
    /// An access token's OAuth client: the agent itself.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    client_id: Option<&'a str>,
    /// An access token's scopes as it carries them, space-separated.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    scope: Option<&'a str>,
    /// Present when the token is bound to a key (DPoP): a receiver then accepts it only with
    /// a proof made with that key (`POST /v1/verify`).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    cnf: Option<Cnf<'a>>,
    /// A delegated token only: the person the agent acts for, as the identity provider in
    /// sub_id names them.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    sub: Option<&'a str>,
    /// A delegated token only: the person (RFC 9493 iss_sub: the provider that vouched for
    /// them, and its sub).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>, nullable = false)]
    sub_id: Option<&'a agentid_core::token::SubjectId>,
    /// A delegated token only: the chain of agents (RFC 8693 §4.1), the one acting
    /// outermost (`sub` its id, `issuer_domain` its organization's name), the one that handed
    /// it the task in its `act`. Every agent of it is checked for revocation.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>, nullable = false)]
    act: Option<&'a agentid_core::token::Actor>,
    #[schema(value_type = Timestamp)]
    verified_at: Millis,
}

/// The key a token is bound to (RFC 7800).
#[derive(Serialize, ToSchema)]
pub(crate) struct Cnf<'a> {
    /// The RFC 7638 SHA-256 thumbprint of the key, base64url.
    #[schema(pattern = "^[A-Za-z0-9_-]{43}$")]
    pub(crate) jkt: &'a str,
}

/// A token that does not pass.
#[derive(Serialize, ToSchema)]
pub(crate) struct InvalidBody {
    /// Always false.
    valid: bool,
    error: TokenError,
}

#[derive(Serialize, ToSchema, Clone, Copy)]
#[allow(clippy::enum_variant_names)]
pub(crate) enum TokenError {
    #[serde(rename = "TOKEN_INVALID")]
    TokenInvalid,
    #[serde(rename = "TOKEN_REVOKED")]
    TokenRevoked,
    #[serde(rename = "TOKEN_EXPIRED")]
    TokenExpired,
    /// `POST /v1/verify` only: the proof is missing for a bound token or present for a bearer
    /// one, or it does not match the request, the token, the token's key or the time.
    #[serde(rename = "PROOF_INVALID")]
    ProofInvalid,
    /// `POST /v1/verify` only: the proof's `jti` was already used with its key.
    #[serde(rename = "PROOF_REPLAYED")]
    ProofReplayed,
}

/// The verification result: the valid form or the invalid form. Built to be serialized at
/// once, never kept, so the size of its valid form costs nothing.
#[derive(Serialize, ToSchema)]
#[serde(untagged)]
#[allow(clippy::large_enum_variant)]
pub(crate) enum VerifyAnswer<'a> {
    /// Rendered in two parts (`valid_json`); this is its schema.
    #[cfg_attr(not(test), allow(dead_code))]
    Valid(ValidBody<'a>),
    Invalid(InvalidBody),
}

#[utoipa::path(
    get, path = "/v1/verify/{token}", tag = "verify",
    params(("token" = String, Path, description = "The token to verify (at most 4096 bytes)")),
    responses(
        (status = 200, description = "The verification result; token failures are answers, not errors. Recorded in the audit log before it is sent.", body = VerifyAnswer),
        (status = 401, description = "UNAUTHORIZED: an Authorization header with an invalid key (verify needs none)", body = ErrorBody),
        (status = 503, description = "AUDIT_UNAVAILABLE: the store cannot record this verification (or give the agent it names), so it is not answered", body = ErrorBody),
    ),
)]
pub async fn verify(state: web::Data<AppState>, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    // Mounted as the default service of the `/v1/verify` scope: a static prefix match, where
    // the `{token}` pattern's regex over a ~330-byte path cost ~2 µs a call (the largest
    // single item of a hot verify in user space, by perf). The rest of the path must be one
    // non-empty segment; percent-encoded unreserved characters (all a token may hold) were
    // already decoded by the router.
    let routing_error = |code: ErrorCode| ApiError::new(code, code.default_message());
    let token = match req.match_info().unprocessed().strip_prefix('/') {
        Some(t) if !t.is_empty() && !t.contains('/') => t,
        _ => return Err(routing_error(ErrorCode::NotFound)),
    };
    if req.method() != Method::GET {
        return Err(routing_error(ErrorCode::MethodNotAllowed)
            .with_header(header::ALLOW, header::HeaderValue::from_static("GET")));
    }
    check_key(&req)?;
    let v = state
        .engine
        .verify()
        .verify(token, context::received(&req), fixed_part)
        .await?;
    Ok(answer(&v))
}

/// `POST /v1/verify` body. Unknown fields are refused.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct VerifyRequest {
    /// The token, as the agent sent it (`Authorization: DPoP <token>` or `Bearer <token>`);
    /// one over 4096 bytes is answered TOKEN_INVALID, unparsed.
    token: String,
    /// The `DPoP` header the agent sent with it: required for a token bound to a key, refused
    /// with a bearer token. At most 4096 bytes are read.
    #[serde(default)]
    dpop: Option<String>,
    /// The method of the request the agent made to the receiver (required with `dpop`).
    #[schema(example = "GET")]
    #[serde(default)]
    htm: Option<String>,
    /// The URL of that request as the agent addressed it, `https://` or `http://` (required
    /// with `dpop`); its query and fragment are not compared.
    #[schema(example = "https://api.example/orders", max_length = 2048)]
    #[serde(default)]
    htu: Option<String>,
}

/// The longest `htu` taken.
const MAX_HTU_LEN: usize = 2048;

impl VerifyRequest {
    /// What the engine checks; every field that is there must be well formed.
    fn presentation(&self) -> Result<Presentation<'_>, ValidationError> {
        let htm = self
            .htm
            .as_deref()
            .map(|m| {
                if is_http_method(m) {
                    Ok(m)
                } else {
                    Err(ValidationError::new("htm", "must be an HTTP method such as GET"))
                }
            })
            .transpose()?;
        let htu = self
            .htu
            .as_deref()
            .map(|u| {
                let scheme = u.starts_with("https://") || u.starts_with("http://");
                let host = u
                    .split("://")
                    .nth(1)
                    .is_some_and(|r| !r.is_empty() && !r.starts_with('/'));
                if scheme && host && u.len() <= MAX_HTU_LEN && u.bytes().all(|b| b.is_ascii_graphic()) {
                    Ok(u)
                } else {
                    Err(ValidationError::new(
                        "htu",
                        format!("must be an absolute http:// or https:// URL of at most {MAX_HTU_LEN} bytes"),
                    ))
                }
            })
            .transpose()?;
        let Some(proof) = self.dpop.as_deref() else {
            return Ok(Presentation::Dpop(None));
        };
        if proof.is_empty() {
            return Err(ValidationError::new(
                "dpop",
                "must not be empty: omit it for a bearer token",
            ));
        }
        let htm = htm.ok_or_else(|| ValidationError::new("htm", "is required with dpop"))?;
        let htu = htu.ok_or_else(|| ValidationError::new("htu", "is required with dpop"))?;
        Ok(Presentation::Dpop(Some(Presented { proof, htm, htu })))
    }
}

#[utoipa::path(
    post, path = "/v1/verify", tag = "verify",
    request_body = VerifyRequest,
    responses(
        (status = 200, description = "The verification result, as for GET /v1/verify/{token}, with the DPoP proof checked: a token bound to a key passes only with a fresh proof made with that key for this method and URL (PROOF_INVALID, PROOF_REPLAYED). Recorded in the audit log before it is sent.", body = VerifyAnswer),
        (status = 400, description = "INVALID_REQUEST or VALIDATION_ERROR (token, dpop, htm or htu)", body = ErrorBody),
        (status = 401, description = "UNAUTHORIZED: an Authorization header with an invalid key (verify needs none)", body = ErrorBody),
        (status = 413, description = "PAYLOAD_TOO_LARGE", body = ErrorBody),
        (status = 503, description = "AUDIT_UNAVAILABLE: the store cannot record this verification (or give the agent it names), so it is not answered", body = ErrorBody),
    ),
)]
pub async fn verify_dpop(
    state: web::Data<AppState>,
    req: HttpRequest,
    body: Bytes,
) -> Result<HttpResponse, ApiError> {
    check_key(&req)?;
    let request = json_body::<VerifyRequest>(&req, &body)?;
    let how = request.presentation()?;
    let v = state
        .engine
        .verify()
        .verify_presented(&request.token, how, context::received(&req), fixed_part)
        .await?;
    Ok(answer(&v))
}

/// An Authorization header, which verify does not need, must hold a valid key if it is sent.
fn check_key(req: &HttpRequest) -> Result<(), ApiError> {
    match context::auth(req) {
        Auth::Rejected => Err(ApiError::unauthorized(
            "invalid, unknown or disabled API key (verify needs none; omit the header or send a valid pk_ key)",
        )),
        Auth::NotBearer => Err(ApiError::unauthorized(super::auth::NOT_BEARER)),
        Auth::Anonymous | Auth::Key(_) | Auth::Unverifiable => Ok(()),
    }
}

fn answer(v: &Verification) -> HttpResponse {
    HttpResponse::Ok()
        .insert_header((header::CACHE_CONTROL, "no-store"))
        .content_type("application/json")
        .body(body(v))
}

impl<'a> ValidBody<'a> {
    fn of(t: &'a ValidToken, verified_at: Millis) -> Self {
        let c = &t.token.claims;
        ValidBody {
            valid: true,
            agent_id: c.agent_id(),
            name: &t.agent.name,
            issuer: c.issuer_domain(),
            scopes: c.granted(),
            description: &t.agent.description,
            issued_at: Millis::from_secs(c.iat),
            expires_at: Millis::from_secs(c.exp),
            livemode: t.agent.mode == KeyMode::Live,
            aud: c.aud.as_ref(),
            client_id: c.client_id.as_deref(),
            scope: c.scope.as_deref(),
            cnf: c.cnf.as_ref().map(|k| Cnf { jkt: &k.jkt }),
            sub: c.act.as_ref().map(|_| c.sub.as_str()),
            sub_id: c.sub_id.as_ref(),
            act: c.act.as_ref(),
            verified_at,
        }
    }
}

const EPOCH_TAIL: &str = r#""verified_at":"1970-01-01T00:00:00.000Z"}"#;

/// The valid answer's fixed part: all of it but `verified_at` and the closing brace.
pub(crate) fn fixed_part(t: &ValidToken) -> String {
    let mut all = serde_json::to_string(&ValidBody::of(t, Millis(0))).expect("answers serialize");
    let fixed_len = all
        .strip_suffix(EPOCH_TAIL)
        .expect("verified_at is the last member")
        .len();
    all.truncate(fixed_len);
    all
}

/// The valid answer's JSON: its fixed part, rendered the first time and kept with the
/// token, then this answer's time.
fn valid_json(t: &ValidToken, verified_at: Millis) -> String {
    let fixed = t.token.valid_answer(|| fixed_part(t));
    let mut out = String::with_capacity(fixed.len() + EPOCH_TAIL.len());
    out.push_str(fixed);
    out.push_str("\"verified_at\":\"");
    verified_at.write_rfc3339(&mut out);
    out.push_str("\"}");
    out
}

/// The answer's JSON: a valid one, else the error.
pub fn body(v: &Verification) -> String {
    if let Some(t) = &v.valid {
        return valid_json(t, v.verified_at);
    }
    let error = match (v.result, v.proof_error) {
        (VerifyResult::Invalid, Some(ProofError::Invalid)) => TokenError::ProofInvalid,
        (VerifyResult::Invalid, Some(ProofError::Replayed)) => TokenError::ProofReplayed,
        (VerifyResult::Revoked, _) => TokenError::TokenRevoked,
        (VerifyResult::Expired, _) => TokenError::TokenExpired,
        (VerifyResult::Valid | VerifyResult::Invalid, _) => TokenError::TokenInvalid,
    };
    serde_json::to_string(&VerifyAnswer::Invalid(InvalidBody { valid: false, error }))
        .expect("verify answers serialize")
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use agentid_core::domain::OrgId;
    use agentid_core::token::Claims;
    use agentid_engine::{AgentEntry, VerifiedToken};

    #[test]
    fn valid_answer_is_the_serialized_valid_body_on_every_call() {
        let token = Arc::new(VerifiedToken::new(Claims::agent(
            "quote\"s.example",
            "agt_01jd0000000000000000000000",
            "01jd0000000000000000000001",
            1_795_000_000,
            1_795_003_600,
            vec!["read:a".into(), "back\\slash".into()],
        )));
        let t = ValidToken {
            token: token.clone(),
            agent: Arc::new(AgentEntry {
                org_id: OrgId::generate(),
                mode: KeyMode::Live,
                name: "n\u{1}é".into(),
                description: "line\nbreak".into(),
            }),
        };
        for verified_at in [Millis(1_795_000_001_234), Millis(1_795_000_002_000)] {
            let expected = serde_json::to_string(&VerifyAnswer::Valid(ValidBody {
                valid: true,
                agent_id: &token.claims.sub,
                name: &t.agent.name,
                issuer: &token.claims.iss,
                scopes: token.claims.granted(),
                description: &t.agent.description,
                issued_at: Millis::from_secs(token.claims.iat),
                expires_at: Millis::from_secs(token.claims.exp),
                livemode: true,
                aud: None,
                client_id: None,
                scope: None,
                cnf: None,
                sub: None,
                sub_id: None,
                act: None,
                verified_at,
            }))
            .unwrap();
            let v = Verification {
                result: VerifyResult::Valid,
                valid: Some(t.clone()),
                proof_error: None,
                policy_error: None,
                verified_at,
            };
            assert_eq!(body(&v), expected);
        }
    }
}

//! `GET /v1/verify/{token}`: the receivers' endpoint. Token failures are answers
//! (200, `valid:false`), not errors; only an unrecordable verification is an error (503).

use actix_web::http::{header, Method};
use actix_web::{web, HttpRequest, HttpResponse};
use serde::Serialize;
use utoipa::ToSchema;

use super::context::AppState;
use super::context::{self, Auth};
use super::error::{ApiError, ErrorBody, ErrorCode};
use super::openapi::Timestamp;
use agentid_core::domain::{KeyMode, Millis, VerifyResult};
use agentid_engine::{ValidToken, Verification};

/// A valid token. `verified_at` must stay the last member: the answer is written as the
/// rest, rendered once per cached token, followed by it (see `valid_body`).
#[derive(Serialize, ToSchema)]
pub struct ValidBody<'a> {
    /// Always true.
    valid: bool,
    #[schema(pattern = "^agt_[0-9a-z]{26}$")]
    agent_id: &'a str,
    name: &'a str,
    issuer: &'a str,
    scopes: &'a [String],
    description: &'a str,
    #[schema(value_type = Timestamp)]
    issued_at: Millis,
    #[schema(value_type = Timestamp)]
    expires_at: Millis,
    /// False for a token issued in test mode (with an sk_test_ key).
    livemode: bool,
    #[schema(value_type = Timestamp)]
    verified_at: Millis,
}

/// A token that does not pass.
#[derive(Serialize, ToSchema)]
pub struct InvalidBody {
    /// Always false.
    valid: bool,
    error: TokenError,
}

#[derive(Serialize, ToSchema, Clone, Copy)]
#[allow(clippy::enum_variant_names)]
pub enum TokenError {
    #[serde(rename = "TOKEN_INVALID")]
    TokenInvalid,
    #[serde(rename = "TOKEN_REVOKED")]
    TokenRevoked,
    #[serde(rename = "TOKEN_EXPIRED")]
    TokenExpired,
}

/// The verification result: the valid form or the invalid form.
#[derive(Serialize, ToSchema)]
#[serde(untagged)]
pub enum VerifyAnswer<'a> {
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
    security((), ("bearer" = [])),
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
    match context::auth(&req) {
        Auth::Rejected => {
            return Err(ApiError::unauthorized(
                "invalid, unknown or disabled API key (verify needs none; omit the header or send a valid pk_ key)",
            ))
        }
        Auth::NotBearer => return Err(ApiError::unauthorized(super::auth::NOT_BEARER)),
        Auth::Anonymous | Auth::Key(_) | Auth::Unverifiable => {}
    }
    let v = state.engine.verify(token, context::received(&req)).await?;
    let unrendered = v.valid.as_ref().filter(|t| !t.token.has_answer());
    let answer = body(&v);
    if let Some(t) = unrendered {
        // The cache entry holds the rendered answer from now on: weigh it again.
        state.engine.answer_rendered(token, &t.token);
    }
    Ok(HttpResponse::Ok()
        .insert_header((header::CACHE_CONTROL, "no-store"))
        .content_type("application/json")
        .body(answer))
}

/// The answer's JSON.
pub fn body(v: &Verification) -> String {
    let error = match (&v.valid, v.result) {
        (Some(t), VerifyResult::Valid) => return valid_body(t, v.verified_at),
        (_, VerifyResult::Revoked) => TokenError::TokenRevoked,
        (_, VerifyResult::Expired) => TokenError::TokenExpired,
        (_, VerifyResult::Valid | VerifyResult::Invalid) => TokenError::TokenInvalid,
    };
    serde_json::to_string(&VerifyAnswer::Invalid(InvalidBody { valid: false, error }))
        .expect("verify answers serialize")
}

/// The valid answer. Its members but `verified_at` depend only on the token and the agent,
/// so they are serialized once per cached token (with `verified_at` at the epoch, which is
/// then cut off) and each answer appends its own `verified_at`. Serializing all of it on
/// every call was about a third of the verify handler's own time under hot load (perf).
fn valid_body(t: &ValidToken, verified_at: Millis) -> String {
    const EPOCH_TAIL: &str = r#""verified_at":"1970-01-01T00:00:00.000Z"}"#;
    let fixed = t.token.valid_answer(|| {
        let c = &t.token.claims;
        let mut all = serde_json::to_string(&VerifyAnswer::Valid(ValidBody {
            valid: true,
            agent_id: &c.sub,
            name: &t.agent.name,
            issuer: &c.iss,
            scopes: &c.scopes,
            description: &t.agent.description,
            issued_at: Millis::from_secs(c.iat),
            expires_at: Millis::from_secs(c.exp),
            livemode: t.agent.mode == KeyMode::Live,
            verified_at: Millis(0),
        }))
        .expect("verify answers serialize");
        let fixed_len = all
            .strip_suffix(EPOCH_TAIL)
            .expect("verified_at is the last member")
            .len();
        all.truncate(fixed_len);
        all
    });
    let mut out = String::with_capacity(fixed.len() + EPOCH_TAIL.len());
    out.push_str(fixed);
    out.push_str("\"verified_at\":\"");
    verified_at.write_rfc3339(&mut out);
    out.push_str("\"}");
    out
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use agentid_core::token::Claims;
    use agentid_engine::{AgentEntry, CheckedToken};

    #[test]
    fn valid_answer_is_the_serialized_valid_body_on_every_call() {
        let token = Arc::new(CheckedToken::new(Claims {
            iss: "quote\"s.example".into(),
            sub: "agt_01jd0000000000000000000000".into(),
            jti: "01jd0000000000000000000001".into(),
            iat: 1_795_000_000,
            exp: 1_795_003_600,
            scopes: vec!["read:a".into(), "back\\slash".into()],
            status: None,
            livemode: None,
        }));
        let t = ValidToken {
            token: token.clone(),
            agent: Arc::new(AgentEntry {
                org_id: "org_1".into(),
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
                scopes: &token.claims.scopes,
                description: &t.agent.description,
                issued_at: Millis::from_secs(token.claims.iat),
                expires_at: Millis::from_secs(token.claims.exp),
                livemode: true,
                verified_at,
            }))
            .unwrap();
            let v = Verification {
                result: VerifyResult::Valid,
                valid: Some(t.clone()),
                verified_at,
            };
            assert_eq!(body(&v), expected);
        }
    }
}

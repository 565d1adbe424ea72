//! `GET /v1/verify/{token}`: the receivers' endpoint. Token failures are answers
//! (200, `valid:false`), not errors; only an unrecordable verification is an error (503).

use actix_web::http::{header, Method};
use actix_web::{web, HttpRequest, HttpResponse};
use serde::Serialize;
use utoipa::ToSchema;

use super::context::AppState;
use super::context::{self, Auth};
use super::error::{ApiError, ErrorBody, ErrorCode};
use super::schema::Timestamp;
use agentid_core::domain::{Millis, VerifyResult};
use agentid_engine::Verification;

/// A valid token: the schema of what the engine renders (`agentid_engine::ValidAnswer`; a
/// test holds the two to one JSON).
#[derive(Serialize, ToSchema)]
pub(crate) struct ValidBody<'a> {
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
}

/// The verification result: the valid form or the invalid form.
#[derive(Serialize, ToSchema)]
#[serde(untagged)]
pub(crate) enum VerifyAnswer<'a> {
    /// Rendered by the engine; this is its schema.
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
    let v = state
        .engine
        .verify()
        .verify(token, context::received(&req))
        .await?;
    let answer = body(&v);
    Ok(HttpResponse::Ok()
        .insert_header((header::CACHE_CONTROL, "no-store"))
        .content_type("application/json")
        .body(answer))
}

/// The answer's JSON: the engine's rendering of a valid one, else the error.
pub fn body(v: &Verification) -> String {
    if let Some(valid) = v.valid_json() {
        return valid;
    }
    let error = match v.result {
        VerifyResult::Revoked => TokenError::TokenRevoked,
        VerifyResult::Expired => TokenError::TokenExpired,
        VerifyResult::Valid | VerifyResult::Invalid => TokenError::TokenInvalid,
    };
    serde_json::to_string(&VerifyAnswer::Invalid(InvalidBody { valid: false, error }))
        .expect("verify answers serialize")
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use agentid_core::domain::KeyMode;
    use agentid_core::token::Claims;
    use agentid_engine::{AgentEntry, ValidToken, VerifiedToken};

    #[test]
    fn valid_answer_is_the_serialized_valid_body_on_every_call() {
        let token = Arc::new(VerifiedToken::new(Claims {
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

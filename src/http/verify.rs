//! `GET /v1/verify/{token}`: the receivers' endpoint. Token failures are answers
//! (200, `valid:false`), not errors; only an unrecordable verification is an error (503).

use std::time::Instant;

use actix_web::http::header;
use actix_web::{web, HttpRequest, HttpResponse};
use serde::Serialize;

use super::auth::{auth, request_ctx};
use super::error::{ApiError, ErrorCode};
use super::gate::Auth;
use super::AppState;
use crate::domain::Millis;
use crate::engine::Verification;

#[derive(Serialize)]
struct ValidBody<'a> {
    valid: bool,
    agent_id: &'a str,
    name: &'a str,
    issuer: &'a str,
    scopes: &'a [String],
    description: &'a str,
    issued_at: Millis,
    expires_at: Millis,
    verified_at: Millis,
}

#[derive(Serialize)]
struct InvalidBody {
    valid: bool,
    error: &'static str,
}

pub async fn verify(
    state: web::Data<AppState>,
    token: web::Path<String>,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let ctx = request_ctx(&req);
    match auth(&req) {
        Auth::Rejected => {
            return Err(ApiError::unauthorized(
                "invalid, unknown or disabled API key (verify needs none; omit the header or send a valid pk_ key)",
            ))
        }
        Auth::Anonymous | Auth::Key(_) | Auth::Unverifiable => {}
    }
    let received = ctx.map_or_else(Instant::now, |c| c.received);
    let v = state.engine.verify(&token, received).await?;
    Ok(HttpResponse::Ok()
        .insert_header((header::CACHE_CONTROL, "no-store"))
        .content_type("application/json")
        .body(body(&v)))
}

fn body(v: &Verification) -> String {
    let json = match (&v.valid, v.result.error_code()) {
        (Some(t), None) => serde_json::to_string(&ValidBody {
            valid: true,
            agent_id: &t.claims.sub,
            name: &t.agent.name,
            issuer: &t.claims.iss,
            scopes: &t.claims.scopes,
            description: &t.agent.description,
            issued_at: Millis::from_secs(t.claims.iat),
            expires_at: Millis::from_secs(t.claims.exp),
            verified_at: v.verified_at,
        }),
        (_, code) => serde_json::to_string(&InvalidBody {
            valid: false,
            error: code.unwrap_or("TOKEN_INVALID"),
        }),
    };
    json.unwrap_or_else(|_| ApiError::new(ErrorCode::InternalError, "").to_string())
}

//! What flows on a stream: its subjects, the verification event, and poll delivery.

use actix_web::http::header;
use actix_web::{web, HttpRequest, HttpResponse};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::auth::Issuer;
use crate::context::AppState;
use crate::error::{ApiError, ErrorBody};
use crate::input::{stream_id, JsonBody};
use agentid_core::domain::ValidationError;
/// An agent as a subject: `iss` its issuer_domain, `sub` its agent_id.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Subject {
    /// `iss_sub`.
    format: String,
    iss: String,
    sub: String,
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct SubjectChange {
    stream_id: String,
    subject: Subject,
    #[serde(default)]
    verified: Option<bool>,
}

async fn subject(
    state: &AppState,
    caller: &agentid_engine::Caller,
    c: SubjectChange,
    add: bool,
) -> Result<(), ApiError> {
    let _ = c.verified;
    if c.subject.format != "iss_sub" {
        return Err(ValidationError::new("subject.format", "must be iss_sub").into());
    }
    Ok(state
        .engine
        .ssf()
        .subject(
            &caller.org.id,
            caller.mode,
            &stream_id(&c.stream_id)?,
            &c.subject.iss,
            &c.subject.sub,
            add,
        )
        .await?)
}

#[utoipa::path(
    post, path = "/ssf/subjects/add", tag = "ssf", request_body = SubjectChange,
    responses(
        (status = 200, description = "Added: the stream now carries only its subjects' events"),
        (status = 400, description = "VALIDATION_ERROR: not an agent of this organization and mode, or the stream holds 10,000 subjects already", body = ErrorBody),
        (status = 404, description = "NOT_FOUND", body = ErrorBody),
    ),
)]
pub(crate) async fn add_subject(
    state: web::Data<AppState>,
    Issuer(caller): Issuer,
    JsonBody(c): JsonBody<SubjectChange>,
) -> Result<HttpResponse, ApiError> {
    subject(&state, &caller, c, true).await?;
    Ok(HttpResponse::Ok().finish())
}

#[utoipa::path(
    post, path = "/ssf/subjects/remove", tag = "ssf", request_body = SubjectChange,
    responses(
        (status = 204, description = "Removed"),
        (status = 400, description = "VALIDATION_ERROR", body = ErrorBody),
        (status = 404, description = "NOT_FOUND: no such stream, or the subject is not one of its subjects", body = ErrorBody),
    ),
)]
pub(crate) async fn remove_subject(
    state: web::Data<AppState>,
    Issuer(caller): Issuer,
    JsonBody(c): JsonBody<SubjectChange>,
) -> Result<HttpResponse, ApiError> {
    subject(&state, &caller, c, false).await?;
    Ok(HttpResponse::NoContent().finish())
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct VerificationRequest {
    stream_id: String,
    #[serde(default)]
    state: Option<String>,
}

#[utoipa::path(
    post, path = "/ssf/verify", tag = "ssf", request_body = VerificationRequest,
    responses(
        (status = 204, description = "A verification SET carrying `state` is on its way"),
        (status = 400, description = "VALIDATION_ERROR", body = ErrorBody),
        (status = 404, description = "NOT_FOUND", body = ErrorBody),
    ),
)]
pub async fn verify(
    state: web::Data<AppState>,
    Issuer(caller): Issuer,
    JsonBody(v): JsonBody<VerificationRequest>,
) -> Result<HttpResponse, ApiError> {
    state
        .engine
        .ssf()
        .verify(
            &caller.org.id,
            caller.mode,
            &stream_id(&v.stream_id)?,
            v.state.as_deref(),
        )
        .await?;
    Ok(HttpResponse::NoContent().finish())
}

/// An RFC 8936 poll.
#[derive(Deserialize, ToSchema)]
pub(crate) struct PollRequest {
    #[serde(default, rename = "maxEvents")]
    max_events: Option<u32>,
    #[serde(default, rename = "returnImmediately")]
    return_immediately: Option<bool>,
    #[serde(default)]
    ack: Vec<String>,
    #[serde(default, rename = "setErrs")]
    set_errs: std::collections::BTreeMap<String, serde_json::Value>,
}

#[derive(Serialize, ToSchema)]
pub(crate) struct PollResponse {
    sets: std::collections::BTreeMap<String, String>,
    #[serde(rename = "moreAvailable")]
    more_available: bool,
}

#[utoipa::path(
    post, path = "/ssf/poll/{stream_id}", tag = "ssf", request_body = PollRequest,
    params(("stream_id" = String, Path, description = "The poll stream")),
    responses(
        (status = 200, description = "Pending SETs by jti (RFC 8936). With returnImmediately false and none pending, waits up to 30 s. Acknowledged (ack or setErrs) SETs are never returned again.", body = PollResponse),
        (status = 401, description = "UNAUTHORIZED: not the stream's poll token", body = ErrorBody),
        (status = 404, description = "NOT_FOUND", body = ErrorBody),
    ),
)]
pub async fn poll(
    state: web::Data<AppState>,
    req: HttpRequest,
    id: web::Path<String>,
    JsonBody(p): JsonBody<PollRequest>,
) -> Result<HttpResponse, ApiError> {
    let token = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim());
    if p.ack.len() + p.set_errs.len() > 1000 {
        return Err(ValidationError::new("ack", "at most 1000 acknowledgements a poll").into());
    }
    let mut ack = p.ack;
    ack.extend(p.set_errs.into_keys());
    let max = p.max_events.unwrap_or(100).clamp(0, 1000);
    let (sets, more) = state
        .engine
        .ssf()
        .poll(
            &stream_id(&id)?,
            token,
            &ack,
            max,
            p.return_immediately.unwrap_or(false),
        )
        .await?;
    Ok(HttpResponse::Ok()
        .insert_header((header::CACHE_CONTROL, "no-store"))
        .json(PollResponse {
            sets: sets.into_iter().collect(),
            more_available: more,
        }))
}

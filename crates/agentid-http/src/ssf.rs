//! The Shared Signals transmitter's endpoints (SSF 1.0): discovery, an organization's
//! streams (secret keys only, each org and mode its own), their status and subjects, the
//! verification event, and RFC 8936 poll delivery.

use actix_web::http::header;
use actix_web::web::Bytes;
use actix_web::{web, HttpRequest, HttpResponse};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::agents::json_body;
use super::auth::Issuer;
use super::context::AppState;
use super::error::{ApiError, ErrorBody, ErrorCode};
use agentid_core::domain::ValidationError;
use agentid_core::records::StreamRecord;
use agentid_engine::ssf::{SsfError, StreamInput, EVENTS_SUPPORTED, POLL, PUSH};

impl From<SsfError> for ApiError {
    fn from(e: SsfError) -> Self {
        match e {
            SsfError::Invalid { field, message } => ValidationError::new(field, message).into(),
            SsfError::NotFound => ApiError::new(
                ErrorCode::NotFound,
                "no such stream of this organization and mode",
            ),
            SsfError::TooMany => ApiError::new(ErrorCode::ValidationError, e.to_string()),
            SsfError::BadPollToken => {
                ApiError::unauthorized("send Authorization: Bearer <the stream's poll_token>")
            }
            SsfError::Store(e) => e.into(),
        }
    }
}

/// The transmitter's configuration (SSF §7.1).
#[derive(Serialize, ToSchema)]
pub struct Configuration {
    spec_version: &'static str,
    issuer: String,
    jwks_uri: String,
    delivery_methods_supported: [&'static str; 2],
    configuration_endpoint: String,
    status_endpoint: String,
    add_subject_endpoint: String,
    remove_subject_endpoint: String,
    verification_endpoint: String,
    authorization_schemes: Vec<serde_json::Value>,
    default_subjects: &'static str,
}

#[utoipa::path(
    get, path = "/.well-known/ssf-configuration", tag = "ssf",
    responses((status = 200, description = "The Shared Signals transmitter's configuration (SSF 1.0 §7.1). Public, never rate limited.", body = Configuration)),
)]
pub async fn configuration(state: web::Data<AppState>) -> HttpResponse {
    let base = state.engine.ssf().public_url().to_owned();
    HttpResponse::Ok()
        .insert_header((header::CACHE_CONTROL, "public, max-age=3600"))
        .json(Configuration {
            spec_version: "1_0",
            jwks_uri: format!("{base}/.well-known/jwks.json"),
            delivery_methods_supported: [PUSH, POLL],
            configuration_endpoint: format!("{base}/ssf/streams"),
            status_endpoint: format!("{base}/ssf/status"),
            add_subject_endpoint: format!("{base}/ssf/subjects/add"),
            remove_subject_endpoint: format!("{base}/ssf/subjects/remove"),
            verification_endpoint: format!("{base}/ssf/verify"),
            authorization_schemes: vec![serde_json::json!({"spec_urn": "urn:ietf:rfc:6750"})],
            default_subjects: "ALL",
            issuer: base,
        })
}

/// How a stream's SETs travel.
#[derive(Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Delivery {
    /// `urn:ietf:rfc:8935` (push) or `urn:ietf:rfc:8936` (poll).
    method: String,
    /// Push: the receiver's https URL. Poll (answers only): the URL to poll.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    endpoint_url: Option<String>,
}

/// A stream to create or replace (SSF §8.1.1).
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StreamRequest {
    /// Required to replace or update; absent to create.
    #[serde(default)]
    stream_id: Option<String>,
    delivery: Delivery,
    #[serde(default)]
    events_requested: Vec<String>,
    #[serde(default)]
    description: Option<String>,
    /// Default: the push endpoint's origin, or the stream id for poll.
    #[serde(default)]
    aud: Option<String>,
}

/// A change of some of a stream's fields (SSF §8.1.1.3).
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StreamPatch {
    stream_id: String,
    #[serde(default)]
    delivery: Option<Delivery>,
    #[serde(default)]
    events_requested: Option<Vec<String>>,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    aud: Option<String>,
}

/// A stream's configuration (SSF §8.1.1).
#[derive(Serialize, ToSchema)]
pub struct StreamConfig {
    stream_id: String,
    iss: String,
    aud: String,
    delivery: Delivery,
    events_supported: [&'static str; 2],
    events_requested: Vec<String>,
    events_delivered: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    description: Option<String>,
    /// Poll streams: the secret the receiver polls with, shown only when the stream is made.
    #[serde(skip_serializing_if = "Option::is_none")]
    poll_token: Option<String>,
}

fn config(state: &AppState, s: StreamRecord, poll_token: Option<String>) -> StreamConfig {
    let ssf = state.engine.ssf();
    let endpoint_url = if s.method == POLL {
        Some(ssf.poll_url(&s.id))
    } else {
        s.endpoint_url
    };
    StreamConfig {
        iss: ssf.public_url().to_owned(),
        aud: s.aud,
        delivery: Delivery {
            method: s.method,
            endpoint_url,
        },
        events_supported: EVENTS_SUPPORTED,
        events_delivered: s
            .events_requested
            .iter()
            .filter(|e| EVENTS_SUPPORTED.contains(&e.as_str()))
            .cloned()
            .collect(),
        events_requested: s.events_requested,
        description: s.description,
        stream_id: s.id,
        poll_token,
    }
}

fn input(
    delivery: Delivery,
    events: Vec<String>,
    description: Option<String>,
    aud: Option<String>,
) -> StreamInput {
    StreamInput {
        method: delivery.method,
        endpoint_url: delivery.endpoint_url,
        events_requested: events,
        description,
        aud,
    }
}

/// `?stream_id=`.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct StreamQuery {
    /// The stream; absent on GET: every stream of the caller's organization and mode.
    stream_id: Option<String>,
}

fn required(q: &StreamQuery) -> Result<&str, ApiError> {
    q.stream_id
        .as_deref()
        .ok_or_else(|| ValidationError::new("stream_id", "is required").into())
}

#[utoipa::path(
    post, path = "/ssf/streams", tag = "ssf", request_body = StreamRequest,
    responses(
        (status = 201, description = "The stream's configuration (a poll stream's `poll_token` only here)", body = StreamConfig),
        (status = 400, description = "VALIDATION_ERROR: a field breaks a rule (a push endpoint must be https and public), or the organization has 10 streams", body = ErrorBody),
        (status = 401, description = "UNAUTHORIZED", body = ErrorBody),
        (status = 403, description = "FORBIDDEN: a publishable key", body = ErrorBody),
        (status = 415, description = "INVALID_REQUEST: not application/json", body = ErrorBody),
    ),
    security(("bearer" = [])),
)]
pub async fn create(
    state: web::Data<AppState>,
    Issuer(caller): Issuer,
    req: HttpRequest,
    body: Bytes,
) -> Result<HttpResponse, ApiError> {
    let r: StreamRequest = json_body(&req, &body)?;
    if r.stream_id.is_some() {
        return Err(ValidationError::new("stream_id", "is given by the service").into());
    }
    let (stream, token) = state
        .engine
        .ssf()
        .create(
            &caller.org.id,
            caller.mode,
            input(r.delivery, r.events_requested, r.description, r.aud),
        )
        .await?;
    Ok(HttpResponse::Created()
        .insert_header((header::CACHE_CONTROL, "no-store"))
        .json(config(&state, stream, token)))
}

/// One stream (with `stream_id`), or every stream of the caller's organization and mode.
#[derive(Serialize, ToSchema)]
#[serde(untagged)]
pub enum Streams {
    One(Box<StreamConfig>),
    All(Vec<StreamConfig>),
}

#[utoipa::path(
    get, path = "/ssf/streams", tag = "ssf", params(StreamQuery),
    responses(
        (status = 200, description = "A stream's configuration; without stream_id, an array of every stream of the caller's organization and mode", body = Streams),
        (status = 400, description = "VALIDATION_ERROR: a malformed query", body = ErrorBody),
        (status = 404, description = "NOT_FOUND: no such stream of this organization and mode", body = ErrorBody),
    ),
    security(("bearer" = [])),
)]
pub async fn read(
    state: web::Data<AppState>,
    Issuer(caller): Issuer,
    q: web::Query<StreamQuery>,
) -> Result<HttpResponse, ApiError> {
    let ssf = state.engine.ssf();
    Ok(match &q.stream_id {
        Some(id) => HttpResponse::Ok().json(Streams::One(Box::new(config(
            &state,
            ssf.get(&caller.org.id, caller.mode, id).await?,
            None,
        )))),
        None => {
            let all: Vec<StreamConfig> = ssf
                .list(&caller.org.id, caller.mode)
                .await?
                .into_iter()
                .map(|s| config(&state, s, None))
                .collect();
            HttpResponse::Ok().json(Streams::All(all))
        }
    })
}

#[utoipa::path(
    put, path = "/ssf/streams", tag = "ssf", request_body = StreamRequest,
    responses(
        (status = 200, description = "The replaced stream's configuration", body = StreamConfig),
        (status = 400, description = "VALIDATION_ERROR", body = ErrorBody),
        (status = 404, description = "NOT_FOUND", body = ErrorBody),
    ),
    security(("bearer" = [])),
)]
pub async fn replace(
    state: web::Data<AppState>,
    Issuer(caller): Issuer,
    req: HttpRequest,
    body: Bytes,
) -> Result<HttpResponse, ApiError> {
    let r: StreamRequest = json_body(&req, &body)?;
    let id = r
        .stream_id
        .clone()
        .ok_or_else(|| ApiError::from(ValidationError::new("stream_id", "is required")))?;
    let stream = state
        .engine
        .ssf()
        .replace(
            &caller.org.id,
            caller.mode,
            &id,
            input(r.delivery, r.events_requested, r.description, r.aud),
        )
        .await?;
    Ok(HttpResponse::Ok().json(config(&state, stream, None)))
}

#[utoipa::path(
    patch, path = "/ssf/streams", tag = "ssf", request_body = StreamPatch,
    responses(
        (status = 200, description = "The updated stream's configuration", body = StreamConfig),
        (status = 400, description = "VALIDATION_ERROR", body = ErrorBody),
        (status = 404, description = "NOT_FOUND", body = ErrorBody),
    ),
    security(("bearer" = [])),
)]
pub async fn update(
    state: web::Data<AppState>,
    Issuer(caller): Issuer,
    req: HttpRequest,
    body: Bytes,
) -> Result<HttpResponse, ApiError> {
    let p: StreamPatch = json_body(&req, &body)?;
    let ssf = state.engine.ssf();
    let current = ssf.get(&caller.org.id, caller.mode, &p.stream_id).await?;
    let delivery = p.delivery.unwrap_or(Delivery {
        method: current.method.clone(),
        endpoint_url: current.endpoint_url.clone(),
    });
    let changed = input(
        delivery,
        p.events_requested.unwrap_or(current.events_requested),
        p.description.or(current.description),
        Some(p.aud.unwrap_or(current.aud)),
    );
    let stream = ssf
        .replace(&caller.org.id, caller.mode, &p.stream_id, changed)
        .await?;
    Ok(HttpResponse::Ok().json(config(&state, stream, None)))
}

#[utoipa::path(
    delete, path = "/ssf/streams", tag = "ssf", params(StreamQuery),
    responses(
        (status = 204, description = "Deleted, with the events it was owed"),
        (status = 400, description = "VALIDATION_ERROR: stream_id is required", body = ErrorBody),
        (status = 404, description = "NOT_FOUND", body = ErrorBody),
    ),
    security(("bearer" = [])),
)]
pub async fn delete(
    state: web::Data<AppState>,
    Issuer(caller): Issuer,
    q: web::Query<StreamQuery>,
) -> Result<HttpResponse, ApiError> {
    state
        .engine
        .ssf()
        .delete(&caller.org.id, caller.mode, required(&q)?)
        .await?;
    Ok(HttpResponse::NoContent().finish())
}

/// A stream's status (SSF §8.1.2).
#[derive(Serialize, ToSchema)]
pub struct StreamStatus {
    stream_id: String,
    /// `enabled`, `paused` (events are kept) or `disabled` (events are dropped).
    status: String,
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StatusChange {
    stream_id: String,
    status: String,
    #[serde(default)]
    reason: Option<String>,
}

#[utoipa::path(
    get, path = "/ssf/status", tag = "ssf", params(StreamQuery),
    responses(
        (status = 200, description = "The stream's status", body = StreamStatus),
        (status = 400, description = "VALIDATION_ERROR: stream_id is required", body = ErrorBody),
        (status = 404, description = "NOT_FOUND", body = ErrorBody),
    ),
    security(("bearer" = [])),
)]
pub async fn status(
    state: web::Data<AppState>,
    Issuer(caller): Issuer,
    q: web::Query<StreamQuery>,
) -> Result<HttpResponse, ApiError> {
    let s = state
        .engine
        .ssf()
        .get(&caller.org.id, caller.mode, required(&q)?)
        .await?;
    Ok(HttpResponse::Ok().json(StreamStatus {
        stream_id: s.id,
        status: s.status,
    }))
}

#[utoipa::path(
    post, path = "/ssf/status", tag = "ssf", request_body = StatusChange,
    responses(
        (status = 200, description = "The stream's new status", body = StreamStatus),
        (status = 400, description = "VALIDATION_ERROR", body = ErrorBody),
        (status = 404, description = "NOT_FOUND", body = ErrorBody),
    ),
    security(("bearer" = [])),
)]
pub async fn set_status(
    state: web::Data<AppState>,
    Issuer(caller): Issuer,
    req: HttpRequest,
    body: Bytes,
) -> Result<HttpResponse, ApiError> {
    let c: StatusChange = json_body(&req, &body)?;
    let _ = c.reason;
    let s = state
        .engine
        .ssf()
        .set_status(&caller.org.id, caller.mode, &c.stream_id, &c.status)
        .await?;
    Ok(HttpResponse::Ok().json(StreamStatus {
        stream_id: s.id,
        status: s.status,
    }))
}

/// An agent as a subject: `iss` its issuer_domain, `sub` its agent_id.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Subject {
    /// `iss_sub`.
    format: String,
    iss: String,
    sub: String,
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SubjectChange {
    stream_id: String,
    subject: Subject,
    #[serde(default)]
    verified: Option<bool>,
}

async fn subject(
    state: &AppState,
    caller: &agentid_engine::Caller,
    req: &HttpRequest,
    body: &Bytes,
    add: bool,
) -> Result<(), ApiError> {
    let c: SubjectChange = json_body(req, body)?;
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
            &c.stream_id,
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
        (status = 400, description = "VALIDATION_ERROR: not an agent of this organization and mode", body = ErrorBody),
        (status = 404, description = "NOT_FOUND", body = ErrorBody),
    ),
    security(("bearer" = [])),
)]
pub async fn add_subject(
    state: web::Data<AppState>,
    Issuer(caller): Issuer,
    req: HttpRequest,
    body: Bytes,
) -> Result<HttpResponse, ApiError> {
    subject(&state, &caller, &req, &body, true).await?;
    Ok(HttpResponse::Ok().finish())
}

#[utoipa::path(
    post, path = "/ssf/subjects/remove", tag = "ssf", request_body = SubjectChange,
    responses(
        (status = 204, description = "Removed"),
        (status = 400, description = "VALIDATION_ERROR", body = ErrorBody),
        (status = 404, description = "NOT_FOUND", body = ErrorBody),
    ),
    security(("bearer" = [])),
)]
pub async fn remove_subject(
    state: web::Data<AppState>,
    Issuer(caller): Issuer,
    req: HttpRequest,
    body: Bytes,
) -> Result<HttpResponse, ApiError> {
    subject(&state, &caller, &req, &body, false).await?;
    Ok(HttpResponse::NoContent().finish())
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct VerificationRequest {
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
    security(("bearer" = [])),
)]
pub async fn verify(
    state: web::Data<AppState>,
    Issuer(caller): Issuer,
    req: HttpRequest,
    body: Bytes,
) -> Result<HttpResponse, ApiError> {
    let v: VerificationRequest = json_body(&req, &body)?;
    state
        .engine
        .ssf()
        .verify(&caller.org.id, caller.mode, &v.stream_id, v.state.as_deref())
        .await?;
    Ok(HttpResponse::NoContent().finish())
}

/// An RFC 8936 poll.
#[derive(Deserialize, ToSchema)]
pub struct PollRequest {
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
pub struct PollResponse {
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
    body: Bytes,
) -> Result<HttpResponse, ApiError> {
    let token = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    let p: PollRequest = json_body(&req, &body)?;
    if p.ack.len() + p.set_errs.len() > 1000 {
        return Err(ValidationError::new("ack", "at most 1000 acknowledgements a poll").into());
    }
    let mut ack = p.ack;
    ack.extend(p.set_errs.into_keys());
    let max = p.max_events.unwrap_or(100).clamp(0, 1000);
    let (sets, more) = state
        .engine
        .ssf()
        .poll(&id, token, &ack, max, p.return_immediately.unwrap_or(false))
        .await?;
    Ok(HttpResponse::Ok()
        .insert_header((header::CACHE_CONTROL, "no-store"))
        .json(PollResponse {
            sets: sets.into_iter().collect(),
            more_available: more,
        }))
}

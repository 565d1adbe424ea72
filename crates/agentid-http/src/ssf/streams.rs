//! An organization's streams: create, read, replace, update, delete, and their status.

use actix_web::http::header;
use actix_web::{web, HttpResponse};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::auth::Issuer;
use crate::context::AppState;
use crate::error::{ApiError, ErrorBody};
use crate::input::{stream_id, JsonBody};
use agentid_core::domain::{StreamId, ValidationError};
use agentid_core::records::StreamRecord;
use agentid_engine::ssf::{StreamChange, StreamInput, EVENTS_SUPPORTED, POLL};
/// How a stream's SETs travel.
#[derive(Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Delivery {
    /// `urn:ietf:rfc:8935` (push) or `urn:ietf:rfc:8936` (poll).
    method: String,
    /// Push: the receiver's https URL. Poll (answers only): the URL to poll.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    endpoint_url: Option<String>,
}

/// A stream to create or replace (SSF §8.1.1).
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct StreamRequest {
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
pub(crate) struct StreamPatch {
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
pub(crate) struct StreamConfig {
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
        Some(ssf.poll_url(s.id.as_str()))
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
        stream_id: s.id.into(),
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
pub(crate) struct StreamQuery {
    /// The stream; absent on GET: every stream of the caller's organization and mode.
    stream_id: Option<String>,
}

#[utoipa::path(
    post, path = "/ssf/streams", tag = "ssf", request_body = StreamRequest,
    responses(
        (status = 201, description = "The stream's configuration (a poll stream's `poll_token` only here)", body = StreamConfig),
        (status = 400, description = "VALIDATION_ERROR: a field breaks a rule (a push endpoint must be https and public), or the organization has 10 streams in the key's mode", body = ErrorBody),
    ),
)]
pub async fn create(
    state: web::Data<AppState>,
    Issuer(caller): Issuer,
    JsonBody(r): JsonBody<StreamRequest>,
) -> Result<HttpResponse, ApiError> {
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
pub(crate) enum Streams {
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
            ssf.get(&caller.org.id, caller.mode, &stream_id(id)?).await?,
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
)]
pub async fn replace(
    state: web::Data<AppState>,
    Issuer(caller): Issuer,
    JsonBody(r): JsonBody<StreamRequest>,
) -> Result<HttpResponse, ApiError> {
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
            &stream_id(&id)?,
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
)]
pub async fn update(
    state: web::Data<AppState>,
    Issuer(caller): Issuer,
    JsonBody(p): JsonBody<StreamPatch>,
) -> Result<HttpResponse, ApiError> {
    let change = StreamChange {
        delivery: p.delivery.map(|d| (d.method, d.endpoint_url)),
        events_requested: p.events_requested,
        description: p.description,
        aud: p.aud,
    };
    let stream = state
        .engine
        .ssf()
        .patch(&caller.org.id, caller.mode, &stream_id(&p.stream_id)?, change)
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
)]
pub async fn delete(
    state: web::Data<AppState>,
    Issuer(caller): Issuer,
    q: web::Query<StreamQuery>,
) -> Result<HttpResponse, ApiError> {
    state
        .engine
        .ssf()
        .delete(&caller.org.id, caller.mode, &required(&q)?)
        .await?;
    Ok(HttpResponse::NoContent().finish())
}

/// A stream's status (SSF §8.1.2).
#[derive(Serialize, ToSchema)]
pub(crate) struct StreamStatus {
    stream_id: String,
    /// `enabled`, `paused` (events are kept) or `disabled` (events are dropped).
    status: String,
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct StatusChange {
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
)]
pub async fn status(
    state: web::Data<AppState>,
    Issuer(caller): Issuer,
    q: web::Query<StreamQuery>,
) -> Result<HttpResponse, ApiError> {
    let s = state
        .engine
        .ssf()
        .get(&caller.org.id, caller.mode, &required(&q)?)
        .await?;
    Ok(HttpResponse::Ok().json(StreamStatus {
        stream_id: s.id.into(),
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
)]
pub async fn set_status(
    state: web::Data<AppState>,
    Issuer(caller): Issuer,
    JsonBody(c): JsonBody<StatusChange>,
) -> Result<HttpResponse, ApiError> {
    let _ = c.reason;
    let s = state
        .engine
        .ssf()
        .set_status(&caller.org.id, caller.mode, &stream_id(&c.stream_id)?, &c.status)
        .await?;
    Ok(HttpResponse::Ok().json(StreamStatus {
        stream_id: s.id.into(),
        status: s.status,
    }))
}

fn required(q: &StreamQuery) -> Result<StreamId, ApiError> {
    let id = q
        .stream_id
        .as_deref()
        .ok_or_else(|| ApiError::from(ValidationError::new("stream_id", "is required")))?;
    stream_id(id)
}

//! The Shared Signals transmitter's endpoints (SSF 1.0): discovery, an organization's
//! streams (secret keys only, each org and mode its own), their status and subjects, the
//! verification event, and RFC 8936 poll delivery.

use actix_web::http::header;
use actix_web::{web, HttpResponse};
use serde::Serialize;
use utoipa::ToSchema;

use super::context::AppState;
use super::error::{ApiError, ErrorCode};
use agentid_core::domain::ValidationError;
use agentid_engine::ssf::{SsfError, POLL, PUSH};

pub(crate) mod events;
pub(crate) mod streams;

impl From<SsfError> for ApiError {
    fn from(e: SsfError) -> Self {
        match e {
            SsfError::Invalid { field, message } => ValidationError::new(field, message).into(),
            SsfError::NotFound => ApiError::new(
                ErrorCode::NotFound,
                "no such stream of this organization and mode",
            ),
            SsfError::NoSuchSubject => ApiError::new(
                ErrorCode::NotFound,
                "the subject is not one of the stream's subjects (a stream carries every agent of \
                 its organization and mode until subjects are added)",
            ),
            SsfError::TooMany | SsfError::TooManySubjects => {
                ApiError::new(ErrorCode::ValidationError, e.to_string())
            }
            SsfError::BadPollToken => {
                ApiError::unauthorized("send Authorization: Bearer <the stream's poll_token>")
            }
            SsfError::Store(e) => e.into(),
        }
    }
}

/// The transmitter's configuration (SSF §7.1).
#[derive(Serialize, ToSchema)]
pub(crate) struct Configuration {
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

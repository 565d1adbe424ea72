//! The gate: the one middleware every request passes. It assigns the request id, resolves the
//! API key, writes the standard error body for every error response (whoever produced it),
//! and logs one line per request (route pattern, never the path: verify paths hold tokens).

use std::sync::Arc;
use std::time::Instant;

use actix_web::body::{BoxBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header::{self, HeaderMap, HeaderValue};
use actix_web::middleware::Next;
use actix_web::{web, HttpMessage, HttpRequest};
use tracing::Instrument;

use super::error::{code_for_status, ErrorCode, ErrorInfo};
use super::{ApiError, AppState};
use crate::domain::{new_id, IdPrefix};
use crate::engine::{Caller, KeyLookup};

/// What the gate learned about the caller's credentials.
#[derive(Debug, Clone)]
pub enum Auth {
    /// No `Authorization` header.
    Anonymous,
    Key(Arc<Caller>),
    /// A header that is malformed or names no usable key.
    Rejected,
    /// The key could not be checked (store unreachable).
    Unverifiable,
}

/// Set on a response whose error status comes with its own documented body (health).
#[derive(Debug, Clone, Copy)]
pub struct KeepBody;

/// Per-request facts the gate puts into the request extensions.
#[derive(Debug, Clone)]
pub struct RequestCtx {
    pub received: Instant,
    pub auth: Auth,
}

pub async fn gate(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<BoxBody>, actix_web::Error> {
    let received = Instant::now();
    let request_id = new_id(IdPrefix::Request);
    let state = req
        .app_data::<web::Data<AppState>>()
        .cloned()
        .expect("AppState is registered");
    let auth = match bearer(req.headers()) {
        None => Auth::Anonymous,
        Some(None) => Auth::Rejected,
        Some(Some(key)) => match state.engine.authenticate(key).await {
            Ok(KeyLookup::Valid(caller)) => Auth::Key(caller),
            Ok(KeyLookup::Rejected) => Auth::Rejected,
            Err(e) => {
                tracing::warn!(error = %e, "cannot check API key");
                Auth::Unverifiable
            }
        },
    };
    req.extensions_mut().insert(RequestCtx { received, auth });
    // Handlers, extractors and the CORS layer turn their errors into responses, so an `Err`
    // here is actix's own last resort; it is passed on as it is.
    let span = tracing::info_span!("request", request_id = %request_id);
    let res = next
        .call(req)
        .instrument(span.clone())
        .await?
        .map_into_boxed_body();
    let _entered = span.enter();
    Ok(finish(res, &state, &request_id, received))
}

/// `Some(None)`: an Authorization header that is not `Bearer <token>`.
fn bearer(headers: &HeaderMap) -> Option<Option<&str>> {
    let value = headers.get(header::AUTHORIZATION)?;
    let parsed = value.to_str().ok().and_then(|v| {
        let (scheme, token) = v.split_once(' ')?;
        let token = token.trim();
        (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
    });
    Some(parsed)
}

fn finish(
    res: ServiceResponse<BoxBody>,
    state: &AppState,
    request_id: &str,
    received: Instant,
) -> ServiceResponse<BoxBody> {
    let status = res.status();
    let is_error = status.is_client_error() || status.is_server_error();
    let mut res = if is_error && res.response().extensions().get::<KeepBody>().is_none() {
        let info = res
            .response()
            .extensions()
            .get::<ErrorInfo>()
            .cloned()
            .unwrap_or_else(|| {
                let code = code_for_status(status);
                ErrorInfo {
                    code: code.as_str(),
                    message: default_message(code).to_owned(),
                }
            });
        let body = serde_json::json!({"error": {
            "code": info.code,
            "message": info.message,
            "request_id": request_id,
            "docs_url": format!("{}/docs/errors#{}", state.public_url, info.code),
        }})
        .to_string();
        res.map_body(|head, _| {
            head.headers
                .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
            BoxBody::new(body)
        })
    } else {
        res
    };
    if let Ok(v) = HeaderValue::from_str(request_id) {
        res.headers_mut()
            .insert(header::HeaderName::from_static("x-request-id"), v);
    }
    log_line(res.request(), status.as_u16(), received);
    res
}

fn log_line(req: &HttpRequest, status: u16, received: Instant) {
    let route = req.match_pattern().unwrap_or_else(|| "unmatched".to_owned());
    let latency_ms = received.elapsed().as_secs_f64() * 1000.0;
    let method = req.method().as_str();
    // Successful verifications are the bulk of traffic: they log at debug.
    if status < 400 && route == "/v1/verify/{token}" {
        tracing::debug!(method, route, status, latency_ms, "request");
    } else {
        tracing::info!(method, route, status, latency_ms, "request");
    }
}

fn default_message(code: ErrorCode) -> &'static str {
    match code {
        ErrorCode::NotFound => "no such route",
        ErrorCode::MethodNotAllowed => "this route does not accept that method",
        ErrorCode::PayloadTooLarge => "the request body is over 64 KiB",
        ErrorCode::UnsupportedMediaType => "unsupported content type",
        ErrorCode::InternalError => "an unexpected error occurred",
        _ => "the request could not be processed",
    }
}

/// Unknown routes.
pub async fn no_route() -> Result<actix_web::HttpResponse, ApiError> {
    Err(ApiError::new(ErrorCode::NotFound, "no such route"))
}

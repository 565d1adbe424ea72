//! What handlers share of reading a request: JSON bodies and page sizes, each bad value with
//! its own clear error.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::Duration;

use actix_web::dev::Payload;
use actix_web::error::PayloadError;
use actix_web::http::header::{self, HeaderMap};
use actix_web::rt::time::{sleep, Sleep};
use actix_web::web::Bytes;
use actix_web::{FromRequest, HttpRequest};
use futures_util::future::LocalBoxFuture;
use futures_util::Stream;

use crate::error::{ApiError, ErrorCode};
use agentid_core::domain::{AgentId, StreamId, ValidationError};
use agentid_engine::ssf::SsfError;
use agentid_engine::EngineError;

const DEFAULT_LIMIT: u32 = 50;
const MAX_LIMIT: u32 = 200;

/// A page size given as text: 1 to 200, 50 when absent (`GET /v1/log`, `GET /v1/agents`).
pub(crate) fn page_limit(raw: Option<&str>) -> Result<u32, ValidationError> {
    match raw {
        None => Ok(DEFAULT_LIMIT),
        Some(s) => s
            .parse::<u32>()
            .ok()
            .filter(|n| (1..=MAX_LIMIT).contains(n))
            .ok_or_else(|| ValidationError::new("limit", "must be an integer from 1 to 200")),
    }
}

/// An agent id from a path: one that does not decode names no agent, as an unknown one.
pub(crate) fn agent_path(s: &str) -> Result<AgentId, ApiError> {
    AgentId::parse(s).ok_or_else(|| EngineError::AgentNotFound.into())
}

/// A stream id from a path, query or body: one that does not decode names no stream.
pub(crate) fn stream_id(s: &str) -> Result<StreamId, ApiError> {
    StreamId::parse(s).ok_or_else(|| SsfError::NotFound.into())
}

/// Whether the request's `Content-Type` is `essence` (its parameters aside).
pub(crate) fn content_type_is(req: &HttpRequest, essence: &str) -> bool {
    let ct = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    ct.split(';')
        .next()
        .unwrap_or("")
        .trim()
        .eq_ignore_ascii_case(essence)
}

/// Enforces `Content-Type: application/json` and parses the body into `T`. A body that is not
/// a JSON object is INVALID_REQUEST; a field of the wrong type, a missing or an unknown field
/// is VALIDATION_ERROR, with the field's path in the message.
pub(crate) fn json_body<T: serde::de::DeserializeOwned>(
    req: &HttpRequest,
    body: &Bytes,
) -> Result<T, ApiError> {
    if !content_type_is(req, "application/json") {
        return Err(ApiError::new(
            ErrorCode::UnsupportedMediaType,
            "the body must be JSON sent with Content-Type: application/json",
        ));
    }
    let value = match serde_json::from_slice::<serde_json::Value>(body) {
        Ok(v @ serde_json::Value::Object(_)) => v,
        Ok(_) => {
            return Err(ApiError::new(
                ErrorCode::InvalidRequest,
                "the body must be a JSON object",
            ))
        }
        Err(e) => {
            return Err(ApiError::new(
                ErrorCode::InvalidRequest,
                format!("the body is not valid JSON ({e})"),
            ))
        }
    };
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let message = if path == "." {
            e.inner().to_string()
        } else {
            format!("{path}: {}", e.inner())
        };
        ApiError::new(ErrorCode::ValidationError, message)
    })
}

/// A request body read as `T` by [`json_body`]. Declared after the caller's own extractors
/// (`Issuer`), so that a caller without a valid key is refused before its body is read.
pub(crate) struct JsonBody<T>(pub(crate) T);

impl<T: serde::de::DeserializeOwned + 'static> FromRequest for JsonBody<T> {
    type Error = actix_web::Error;
    type Future = LocalBoxFuture<'static, Result<Self, actix_web::Error>>;

    fn from_request(req: &HttpRequest, payload: &mut Payload) -> Self::Future {
        read_body(req, payload, |req, body| json_body(req, body).map(JsonBody))
    }
}

/// An optional JSON body: none (or only whitespace) is `None`; any other must be a JSON
/// object, as [`JsonBody`] reads it.
pub(crate) struct OptionalJsonBody<T>(pub(crate) Option<T>);

impl<T: serde::de::DeserializeOwned + 'static> FromRequest for OptionalJsonBody<T> {
    type Error = actix_web::Error;
    type Future = LocalBoxFuture<'static, Result<Self, actix_web::Error>>;

    fn from_request(req: &HttpRequest, payload: &mut Payload) -> Self::Future {
        read_body(req, payload, |req, body| {
            let none = body.iter().all(u8::is_ascii_whitespace);
            Ok(OptionalJsonBody(if none {
                None
            } else {
                Some(json_body(req, body)?)
            }))
        })
    }
}

/// The body as the route's limit reads it (over it, actix's 413), then `read`.
fn read_body<B: 'static>(
    req: &HttpRequest,
    payload: &mut Payload,
    read: fn(&HttpRequest, &Bytes) -> Result<B, ApiError>,
) -> LocalBoxFuture<'static, Result<B, actix_web::Error>> {
    let req = req.clone();
    let body = Bytes::from_request(&req, payload);
    Box::pin(async move { Ok(read(&req, &body.await?)?) })
}

/// How long a request's body may take to arrive, from when the gate takes the request: a caller
/// that sends it a byte at a time holds its call this long at most (and a body of a stated
/// length its connection; actix reads a chunked one to its end, however slowly it comes).
pub(crate) const BODY_TIME: Duration = Duration::from_secs(10);

/// Whether the request announces a body (`Content-Length` above 0, or chunked).
pub(crate) fn has_body(headers: &HeaderMap) -> bool {
    headers.contains_key(header::TRANSFER_ENCODING)
        || headers
            .get(header::CONTENT_LENGTH)
            .is_some_and(|v| v.as_bytes() != b"0")
}

/// `body`, cut off with an error once [`BODY_TIME`] has passed; `late` says it was.
pub(crate) fn timed(body: Payload, late: Rc<Cell<bool>>) -> Payload {
    Payload::Stream {
        payload: Box::pin(Timed {
            body,
            deadline: Box::pin(sleep(BODY_TIME)),
            late,
        }),
    }
}

struct Timed {
    body: Payload,
    deadline: Pin<Box<Sleep>>,
    late: Rc<Cell<bool>>,
}

impl Stream for Timed {
    type Item = Result<Bytes, PayloadError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if let Poll::Ready(item) = Pin::new(&mut self.body).poll_next(cx) {
            return Poll::Ready(item);
        }
        match self.deadline.as_mut().poll(cx) {
            Poll::Ready(()) => {
                self.late.set(true);
                let late = std::io::Error::new(std::io::ErrorKind::TimedOut, "the body came too slowly");
                Poll::Ready(Some(Err(PayloadError::Io(late))))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

//! The gate: the one middleware every request passes. It assigns the request id, resolves the
//! API key, applies the rate limit (429 before any work), writes the standard error body for
//! every error response (whoever produced it), sets `X-Request-Id` and `X-RateLimit-*` on every
//! response, records metrics, and logs one line per request (route pattern, never the path:
//! verify paths hold tokens).

use std::cell::Cell;
use std::rc::Rc;
use std::time::Instant;

use actix_web::body::{BoxBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header::{self, HeaderMap, HeaderName, HeaderValue};
use actix_web::http::StatusCode;
use actix_web::middleware::Next;
use actix_web::ResponseError;
use actix_web::{web, HttpMessage, HttpRequest};
use tracing::Instrument;

use super::context::{AppState, Auth, Charged, KeepBody, RequestCtx};
use super::error::{code_for_status, ApiError, ErrorBody, ErrorCode, ErrorDetail, ErrorInfo};
use super::routes::{self, Route};
use super::{client, input};
use agentid_core::domain::{new_id, ApiKeyKind, IdPrefix};
use agentid_engine::ratelimit::{Class, Decision, RateSubject};
use agentid_engine::KeyLookup;

/// The gate of `route`: every request the route takes passes it first.
pub(crate) async fn gate(
    route: &'static Route,
    mut req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<BoxBody>, actix_web::Error> {
    let received = Instant::now();
    let request_id = new_id(IdPrefix::Request);
    let state = req
        .app_data::<web::Data<AppState>>()
        .cloned()
        .expect("AppState is registered");
    let ip = client::address(
        req.peer_addr().map(|a| a.ip()),
        req.headers(),
        &state.trusted_proxies,
    );
    // A CORS preflight is the browser's question, not a call: it counts against nothing (a
    // page verifying with a publishable key would otherwise spend its address's anonymous
    // calls on preflights, and a 429 to one is a CORS failure whose Retry-After no script
    // can read).
    // Only where a CORS layer answers it (a public route, a method it can read): elsewhere an
    // OPTIONS is a call like any other (forward auth takes every method).
    let preflight = route.public
        && req.method() == actix_web::http::Method::OPTIONS
        && req
            .headers()
            .get("access-control-request-method")
            .is_some_and(|m| actix_web::http::Method::from_bytes(m.as_bytes()).is_ok());
    let counted = route.counted && !preflight;
    let span = tracing::info_span!("request", request_id = %request_id);
    let auth = match api_key(req.headers(), route).filter(|_| !route.keyless) {
        None => Auth::Anonymous,
        Some(None) => Auth::NotBearer,
        Some(Some(key)) => match if counted {
            state.engine.authenticate(key, ip).await
        } else {
            state.engine.authenticate_known(key).await
        } {
            Ok(KeyLookup::Valid(caller)) => Auth::Key(caller),
            Ok(KeyLookup::Rejected) => Auth::Rejected,
            // Never refused where nothing is counted (`/health`): no key is looked up, the
            // call is anonymous.
            Ok(KeyLookup::Throttled(_)) if !counted => Auth::Anonymous,
            Ok(KeyLookup::Throttled(decision)) => {
                metrics::counter!("agentid_rate_limited_total", "class" => "key_lookup").increment(1);
                let res = too_many(req, &decision, "too many unknown API keys from this address");
                let _entered = span.enter();
                return Ok(finish(route, res, &state, &request_id, received, &decision));
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot check API key");
                Auth::Unverifiable
            }
        },
    };
    let class = route.class;
    // A key that does not check out still costs its address a call: no free retries (a key
    // the store could not check is the outage's, below). A publishable key (anyone has it)
    // spends its organization's calls on verify only: anywhere else it is refused, and the
    // call costs its address.
    let who = match &auth {
        Auth::Key(c) if c.kind == ApiKeyKind::Publishable && class == Class::Other => {
            RateSubject::Anonymous(ip)
        }
        Auth::Key(c) => RateSubject::Org {
            org_id: c.org.id.as_str(),
            per_minute: match class {
                Class::Verify | Class::Publishable => c.org.limits().verify_per_minute,
                Class::Other => c.org.limits().other_per_minute,
            },
        },
        _ => RateSubject::Anonymous(ip),
    };
    let limits = state.engine.rate_limits();
    let (decision, share_refused) = match &auth {
        Auth::Key(c) if counted && class == Class::Verify && c.kind == ApiKeyKind::Publishable => {
            limits
                .check_publishable_verify(c.org.id.as_str(), c.org.limits().verify_per_minute)
                .await
        }
        // A key the store could not check (an outage) is answered for the outage (503) by
        // its handler: charging its address's anonymous bucket would answer 429 instead. The
        // verify routes take such a call as one without a key: it costs what one does.
        Auth::Unverifiable if counted && class != Class::Other => (limits.check(who, class).await, false),
        Auth::Unverifiable => (limits.peek(who, class), false),
        _ if counted => (limits.check(who, class).await, false),
        _ => (limits.peek(who, class), false),
    };
    if !decision.allowed {
        let (label, why) = if share_refused {
            (
                Class::Publishable.as_str(),
                format!(
                    "publishable keys may make {} of the organization's verify calls per minute (half its \
                     limit, the rest is kept for its secret keys); that share is used up",
                    decision.limit
                ),
            )
        } else {
            (
                class.as_str(),
                format!("rate limit of {} calls per minute reached", decision.limit),
            )
        };
        metrics::counter!("agentid_rate_limited_total", "class" => label).increment(1);
        let res = too_many(req, &decision, &why);
        let _entered = span.enter();
        return Ok(finish(route, res, &state, &request_id, received, &decision));
    }
    req.extensions_mut().insert(RequestCtx { received, auth, ip });
    // A body that comes too slowly ends the call: it cannot hold its connection for long.
    let late = input::has_body(req.headers()).then(|| {
        let late = Rc::new(Cell::new(false));
        let body = req.take_payload();
        req.set_payload(input::timed(body, late.clone()));
        late
    });
    // Handlers, extractors and the CORS layer turn their errors into responses, so an `Err`
    // here is actix's own last resort; it is passed on as it is.
    let mut res = next
        .call(req)
        .instrument(span.clone())
        .await?
        .map_into_boxed_body();
    if late.is_some_and(|l| l.get()) && res.response().extensions().get::<ErrorInfo>().is_none() {
        res.response_mut().extensions_mut().insert(ErrorInfo {
            code: ErrorCode::InvalidRequest.as_str(),
            message: format!(
                "the request body did not arrive within {} s",
                input::BODY_TIME.as_secs()
            ),
        });
    }
    let _entered = span.enter();
    Ok(finish(route, res, &state, &request_id, received, &decision))
}

/// A 429 the gate answers itself: `why`, and when to retry (also as `Retry-After`).
fn too_many(req: ServiceRequest, decision: &Decision, why: &str) -> ServiceResponse<BoxBody> {
    let retry = decision.retry_after.unwrap_or(1);
    let err = ApiError::new(ErrorCode::RateLimited, format!("{why}; retry in {retry} s"))
        .with_header(header::RETRY_AFTER, HeaderValue::from(retry));
    req.into_response(err.error_response())
}

/// `Some(None)`: an Authorization header that is not `Bearer <token>`.
/// The API key the route's `key_header` carries: `Bearer <key>` in `Authorization`, the key
/// alone in any other header. `Some(None)`: a header that holds no key.
fn api_key<'h>(headers: &'h HeaderMap, route: &Route) -> Option<Option<&'h str>> {
    if !route.key_in_authorization() {
        let value = headers.get(route.key_header)?;
        return Some(value.to_str().ok().map(str::trim).filter(|k| !k.is_empty()));
    }
    bearer(headers)
}

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
    route: &'static Route,
    res: ServiceResponse<BoxBody>,
    state: &AppState,
    request_id: &str,
    received: Instant,
    limit: &Decision,
) -> ServiceResponse<BoxBody> {
    let status = res.status();
    let is_error = status.is_client_error() || status.is_server_error();
    let limit = res
        .response()
        .extensions()
        .get::<Charged>()
        .map_or(*limit, |c| c.0);
    let limit = &limit;
    let mut res = if is_error && res.response().extensions().get::<KeepBody>().is_none() && route.oauth {
        // An OAuth endpoint's errors have RFC 6749's shape, whoever made them (a 413, a 429).
        let message = res
            .response()
            .extensions()
            .get::<ErrorInfo>()
            .map(|i| i.message.clone())
            .unwrap_or_else(|| code_for_status(status).default_message().to_owned());
        let body = super::oauth::error_json(super::oauth::code_for_status(status), &message);
        res.map_body(|head, _| {
            head.headers
                .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
            head.headers
                .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
            BoxBody::new(body)
        })
    } else if is_error && res.response().extensions().get::<KeepBody>().is_none() {
        let info = res
            .response()
            .extensions()
            .get::<ErrorInfo>()
            .cloned()
            .unwrap_or_else(|| {
                let code = code_for_status(status);
                ErrorInfo {
                    code: code.as_str(),
                    message: code.default_message().to_owned(),
                }
            });
        let body = serde_json::to_string(&ErrorBody {
            error: ErrorDetail {
                docs_url: format!("{}/docs/errors#{}", state.public_url, info.code),
                code: info.code.to_owned(),
                message: info.message,
                request_id: request_id.to_owned(),
            },
        })
        .expect("error bodies serialize");
        res.map_body(|head, _| {
            head.headers
                .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
            BoxBody::new(body)
        })
    } else {
        res
    };
    let headers = res.headers_mut();
    if let Ok(v) = HeaderValue::from_str(request_id) {
        headers.insert(HeaderName::from_static("x-request-id"), v);
    }
    headers.insert(
        HeaderName::from_static("x-ratelimit-limit"),
        HeaderValue::from(limit.limit),
    );
    headers.insert(
        HeaderName::from_static("x-ratelimit-remaining"),
        HeaderValue::from(limit.remaining),
    );
    headers.insert(
        HeaderName::from_static("x-ratelimit-reset"),
        HeaderValue::from(limit.reset),
    );
    // Answers the gate makes itself (429) never reach the route's CORS layer: a browser
    // receiver must still be able to read them.
    if route.public && !headers.contains_key(header::ACCESS_CONTROL_ALLOW_ORIGIN) {
        headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, HeaderValue::from_static("*"));
        headers.insert(
            header::ACCESS_CONTROL_EXPOSE_HEADERS,
            HeaderValue::from_static(routes::EXPOSED_HEADERS),
        );
    }
    if state.is_draining() {
        // Clients move to another instance with their next call, instead of finding this
        // connection closed under it when the instance stops.
        res.response_mut()
            .head_mut()
            .set_connection_type(actix_web::http::ConnectionType::Close);
    }
    record(route, res.request(), status, received);
    res
}

fn record(route: &'static Route, req: &HttpRequest, status: StatusCode, received: Instant) {
    // The verify scope answers 404 only for a path that is not `/v1/verify/{token}` (token
    // failures are 200 answers), so such a request matched no route.
    let route = if std::ptr::eq(route, &routes::VERIFY) && status == StatusCode::NOT_FOUND {
        routes::UNMATCHED.pattern
    } else {
        route.pattern
    };
    let elapsed = received.elapsed();
    let method = method_label(req.method());
    RequestMetrics::with(route, method, status, |m| {
        m.requests.increment(1);
        m.duration.record(elapsed.as_secs_f64());
    });
    let status = status.as_u16();
    let latency_ms = elapsed.as_secs_f64() * 1000.0;
    // Successful verifications are the bulk of traffic: they log at debug.
    if status < 400 && route == routes::VERIFY.pattern {
        tracing::debug!(method, route, status, latency_ms, "request");
    } else {
        tracing::info!(method, route, status, latency_ms, "request");
    }
}

/// A request's series: `agentid_http_requests_total` and
/// `agentid_http_request_duration_seconds`, by route, method and status.
struct RequestMetrics {
    requests: metrics::Counter,
    duration: metrics::Histogram,
}

/// Which series: the addresses and lengths of the route and method labels (both `'static`,
/// so a label is the same address every time; should one text sit at two addresses, it
/// gets two entries holding the same series) and the status code.
type SeriesKey = (usize, usize, usize, usize, u16);

impl RequestMetrics {
    /// Runs `f` with the series' handles, which each HTTP worker keeps. `counter!` and
    /// `histogram!` with labels build their key (a vector of labels) and look it up in the
    /// recorder's registry, shared by every thread, on every call: keeping the handles saved
    /// ~1,100 user-space instructions a request (load/instructions-per-request).
    fn with(route: &'static str, method: &'static str, status: StatusCode, f: impl FnOnce(&RequestMetrics)) {
        thread_local! {
            static SERIES: std::cell::RefCell<std::collections::HashMap<SeriesKey, RequestMetrics>> =
                std::cell::RefCell::default();
        }
        let key = (
            route.as_ptr() as usize,
            route.len(),
            method.as_ptr() as usize,
            method.len(),
            status.as_u16(),
        );
        SERIES.with_borrow_mut(|series| {
            let m = series.entry(key).or_insert_with(|| {
                // Handles taken before the recorder is installed would count nowhere.
                agentid_engine::recorder::handle();
                RequestMetrics {
                    requests: metrics::counter!(
                        "agentid_http_requests_total",
                        "route" => route, "method" => method, "status" => status_label(status)
                    ),
                    duration: metrics::histogram!("agentid_http_request_duration_seconds", "route" => route),
                }
            });
            f(m)
        })
    }
}

/// Metric labels without an allocation for what the service answers.
fn method_label(m: &actix_web::http::Method) -> &'static str {
    use actix_web::http::Method;
    match *m {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::OPTIONS => "OPTIONS",
        Method::HEAD => "HEAD",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::PATCH => "PATCH",
        _ => "other",
    }
}

fn status_label(s: StatusCode) -> std::borrow::Cow<'static, str> {
    match s.as_u16() {
        200 => "200".into(),
        201 => "201".into(),
        204 => "204".into(),
        400 => "400".into(),
        401 => "401".into(),
        404 => "404".into(),
        429 => "429".into(),
        503 => "503".into(),
        _ => s.as_str().to_owned().into(),
    }
}

/// Unknown routes.
pub(crate) async fn no_route() -> Result<actix_web::HttpResponse, ApiError> {
    Err(ApiError::new(
        ErrorCode::NotFound,
        ErrorCode::NotFound.default_message(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each worker's handles count into the recorder's series, one series per route, method
    /// and status, however often the same request is recorded.
    #[test]
    fn request_metrics_reach_the_recorder_through_kept_handles() {
        // A route of its own: the recorder is the process's, shared with other tests.
        const ROUTE: &str = "/test/request-metrics/{id}";
        let record = |status| {
            RequestMetrics::with(ROUTE, "GET", status, |m| {
                m.requests.increment(1);
                m.duration.record(0.001);
            })
        };
        for _ in 0..3 {
            record(StatusCode::OK);
        }
        record(StatusCode::NOT_FOUND);
        std::thread::spawn(move || record(StatusCode::OK)).join().unwrap();
        let text = agentid_engine::recorder::handle().render();
        let value = |status: &str| {
            let series = format!(
                "agentid_http_requests_total{{route=\"{ROUTE}\",method=\"GET\",status=\"{status}\"}} "
            );
            let line = text.lines().find(|l| l.starts_with(&series));
            line.and_then(|l| l[series.len()..].parse::<u64>().ok())
        };
        assert_eq!(value("200"), Some(4), "{text}");
        assert_eq!(value("404"), Some(1), "{text}");
        let count = format!("agentid_http_request_duration_seconds_count{{route=\"{ROUTE}\"}} 5");
        assert!(text.contains(&count), "{text}");
    }
}

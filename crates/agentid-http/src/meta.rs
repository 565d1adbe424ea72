//! Unauthenticated service endpoints: health, public keys, error documentation.

use actix_web::http::header;
use actix_web::{web, HttpResponse};
use serde::Serialize;
use utoipa::ToSchema;

use super::context::AppState;
use super::context::KeepBody;
use super::error::{ApiError, ErrorBody, ErrorCode};
use super::schema::Timestamp;
use agentid_core::domain::Millis;

/// The health record.
#[derive(Serialize, ToSchema)]
pub(crate) struct Health {
    /// ok when healthy; unavailable when the database cannot be reached; draining while the
    /// instance finishes its work before it stops (a balancer should send it nothing new).
    #[schema(example = "ok")]
    status: &'static str,
    version: &'static str,
    #[schema(value_type = Timestamp)]
    timestamp: Millis,
}

#[utoipa::path(
    get, path = "/health", tag = "service",
    responses(
        (status = 200, description = "Healthy", body = Health),
        (status = 503, description = "The database cannot be reached (status unavailable), or the instance is stopping (status draining)", body = Health),
    ),
)]
pub(crate) async fn health(state: web::Data<AppState>) -> HttpResponse {
    let draining = state.is_draining();
    let ok = !draining && state.engine.store_healthy().await;
    let body = Health {
        status: match (ok, draining) {
            (true, _) => "ok",
            (false, true) => "draining",
            (false, false) => "unavailable",
        },
        version: env!("CARGO_PKG_VERSION"),
        timestamp: Millis::now(),
    };
    let mut res = if ok {
        HttpResponse::Ok()
    } else {
        HttpResponse::ServiceUnavailable()
    };
    let mut res = res.insert_header((header::CACHE_CONTROL, "no-store")).json(body);
    // A 503 here is the health record itself, not an error body.
    res.extensions_mut().insert(KeepBody);
    res
}

#[utoipa::path(
    get, path = "/.well-known/public-key.pem", tag = "service",
    responses((status = 200, description = "SPKI PEM of the key that signs new tokens, for offline validation (after a rotation it changes: receivers that keep several keys use jwks.json)", content_type = "application/x-pem-file", body = String)),
)]
pub async fn public_key_pem(state: web::Data<AppState>) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("application/x-pem-file")
        .insert_header((header::CACHE_CONTROL, "public, max-age=300"))
        .body(state.engine.public_keys().public_key_pem().to_owned())
}

#[utoipa::path(
    get, path = "/.well-known/jwks.json", tag = "service",
    responses(
        (status = 200, description = "JWK set of every key that validates unexpired tokens: the signing key, a key about to sign, and a replaced key until its last token expires. Cache it; on a token whose kid it lacks, fetch it again (at most once a minute). Also answers HEAD; honours If-None-Match with its ETag.", body = Object),
        (status = 304, description = "Not modified: the ETag in If-None-Match is the current one"),
    ),
)]
pub async fn jwks(state: web::Data<AppState>, req: actix_web::HttpRequest) -> HttpResponse {
    let keys = state.engine.public_keys();
    let body = keys.jwks_json();
    let etag = format!("\"{}\"", &agentid_core::keys::thumbprint_of_text(body)[..22]);
    let fresh = req
        .headers()
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == etag || t.trim() == "*"));
    let mut res = if fresh {
        HttpResponse::NotModified()
    } else {
        HttpResponse::Ok()
    };
    res.insert_header((header::CACHE_CONTROL, "public, max-age=300"))
        .insert_header((header::ETAG, etag));
    if fresh {
        return res.finish();
    }
    res.content_type("application/json").body(body.to_owned())
}

#[utoipa::path(
    get, path = "/.well-known/log-key", tag = "service",
    responses((status = 200, description = "The key that signs the audit log's checkpoints, as a C2SP signed-note verifier key: <name>+<8 hex digits of key hash>+<base64(0x01 ‖ Ed25519 public key)>", content_type = "text/plain", body = String)),
)]
pub async fn log_key(state: web::Data<AppState>) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/plain; charset=utf-8")
        .insert_header((header::CACHE_CONTROL, "public, max-age=3600"))
        .body(format!("{}\n", state.engine.transparency().verifier()))
}

#[utoipa::path(
    get, path = "/docs/errors", tag = "service",
    responses((status = 200, description = "Every error code, with an anchor per code (error.docs_url points here)", content_type = "text/html", body = String)),
)]
pub(crate) async fn error_docs() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/html; charset=utf-8")
        .insert_header((header::CACHE_CONTROL, "public, max-age=86400"))
        .body(super::error::docs_page())
}

/// Whether an `Accept` header allows a signed status list: absent, `*/*` or
/// `application/statuslist+jwt` among its media ranges (parameters ignored).
fn accepts_status_list(req: &actix_web::HttpRequest) -> bool {
    let Some(accept) = req.headers().get(header::ACCEPT) else {
        return true;
    };
    let Ok(accept) = accept.to_str() else {
        return false;
    };
    accept.split(',').any(|range| {
        let media = range.split(';').next().unwrap_or("").trim();
        media == "*/*" || media.eq_ignore_ascii_case("application/statuslist+jwt")
    })
}

#[utoipa::path(
    get, path = "/v1/status/{id}", tag = "service",
    params(("id" = String, Path, description = "The list's id, as the `uri` of a token's `status.status_list` names it")),
    responses(
        (status = 200, description = "The Token Status List (draft-ietf-oauth-status-list) as a compact JWS signed with a key in /.well-known/jwks.json: header typ statuslist+jwt; claims iss, sub (the URI), iat, exp, ttl and status_list {bits: 1, lst: base64url of the zlib-compressed bits}. The status of index i is bit i mod 8 of byte i / 8, least significant first; 1 is revoked. Public, never rate limited. Also answers HEAD; honours If-None-Match with its ETag.", content_type = "application/statuslist+jwt", body = String),
        (status = 304, description = "Not modified: the ETag in If-None-Match is the current one"),
        (status = 404, description = "NOT_FOUND: no such status list", body = ErrorBody),
        (status = 406, description = "NOT_ACCEPTABLE: the Accept header allows neither application/statuslist+jwt nor */*", body = ErrorBody),
    ),
)]
pub async fn status_list(
    state: web::Data<AppState>,
    req: actix_web::HttpRequest,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let outcome = |o: &'static str| {
        metrics::counter!("agentid_status_list_requests_total", "outcome" => o).increment(1)
    };
    if !accepts_status_list(&req) {
        outcome("not_acceptable");
        return Err(ApiError::new(
            ErrorCode::NotAcceptable,
            "a status list is served as application/statuslist+jwt: send that in Accept, or */*, or no Accept",
        ));
    }
    let Some(list) = state.engine.status_lists().get(&id) else {
        outcome("not_found");
        return Err(ApiError::new(ErrorCode::NotFound, "no such status list"));
    };
    // Never kept past the list's `exp` (a short ttl, or a publisher fallen behind).
    let max_age = list.max_age(state.engine.status_lists().config().ttl, Millis::now());
    let fresh = req
        .headers()
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == list.etag || t.trim() == "*"));
    let mut res = if fresh {
        outcome("not_modified");
        HttpResponse::NotModified()
    } else {
        outcome("ok");
        HttpResponse::Ok()
    };
    res.insert_header((header::CACHE_CONTROL, format!("public, max-age={max_age}")))
        .insert_header((header::ETAG, list.etag.clone()));
    if fresh {
        return Ok(res.finish());
    }
    Ok(res
        .content_type("application/statuslist+jwt")
        .body(list.jwt.clone()))
}

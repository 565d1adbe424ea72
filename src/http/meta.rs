//! Unauthenticated service endpoints: health, public keys, error documentation.

use actix_web::http::header;
use actix_web::{web, HttpResponse};
use serde::Serialize;
use utoipa::ToSchema;

use super::context::AppState;
use super::context::KeepBody;
use crate::domain::Millis;

/// The health record.
#[derive(Serialize, ToSchema)]
pub struct Health {
    /// ok when healthy; unavailable when the database cannot be reached; draining while the
    /// instance finishes its work before it stops (a balancer should send it nothing new).
    #[schema(example = "ok")]
    status: &'static str,
    version: &'static str,
    timestamp: Millis,
}

#[utoipa::path(
    get, path = "/health", tag = "service",
    responses(
        (status = 200, description = "Healthy", body = Health),
        (status = 503, description = "The database cannot be reached (status unavailable), or the instance is stopping (status draining)", body = Health),
    ),
)]
pub async fn health(state: web::Data<AppState>) -> HttpResponse {
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
    let etag = format!("\"{}\"", &crate::keys::thumbprint_of_text(body)[..22]);
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
pub async fn error_docs() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/html; charset=utf-8")
        .insert_header((header::CACHE_CONTROL, "public, max-age=86400"))
        .body(super::error::docs_page())
}

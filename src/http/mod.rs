//! HTTP: routes, the gate middleware, extractors, request parsing and response shapes.
//! Nothing below this module knows about actix-web.

mod agents;
mod auth;
pub mod cursor;
mod error;
mod gate;
mod log;
mod meta;
pub mod openapi;
mod verify;

use std::sync::Arc;

use actix_web::web;

use crate::engine::Engine;

pub use error::{ApiError, ErrorCode};
/// The verify answer's JSON, for the benchmarks.
#[doc(hidden)]
pub use verify::body as verify_answer_body;

/// Request bodies larger than this are refused with 413.
pub const MAX_BODY: usize = 64 * 1024;

/// What every handler can reach.
pub struct AppState {
    pub engine: Arc<Engine>,
    /// `{base_url}` of the spec, without a trailing slash.
    pub public_url: String,
}

impl AppState {
    pub fn verify_url(&self, token: &str) -> String {
        format!("{}/v1/verify/{token}", self.public_url)
    }

    pub fn public_key_url(&self) -> String {
        format!("{}/.well-known/public-key.pem", self.public_url)
    }
}

/// Builds the whole HTTP application for one worker.
pub fn app(
    state: web::Data<AppState>,
) -> actix_web::App<
    impl actix_web::dev::ServiceFactory<
        actix_web::dev::ServiceRequest,
        Config = (),
        Response = actix_web::dev::ServiceResponse<impl actix_web::body::MessageBody>,
        Error = actix_web::Error,
        InitError = (),
    >,
> {
    actix_web::App::new()
        .app_data(state)
        .app_data(web::PayloadConfig::new(MAX_BODY))
        .configure(routes)
        .default_service(web::to(gate::no_route))
        .wrap(actix_web::middleware::from_fn(gate::gate))
}

/// The pattern of the route a request matched, for metrics and logs. Each resource carries
/// its own (see `resource`): reading it back is a lookup, where `HttpRequest::match_pattern`
/// would run the router again (for verify, a regex over a 330-byte path).
#[derive(Debug, Clone, Copy)]
pub struct RoutePattern(pub &'static str);

fn resource(path: &'static str) -> actix_web::Resource {
    web::resource(path).app_data(RoutePattern(path))
}

fn routes(cfg: &mut web::ServiceConfig) {
    cfg.service(
        resource("/health")
            .wrap(meta::cors())
            .route(web::get().to(meta::health)),
    )
    .service(
        resource("/.well-known/public-key.pem")
            .wrap(meta::cors())
            .route(web::get().to(meta::public_key_pem)),
    )
    .service(
        resource("/.well-known/jwks.json")
            .wrap(meta::cors())
            .route(web::get().to(meta::jwks)),
    )
    .service(resource("/docs/errors").route(web::get().to(meta::error_docs)))
    .service(resource("/openapi.json").route(web::get().to(openapi::document)))
    // Verify is routed by its static prefix, not by the pattern's regex (see `verify::verify`).
    .service(
        web::scope("/v1/verify")
            .app_data(RoutePattern(verify::ROUTE))
            .wrap(meta::cors())
            .default_service(web::to(verify::verify)),
    )
    .service(resource("/v1/agents/register").route(web::post().to(agents::register)))
    .service(resource("/v1/agents").route(web::get().to(agents::list)))
    .service(resource("/v1/agents/{id}").route(web::get().to(agents::get)))
    .service(resource("/v1/agents/{id}/issue-token").route(web::post().to(agents::issue_token)))
    .service(resource("/v1/agents/{id}/revoke").route(web::post().to(agents::revoke)))
    .service(resource("/v1/log").route(web::get().to(log::read)));
}

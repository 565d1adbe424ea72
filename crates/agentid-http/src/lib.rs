//! HTTP: routes, the gate middleware, extractors, request parsing and response shapes.
//! Nothing below this module knows about actix-web.
#![forbid(unsafe_code)]

mod agents;
mod auth;
mod client;
mod context;
pub(crate) mod cursor;
mod domains;
mod error;
mod gate;
mod input;
mod log;
mod meta;
mod oauth;
pub(crate) mod openapi;
pub(crate) mod routes;
mod schema;
mod ssf;
mod verify;

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceFactory, ServiceRequest, ServiceResponse};
use actix_web::middleware::{from_fn, Condition};
use actix_web::web;

use routes::Route;

pub use context::AppState;
pub use error::ErrorCode;
/// The verify answer's JSON, for the benchmarks.
#[doc(hidden)]
pub use verify::body as verify_answer_body;

/// Request bodies larger than this are refused with 413.
pub(crate) const MAX_BODY: usize = 64 * 1024;

/// Builds the whole HTTP application for one worker: every route of the table, each behind
/// its own gate, and the gate of `UNMATCHED` in front of the answer to any other path.
pub fn app(
    state: web::Data<AppState>,
) -> actix_web::App<
    impl ServiceFactory<
        ServiceRequest,
        Config = (),
        Response = ServiceResponse<impl MessageBody>,
        Error = actix_web::Error,
        InitError = (),
    >,
> {
    actix_web::App::new()
        .app_data(state)
        .app_data(web::PayloadConfig::new(MAX_BODY))
        .configure(routes)
        .default_service(
            web::to(gate::no_route).wrap(from_fn(|req, next| gate::gate(&routes::UNMATCHED, req, next))),
        )
}

/// A resource for `route`: its pattern, CORS when it is public, and its gate outermost.
fn resource(
    route: &'static Route,
) -> actix_web::Resource<
    impl ServiceFactory<
        ServiceRequest,
        Config = (),
        Response = ServiceResponse<impl MessageBody>,
        Error = actix_web::Error,
        InitError = (),
    >,
> {
    web::resource(route.pattern)
        .wrap(Condition::new(route.public, routes::cors()))
        .wrap(from_fn(move |req, next| gate::gate(route, req, next)))
}

fn routes(cfg: &mut web::ServiceConfig) {
    cfg.service(resource(&routes::HEALTH).route(web::get().to(meta::health)))
        .service(resource(&routes::PUBLIC_KEY).route(web::get().to(meta::public_key_pem)))
        .service(
            resource(&routes::JWKS)
                .route(web::get().to(meta::jwks))
                .route(web::head().to(meta::jwks)),
        )
        .service(resource(&routes::LOG_KEY).route(web::get().to(meta::log_key)))
        .service(resource(&routes::ERROR_DOCS).route(web::get().to(meta::error_docs)))
        .service(resource(&routes::OPENAPI).route(web::get().to(openapi::document)))
        .service(resource(&routes::OAUTH_METADATA).route(web::get().to(oauth::metadata)))
        .service(
            resource(&routes::OAUTH_AUTHORIZE)
                .route(web::get().to(oauth::authorize))
                .route(web::post().to(oauth::authorize_form)),
        )
        .service(resource(&routes::OAUTH_TOKEN).route(web::post().to(oauth::token)))
        .service(resource(&routes::OAUTH_INTROSPECT).route(web::post().to(oauth::introspect)))
        // Before verify's scope, which would take `/v1/verify` too. Its body holds a token and
        // a proof (4 KiB each): an oversized proof, up to twice the usual body limit, is
        // answered PROOF_INVALID and recorded rather than refused unread.
        .service(
            resource(&routes::VERIFY_DPOP)
                .app_data(web::PayloadConfig::new(2 * MAX_BODY))
                .route(web::post().to(verify::verify_dpop)),
        )
        // Verify is routed by its static prefix, not by its pattern's regex (see `verify::verify`).
        .service(
            web::scope("/v1/verify")
                .wrap(Condition::new(routes::VERIFY.public, routes::cors()))
                .wrap(from_fn(|req, next| gate::gate(&routes::VERIFY, req, next)))
                .default_service(web::to(verify::verify)),
        )
        // Patterns with a `{segment}` are matched by regex, about 3,000 instructions a try with
        // regex-lite (load/instructions-per-request): they come after verify's scope, so that
        // routing a verify runs none of them.
        .service(
            resource(&routes::STATUS_LIST)
                .route(web::get().to(meta::status_list))
                .route(web::head().to(meta::status_list)),
        )
        .service(resource(&routes::REGISTER).route(web::post().to(agents::register)))
        .service(resource(&routes::AGENTS).route(web::get().to(agents::list)))
        .service(resource(&routes::AGENT).route(web::get().to(agents::get)))
        .service(resource(&routes::ISSUE_TOKEN).route(web::post().to(agents::issue_token)))
        .service(resource(&routes::REVOKE).route(web::post().to(agents::revoke)))
        .service(
            resource(&routes::DOMAINS)
                .route(web::post().to(domains::claim))
                .route(web::get().to(domains::list)),
        )
        .service(
            resource(&routes::DOMAIN)
                .route(web::get().to(domains::get))
                .route(web::delete().to(domains::release)),
        )
        .service(resource(&routes::DOMAIN_VERIFY).route(web::post().to(domains::verify)))
        .service(resource(&routes::LOG).route(web::get().to(log::read)))
        .service(resource(&routes::LOG_CHECKPOINT).route(web::get().to(log::checkpoint)))
        .service(resource(&routes::LOG_COMMITMENTS).route(web::get().to(log::commitments)))
        .service(resource(&routes::SSF_CONFIGURATION).route(web::get().to(ssf::configuration)))
        .service(
            resource(&routes::SSF_STREAMS)
                .route(web::post().to(ssf::streams::create))
                .route(web::get().to(ssf::streams::read))
                .route(web::put().to(ssf::streams::replace))
                .route(web::patch().to(ssf::streams::update))
                .route(web::delete().to(ssf::streams::delete)),
        )
        .service(
            resource(&routes::SSF_STATUS)
                .route(web::get().to(ssf::streams::status))
                .route(web::post().to(ssf::streams::set_status)),
        )
        .service(resource(&routes::SSF_SUBJECTS_ADD).route(web::post().to(ssf::events::add_subject)))
        .service(resource(&routes::SSF_SUBJECTS_REMOVE).route(web::post().to(ssf::events::remove_subject)))
        .service(resource(&routes::SSF_VERIFY).route(web::post().to(ssf::events::verify)))
        .service(resource(&routes::SSF_POLL).route(web::post().to(ssf::events::poll)))
        .service(resource(&routes::INCLUSION_PROOF).route(web::get().to(log::inclusion)))
        .service(resource(&routes::CONSISTENCY_PROOF).route(web::get().to(log::consistency)));
}

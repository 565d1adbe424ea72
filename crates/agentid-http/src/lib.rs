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
mod forward;
mod gate;
mod identity_providers;
mod input;
mod log;
mod meta;
mod oauth;
pub(crate) mod openapi;
pub(crate) mod routes;
mod schema;
mod signed;
mod ssf;
mod verify;

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceFactory, ServiceRequest, ServiceResponse};
use actix_web::middleware::{from_fn, Condition};
use actix_web::web;

use error::ErrorBody;
use openapi::{FieldRules, Shared};
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
        // A query string that does not read (a parameter given twice) names what is wrong.
        .app_data(web::QueryConfig::default().error_handler(|e, _| {
            let why = match e {
                actix_web::error::QueryPayloadError::Deserialize(d) => d.to_string(),
                other => other.to_string(),
            };
            error::ApiError::from(agentid_core::domain::ValidationError::new("query", why)).into()
        }))
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

/// Declares every route once: mounted in this order by `routes` (each handler under its
/// method, with the route's facts from `routes.rs` and its gate), and documented, each handler
/// that is listed in the first brackets joining the OpenAPI document's paths (its
/// `#[utoipa::path]` says the rest). A second bracket mounts handlers that are not documented
/// again (HEAD of a GET); `limit` raises the route's body limit; `scope` mounts a handler for
/// every path under a prefix.
macro_rules! route_table {
    (doc: { $($doc:tt)* } routes: { $($table:tt)* }) => {
        fn routes(cfg: &mut web::ServiceConfig) {
            route_table!(@mount cfg; $($table)*);
        }
        route_table!(@doc [$($doc)*] [] [] $($table)*);
    };
    (@mount $cfg:ident;) => {};
    (@mount $cfg:ident; $route:ident => scope $prefix:literal [$method:ident: $handler:path], $($rest:tt)*) => {
        $cfg.service(
            web::scope($prefix)
                .wrap(Condition::new(routes::$route.public, routes::cors()))
                .wrap(from_fn(|req, next| gate::gate(&routes::$route, req, next)))
                .default_service(web::to($handler)),
        );
        route_table!(@mount $cfg; $($rest)*);
    };
    (@mount $cfg:ident; $route:ident => [$($method:ident: $handler:path),+]
        $([$($more:ident: $also:path),+])? $(limit $limit:expr)?, $($rest:tt)*) => {
        $cfg.service(
            resource(&routes::$route)
                $(.app_data(web::PayloadConfig::new($limit)))?
                $(.route(web::$method().to($handler)))+
                $($(.route(web::$more().to($also)))+)?,
        );
        route_table!(@mount $cfg; $($rest)*);
    };
    (@doc [$($doc:tt)*] [$($done:path,)*] [$($seen:ident,)*]) => {
        /// The OpenAPI document: the routes' handlers, and what every operation shares.
        #[derive(utoipa::OpenApi)]
        #[openapi(paths($($done),*), $($doc)*)]
        pub(crate) struct ApiDoc;

        /// The facts of every route the document lists (its security comes from them).
        pub(crate) static DOCUMENTED: &[&Route] = &[$(&routes::$seen),*];
    };
    (@doc [$($doc:tt)*] [$($done:path,)*] [$($seen:ident,)*]
        $route:ident => scope $prefix:literal [$method:ident: $handler:path], $($rest:tt)*) => {
        route_table!(@doc [$($doc)*] [$($done,)* $handler,] [$($seen,)* $route,] $($rest)*);
    };
    (@doc [$($doc:tt)*] [$($done:path,)*] [$($seen:ident,)*] $route:ident => [$($method:ident: $handler:path),+]
        $([$($more:ident: $also:path),+])? $(limit $limit:expr)?, $($rest:tt)*) => {
        route_table!(@doc [$($doc)*] [$($done,)* $($handler,)+] [$($seen,)* $route,] $($rest)*);
    };
}

route_table! {
    doc: {
        info(title = "agentid"),
        components(schemas(ErrorBody)),
        modifiers(&FieldRules, &Shared),
        tags(
            (name = "agents", description = "Issuer side: secret keys (sk_live_, sk_test_)"),
            (name = "domains", description = "Issuer domains: an organization issues only under names it proved (DNS TXT or an HTTPS file) or the operator granted"),
            (name = "verify", description = "Receiver side: no credentials (a pk_ key moves you to your organization's limit)"),
            (name = "audit", description = "The hash-chained verification log: pages, signed checkpoints, inclusion and consistency proofs (RFC 9162)"),
            (name = "service", description = "Health and keys for offline validation"),
            (name = "oauth", description = "OAuth 2 authorization server: agents get access tokens for one resource with their own key (client credentials, private_key_jwt); receivers introspect them. Errors have RFC 6749's body."),
        ),
    }
    routes: {
        HEALTH => [get: meta::health] [head: meta::health],
        PUBLIC_KEY => [get: meta::public_key_pem] [head: meta::public_key_pem],
        JWKS => [get: meta::jwks] [head: meta::jwks],
        LOG_KEY => [get: meta::log_key] [head: meta::log_key],
        ERROR_DOCS => [get: meta::error_docs] [head: meta::error_docs],
        OPENAPI => [get: openapi::document] [head: openapi::document],
        OAUTH_METADATA => [get: oauth::metadata] [head: oauth::metadata],
        OAUTH_AUTHORIZE => [get: oauth::authorize, post: oauth::authorize_form],
        OAUTH_TOKEN => [post: oauth::token],
        OAUTH_INTROSPECT => [post: oauth::introspect],
        // Before verify's scope, which would take `/v1/verify` too. Its body holds a token and
        // a proof (4 KiB each): an oversized proof, up to twice the usual body limit, is
        // answered PROOF_INVALID and recorded rather than refused unread.
        VERIFY_DPOP => [post: verify::verify_dpop] limit 2 * MAX_BODY,
        // Before verify's scope too: a request's fields (each at most 8 KiB).
        VERIFY_REQUEST => [post: signed::verify_request] limit 2 * MAX_BODY,
        // Verify is routed by its static prefix, not by its pattern's regex (see `verify::verify`).
        VERIFY => scope "/v1/verify" [get: verify::verify],
        // Any method: gateways pass the guarded request's own (NGINX's auth_request does). A
        // scope, so that Envoy's form (the guarded path after the route's) reaches it too.
        FORWARD_AUTH => scope "/v1/forward-auth" [get: forward::check],
        // Patterns with a `{segment}` are matched by regex, about 3,000 instructions a try with
        // regex-lite (load/instructions-per-request): they come after verify's scope, so that
        // routing a verify runs none of them.
        STATUS_LIST => [get: meta::status_list] [head: meta::status_list],
        DIRECTORY => [get: signed::directory],
        REGISTER => [post: agents::register],
        AGENTS => [get: agents::list],
        AGENT => [get: agents::get],
        ISSUE_TOKEN => [post: agents::issue_token],
        CLIENT_SECRET => [post: agents::client_secret],
        IDENTITY_PROVIDERS => [post: identity_providers::add, get: identity_providers::list],
        IDENTITY_PROVIDER => [delete: identity_providers::remove],
        SUBJECTS_REVOKE => [post: identity_providers::revoke_subject],
        REVOKE => [post: agents::revoke],
        DOMAINS => [post: domains::claim, get: domains::list],
        DOMAIN => [get: domains::get, delete: domains::release],
        DOMAIN_VERIFY => [post: domains::verify],
        LOG => [get: log::read],
        LOG_CHECKPOINT => [get: log::checkpoint],
        LOG_COMMITMENTS => [get: log::commitments],
        SSF_CONFIGURATION => [get: ssf::configuration] [head: ssf::configuration],
        SSF_STREAMS => [
            post: ssf::streams::create,
            get: ssf::streams::read,
            put: ssf::streams::replace,
            patch: ssf::streams::update,
            delete: ssf::streams::delete
        ],
        SSF_STATUS => [get: ssf::streams::status, post: ssf::streams::set_status],
        SSF_SUBJECTS_ADD => [post: ssf::events::add_subject],
        SSF_SUBJECTS_REMOVE => [post: ssf::events::remove_subject],
        SSF_VERIFY => [post: ssf::events::verify],
        SSF_POLL => [post: ssf::events::poll],
        INCLUSION_PROOF => [get: log::inclusion],
        CONSISTENCY_PROOF => [get: log::consistency],
    }
}

//! The OpenAPI 3 document, generated from the handlers' `#[utoipa::path]` annotations and the
//! request/response types they really use. Served at `/openapi.json`. Headers and error
//! answers that every operation shares (rate limits, request id, 429, 500, auth failures) are
//! added by one modifier instead of being repeated on each handler.

use std::sync::OnceLock;

use actix_web::HttpResponse;
use agentid_core::domain::fields::{self, FieldRule};
use utoipa::openapi::path::Operation;
use utoipa::openapi::schema::{ObjectBuilder, Schema, Type};
use utoipa::openapi::security::{
    ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme,
};
use utoipa::openapi::{HeaderBuilder, RefOr, ResponseBuilder};
use utoipa::{Modify, OpenApi, PartialSchema};

use super::routes::Route;
use super::ApiDoc;
use agentid_engine::ratelimit::Class;

use super::error::{ErrorBody, ErrorCode};

/// The field rules of core (`domain::fields`) stated in the schemas of the fields that carry
/// them: written once, there, for the parsers and this document alike.
pub(crate) struct FieldRules;

const FIELD_RULES: &[(&str, &str, &FieldRule)] = &[
    ("RegisterRequest", "name", &fields::NAME),
    ("RegisterRequest", "issuer_domain", &fields::ISSUER_DOMAIN),
    ("RegisterRequest", "description", &fields::DESCRIPTION),
    ("RevokeRequest", "reason", &fields::REVOKE_REASON),
    ("ClaimRequest", "domain", &fields::ISSUER_DOMAIN),
    ("Registered", "agent_id", &fields::AGENT_ID),
    ("AgentSummary", "id", &fields::AGENT_ID),
    ("AgentDetail", "id", &fields::AGENT_ID),
    ("Issued", "agent_id", &fields::AGENT_ID),
    ("RevokedBody", "agent_id", &fields::AGENT_ID),
    ("ValidBody", "agent_id", &fields::AGENT_ID),
    ("VerifyRequest", "htm", &fields::HTTP_METHOD),
    ("SignedRequest", "method", &fields::HTTP_METHOD),
];

impl Modify for FieldRules {
    fn modify(&self, api: &mut utoipa::openapi::OpenApi) {
        let schemas = &mut api.components.get_or_insert_with(Default::default).schemas;
        for (schema, field, rule) in FIELD_RULES {
            let property = match schemas.get_mut(*schema) {
                Some(RefOr::T(Schema::Object(o))) => o.properties.get_mut(*field),
                _ => None,
            };
            let Some(RefOr::T(Schema::Object(p))) = property else {
                panic!("the document has no string field {schema}.{field} to state its rule in");
            };
            p.pattern = Some(rule.pattern.to_owned());
            p.min_length = rule.min_length;
            p.max_length = rule.max_length;
        }
    }
}

/// The shared parts of every operation.
pub(crate) struct Shared;

impl Modify for Shared {
    fn modify(&self, api: &mut utoipa::openapi::OpenApi) {
        let listed: Vec<String> = ErrorCode::ALL
            .iter()
            .map(|c| format!("{} ({})", c.as_str(), c.status().as_u16()))
            .collect();
        api.info.description = Some(format!(
            "Identity and verification for AI agents: register, issue, verify, revoke, audit. \
             Every error answer has the standard body (ErrorBody) and the same id in X-Request-Id. \
             Error codes: {}. Token failures on verify are answers (200, valid false): TOKEN_INVALID, \
             TOKEN_REVOKED, TOKEN_EXPIRED, and with a DPoP proof (POST /v1/verify) PROOF_INVALID and \
             PROOF_REPLAYED. Every response carries X-RateLimit-Limit, X-RateLimit-Remaining \
             and X-RateLimit-Reset.",
            listed.join(", ")
        ));
        let components = api.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "gateway_key",
            SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::with_description(
                "X-Agentid-Key",
                "A publishable key (pk_…) of the gateway's organization, on /v1/forward-auth",
            ))),
        );
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some("An API key: sk_live_…, sk_test_…, pk_live_…, pk_test_…"))
                    .build(),
            ),
        );
        for (path, item) in api.paths.paths.iter_mut() {
            let route = super::DOCUMENTED
                .iter()
                .find(|r| r.pattern == path)
                .unwrap_or_else(|| panic!("{path} is documented but in no route of the table"));
            for op in [
                &mut item.get,
                &mut item.post,
                &mut item.put,
                &mut item.patch,
                &mut item.delete,
                &mut item.head,
            ]
            .into_iter()
            .flatten()
            {
                op.security = security(route);
                shared_responses(op);
            }
        }
    }
}

fn error_response(code: ErrorCode) -> RefOr<utoipa::openapi::Response> {
    let codes: Vec<&str> = ErrorCode::ALL
        .iter()
        .filter(|c| c.status() == code.status())
        .map(|c| c.as_str())
        .collect();
    ResponseBuilder::new()
        .description(format!(
            "{} Standard error body; error.code one of {}",
            code.describe(),
            codes.join(", ")
        ))
        .content(
            "application/json",
            utoipa::openapi::ContentBuilder::new()
                .schema(Some(ErrorBody::schema()))
                .build(),
        )
        .into()
}

fn oauth_error_response(code: ErrorCode) -> RefOr<utoipa::openapi::Response> {
    ResponseBuilder::new()
        .description(format!(
            "RFC 6749 error body; error {}",
            super::oauth::code_for_status(code.status())
        ))
        .content(
            "application/json",
            utoipa::openapi::ContentBuilder::new()
                .schema(Some(super::oauth::OAuthErrorBody::schema()))
                .build(),
        )
        .into()
}

/// Which keys a route takes, from its facts: none for a keyless one or one charged to no
/// bucket (health), any or none for one limited like verify (a `pk_` key only moves the call
/// to its organization's limit), and a key for every other.
fn security(route: &Route) -> Option<Vec<SecurityRequirement>> {
    let key = SecurityRequirement::new("bearer", Vec::<String>::new());
    if route.keyless || !route.counted {
        return None;
    }
    if !route.key_in_authorization() {
        // Authorization carries something else there (forward auth: the agent's token).
        return Some(vec![
            SecurityRequirement::default(),
            SecurityRequirement::new("gateway_key", Vec::<String>::new()),
        ]);
    }
    Some(match route.class {
        Class::Verify => vec![SecurityRequirement::default(), key],
        Class::Other | Class::Publishable => vec![key],
    })
}

fn shared_responses(op: &mut Operation) {
    let security = op.security.as_deref().unwrap_or_default();
    // An empty requirement among the alternatives makes the key optional (verify): a bad key
    // is still refused (401), but any kind of key is accepted, so there is no 403.
    let key_optional = security.contains(&SecurityRequirement::default());
    let mut extra = vec![ErrorCode::RateLimited, ErrorCode::InternalError];
    // Every JSON body is refused alike: 415 without `Content-Type: application/json`, 400
    // when it is not a JSON object or a field breaks a rule.
    if op.request_body.is_some() {
        extra.extend([ErrorCode::UnsupportedMediaType, ErrorCode::InvalidRequest]);
    }
    if !security.is_empty() {
        extra.extend([ErrorCode::Unauthorized, ErrorCode::ServiceUnavailable]);
        if !key_optional {
            extra.push(ErrorCode::Forbidden);
        }
    }
    // An OAuth endpoint answers every error with RFC 6749's body, the gate's own too.
    let oauth = op.tags.as_ref().is_some_and(|t| t.iter().any(|t| t == "oauth"));
    for code in extra {
        op.responses
            .responses
            .entry(code.status().as_u16().to_string())
            .or_insert_with(|| {
                if oauth {
                    oauth_error_response(code)
                } else {
                    error_response(code)
                }
            });
    }
    let int = |desc: &str| {
        HeaderBuilder::new()
            .schema(ObjectBuilder::new().schema_type(Type::Integer).minimum(Some(0)))
            .description(Some(desc))
            .build()
    };
    for resp in op.responses.responses.values_mut() {
        if let RefOr::T(r) = resp {
            r.headers.insert(
                "X-RateLimit-Limit".into(),
                int("Calls allowed per minute in this bucket"),
            );
            r.headers
                .insert("X-RateLimit-Remaining".into(), int("Calls left before 429"));
            r.headers.insert(
                "X-RateLimit-Reset".into(),
                int("Unix seconds when the bucket is full again"),
            );
            r.headers.insert(
                "X-Request-Id".into(),
                HeaderBuilder::new()
                    .schema(
                        ObjectBuilder::new()
                            .schema_type(Type::String)
                            .pattern(Some("^req_[0-9a-z]{26}$")),
                    )
                    .description(Some("Request identifier, equal to error.request_id on errors"))
                    .build(),
            );
        }
    }
}

#[utoipa::path(
    get, path = "/openapi.json", tag = "service",
    responses((status = 200, description = "This document", body = Object)),
)]
pub(crate) async fn document() -> HttpResponse {
    static DOC: OnceLock<String> = OnceLock::new();
    let json = DOC.get_or_init(|| {
        ApiDoc::openapi()
            .to_pretty_json()
            .expect("the document serializes")
    });
    HttpResponse::Ok()
        .content_type("application/json")
        .body(json.as_str())
}

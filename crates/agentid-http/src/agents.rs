//! Issuer endpoints: register, list, get, issue-token, revoke.

use actix_web::http::header;
use actix_web::web;
use actix_web::HttpResponse;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::auth::Issuer;
use super::context::AppState;
use super::cursor;
use super::error::{ApiError, ErrorBody, ErrorCode};
use super::input::{agent_path, JsonBody, OptionalJsonBody};
use super::schema::Timestamp;
use agentid_core::domain::fields;
use agentid_core::domain::{
    AgentFields, AgentId, AgentStatus, Description, ExpirySeconds, IssuerDomain, Ledger, Millis, Name,
    RevokeReason, Scopes, ValidationError,
};
use agentid_core::records::AgentRecord;
use agentid_core::token::dpop::PublicJwk;
use agentid_engine::Binding;

/// `POST /v1/agents/register` body. Unknown fields are refused.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RegisterRequest {
    /// Human-readable name, 1–128 characters, no control characters, not only white space.
    #[schema(example = "Billing bot")]
    name: String,
    /// A DNS host name; stored lower-case and embedded in the token as `iss`.
    #[schema(example = "billing.example.com")]
    issuer_domain: String,
    /// 1–64 distinct scopes of the form `action:resource`.
    #[schema(min_items = 1, max_items = 64, value_type = Vec<ScopeString>, example = json!(["read:invoices"]))]
    scopes: Vec<String>,
    /// Optional context, at most 1024 characters (newline and tab allowed).
    #[serde(default)]
    description: Option<String>,
    /// Token lifetime in seconds (default 86400, or the plan's maximum when that is shorter;
    /// the plan caps one asked for: EXPIRY_TOO_LONG). A whole
    /// number, however written (`86400.0` too).
    #[schema(value_type = Option<u64>, minimum = 1, example = 86400)]
    #[serde(default)]
    expiry_seconds: Option<serde_json::Number>,
    /// Binds the token to this key (DPoP, RFC 9449): a public JWK, OKP/Ed25519 or EC/P-256.
    /// The token carries its thumbprint as `cnf.jkt`, and passes only with a proof made with
    /// the key. Without it, the token is a bearer token.
    #[schema(value_type = Option<Object>, example = json!({"kty": "OKP", "crv": "Ed25519", "x": "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"}))]
    #[serde(default)]
    jwk: Option<serde_json::Value>,
}

/// `POST /v1/agents/{id}/issue-token` body (optional).
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct IssueRequest {
    /// Binds the new token, and the agent from now on, to this key (a public JWK, as at
    /// registration). Absent: the agent's key as it stands (a bound agent stays bound). `null`:
    /// no key, a bearer token (the dropped binding is recorded).
    #[schema(value_type = Option<Object>)]
    #[serde(default, deserialize_with = "present")]
    jwk: Option<Option<serde_json::Value>>,
}

/// A field that may be absent (`None`), `null` (`Some(None)`) or a value.
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Option<serde_json::Value>>, D::Error> {
    Ok(Some(Option::deserialize(d)?))
}

/// The key a token is to be bound to, when the body names one.
fn binding(jwk: Option<&serde_json::Value>) -> Result<Option<PublicJwk>, ValidationError> {
    jwk.map(|v| PublicJwk::parse(v).map_err(|e| ValidationError::new("jwk", e.0)))
        .transpose()
}

/// One scope: `action:resource`, lower-case, at most 128 characters (the rule
/// `domain::Scopes` checks).
/// (Written by hand: the derive takes no `max_length` on a newtype.)
pub(crate) struct ScopeString;

impl utoipa::PartialSchema for ScopeString {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{ObjectBuilder, Type};
        ObjectBuilder::new()
            .schema_type(Type::String)
            .description(Some("`action:resource`, lower-case, at most 128 characters"))
            .pattern(Some(fields::SCOPE.pattern))
            .max_length(fields::SCOPE.max_length)
            .examples(["read:invoices"])
            .into()
    }
}

impl ToSchema for ScopeString {}

/// `POST /v1/agents/{id}/revoke` body (optional).
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RevokeRequest {
    /// Why; stored with the agent and in the audit log. At most 512 characters, no control characters.
    #[serde(default)]
    reason: Option<String>,
}

impl RegisterRequest {
    fn parse(self) -> Result<AgentFields, ValidationError> {
        Ok(AgentFields {
            name: Name::parse(&self.name)?,
            issuer_domain: IssuerDomain::parse(&self.issuer_domain)?,
            scopes: Scopes::parse(&self.scopes)?,
            description: Description::parse(self.description.as_deref().unwrap_or(""))?,
            expiry: self
                .expiry_seconds
                .map(|n| ExpirySeconds::from_number(&n))
                .transpose()?,
        })
    }
}

/// A newly registered agent and its first token (shown only here).
#[derive(Serialize, ToSchema)]
pub(crate) struct Registered {
    agent_id: String,
    name: String,
    /// Echoes the issuer_domain (lower-case).
    issuer: String,
    scopes: Vec<String>,
    /// Compact JWS, alg EdDSA. Shown only in this response.
    token: String,
    #[schema(value_type = Timestamp)]
    expires_at: Millis,
    /// {base_url}/v1/verify/{token}
    verify_url: String,
    /// {base_url}/.well-known/public-key.pem
    public_key_url: String,
}

#[utoipa::path(
    post, path = "/v1/agents/register", tag = "agents",
    request_body = RegisterRequest,
    responses(
        (status = 201, description = "Registered", body = Registered),
        (status = 400, description = "INVALID_REQUEST, VALIDATION_ERROR (also when the token would exceed the 4096-byte limit of a token) or EXPIRY_TOO_LONG", body = ErrorBody),
        (status = 403, description = "ISSUER_DOMAIN_NOT_VERIFIED: the organization does not hold the issuer_domain (or FORBIDDEN: a publishable key)", body = ErrorBody),
        (status = 413, description = "PAYLOAD_TOO_LARGE", body = ErrorBody),
    ),
)]
pub(crate) async fn register(
    state: web::Data<AppState>,
    Issuer(caller): Issuer,
    JsonBody(request): JsonBody<RegisterRequest>,
) -> Result<HttpResponse, ApiError> {
    let key = binding(request.jwk.as_ref())?;
    let fields = request.parse()?;
    let reg = state
        .engine
        .agents()
        .register(&caller, fields, key.as_ref())
        .await?;
    tracing::info!(agent_id = %reg.agent.id, org_id = %caller.org.id, "agent registered");
    Ok(no_store(HttpResponse::Created()).json(Registered {
        verify_url: state.verify_url(&reg.token),
        public_key_url: state.public_key_url(),
        agent_id: reg.agent.id.into(),
        name: reg.agent.name,
        issuer: reg.agent.issuer_domain.into(),
        scopes: reg.agent.scopes.into_vec(),
        token: reg.token,
        expires_at: reg.agent.expires_at,
    }))
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Active,
    Expired,
    Revoked,
}

fn status(a: &AgentRecord, now: Millis) -> Status {
    match AgentStatus::of(a.revoked_at.is_some(), a.expires_at, now) {
        AgentStatus::Active => Status::Active,
        AgentStatus::Expired => Status::Expired,
        AgentStatus::Revoked => Status::Revoked,
    }
}

/// An agent in list form.
#[derive(Serialize, ToSchema)]
pub(crate) struct AgentSummary {
    id: String,
    name: String,
    issuer_domain: String,
    scopes: Vec<String>,
    status: Status,
    #[schema(value_type = Timestamp)]
    created_at: Millis,
    /// Expiry of the latest token.
    #[schema(value_type = Timestamp)]
    expires_at: Millis,
    verification_count: i64,
}

/// An agent in full.
#[derive(Serialize, ToSchema)]
pub(crate) struct AgentDetail {
    id: String,
    name: String,
    issuer_domain: String,
    description: String,
    scopes: Vec<String>,
    status: Status,
    #[schema(value_type = Timestamp)]
    created_at: Millis,
    #[schema(value_type = Timestamp)]
    expires_at: Millis,
    #[schema(value_type = Option<Timestamp>)]
    revoked_at: Option<Millis>,
    revocation_reason: Option<String>,
    verification_count: i64,
    /// The RFC 7638 thumbprint of the key the newest token is bound to (its `cnf.jkt`); null
    /// when the newest token is a bearer token.
    #[schema(pattern = "^[A-Za-z0-9_-]{43}$")]
    jkt: Option<String>,
}

/// Paging of `GET /v1/agents`: without either, the whole array (as the spec says).
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct ListParams {
    /// Page size, 1 to 200; with it (or a cursor) the answer is one page, and a `Link:
    /// <…>; rel="next"` header names the next one while there is one.
    #[param(value_type = Option<u32>, minimum = 1, maximum = 200)]
    limit: Option<String>,
    /// Opaque cursor from the previous page's `Link` header.
    cursor: Option<String>,
}

#[utoipa::path(
    get, path = "/v1/agents", tag = "agents", params(ListParams),
    responses(
        (status = 200, description = "The caller's agents (this key's mode), newest first: all of them (sent as they are read, 1,000 at a time: a store failure past the first thousand cuts the array off, which a client sees as JSON that does not parse), or a page of `limit` with a `Link: <…>; rel=\"next\"` header (RFC 8288) while more follow", body = Vec<AgentSummary>,
         headers(("Link" = String, description = "The next page, when there is one"))),
        (status = 400, description = "VALIDATION_ERROR (limit) or INVALID_CURSOR", body = ErrorBody),
        (status = 429, description = "RATE_LIMITED: the organization's rate limit, or its unpaged lists being sent on this instance holding 16 MiB of pages already (Retry-After; a paged list is not counted)", body = ErrorBody),
    ),
)]
pub async fn list(
    state: web::Data<AppState>,
    Issuer(caller): Issuer,
    params: web::Query<ListParams>,
) -> Result<HttpResponse, ApiError> {
    let now = Millis::now();
    let summary = move |a: AgentRecord| AgentSummary {
        status: status(&a, now),
        id: a.id.into(),
        name: a.name,
        issuer_domain: a.issuer_domain.into(),
        scopes: a.scopes.into_vec(),
        created_at: a.created_at,
        expires_at: a.expires_at,
        verification_count: a.verification_count,
    };
    if params.limit.is_none() && params.cursor.is_none() {
        let listing = state.engine.agents().open_listing(&caller);
        return streamed(state.engine.clone(), caller, listing, summary).await;
    }
    let limit = super::input::page_limit(params.limit.as_deref())?;
    let ledger = Ledger {
        org_id: caller.org.id.as_str().to_owned(),
        mode: caller.mode,
    };
    let secret = state.engine.keys().mac_secret();
    let before = params
        .cursor
        .as_deref()
        .map(|c| {
            cursor::decode_agent(secret, &ledger, c)
                .as_deref()
                .and_then(AgentId::parse)
                .ok_or_else(|| {
                    ApiError::new(
                        ErrorCode::InvalidCursor,
                        "cursor was not issued for this organization and mode",
                    )
                })
        })
        .transpose()?;
    let mut page = state
        .engine
        .agents()
        .list(&caller, before.as_ref(), Some(limit + 1))
        .await?;
    let more = page.len() > limit as usize;
    page.truncate(limit as usize);
    let next = more
        .then(|| {
            page.last()
                .map(|a| cursor::encode_agent(secret, &ledger, a.id.as_str()))
        })
        .flatten();
    let mut res = HttpResponse::Ok();
    if let Some(c) = next {
        res.insert_header((
            header::LINK,
            format!(
                "<{}/v1/agents?limit={limit}&cursor={c}>; rel=\"next\"",
                state.public_url
            ),
        ));
    }
    Ok(res.json(page.into_iter().map(summary).collect::<Vec<_>>()))
}

/// Agents read at a time for the unpaged list.
const STREAMED_PAGE: u32 = 1000;

/// The unpaged list, all of the caller's agents in one JSON array, read and sent a page at a
/// time: an organization of millions of agents costs an instance one page of them in memory,
/// not all of them at once. The first page is read before the answer starts, so that a store
/// that cannot answer is a 503; a later failure cuts the answer off (an incomplete array).
async fn streamed(
    engine: std::sync::Arc<agentid_engine::Engine>,
    caller: std::sync::Arc<agentid_engine::Caller>,
    mut listing: agentid_engine::Listing,
    summary: impl Fn(AgentRecord) -> AgentSummary + Clone + 'static,
) -> Result<HttpResponse, ApiError> {
    let first = engine.agents().list(&caller, None, Some(STREAMED_PAGE)).await?;
    let (opening, last, next) = page(first, true, &summary);
    // Held until the answer is: a page of it refused (the organization's lists hold as much
    // as they may) is a 429 before it starts, and cuts it off after.
    listing.hold(opening.len())?;
    // The state: the page in hand (the first, until the answer opens with it), where the
    // next starts, whether the array is closed, and the pages' count.
    let pages = futures_util::stream::unfold(
        (Some(opening), next, last, listing),
        move |(in_hand, before, done, mut listing)| {
            let (engine, caller) = (engine.clone(), caller.clone());
            let summary = summary.clone();
            async move {
                if let Some(chunk) = in_hand {
                    return Some((Ok(web::Bytes::from(chunk)), (None, before, done, listing)));
                }
                if done {
                    return None;
                }
                let cut = |why: String| {
                    tracing::warn!(error = %why, "the agent list was cut off");
                    std::io::Error::other("the agent list could not be read on")
                };
                let rows = match engine
                    .agents()
                    .list(&caller, before.as_ref(), Some(STREAMED_PAGE))
                    .await
                {
                    Ok(rows) => rows,
                    Err(e) => return Some((Err(cut(e.to_string())), (None, None, true, listing))),
                };
                let (chunk, last, next) = page(rows, false, &summary);
                if let Err(e) = listing.hold(chunk.len()) {
                    return Some((Err(cut(e.to_string())), (None, None, true, listing)));
                }
                Some((Ok(web::Bytes::from(chunk)), (None, next, last, listing)))
            }
        },
    );
    Ok(HttpResponse::Ok()
        .content_type("application/json")
        .streaming(pages))
}

/// A page of the unpaged list as sent: its JSON (opening the array, or going on with a
/// comma; closing it after the last page), whether it is the last, and where the next starts.
fn page(
    rows: Vec<AgentRecord>,
    opening: bool,
    summary: &impl Fn(AgentRecord) -> AgentSummary,
) -> (Vec<u8>, bool, Option<AgentId>) {
    let last = rows.len() < STREAMED_PAGE as usize;
    let next = rows.last().map(|a| a.id.clone());
    let mut chunk = Vec::with_capacity(rows.len() * 256 + 2);
    if opening {
        chunk.push(b'[');
    }
    for (i, a) in rows.into_iter().enumerate() {
        if i > 0 || !opening {
            chunk.push(b',');
        }
        serde_json::to_writer(&mut chunk, &summary(a)).expect("a summary serializes");
    }
    if last {
        chunk.push(b']');
    }
    (chunk, last, next)
}

#[utoipa::path(
    get, path = "/v1/agents/{id}", tag = "agents",
    params(("id" = String, Path, description = "Agent id (agt_…)")),
    responses(
        (status = 200, description = "The agent", body = AgentDetail),
        (status = 404, description = "AGENT_NOT_FOUND", body = ErrorBody),
    ),
)]
pub async fn get(
    state: web::Data<AppState>,
    Issuer(caller): Issuer,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let a = state.engine.agents().get(&caller, &agent_path(&id)?).await?;
    Ok(HttpResponse::Ok().json(AgentDetail {
        status: status(&a, Millis::now()),
        id: a.id.into(),
        name: a.name,
        issuer_domain: a.issuer_domain.into(),
        description: a.description,
        scopes: a.scopes.into_vec(),
        created_at: a.created_at,
        expires_at: a.expires_at,
        revoked_at: a.revoked_at,
        revocation_reason: a.revocation_reason,
        verification_count: a.verification_count,
        jkt: a.jkt,
    }))
}

/// A new token (shown only here).
#[derive(Serialize, ToSchema)]
pub(crate) struct Issued {
    agent_id: String,
    token: String,
    #[schema(value_type = Timestamp)]
    expires_at: Millis,
    verify_url: String,
}

#[utoipa::path(
    post, path = "/v1/agents/{id}/issue-token", tag = "agents",
    params(("id" = String, Path, description = "Agent id (agt_…)")),
    request_body(content = Option<IssueRequest>, description = "Optional; send with Content-Type: application/json"),
    responses(
        (status = 201, description = "A new token; earlier tokens stay valid until their own expiry", body = Issued),
        (status = 400, description = "INVALID_REQUEST, or VALIDATION_ERROR: a bad jwk, or the agent's token would exceed the 4096-byte limit of a token (an agent registered before the limit was enforced)", body = ErrorBody),
        (status = 403, description = "ISSUER_DOMAIN_NOT_VERIFIED: the organization no longer holds the agent's issuer_domain (or FORBIDDEN: a publishable key)", body = ErrorBody),
        (status = 404, description = "AGENT_NOT_FOUND", body = ErrorBody),
        (status = 409, description = "AGENT_REVOKED", body = ErrorBody),
        (status = 413, description = "PAYLOAD_TOO_LARGE", body = ErrorBody),
    ),
)]
pub(crate) async fn issue_token(
    state: web::Data<AppState>,
    Issuer(caller): Issuer,
    id: web::Path<String>,
    OptionalJsonBody(body): OptionalJsonBody<IssueRequest>,
) -> Result<HttpResponse, ApiError> {
    let jwk = body.and_then(|b| b.jwk);
    let key = match &jwk {
        Some(Some(v)) => binding(Some(v))?,
        _ => None,
    };
    let how = match (&jwk, &key) {
        (_, Some(key)) => Binding::Key(key),
        (Some(None), _) => Binding::Dropped,
        _ => Binding::Same,
    };
    let issued = state
        .engine
        .agents()
        .issue_token(&caller, &agent_path(&id)?, how)
        .await?;
    tracing::info!(agent_id = %issued.agent_id, "token issued");
    Ok(no_store(HttpResponse::Created()).json(Issued {
        verify_url: state.verify_url(&issued.token),
        agent_id: issued.agent_id.into(),
        token: issued.token,
        expires_at: issued.expires_at,
    }))
}

/// A new client secret (shown only here).
#[derive(Serialize, ToSchema)]
pub(crate) struct ClientSecret {
    /// The agent's id: its OAuth client_id.
    client_id: String,
    /// For the token endpoint: client_secret_basic or client_secret_post.
    #[schema(example = "cs_…")]
    client_secret: String,
}

#[utoipa::path(
    post, path = "/v1/agents/{id}/client-secret", tag = "agents",
    params(("id" = String, Path, description = "Agent id (agt_…)")),
    responses(
        (status = 201, description = "A new client secret, shown only here (stored as its hash). The agent authenticates with it at /oauth/token (client_secret_basic, client_secret_post); the secret it replaces stays valid 24 h more, any older one ends.", body = ClientSecret),
        (status = 404, description = "AGENT_NOT_FOUND", body = ErrorBody),
        (status = 409, description = "AGENT_REVOKED", body = ErrorBody),
    ),
)]
pub(crate) async fn client_secret(
    state: web::Data<AppState>,
    Issuer(caller): Issuer,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let id = agent_path(&id)?;
    let secret = state.engine.agents().new_client_secret(&caller, &id).await?;
    Ok(no_store(HttpResponse::Created()).json(ClientSecret {
        client_id: id.into(),
        client_secret: secret,
    }))
}

/// The revocation as stored (a repeated revoke returns the first one).
#[derive(Serialize, ToSchema)]
pub(crate) struct RevokedBody {
    revoked: bool,
    agent_id: String,
    #[schema(value_type = Timestamp)]
    revoked_at: Millis,
    /// The reason given, or null when none was.
    reason: Option<String>,
}

#[utoipa::path(
    post, path = "/v1/agents/{id}/revoke", tag = "agents",
    params(("id" = String, Path, description = "Agent id (agt_…)")),
    request_body(content = Option<RevokeRequest>, description = "Optional; send with Content-Type: application/json"),
    responses(
        (status = 200, description = "Revoked (idempotent)", body = RevokedBody),
        (status = 400, description = "INVALID_REQUEST or VALIDATION_ERROR", body = ErrorBody),
        (status = 404, description = "AGENT_NOT_FOUND", body = ErrorBody),
        (status = 413, description = "PAYLOAD_TOO_LARGE", body = ErrorBody),
    ),
)]
pub async fn revoke(
    state: web::Data<AppState>,
    Issuer(caller): Issuer,
    id: web::Path<String>,
    OptionalJsonBody(body): OptionalJsonBody<RevokeRequest>,
) -> Result<HttpResponse, ApiError> {
    let reason = body
        .and_then(|b| b.reason)
        .as_deref()
        .map(RevokeReason::parse)
        .transpose()?;
    let (a, revoked_at) = state
        .engine
        .agents()
        .revoke(&caller, &agent_path(&id)?, reason)
        .await?;
    tracing::info!(agent_id = %a.id, "agent revoked");
    Ok(HttpResponse::Ok().json(RevokedBody {
        revoked: true,
        agent_id: a.id.into(),
        revoked_at,
        reason: a.revocation_reason,
    }))
}

fn no_store(mut b: actix_web::HttpResponseBuilder) -> actix_web::HttpResponseBuilder {
    b.insert_header((header::CACHE_CONTROL, "no-store"));
    b
}

/// The request-body parsers never panic: arbitrary bytes, and JSON objects with the
/// fields of a register or revoke body holding arbitrary values (fixed seed).
#[cfg(test)]
mod props {
    use actix_web::test::TestRequest;
    use actix_web::web::Bytes;
    use proptest::prelude::*;

    use super::super::input::json_body;
    use super::*;

    fn json_value() -> impl Strategy<Value = serde_json::Value> {
        let leaf = prop_oneof![
            Just(serde_json::Value::Null),
            any::<bool>().prop_map(serde_json::Value::from),
            any::<i64>().prop_map(serde_json::Value::from),
            any::<f64>().prop_map(serde_json::Value::from),
            proptest::collection::vec(any::<char>(), 0..140)
                .prop_map(|c| serde_json::Value::from(String::from_iter(c))),
        ];
        // Arrays up to 70 long: past the 64 scopes a body may hold.
        leaf.prop_recursive(2, 80, 70, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..70).prop_map(serde_json::Value::from),
                proptest::collection::hash_map("[a-z_]{0,12}", inner, 0..4)
                    .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
            ]
        })
    }

    fn fields() -> impl Strategy<Value = Vec<(&'static str, serde_json::Value)>> {
        let names = prop_oneof![
            Just("name"),
            Just("issuer_domain"),
            Just("scopes"),
            Just("description"),
            Just("expiry_seconds"),
            Just("reason"),
            Just("other"),
        ];
        proptest::collection::vec((names, json_value()), 0..7)
    }

    fn parse_both(body: &[u8]) {
        let req = TestRequest::default()
            .insert_header((header::CONTENT_TYPE, "application/json"))
            .to_http_request();
        let body = Bytes::copy_from_slice(body);
        if let Ok(r) = json_body::<RegisterRequest>(&req, &body) {
            let _ = r.parse();
        }
        let _ = json_body::<RevokeRequest>(&req, &body).map(|r| r.reason.map(|s| RevokeReason::parse(&s)));
    }

    proptest! {
        #![proptest_config(agentid_core::testing::fixed_seed(31, 256))]

        #[test]
        fn any_bytes(b in proptest::collection::vec(any::<u8>(), 0..3000)) {
            parse_both(&b);
        }

        #[test]
        fn objects_with_the_bodies_fields(f in fields()) {
            let obj: serde_json::Map<String, serde_json::Value> =
                f.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
            parse_both(serde_json::to_string(&obj).unwrap().as_bytes());
        }
    }
}

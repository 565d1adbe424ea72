//! Issuer domains: claim a name, prove it (DNS TXT or an HTTPS file), list, release. A domain
//! is its organization's in both modes: secret keys of either mode read them, and only a live
//! one changes who holds a name (a test key is handed out more freely, and a released name
//! stops its organization's live issuance).

use actix_web::http::header::{self, HeaderValue};
use actix_web::web;
use actix_web::HttpResponse;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::auth::{Issuer, LiveIssuer};
use super::context::AppState;
use super::error::{ApiError, ErrorBody, ErrorCode};
use super::input::JsonBody;
use super::schema::Timestamp;
use agentid_core::domain::holding::parse_name;
use agentid_core::domain::Millis;
use agentid_engine::domains::{DomainError, DomainView};

impl From<DomainError> for ApiError {
    fn from(e: DomainError) -> Self {
        match e {
            DomainError::Invalid(v) => v.into(),
            DomainError::NotFound(_) => ApiError::new(ErrorCode::DomainNotFound, e.to_string()),
            DomainError::TooMany { .. } | DomainError::TooManyNames { .. } => {
                ApiError::new(ErrorCode::TooManyDomains, e.to_string())
            }
            DomainError::NotVerified(found) => ApiError::new(ErrorCode::DomainNotVerified, found),
            DomainError::RateLimited(wait) | DomainError::Busy(wait) => {
                let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
                ApiError::new(ErrorCode::RateLimited, format!("{e}: retry in {secs} s"))
                    .with_header(header::RETRY_AFTER, HeaderValue::from(secs.max(1)))
            }
            DomainError::Store(s) => s.into(),
        }
    }
}

/// `POST /v1/domains` body. Unknown fields are refused.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ClaimRequest {
    /// A DNS host name, as `issuer_domain` takes it (lower-cased).
    #[schema(example = "bank.example")]
    domain: String,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub(crate) enum DomainStatus {
    Pending,
    Verified,
}

/// How the organization came to hold the name.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Method {
    /// A TXT record: the name and every name below it.
    Dns,
    /// A file at the well-known HTTPS path: that host alone.
    Https,
    /// The operator's grant: the name and every name below it.
    Operator,
    /// Its agents used the name before names were proven, and no other organization's did.
    Existing,
}

/// A domain of the caller's organization.
#[derive(Serialize, ToSchema)]
pub(crate) struct DomainBody {
    domain: String,
    status: DomainStatus,
    /// Null while pending.
    method: Option<Method>,
    /// Null while pending.
    #[schema(value_type = Option<Timestamp>)]
    verified_at: Option<Millis>,
    #[schema(value_type = Timestamp)]
    created_at: Millis,
    /// What to publish, while pending (null once verified).
    challenge: Option<ChallengeBody>,
}

/// Publish either.
#[derive(Serialize, ToSchema)]
pub(crate) struct ChallengeBody {
    dns: DnsChallenge,
    https: HttpsChallenge,
}

#[derive(Serialize, ToSchema)]
pub(crate) struct DnsChallenge {
    /// `_agentid-challenge.<domain>`
    name: String,
    /// Always TXT.
    #[serde(rename = "type")]
    kind: &'static str,
    /// `agentid-domain-verification=<value>`
    value: String,
}

#[derive(Serialize, ToSchema)]
pub(crate) struct HttpsChallenge {
    /// `https://<domain>/.well-known/agentid-domain-verification`
    url: String,
    /// What the file holds: the value alone.
    content: String,
}

/// The caller's domains.
#[derive(Serialize, ToSchema)]
pub(crate) struct DomainList {
    data: Vec<DomainBody>,
}

fn body(d: DomainView) -> DomainBody {
    use agentid_core::domain::holding::ProofMethod as M;
    DomainBody {
        status: if d.holding.is_some() {
            DomainStatus::Verified
        } else {
            DomainStatus::Pending
        },
        method: d.holding.as_ref().map(|h| match h.method {
            M::Dns => Method::Dns,
            M::Https => Method::Https,
            M::Operator => Method::Operator,
            M::Existing => Method::Existing,
        }),
        verified_at: d.holding.as_ref().map(|h| h.at),
        created_at: d.created_at,
        challenge: d.challenge.map(|c| ChallengeBody {
            dns: DnsChallenge {
                name: c.dns_name,
                kind: "TXT",
                value: c.dns_value,
            },
            https: HttpsChallenge {
                url: c.https_url,
                content: c.https_content,
            },
        }),
        domain: d.domain,
    }
}

#[utoipa::path(
    post, path = "/v1/domains", tag = "domains",
    request_body = ClaimRequest,
    responses(
        (status = 201, description = "Claimed: publish the challenge (either form), then verify", body = DomainBody),
        (status = 200, description = "The organization had claimed it, or holds it, already: as it is", body = DomainBody),
        (status = 400, description = "INVALID_REQUEST or VALIDATION_ERROR", body = ErrorBody),
        (status = 409, description = "TOO_MANY_DOMAINS: 100 claims pending already, or 1,000 names held and claimed together", body = ErrorBody),
        (status = 413, description = "PAYLOAD_TOO_LARGE", body = ErrorBody),
    ),
)]
pub(crate) async fn claim(
    state: web::Data<AppState>,
    LiveIssuer(caller): LiveIssuer,
    JsonBody(request): JsonBody<ClaimRequest>,
) -> Result<HttpResponse, ApiError> {
    let name = parse_name("domain", &request.domain)?;
    let (view, new) = state.engine.domains().claim(&caller.org.id, &name).await?;
    if new {
        tracing::info!(domain = %name.as_str(), org_id = %caller.org.id, "issuer domain claimed");
        Ok(HttpResponse::Created().json(body(view)))
    } else {
        Ok(HttpResponse::Ok().json(body(view)))
    }
}

#[utoipa::path(
    get, path = "/v1/domains", tag = "domains",
    responses((status = 200, description = "The organization's domains, held and pending, by name", body = DomainList)),
)]
pub(crate) async fn list(
    state: web::Data<AppState>,
    Issuer(caller): Issuer,
) -> Result<HttpResponse, ApiError> {
    let data = state
        .engine
        .domains()
        .list(&caller.org.id)
        .await?
        .into_iter()
        .map(body)
        .collect();
    Ok(HttpResponse::Ok().json(DomainList { data }))
}

#[utoipa::path(
    get, path = "/v1/domains/{domain}", tag = "domains",
    params(("domain" = String, Path, description = "The domain (any case)")),
    responses(
        (status = 200, description = "The domain", body = DomainBody),
        (status = 400, description = "VALIDATION_ERROR: not a host name", body = ErrorBody),
        (status = 404, description = "DOMAIN_NOT_FOUND", body = ErrorBody),
    ),
)]
pub async fn get(
    state: web::Data<AppState>,
    Issuer(caller): Issuer,
    domain: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let name = parse_name("domain", &domain)?;
    let view = state.engine.domains().get(&caller.org.id, &name).await?;
    Ok(HttpResponse::Ok().json(body(view)))
}

#[utoipa::path(
    post, path = "/v1/domains/{domain}/verify", tag = "domains",
    params(("domain" = String, Path, description = "The domain (any case)")),
    responses(
        (status = 200, description = "Verified (DNS tried first, then HTTPS); a domain held already answers as it is", body = DomainBody),
        (status = 400, description = "VALIDATION_ERROR: not a host name", body = ErrorBody),
        (status = 404, description = "DOMAIN_NOT_FOUND: not claimed", body = ErrorBody),
        (status = 422, description = "DOMAIN_NOT_VERIFIED: what each lookup found", body = ErrorBody),
        (status = 429, description = "RATE_LIMITED: 10 attempts a minute per domain, or 4 verifications of the organization's under way at once (Retry-After)", body = ErrorBody),
    ),
)]
pub async fn verify(
    state: web::Data<AppState>,
    LiveIssuer(caller): LiveIssuer,
    domain: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let name = parse_name("domain", &domain)?;
    let view = state.engine.domains().verify(&caller.org.id, &name).await?;
    tracing::info!(domain = %name.as_str(), org_id = %caller.org.id, "issuer domain verified");
    Ok(HttpResponse::Ok().json(body(view)))
}

#[utoipa::path(
    delete, path = "/v1/domains/{domain}", tag = "domains",
    params(("domain" = String, Path, description = "The domain (any case)")),
    responses(
        (status = 204, description = "Released: the organization's agents under it keep their tokens until they expire, and get no new ones"),
        (status = 400, description = "VALIDATION_ERROR: not a host name", body = ErrorBody),
        (status = 404, description = "DOMAIN_NOT_FOUND", body = ErrorBody),
    ),
)]
pub async fn release(
    state: web::Data<AppState>,
    LiveIssuer(caller): LiveIssuer,
    domain: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let name = parse_name("domain", &domain)?;
    state.engine.domains().release(&caller.org.id, &name).await?;
    tracing::info!(domain = %name.as_str(), org_id = %caller.org.id, "issuer domain released");
    Ok(HttpResponse::NoContent().finish())
}

//! Signed requests (Web Bot Auth): an issuer's signature directory, and the online check of a
//! request a receiver forwards.

use std::collections::BTreeMap;

use actix_web::http::header;
use actix_web::web::{self, Bytes};
use actix_web::{HttpRequest, HttpResponse};
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use utoipa::ToSchema;

use super::context::{self, AppState, Auth};
use super::error::{ApiError, ErrorBody, ErrorCode};
use super::input::json_body;
use super::schema::Timestamp;
use agentid_core::domain::{is_http_method, IssuerDomain, Millis, ValidationError};
use agentid_core::httpsig::Request;
use agentid_engine::signed::{CheckError, RequestPolicy, RequestResult, MAX_AGENT_URL, MAX_TRUSTED};

/// The media type of a signature directory (draft-meunier-http-message-signatures-directory).
const DIRECTORY_TYPE: &str = "application/http-message-signatures-directory+json";
/// Header fields a request may forward, and the longest method, URL and value.
const MAX_FIELDS: usize = 64;
const MAX_VALUE: usize = 8192;
const MAX_URL: usize = 4096;

#[utoipa::path(
    get, path = "/v1/directories/{issuer_domain}", tag = "verify",
    params(("issuer_domain" = String, Path, description = "The name whose agents' keys to list")),
    responses(
        (status = 200, description = "The HTTP message signatures directory of the name's live agents bound to an Ed25519 key and not revoked (application/http-message-signatures-directory+json: {\"keys\": [JWK with kid, its RFC 7638 thumbprint]}), with Cache-Control: max-age=60 and an ETag. A revoked agent's key is gone at once; test-mode agents are never listed. An agent's Signature-Agent names this URL."),
        (status = 304, description = "Not modified: the ETag in If-None-Match is the current one"),
        (status = 400, description = "VALIDATION_ERROR: not a domain name", body = ErrorBody),
        (status = 429, description = "RATE_LIMITED: this address's calls are used up", body = ErrorBody),
    ),
)]
pub(crate) async fn directory(
    state: web::Data<AppState>,
    req: HttpRequest,
    domain: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let domain = IssuerDomain::parse(&domain)?;
    let keys = state.engine.signed_requests().directory(&domain).await?;
    let body = serde_json::json!({ "keys": keys }).to_string();
    let etag = format!(
        "\"{}\"",
        URL_SAFE_NO_PAD.encode(&Sha256::digest(body.as_bytes())[..16])
    );
    let cached = req
        .headers()
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == etag || t.trim() == "*"));
    let mut res = if cached {
        HttpResponse::NotModified()
    } else {
        HttpResponse::Ok()
    };
    res.insert_header((header::CACHE_CONTROL, "max-age=60"))
        .insert_header((header::ETAG, etag));
    Ok(if cached {
        res.finish()
    } else {
        res.content_type(DIRECTORY_TYPE).body(body)
    })
}

/// `POST /v1/verify/request` body: the request as the receiver got it.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct SignedRequest {
    /// Its method.
    #[schema(example = "GET")]
    method: String,
    /// Its absolute target URI, as the agent addressed it (the receiver's public origin and
    /// the request's path and query).
    #[schema(example = "https://api.example/docs/1")]
    url: String,
    /// Its header fields, by name (at most 64): Signature-Input, Signature, Signature-Agent
    /// and those the signature covers.
    #[schema(value_type = Object)]
    headers: BTreeMap<String, String>,
    /// The tag the signature must carry (web-bot-auth).
    #[serde(default)]
    required_tag: Option<String>,
    /// Signature agents (directory URLs, at most 16) beside agentid's own whose keys the
    /// receiver takes: fetched under the outbound rule and cached as they say. Needs an API
    /// key (pk_…): each is a URL the service fetches.
    #[serde(default)]
    trusted_signature_agents: Vec<String>,
}

/// What the check found.
#[derive(Serialize, ToSchema)]
pub(crate) struct SignedAnswer {
    /// verified: signed by a key of the agentid directory it names, in its time, never seen
    /// before, the agent live. invalid: a signature that fails (with reason). unverified:
    /// no signature under the tag, or a signature agent that is not one of this service's
    /// directories (with reason).
    #[schema(example = "verified")]
    result: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    signature_agent: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    keyid: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tag: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Timestamp>)]
    created: Option<Millis>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Timestamp>)]
    expires: Option<Millis>,
    /// A verified agentid agent: its id, the name its organization proved, its scopes and
    /// its mode.
    #[serde(skip_serializing_if = "Option::is_none")]
    agent_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    issuer: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    scopes: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    livemode: Option<bool>,
}

impl From<CheckError> for ApiError {
    fn from(e: CheckError) -> Self {
        match e {
            CheckError::Unrecorded(a) => a.into(),
            CheckError::Store(s) if s.is_transient() => ApiError::new(
                ErrorCode::AuditUnavailable,
                "the store cannot be reached, so the check can be neither made nor recorded; retry shortly",
            ),
            CheckError::Store(s) => ApiError::internal(&s),
        }
    }
}

/// Signature agents a receiver trusts: at most [`MAX_TRUSTED`] http(s) URLs.
pub(crate) fn trusted_agents(urls: Vec<String>) -> Result<Vec<String>, ApiError> {
    if urls.len() > MAX_TRUSTED {
        return Err(
            ValidationError::new("trusted_signature_agents", format!("at most {MAX_TRUSTED} URLs")).into(),
        );
    }
    for u in &urls {
        let ok = (u.starts_with("https://") || u.starts_with("http://"))
            && u.len() <= MAX_AGENT_URL
            && u.bytes().all(|b| b.is_ascii_graphic());
        if !ok {
            return Err(ValidationError::new(
                "trusted_signature_agents",
                format!("{u:?} is not an http(s) URL of at most {MAX_AGENT_URL} bytes"),
            )
            .into());
        }
    }
    Ok(urls)
}

#[utoipa::path(
    post, path = "/v1/verify/request", tag = "verify",
    request_body = SignedRequest,
    responses(
        (status = 200, description = "The check of the request's HTTP message signature (RFC 9421, Web Bot Auth): its Signature-Input, Signature and Signature-Agent read as structured fields; the signature tagged required_tag (web-bot-auth); covering @authority (or @target-uri) and Signature-Agent; created and expires at most 24 h apart, created not ahead, expires not past; keyid the key's thumbprint in the directory Signature-Agent names: agentid's own (a revoked agent's key is not there; also https://<issuer domain>/.well-known/http-message-signatures-directory while an organization with agents under the name here holds it), or one in trusted_signature_agents, fetched; a nonce seen before is a replay. Recorded in the audit log before it is sent.", body = SignedAnswer),
        (status = 400, description = "INVALID_REQUEST or VALIDATION_ERROR (method, url, headers)", body = ErrorBody),
        (status = 401, description = "UNAUTHORIZED: an Authorization header with an invalid key (the check needs none), or trusted_signature_agents without a key", body = ErrorBody),
        (status = 413, description = "PAYLOAD_TOO_LARGE", body = ErrorBody),
        (status = 503, description = "AUDIT_UNAVAILABLE: the check cannot be recorded, so it is not answered", body = ErrorBody),
    ),
)]
pub(crate) async fn verify_request(
    state: web::Data<AppState>,
    req: HttpRequest,
    body: Bytes,
) -> Result<HttpResponse, ApiError> {
    let keyed = match context::auth(&req) {
        Auth::Rejected => {
            return Err(ApiError::unauthorized(
                "invalid, unknown or disabled API key (the check needs none; omit the header or send a valid pk_ key)",
            ))
        }
        Auth::NotBearer => return Err(ApiError::unauthorized(super::auth::NOT_BEARER)),
        Auth::Key(_) => true,
        Auth::Anonymous | Auth::Unverifiable => false,
    };
    let r: SignedRequest = json_body(&req, &body)?;
    if !r.trusted_signature_agents.is_empty() && !keyed {
        // Each names a URL the service may fetch: not for callers it cannot tell apart.
        return Err(ApiError::unauthorized(
            "trusted_signature_agents makes the service fetch their directories: send an API key (pk_…)",
        ));
    }
    if !is_http_method(&r.method) {
        return Err(
            ValidationError::new("method", "must be an HTTP method (1 to 32 token characters)").into(),
        );
    }
    let absolute = (r.url.starts_with("https://") || r.url.starts_with("http://"))
        && r.url.len() <= MAX_URL
        && r.url.bytes().all(|b| b.is_ascii_graphic());
    if !absolute {
        return Err(
            ValidationError::new("url", "must be an absolute http(s) URL of at most 4096 bytes").into(),
        );
    }
    if r.headers.len() > MAX_FIELDS
        || r.headers
            .iter()
            .any(|(n, v)| n.len() > 256 || v.len() > MAX_VALUE)
    {
        return Err(ValidationError::new(
            "headers",
            format!("at most {MAX_FIELDS} fields, names of 256 bytes, values of {MAX_VALUE}"),
        )
        .into());
    }
    let headers: Vec<(String, String)> = r.headers.into_iter().collect();
    let mut policy = RequestPolicy {
        trusted: trusted_agents(r.trusted_signature_agents)?,
        ..RequestPolicy::default()
    };
    match r.required_tag {
        Some(tag) if tag.is_empty() || tag.len() > 64 => {
            return Err(ValidationError::new("required_tag", "must be 1 to 64 bytes").into())
        }
        Some(tag) => policy.tag = tag,
        None => {}
    }
    let request = Request {
        method: &r.method,
        url: &r.url,
        headers: &headers,
    };
    let check = state
        .engine
        .signed_requests()
        .check(&request, &policy, context::received(&req))
        .await?;
    let sig = check.signature.as_ref();
    let agent = check
        .agent
        .as_ref()
        .filter(|_| check.result == RequestResult::Verified);
    let answer = SignedAnswer {
        result: check.result.as_str(),
        reason: check.reason.clone(),
        signature_agent: sig.and_then(|s| s.signature_agent.clone()),
        keyid: sig.map(|s| s.keyid.clone()),
        tag: sig.map(|s| s.tag.clone()),
        created: sig.map(|s| Millis::from_secs(s.created)),
        expires: sig.map(|s| Millis::from_secs(s.expires)),
        agent_id: agent.map(|a| a.id.to_string()),
        issuer: agent.map(|a| a.issuer_domain.to_string()),
        scopes: agent.map(|a| a.scopes.as_slice().to_vec()),
        livemode: agent.map(|a| a.mode == agentid_core::domain::KeyMode::Live),
    };
    Ok(HttpResponse::Ok()
        .insert_header((header::CACHE_CONTROL, "no-store"))
        .json(answer))
}

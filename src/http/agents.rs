//! Issuer endpoints: register, list, get, issue-token, revoke.

use actix_web::http::header;
use actix_web::web::{self, Bytes};
use actix_web::{HttpRequest, HttpResponse};
use serde::Serialize;
use serde_json::{Map, Value};

use super::auth::Issuer;
use super::error::{ApiError, ErrorCode};
use super::AppState;
use crate::domain::{
    AgentFields, AgentStatus, Description, ExpirySeconds, IssuerDomain, Millis, Name, RevokeReason, Scopes,
    ValidationError,
};
use crate::store::AgentRecord;

/// The body as a JSON object; enforces `Content-Type: application/json`.
fn json_object(req: &HttpRequest, body: &Bytes) -> Result<Map<String, Value>, ApiError> {
    let ct = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let essence = ct.split(';').next().unwrap_or("").trim();
    if !essence.eq_ignore_ascii_case("application/json") {
        return Err(ApiError::new(
            ErrorCode::UnsupportedMediaType,
            "the body must be JSON sent with Content-Type: application/json",
        ));
    }
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(ApiError::new(
            ErrorCode::InvalidRequest,
            "the body must be a JSON object",
        )),
        Err(e) => Err(ApiError::new(
            ErrorCode::InvalidRequest,
            format!("the body is not valid JSON ({e})"),
        )),
    }
}

fn reject_unknown(map: &Map<String, Value>, allowed: &[&str]) -> Result<(), ApiError> {
    match map.keys().find(|k| !allowed.contains(&k.as_str())) {
        Some(k) => Err(ValidationError::new("body", format!("unknown field {k:?}")).into()),
        None => Ok(()),
    }
}

fn string_field<'a>(
    map: &'a Map<String, Value>,
    field: &'static str,
) -> Result<Option<&'a str>, ValidationError> {
    match map.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(ValidationError::new(field, "must be a string")),
    }
}

fn required<T>(v: Option<T>, field: &'static str) -> Result<T, ValidationError> {
    v.ok_or_else(|| ValidationError::new(field, "is required"))
}

fn parse_registration(map: &Map<String, Value>) -> Result<AgentFields, ApiError> {
    reject_unknown(
        map,
        &["name", "issuer_domain", "scopes", "description", "expiry_seconds"],
    )?;
    let name = Name::parse(required(string_field(map, "name")?, "name")?)?;
    let issuer_domain = IssuerDomain::parse(required(string_field(map, "issuer_domain")?, "issuer_domain")?)?;
    let scopes = match map.get("scopes") {
        None | Some(Value::Null) => return Err(ValidationError::new("scopes", "is required").into()),
        Some(Value::Array(items)) => {
            let strings: Option<Vec<&str>> = items.iter().map(Value::as_str).collect();
            let strings =
                strings.ok_or_else(|| ValidationError::new("scopes", "must be an array of strings"))?;
            Scopes::parse(&strings)?
        }
        Some(_) => return Err(ValidationError::new("scopes", "must be an array of strings").into()),
    };
    let description = Description::parse(string_field(map, "description")?.unwrap_or(""))?;
    let expiry = match map.get("expiry_seconds") {
        None | Some(Value::Null) => ExpirySeconds::DEFAULT,
        Some(Value::Number(n)) => match n.as_u64() {
            Some(v) => ExpirySeconds::parse(v)?,
            None => return Err(ValidationError::new("expiry_seconds", "must be a positive integer").into()),
        },
        Some(_) => return Err(ValidationError::new("expiry_seconds", "must be a positive integer").into()),
    };
    Ok(AgentFields {
        name,
        issuer_domain,
        scopes,
        description,
        expiry,
    })
}

#[derive(Serialize)]
struct Registered {
    agent_id: String,
    name: String,
    issuer: String,
    scopes: Vec<String>,
    token: String,
    expires_at: Millis,
    verify_url: String,
    public_key_url: String,
}

pub async fn register(
    state: web::Data<AppState>,
    Issuer(caller): Issuer,
    req: HttpRequest,
    body: Bytes,
) -> Result<HttpResponse, ApiError> {
    let fields = parse_registration(&json_object(&req, &body)?)?;
    let reg = state.engine.register(&caller, fields).await?;
    tracing::info!(agent_id = %reg.agent.id, org_id = %caller.org.id, "agent registered");
    Ok(no_store(HttpResponse::Created()).json(Registered {
        verify_url: state.verify_url(&reg.token),
        public_key_url: state.public_key_url(),
        agent_id: reg.agent.id,
        name: reg.agent.name,
        issuer: reg.agent.issuer_domain,
        scopes: reg.agent.scopes,
        token: reg.token,
        expires_at: reg.agent.expires_at,
    }))
}

/// An agent in list form.
#[derive(Serialize)]
struct AgentSummary {
    id: String,
    name: String,
    issuer_domain: String,
    scopes: Vec<String>,
    status: &'static str,
    created_at: Millis,
    expires_at: Millis,
    verification_count: i64,
}

/// An agent in full.
#[derive(Serialize)]
struct AgentDetail {
    id: String,
    name: String,
    issuer_domain: String,
    description: String,
    scopes: Vec<String>,
    status: &'static str,
    created_at: Millis,
    expires_at: Millis,
    revoked_at: Option<Millis>,
    revocation_reason: Option<String>,
    verification_count: i64,
}

fn status(a: &AgentRecord, now: Millis) -> &'static str {
    AgentStatus::of(a.revoked_at.is_some(), a.expires_at, now).as_str()
}

pub async fn list(state: web::Data<AppState>, Issuer(caller): Issuer) -> Result<HttpResponse, ApiError> {
    let now = Millis::now();
    let agents: Vec<AgentSummary> = state
        .engine
        .list_agents(&caller)
        .await?
        .into_iter()
        .map(|a| AgentSummary {
            status: status(&a, now),
            id: a.id,
            name: a.name,
            issuer_domain: a.issuer_domain,
            scopes: a.scopes,
            created_at: a.created_at,
            expires_at: a.expires_at,
            verification_count: a.verification_count,
        })
        .collect();
    Ok(HttpResponse::Ok().json(agents))
}

pub async fn get(
    state: web::Data<AppState>,
    Issuer(caller): Issuer,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let a = state.engine.agent(&caller, &id).await?;
    Ok(HttpResponse::Ok().json(AgentDetail {
        status: status(&a, Millis::now()),
        id: a.id,
        name: a.name,
        issuer_domain: a.issuer_domain,
        description: a.description,
        scopes: a.scopes,
        created_at: a.created_at,
        expires_at: a.expires_at,
        revoked_at: a.revoked_at,
        revocation_reason: a.revocation_reason,
        verification_count: a.verification_count,
    }))
}

#[derive(Serialize)]
struct Issued {
    agent_id: String,
    token: String,
    expires_at: Millis,
    verify_url: String,
}

pub async fn issue_token(
    state: web::Data<AppState>,
    Issuer(caller): Issuer,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let issued = state.engine.issue_token(&caller, &id).await?;
    tracing::info!(agent_id = %issued.agent_id, "token issued");
    Ok(no_store(HttpResponse::Created()).json(Issued {
        verify_url: state.verify_url(&issued.token),
        agent_id: issued.agent_id,
        token: issued.token,
        expires_at: issued.expires_at,
    }))
}

#[derive(Serialize)]
struct RevokedBody {
    revoked: bool,
    agent_id: String,
    revoked_at: Option<Millis>,
    reason: Option<String>,
}

pub async fn revoke(
    state: web::Data<AppState>,
    Issuer(caller): Issuer,
    id: web::Path<String>,
    req: HttpRequest,
    body: Bytes,
) -> Result<HttpResponse, ApiError> {
    // The body is optional; when there is one, it must be a JSON object.
    let reason = if body.iter().all(u8::is_ascii_whitespace) {
        None
    } else {
        let map = json_object(&req, &body)?;
        reject_unknown(&map, &["reason"])?;
        string_field(&map, "reason")?
            .map(RevokeReason::parse)
            .transpose()?
    };
    let a = state.engine.revoke(&caller, &id, reason).await?;
    tracing::info!(agent_id = %a.id, "agent revoked");
    Ok(HttpResponse::Ok().json(RevokedBody {
        revoked: true,
        agent_id: a.id,
        revoked_at: a.revoked_at,
        reason: a.revocation_reason,
    }))
}

fn no_store(mut b: actix_web::HttpResponseBuilder) -> actix_web::HttpResponseBuilder {
    b.insert_header((header::CACHE_CONTROL, "no-store"));
    b
}

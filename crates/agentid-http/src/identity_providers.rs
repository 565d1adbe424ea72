//! Issuer endpoints for the identity providers an organization trusts to vouch for the people
//! its agents act for: add one, list them, remove one; and revoking a person's delegations
//! (live secret keys only).

use actix_web::web;
use actix_web::HttpResponse;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::auth::Issuer;
use super::context::AppState;
use super::error::{ApiError, ErrorBody, ErrorCode};
use super::input::JsonBody;
use super::schema::Timestamp;
use agentid_core::domain::{IdpId, Millis, ValidationError};
use agentid_core::records::IdentityProviderRecord;
use agentid_engine::identity_providers::{IdentityProviderError, Keys};

impl From<IdentityProviderError> for ApiError {
    fn from(e: IdentityProviderError) -> Self {
        match e {
            IdentityProviderError::Invalid { field, message } => ValidationError::new(field, message).into(),
            IdentityProviderError::TestMode => ApiError::new(ErrorCode::Forbidden, e.to_string()),
            IdentityProviderError::NotFound => ApiError::new(
                ErrorCode::NotFound,
                "no identity provider with this id for this organization",
            ),
            IdentityProviderError::Store(e) => e.into(),
        }
    }
}

/// `POST /v1/identity-providers` body: the issuer and its keys, inline or where it publishes
/// them (one of the two). Unknown fields are refused.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct AddRequest {
    /// Its tokens' `iss`, exactly: an https URL.
    #[schema(example = "https://idp.example")]
    issuer: String,
    /// Its public keys (RSA, EC or Ed25519), as a key set: `{"keys": [ … ]}`, 1 to 20.
    #[schema(value_type = Option<Object>)]
    #[serde(default)]
    jwks: Option<serde_json::Value>,
    /// The https URL it publishes its key set at.
    #[serde(default)]
    jwks_uri: Option<String>,
}

/// An identity provider the organization trusts.
#[derive(Serialize, ToSchema)]
pub(crate) struct IdentityProvider {
    /// `idp_…`.
    id: String,
    issuer: String,
    /// Its key set, when it was given inline.
    #[schema(value_type = Option<Object>)]
    #[serde(skip_serializing_if = "Option::is_none")]
    jwks: Option<serde_json::Value>,
    /// Where it publishes its key set, when it was given so.
    #[serde(skip_serializing_if = "Option::is_none")]
    jwks_uri: Option<String>,
    #[schema(value_type = Timestamp)]
    created_at: Millis,
}

impl From<IdentityProviderRecord> for IdentityProvider {
    fn from(r: IdentityProviderRecord) -> Self {
        IdentityProvider {
            id: r.id.into(),
            issuer: r.issuer,
            jwks: r.jwks.and_then(|j| serde_json::from_str(&j).ok()),
            jwks_uri: r.jwks_uri,
            created_at: r.created_at,
        }
    }
}

/// The organization's identity providers, oldest first.
#[derive(Serialize, ToSchema)]
pub(crate) struct IdentityProviderList {
    data: Vec<IdentityProvider>,
}

#[utoipa::path(
    post, path = "/v1/identity-providers", tag = "agents", request_body = AddRequest,
    responses(
        (status = 201, description = "Trusted", body = IdentityProvider),
        (status = 400, description = "VALIDATION_ERROR: not an https issuer, a key set of public keys or an https jwks_uri (one of the two); the issuer is trusted already; or the organization trusts 10", body = ErrorBody),
        (status = 403, description = "FORBIDDEN: a publishable or test-mode key (identity providers are trusted in live mode)", body = ErrorBody),
    ),
)]
pub(crate) async fn add(
    state: web::Data<AppState>,
    Issuer(caller): Issuer,
    JsonBody(r): JsonBody<AddRequest>,
) -> Result<HttpResponse, ApiError> {
    let keys = match (r.jwks, r.jwks_uri) {
        (Some(jwks), None) => Keys::Inline(jwks),
        (None, Some(uri)) => Keys::At(uri),
        _ => return Err(ValidationError::new("jwks", "give jwks or jwks_uri, one of the two").into()),
    };
    let idp = state
        .engine
        .identity_providers()
        .add(&caller, &r.issuer, keys)
        .await?;
    Ok(HttpResponse::Created().json(IdentityProvider::from(idp)))
}

#[utoipa::path(
    get, path = "/v1/identity-providers", tag = "agents",
    responses(
        (status = 200, description = "The organization's identity providers, oldest first", body = IdentityProviderList),
        (status = 403, description = "FORBIDDEN: a publishable or test-mode key", body = ErrorBody),
    ),
)]
pub(crate) async fn list(
    state: web::Data<AppState>,
    Issuer(caller): Issuer,
) -> Result<HttpResponse, ApiError> {
    let all = state.engine.identity_providers().list(&caller).await?;
    Ok(HttpResponse::Ok().json(IdentityProviderList {
        data: all.into_iter().map(IdentityProvider::from).collect(),
    }))
}

#[utoipa::path(
    delete, path = "/v1/identity-providers/{id}", tag = "agents",
    params(("id" = String, Path, description = "Identity provider id (idp_…)")),
    responses(
        (status = 204, description = "No longer trusted"),
        (status = 403, description = "FORBIDDEN: a publishable or test-mode key", body = ErrorBody),
        (status = 404, description = "NOT_FOUND: no such identity provider of this organization", body = ErrorBody),
    ),
)]
pub(crate) async fn remove(
    state: web::Data<AppState>,
    Issuer(caller): Issuer,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let id = IdpId::parse(&id).ok_or(IdentityProviderError::NotFound)?;
    state.engine.identity_providers().remove(&caller, &id).await?;
    Ok(HttpResponse::NoContent().finish())
}

/// `POST /v1/subjects/revoke` body: a person, as their identity provider names them.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RevokeSubjectRequest {
    /// The identity provider's issuer (https URL), as the token's sub_id.iss says it.
    #[schema(example = "https://idp.example")]
    iss: String,
    /// The person's sub at that provider (1 to 255 bytes).
    #[schema(example = "alice")]
    sub: String,
}

/// A person's delegations revoked.
#[derive(Serialize, ToSchema)]
pub(crate) struct SubjectRevoked {
    iss: String,
    sub: String,
    /// Every delegated token for the person issued until then fails online.
    #[schema(value_type = Timestamp)]
    revoked_at: Millis,
}

#[utoipa::path(
    post, path = "/v1/subjects/revoke", tag = "agents", request_body = RevokeSubjectRequest,
    responses(
        (status = 200, description = "Every delegated token the organization's agents hold for this person, issued until now, fails online verification and introspection at once; an OpenID CAEP session-revoked event (sub_id iss_sub) goes to the organization's live Shared Signals streams that carry revocations. A token the person gets after this (a new sign-in) is not affected.", body = SubjectRevoked),
        (status = 400, description = "VALIDATION_ERROR: iss is not an https URL, or sub is empty or over 255 bytes", body = ErrorBody),
        (status = 403, description = "FORBIDDEN: a publishable or test-mode key", body = ErrorBody),
    ),
)]
pub(crate) async fn revoke_subject(
    state: web::Data<AppState>,
    Issuer(caller): Issuer,
    JsonBody(r): JsonBody<RevokeSubjectRequest>,
) -> Result<HttpResponse, ApiError> {
    let at = state
        .engine
        .identity_providers()
        .revoke_subject(&caller, &r.iss, &r.sub)
        .await?;
    Ok(HttpResponse::Ok().json(SubjectRevoked {
        iss: r.iss,
        sub: r.sub,
        revoked_at: at,
    }))
}

//! What a token request says, before anything is checked, and how one is refused: the form's
//! fields, the grants and types they may name, and RFC 6749's errors. The token endpoint
//! (`super`) and the delegation grants (`crate::delegation`) both speak it.

use agentid_store::StoreError;

use crate::audit::AuditError;

/// `grant_type` of the client credentials grant (RFC 6749 §4.4).
pub const CLIENT_CREDENTIALS: &str = "client_credentials";
/// `client_assertion_type` of a JWT client assertion (RFC 7523 §2.2).
pub const JWT_BEARER_ASSERTION: &str = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer";
/// `grant_type` of token exchange (RFC 8693 §2.1).
pub const TOKEN_EXCHANGE: &str = "urn:ietf:params:oauth:grant-type:token-exchange";
/// `grant_type` of a JWT authorization grant (RFC 7523 §2.1), which carries an ID-JAG.
pub const JWT_BEARER_GRANT: &str = "urn:ietf:params:oauth:grant-type:jwt-bearer";
/// The header `typ` of an ID-JAG.
pub const ID_JAG_TYP: &str = "oauth-id-jag+jwt";
/// The grant profile metadata advertises (`authorization_grant_profiles_supported`).
pub const ID_JAG_PROFILE: &str = "urn:ietf:params:oauth:grant-profile:id-jag";
/// Token types a subject token may be (RFC 8693 §3), and the type handed out.
pub const ID_TOKEN_TYPE: &str = "urn:ietf:params:oauth:token-type:id_token";
pub const JWT_TYPE: &str = "urn:ietf:params:oauth:token-type:jwt";
pub const ACCESS_TOKEN_TYPE: &str = "urn:ietf:params:oauth:token-type:access_token";

/// A refused token request, as RFC 6749 §5.2 (with RFC 8707's `invalid_target` and RFC
/// 9449's `invalid_dpop_proof`) names it; each with what to tell the client.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OAuthError {
    #[error("invalid_request: {0}")]
    InvalidRequest(String),
    #[error("invalid_client: {0}")]
    InvalidClient(String),
    #[error("unsupported_grant_type: {0}")]
    UnsupportedGrantType(String),
    #[error("invalid_grant: {0}")]
    InvalidGrant(String),
    #[error("invalid_scope: {0}")]
    InvalidScope(String),
    #[error("invalid_target: {0}")]
    InvalidTarget(String),
    #[error("invalid_dpop_proof: {0}")]
    InvalidDpopProof(String),
    /// The request could not be checked or recorded (the store): nothing was handed out.
    #[error("temporarily_unavailable: {0}")]
    Unavailable(String),
    /// Something unexpected failed (no detail for the client; the log has it).
    #[error("server_error")]
    ServerError,
    /// The client's organization used its limit up (429, with the bucket's state).
    #[error("temporarily_unavailable: the rate limit of the agent's organization is used up")]
    RateLimited(crate::ratelimit::Decision),
}

impl OAuthError {
    /// The `error` code (RFC 6749 §5.2).
    pub fn code(&self) -> &'static str {
        match self {
            OAuthError::InvalidRequest(_) => "invalid_request",
            OAuthError::InvalidClient(_) => "invalid_client",
            OAuthError::UnsupportedGrantType(_) => "unsupported_grant_type",
            OAuthError::InvalidGrant(_) => "invalid_grant",
            OAuthError::InvalidScope(_) => "invalid_scope",
            OAuthError::InvalidTarget(_) => "invalid_target",
            OAuthError::InvalidDpopProof(_) => "invalid_dpop_proof",
            OAuthError::Unavailable(_) | OAuthError::RateLimited(_) => "temporarily_unavailable",
            OAuthError::ServerError => "server_error",
        }
    }

    /// The `error_description`.
    pub fn description(&self) -> &str {
        match self {
            OAuthError::InvalidRequest(d)
            | OAuthError::InvalidClient(d)
            | OAuthError::UnsupportedGrantType(d)
            | OAuthError::InvalidGrant(d)
            | OAuthError::InvalidScope(d)
            | OAuthError::InvalidTarget(d)
            | OAuthError::InvalidDpopProof(d)
            | OAuthError::Unavailable(d) => d,
            OAuthError::ServerError => "an unexpected error occurred",
            OAuthError::RateLimited(_) => "the rate limit of the agent's organization is used up",
        }
    }
}

impl From<StoreError> for OAuthError {
    fn from(e: StoreError) -> Self {
        if e.is_transient() {
            tracing::warn!(error = %e, "token request: the store is unavailable");
            OAuthError::Unavailable(match e {
                StoreError::Busy => "every database connection is in use; retry shortly".into(),
                _ => "the database cannot be reached; retry shortly".into(),
            })
        } else {
            tracing::error!(error = %e, "token request: the store failed");
            OAuthError::ServerError
        }
    }
}

impl From<AuditError> for OAuthError {
    fn from(e: AuditError) -> Self {
        OAuthError::Unavailable(format!("the request could not be recorded ({e}); retry shortly"))
    }
}

/// A token request (`POST /oauth/token`) as its form said it; every value unchecked.
#[derive(Clone, Default)]
pub struct TokenRequest<'a> {
    pub grant_type: Option<&'a str>,
    pub client_id: Option<&'a str>,
    /// `client_secret_post`'s, or `client_secret_basic`'s.
    pub client_secret: Option<&'a str>,
    pub client_assertion_type: Option<&'a str>,
    pub client_assertion: Option<&'a str>,
    pub scope: Option<&'a str>,
    pub resources: Vec<&'a str>,
    /// Token exchange's logical targets (RFC 8693 §2.1), each one of `resources`.
    pub audiences: Vec<&'a str>,
    /// The request's `DPoP` header.
    pub dpop: Option<&'a str>,
    /// Token exchange (RFC 8693 §2.1).
    pub subject_token: Option<&'a str>,
    pub subject_token_type: Option<&'a str>,
    pub actor_token: Option<&'a str>,
    pub requested_token_type: Option<&'a str>,
    /// A JWT authorization grant (RFC 7523 §2.1): an ID-JAG.
    pub assertion: Option<&'a str>,
}

/// What a secret shows in `Debug`: whether there is one, never what it is.
fn hidden(secret: Option<&str>) -> Option<&'static str> {
    secret.map(|_| "…")
}

impl std::fmt::Debug for TokenRequest<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenRequest")
            .field("grant_type", &self.grant_type)
            .field("client_id", &self.client_id)
            .field("client_secret", &hidden(self.client_secret))
            .field("client_assertion_type", &self.client_assertion_type)
            .field("client_assertion", &hidden(self.client_assertion))
            .field("scope", &self.scope)
            .field("resources", &self.resources)
            .field("audiences", &self.audiences)
            .field("dpop", &hidden(self.dpop))
            .field("subject_token", &hidden(self.subject_token))
            .field("subject_token_type", &self.subject_token_type)
            .field("actor_token", &hidden(self.actor_token))
            .field("requested_token_type", &self.requested_token_type)
            .field("assertion", &hidden(self.assertion))
            .finish()
    }
}

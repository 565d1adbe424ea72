//! agentid as an OAuth 2 authorization server: its metadata (RFC 8414), the token endpoint
//! (client credentials with `private_key_jwt`, RFC 7523; resources, RFC 8707; DPoP, RFC
//! 9449), token introspection (RFC 7662), and an authorization endpoint that refuses every
//! browser flow. Errors have RFC 6749 §5.2's body, `{"error", "error_description"}`.

use actix_web::http::header;
use actix_web::http::StatusCode;
use actix_web::web::Bytes;
use actix_web::{web, HttpRequest, HttpResponse};
use base64::Engine as _;
use serde::Serialize;
use utoipa::ToSchema;

use super::context::{self, AppState, Auth, Charged, KeepBody};
use super::input::content_type_is;
use super::verify::Cnf;
use agentid_core::domain::KeyMode;
use agentid_core::token::policy::Policy;
use agentid_core::token::Audience;
use agentid_core::token::{Actor, SubjectId};
use agentid_engine::oauth::{OAuthError, TokenRequest, CLIENT_CREDENTIALS};
use agentid_engine::oauth::{ID_JAG_PROFILE, JWT_BEARER_GRANT, TOKEN_EXCHANGE};
use agentid_engine::{Presentation, Verification, VerifyError};

/// RFC 6749 §5.2's error body.
#[derive(Serialize, ToSchema)]
pub(crate) struct OAuthErrorBody<'a> {
    /// The error code: invalid_request, invalid_client, unsupported_grant_type,
    /// invalid_scope, invalid_target (RFC 8707), invalid_dpop_proof (RFC 9449),
    /// unsupported_response_type (the authorization endpoint), temporarily_unavailable (a
    /// rate limit or an outage: retry after Retry-After), server_error.
    #[schema(example = "invalid_client")]
    error: &'a str,
    /// What was wrong, for people.
    error_description: &'a str,
}

/// An error body as RFC 6749 §5.2 has it.
pub(crate) fn error_json(code: &str, description: &str) -> String {
    serde_json::to_string(&OAuthErrorBody {
        error: code,
        error_description: description,
    })
    .expect("error bodies serialize")
}

/// The code of an error answer no handler wrote (the gate's 429, actix's 413).
pub(crate) fn code_for_status(status: StatusCode) -> &'static str {
    match status.as_u16() {
        401 => "invalid_client",
        429 | 503 => "temporarily_unavailable",
        s if s < 500 => "invalid_request",
        _ => "server_error",
    }
}

/// An OAuth error answer: its status, its body (kept as it is by the gate), `no-store`, and
/// `Retry-After` when it is worth a retry.
fn refusal(e: &OAuthError) -> HttpResponse {
    let status = match e {
        OAuthError::InvalidClient(_) => StatusCode::UNAUTHORIZED,
        OAuthError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        OAuthError::ServerError => StatusCode::INTERNAL_SERVER_ERROR,
        OAuthError::RateLimited(_) => StatusCode::TOO_MANY_REQUESTS,
        _ => StatusCode::BAD_REQUEST,
    };
    let mut res = HttpResponse::build(status);
    res.insert_header((header::CACHE_CONTROL, "no-store"));
    if status == StatusCode::SERVICE_UNAVAILABLE {
        res.insert_header((header::RETRY_AFTER, crate::error::RETRY_AFTER_SECONDS));
    }
    let mut res = res
        .content_type("application/json")
        .body(error_json(e.code(), e.description()));
    res.extensions_mut().insert(KeepBody);
    res
}

/// The authorization server's metadata (RFC 8414 §2).
#[derive(Serialize, ToSchema)]
pub(crate) struct Metadata {
    /// The service's public URL, exactly (no trailing slash): the `iss` of its access tokens.
    #[schema(example = "https://id.example.com")]
    issuer: String,
    authorization_endpoint: String,
    token_endpoint: String,
    introspection_endpoint: String,
    jwks_uri: String,
    /// None: agents use no browser flow (the authorization endpoint refuses every request).
    response_types_supported: [&'static str; 0],
    grant_types_supported: [&'static str; 3],
    /// The ID-JAG profile (urn:ietf:params:oauth:grant-profile:id-jag): a person's identity
    /// provider vouches for them with an ID-JAG at the jwt-bearer grant.
    authorization_grant_profiles_supported: [&'static str; 1],
    token_endpoint_auth_methods_supported: [&'static str; 3],
    token_endpoint_auth_signing_alg_values_supported: [&'static str; 2],
    introspection_endpoint_auth_methods_supported: [&'static str; 1],
    dpop_signing_alg_values_supported: [&'static str; 2],
}

const ALGS: [&str; 2] = ["EdDSA", "ES256"];

#[utoipa::path(
    get, path = "/.well-known/oauth-authorization-server", tag = "oauth",
    responses((status = 200, description = "The OAuth 2 authorization server's metadata (RFC 8414). agentid is no OpenID provider: /.well-known/openid-configuration answers 404.", body = Metadata)),
)]
pub(crate) async fn metadata(state: web::Data<AppState>) -> HttpResponse {
    let issuer = state.engine.oauth().issuer();
    let body = Metadata {
        authorization_endpoint: format!("{issuer}/oauth/authorize"),
        token_endpoint: format!("{issuer}/oauth/token"),
        introspection_endpoint: format!("{issuer}/oauth/introspect"),
        jwks_uri: format!("{issuer}/.well-known/jwks.json"),
        issuer: issuer.to_owned(),
        response_types_supported: [],
        grant_types_supported: [CLIENT_CREDENTIALS, TOKEN_EXCHANGE, JWT_BEARER_GRANT],
        authorization_grant_profiles_supported: [ID_JAG_PROFILE],
        token_endpoint_auth_methods_supported: [
            "private_key_jwt",
            "client_secret_basic",
            "client_secret_post",
        ],
        token_endpoint_auth_signing_alg_values_supported: ALGS,
        introspection_endpoint_auth_methods_supported: ["none"],
        dpop_signing_alg_values_supported: ALGS,
    };
    HttpResponse::Ok()
        .insert_header((header::CACHE_CONTROL, "public, max-age=300"))
        .json(body)
}

#[utoipa::path(
    get, path = "/oauth/authorize", tag = "oauth",
    responses((status = 400, description = "unsupported_response_type, always: agents get tokens with the client credentials grant at the token endpoint, and no browser flow is offered (nor any redirect made).", body = OAuthErrorBody)),
)]
pub(crate) async fn authorize() -> HttpResponse {
    refusal_with(
        "unsupported_response_type",
        "agentid offers no browser flow: an agent gets its tokens at the token endpoint with the \
         client_credentials grant and private_key_jwt",
    )
}

#[utoipa::path(
    post, path = "/oauth/authorize", tag = "oauth",
    responses((status = 400, description = "unsupported_response_type, always, as for GET.", body = OAuthErrorBody)),
)]
pub(crate) async fn authorize_form() -> HttpResponse {
    authorize().await
}

fn refusal_with(code: &str, description: &str) -> HttpResponse {
    let mut res = HttpResponse::BadRequest()
        .insert_header((header::CACHE_CONTROL, "no-store"))
        .content_type("application/json")
        .body(error_json(code, description));
    res.extensions_mut().insert(KeepBody);
    res
}

/// A form body (`application/x-www-form-urlencoded`): its pairs, decoded.
struct Form(Vec<(String, String)>);

impl Form {
    fn parse(req: &HttpRequest, body: &Bytes) -> Result<Form, OAuthError> {
        if !content_type_is(req, "application/x-www-form-urlencoded") {
            return Err(OAuthError::InvalidRequest(
                "the body must be a form sent with Content-Type: application/x-www-form-urlencoded".into(),
            ));
        }
        Ok(Form(
            form_urlencoded::parse(body)
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect(),
        ))
    }

    /// A parameter that may be sent once (RFC 6749 §3.2); an empty value is no value.
    fn one(&self, name: &str) -> Result<Option<&str>, OAuthError> {
        let mut values = self.0.iter().filter(|(k, _)| k == name).map(|(_, v)| v.as_str());
        match (values.next(), values.next()) {
            (_, Some(_)) => Err(OAuthError::InvalidRequest(format!(
                "{name} is sent more than once"
            ))),
            (v, None) => Ok(v.filter(|v| !v.is_empty())),
        }
    }

    fn all(&self, name: &str) -> Vec<&str> {
        self.0
            .iter()
            .filter(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
            .collect()
    }
}

/// The token endpoint's form (RFC 6749 §4.4.2, RFC 7523 §2.2, RFC 8707 §2, RFC 8693 §2.1).
#[derive(ToSchema)]
#[allow(dead_code)]
pub(crate) struct TokenForm {
    /// client_credentials; urn:ietf:params:oauth:grant-type:token-exchange (an agent acting
    /// for a person, or taking a task handed on); urn:ietf:params:oauth:grant-type:jwt-bearer
    /// (an ID-JAG).
    #[schema(example = "client_credentials")]
    grant_type: String,
    /// Token exchange: the person's token from an identity provider the organization trusts
    /// (aud the agent's id or this issuer), or a delegated agentid token whose aud includes
    /// this issuer (handed on by another agent of the organization).
    subject_token: Option<String>,
    /// Token exchange: urn:ietf:params:oauth:token-type:id_token, …:jwt or …:access_token.
    subject_token_type: Option<String>,
    /// Token exchange: absent or urn:ietf:params:oauth:token-type:access_token.
    requested_token_type: Option<String>,
    /// jwt-bearer: an ID-JAG (typ oauth-id-jag+jwt) from an identity provider the organization
    /// trusts: aud this issuer, client_id the agent, exp at most 300 s ahead, a jti used once;
    /// its resource is the token's aud.
    assertion: Option<String>,
    /// private_key_jwt: urn:ietf:params:oauth:client-assertion-type:jwt-bearer.
    client_assertion_type: Option<String>,
    /// private_key_jwt: a JWT signed by the agent's bound key (EdDSA or ES256): iss and sub the
    /// agent's id, aud this issuer or the token endpoint, exp at most 300 s after iat, a jti
    /// used once.
    client_assertion: Option<String>,
    /// The agent's id (agt_…); optional with an assertion (it names it), required with
    /// client_secret_post.
    client_id: Option<String>,
    /// client_secret_post: the agent's client secret (POST /v1/agents/{id}/client-secret).
    /// Or send the id and secret as `Authorization: Basic` (client_secret_basic).
    client_secret: Option<String>,
    /// Scopes asked for, space-separated, all of them the agent's; absent: all of them.
    scope: Option<String>,
    /// The absolute URI of the service the token is for (the token's aud); repeat it for
    /// several, at most 10.
    #[schema(example = "https://api.example.com/mcp")]
    resource: Vec<String>,
    /// Token exchange's logical target (RFC 8693): each must be one of the resources asked
    /// for (the token's audience is its resources).
    audience: Vec<String>,
}

/// A token handed out (RFC 6749 §5.1).
#[derive(Serialize, ToSchema)]
pub(crate) struct TokenAnswer<'a> {
    /// An RFC 9068 access token (JWT, typ at+jwt, EdDSA).
    access_token: &'a str,
    /// Bearer, or DPoP when the request came with a DPoP proof (the token carries cnf.jkt).
    #[schema(example = "Bearer")]
    token_type: &'a str,
    /// Seconds until it expires.
    expires_in: i64,
    /// The scopes granted, space-separated.
    scope: &'a str,
    /// Token exchange only (RFC 8693 §2.2.1): urn:ietf:params:oauth:token-type:access_token.
    #[serde(skip_serializing_if = "Option::is_none")]
    issued_token_type: Option<&'static str>,
}

#[utoipa::path(
    post, path = "/oauth/token", tag = "oauth",
    request_body(content = TokenForm, content_type = "application/x-www-form-urlencoded"),
    params(("DPoP" = Option<String>, Header, description = "A DPoP proof (RFC 9449 §5: htm POST, htu this endpoint) to bind the token to its key")),
    responses(
        (status = 200, description = "The access token. Recorded in the agent's audit log before it is sent.", body = TokenAnswer),
        (status = 400, description = "invalid_request, unsupported_grant_type, invalid_scope, invalid_target or invalid_dpop_proof", body = OAuthErrorBody),
        (status = 401, description = "invalid_client: an unknown, revoked or unbound agent, a bad, expired or replayed assertion, or a client secret that is not the agent's", body = OAuthErrorBody),
        (status = 413, description = "invalid_request: the body is over 64 KiB", body = OAuthErrorBody),
        (status = 429, description = "temporarily_unavailable: the rate limit of the agent's organization (or, for failed requests, of this address) is used up; retry after Retry-After", body = OAuthErrorBody),
        (status = 500, description = "server_error", body = OAuthErrorBody),
        (status = 503, description = "temporarily_unavailable: the database cannot be reached or the request cannot be recorded", body = OAuthErrorBody),
    ),
)]
pub(crate) async fn token(state: web::Data<AppState>, req: HttpRequest, body: Bytes) -> HttpResponse {
    // A client that failed to authenticate is challenged, whichever way it tried: RFC 6749
    // §5.2 asks it of the header's, and RFC 9110 §15.5.2 of every 401 (Basic: the one scheme
    // of the header the endpoint takes).
    let refusal = |e: &OAuthError| {
        let mut res = refusal(e);
        if matches!(e, OAuthError::InvalidClient(_)) {
            res.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Basic realm=\"agentid\""),
            );
        }
        res
    };
    let form = match Form::parse(&req, &body) {
        Ok(f) => f,
        Err(e) => return refusal(&e),
    };
    let basic = match basic_credentials(&req) {
        Ok(b) => b,
        Err(e) => return refusal(&e),
    };
    let request = match token_request(&form, &req, basic.as_ref()) {
        Ok(r) => r,
        Err(e) => return refusal(&e),
    };
    let oauth = state.engine.oauth();
    if let Err(e) = oauth.check_request(&request) {
        return refusal(&e);
    }
    let limits = state.engine.rate_limits();
    let ip = context::client_ip(&req);
    // Every request holds a cell of its address's bucket of failed ones while its client is
    // checked, kept only when the client fails: an address whose failed requests used the
    // bucket up is refused before any check.
    let cell = limits.hold_failed_client(ip);
    if !cell.decision().allowed {
        return too_many(
            cell.decision(),
            "too many failed token requests from this address",
        );
    }
    let received = context::received(&req);
    let client = match oauth.authenticate(&request, received).await {
        Ok(c) => {
            drop(cell);
            c
        }
        Err(OAuthError::RateLimited(charged)) => {
            drop(cell);
            return too_many(charged, "the rate limit of the agent's organization is used up");
        }
        Err(e) => {
            let mut res = refusal(&e);
            if matches!(e, OAuthError::InvalidClient(_)) {
                res.extensions_mut().insert(Charged(cell.failed()));
            }
            return res;
        }
    };
    let charged = client.charged;
    let mut res = match oauth.issue(&client, &request, received).await {
        Ok(t) => HttpResponse::Ok()
            .insert_header((header::CACHE_CONTROL, "no-store"))
            .insert_header((header::PRAGMA, "no-cache"))
            .json(TokenAnswer {
                access_token: &t.token,
                token_type: t.token_type,
                expires_in: t.expires_in,
                scope: &t.scope,
                issued_token_type: t.issued_token_type,
            }),
        Err(e) => refusal(&e),
    };
    res.extensions_mut().insert(Charged(charged));
    res
}

fn too_many(decision: agentid_engine::ratelimit::Decision, why: &str) -> HttpResponse {
    metrics::counter!("agentid_rate_limited_total", "class" => "oauth_token").increment(1);
    let retry = decision.retry_after.unwrap_or(1);
    let mut res = HttpResponse::TooManyRequests()
        .insert_header((header::CACHE_CONTROL, "no-store"))
        .insert_header((header::RETRY_AFTER, retry))
        .content_type("application/json")
        .body(error_json(
            "temporarily_unavailable",
            &format!("{why}; retry in {retry} s"),
        ));
    res.extensions_mut().insert(KeepBody);
    res.extensions_mut().insert(Charged(decision));
    res
}

/// `Authorization: Basic` credentials (client_secret_basic, RFC 6749 §2.3.1): the client id
/// and secret, each form-urlencoded before the pair was base64-encoded. `None` without the
/// header or with another scheme.
fn basic_credentials(req: &HttpRequest) -> Result<Option<(String, String)>, OAuthError> {
    let Some(value) = req.headers().get(header::AUTHORIZATION) else {
        return Ok(None);
    };
    let bad =
        || OAuthError::InvalidClient("Authorization: Basic must hold base64(client_id:client_secret)".into());
    let value = value.to_str().map_err(|_| bad())?;
    let Some((scheme, encoded)) = value.split_once(' ') else {
        return Ok(None);
    };
    if !scheme.eq_ignore_ascii_case("basic") {
        return Ok(None);
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .map_err(|_| bad())?;
    let decoded = String::from_utf8(decoded).map_err(|_| bad())?;
    let (id, secret) = decoded.split_once(':').ok_or_else(bad)?;
    let unescape = |s: &str| -> String {
        form_urlencoded::parse(format!("v={s}").as_bytes())
            .next()
            .map(|(_, v)| v.into_owned())
            .unwrap_or_default()
    };
    Ok(Some((unescape(id), unescape(secret))))
}

fn token_request<'a>(
    form: &'a Form,
    req: &'a HttpRequest,
    basic: Option<&'a (String, String)>,
) -> Result<TokenRequest<'a>, OAuthError> {
    let mut client_id = form.one("client_id")?;
    let mut client_secret = form.one("client_secret")?;
    if let Some((id, secret)) = basic {
        // RFC 6749 §2.3.1: the header, or the body, not both.
        if client_secret.is_some() {
            return Err(OAuthError::InvalidRequest(
                "a client secret in both Authorization: Basic and the body: send it one way".into(),
            ));
        }
        if client_id.is_some_and(|c| c != id) {
            return Err(OAuthError::InvalidRequest(
                "client_id in the body is not the one in Authorization: Basic".into(),
            ));
        }
        client_id = Some(id.as_str());
        client_secret = Some(secret.as_str());
    }
    let dpop = match req.headers().get_all("dpop").collect::<Vec<_>>()[..] {
        [] => None,
        [one] => Some(
            one.to_str()
                .map_err(|_| OAuthError::InvalidDpopProof("the DPoP header is not ASCII".into()))?,
        ),
        _ => return Err(OAuthError::InvalidDpopProof("more than one DPoP header".into())),
    };
    Ok(TokenRequest {
        grant_type: form.one("grant_type")?,
        client_id,
        client_secret,
        client_assertion_type: form.one("client_assertion_type")?,
        client_assertion: form.one("client_assertion")?,
        scope: form.one("scope")?,
        resources: form.all("resource"),
        audiences: form.all("audience"),
        dpop,
        subject_token: form.one("subject_token")?,
        subject_token_type: form.one("subject_token_type")?,
        actor_token: form.one("actor_token")?,
        requested_token_type: form.one("requested_token_type")?,
        assertion: form.one("assertion")?,
    })
}

/// The introspection endpoint's form (RFC 7662 §2.1).
#[derive(ToSchema)]
#[allow(dead_code)]
pub(crate) struct IntrospectForm {
    /// The token: an access token or an agent token.
    token: String,
    /// Ignored: every token agentid issues is looked at alike.
    token_type_hint: Option<String>,
}

/// What introspection says of a token (RFC 7662 §2.2): `{"active": false}` alone, or the
/// token's facts.
#[derive(Serialize, ToSchema)]
pub(crate) struct Introspection<'a> {
    active: bool,
    /// The token's issuer: agentid's URL for an access token, the issuer domain for an
    /// agent token.
    #[serde(skip_serializing_if = "Option::is_none")]
    iss: Option<&'a str>,
    /// The agent; for a delegated token, the person it acts for (as sub_id's provider names
    /// them).
    #[serde(skip_serializing_if = "Option::is_none")]
    sub: Option<&'a str>,
    /// The agent (an agent is its own OAuth client); for a delegated token, the agent acting.
    #[serde(skip_serializing_if = "Option::is_none")]
    client_id: Option<&'a str>,
    /// A delegated token's person (RFC 9493 iss_sub).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    sub_id: Option<&'a SubjectId>,
    /// A delegated token's chain of agents (RFC 8693 §4.1): the one acting, and inside it
    /// (act) the one that handed it the task, and so on.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    act: Option<&'a Actor>,
    /// An access token's resources: a string, or an array of several.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    aud: Option<&'a Audience>,
    /// The scopes, space-separated.
    #[serde(skip_serializing_if = "Option::is_none")]
    scope: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    exp: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    iat: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    jti: Option<&'a str>,
    /// Bearer, or DPoP for a token bound to a key (whose proof the receiver must check).
    #[serde(skip_serializing_if = "Option::is_none")]
    token_type: Option<&'static str>,
    /// The name the agent's organization proved.
    #[serde(skip_serializing_if = "Option::is_none")]
    issuer_domain: Option<&'a str>,
    /// False for a test-mode token.
    #[serde(skip_serializing_if = "Option::is_none")]
    livemode: Option<bool>,
    /// The key a bound token is bound to (RFC 7800).
    #[serde(skip_serializing_if = "Option::is_none")]
    cnf: Option<Cnf<'a>>,
}

#[utoipa::path(
    post, path = "/oauth/introspect", tag = "oauth",
    request_body(content = IntrospectForm, content_type = "application/x-www-form-urlencoded"),
    responses(
        (status = 200, description = "What the token is (RFC 7662): active only when it verifies now (signature, agent, revocation at once, expiry), and a test-mode token only to a caller sending a test-mode key (`pk_test_…`). Recorded in the audit log like a verification.", body = Introspection),
        (status = 400, description = "invalid_request: no token, or not a form", body = OAuthErrorBody),
        (status = 401, description = "invalid_client: an Authorization header with an invalid API key (introspection needs none)", body = OAuthErrorBody),
        (status = 413, description = "invalid_request: the body is over 64 KiB", body = OAuthErrorBody),
        (status = 429, description = "temporarily_unavailable: the verify rate limit of this address (or of the pk_ key's organization) is used up", body = OAuthErrorBody),
        (status = 500, description = "server_error", body = OAuthErrorBody),
        (status = 503, description = "temporarily_unavailable: the verification cannot be recorded", body = OAuthErrorBody),
    ),
)]
pub(crate) async fn introspect(state: web::Data<AppState>, req: HttpRequest, body: Bytes) -> HttpResponse {
    if let Auth::Rejected = context::auth(&req) {
        // The key came in `Authorization`: the challenge names its scheme (RFC 6749 §5.2).
        let mut res = refusal(&OAuthError::InvalidClient(
            "invalid, unknown or disabled API key (introspection needs none; omit the header or send a valid pk_ key)"
                .into(),
        ));
        res.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            header::HeaderValue::from_static("Bearer"),
        );
        return res;
    }
    let token = match Form::parse(&req, &body).and_then(|f| f.one("token").map(|t| t.map(str::to_owned))) {
        Ok(Some(t)) => t,
        Ok(None) => return refusal(&OAuthError::InvalidRequest("token is required".into())),
        Err(e) => return refusal(&e),
    };
    // A test-mode token is active only to a caller with a test-mode key: a receiver's
    // introspection takes live tokens alone, as forward auth and the receiver libraries do.
    let policy = Policy {
        allow_test: matches!(context::auth(&req), Auth::Key(c) if c.mode == KeyMode::Test),
        ..Policy::default()
    };
    let v = match state
        .engine
        .verify()
        .verify_for(
            &token,
            Presentation::Token,
            Some(&policy),
            context::received(&req),
            crate::verify::fixed_part,
        )
        .await
    {
        Ok(v) => v,
        Err(e) => return refusal(&unverified(e)),
    };
    HttpResponse::Ok()
        .insert_header((header::CACHE_CONTROL, "no-store"))
        .content_type("application/json")
        .body(introspection_json(&v))
}

fn unverified(e: VerifyError) -> OAuthError {
    match e {
        VerifyError::AgentUnreadable(s) if !s.is_transient() => {
            tracing::error!(error = %s, "introspection: the token's agent could not be read");
            OAuthError::ServerError
        }
        e => {
            // The store's own words stay in the service's log, not in the answer.
            tracing::warn!(error = %e, "introspection: not recorded");
            OAuthError::Unavailable("the introspection could not be recorded; retry shortly".into())
        }
    }
}

/// The introspection answer of a verification.
pub(crate) fn introspection_json(v: &Verification) -> String {
    let Some(valid) = &v.valid else {
        return r#"{"active":false}"#.to_owned();
    };
    let c = &valid.token.claims;
    serde_json::to_string(&Introspection {
        active: true,
        iss: Some(&c.iss),
        sub: Some(&c.sub),
        client_id: Some(c.agent_id()),
        sub_id: c.sub_id.as_ref(),
        act: c.act.as_ref(),
        aud: c.aud.as_ref(),
        scope: Some(c.granted().join(" ")),
        exp: Some(c.exp),
        iat: Some(c.iat),
        jti: Some(&c.jti),
        token_type: Some(if c.cnf.is_some() { "DPoP" } else { "Bearer" }),
        issuer_domain: Some(c.issuer_domain()),
        livemode: Some(valid.agent.mode == agentid_core::domain::KeyMode::Live),
        cnf: c.cnf.as_ref().map(|c| Cnf { jkt: &c.jkt }),
    })
    .expect("introspection answers serialize")
}

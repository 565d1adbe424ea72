//! `/v1/forward-auth`: the subrequest a gateway makes before it lets a request through (NGINX
//! `auth_request`, Caddy `forward_auth`, Traefik ForwardAuth, Envoy `ext_authz` over HTTP).
//! The agent's token comes as the request brought it (`Authorization: Bearer` or `DPoP`, with
//! the `DPoP` proof header); the request it guards, as the gateway's forwarded headers name it,
//! read only from the peers `--forward-auth-trusted-peers` names; the receiver's policy, from
//! the query string of the URL in the gateway's configuration. Envoy, which appends the
//! guarded path to the URL it calls and keeps the guarded method, calls
//! `/v1/forward-auth/<guarded path>` with the policy in `X-Agentid-Policy`: there the guarded
//! request is the call's own method, path and query, the query never read as policy. Every call is verified and
//! recorded as `POST /v1/verify` is, and answered with no body and the agent's facts in
//! `X-Agent-*` headers, or refused as the receiver libraries refuse (401 or 403 with their
//! `WWW-Authenticate`, 503 with `Retry-After`). A request without `Authorization` that an
//! agent signed (Web Bot Auth: `Signature-Input`, `Signature`, `Signature-Agent`) is checked as
//! `POST /v1/verify/request` checks it, for the configured origin and the forwarded path and
//! query.

use actix_web::http::header::{self, HeaderMap, HeaderName, HeaderValue};
use actix_web::{web, HttpRequest, HttpResponse};
use serde::Deserialize;
use utoipa::IntoParams;

use super::context::{self, AppState, Auth};
use super::error::{ApiError, ErrorBody, ErrorCode};
use super::routes::FORWARD_AUTH;
use super::verify::fixed_part;
use agentid_core::domain::{is_http_method, IssuerDomain, Scopes, ValidationError, VerifyResult};
use agentid_core::token::absolute_uri;
use agentid_core::token::policy::{Policy, PolicyRefusal};
use agentid_engine::signed::{RequestPolicy, RequestResult};
use agentid_engine::{Presentation, Presented, ProofError, Verification};

/// The proof algorithms a DPoP challenge names (as the receiver libraries name them).
const DPOP_ALGS: &str = "EdDSA Ed25519 ES256";
/// The most values of a policy parameter, and the longest value.
const MAX_VALUES: usize = 16;
const MAX_VALUE_LEN: usize = 2048;
/// Where Envoy's configuration names the policy (its calls' query strings are the caller's).
const POLICY_HEADER: &str = "x-agentid-policy";

/// The receiver's policy, set in the gateway's configuration (the URL it calls). Unknown
/// parameters are refused, so a misspelt one cannot silently weaken the policy.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)] // the document's; the query is read by `policy`
pub(crate) struct ForwardAuthParams {
    /// The receiver's resource identifier (repeatable: any of them): only access tokens for
    /// it pass, never an agent token, which names no audience.
    audience: Option<Vec<String>>,
    /// A scope every request through this gateway needs (repeatable: all of them).
    scope: Option<Vec<String>>,
    /// An issuer domain the receiver trusts (repeatable: any of them).
    issuer: Option<Vec<String>>,
    /// The receiver's public origin (`https://api.example`): a DPoP proof must name it and the
    /// forwarded path. Without it, DPoP-bound tokens are refused.
    origin: Option<String>,
    /// A signed request's signature agent (a directory URL) the receiver trusts beside
    /// agentid's own (repeatable, at most 16).
    signature_agent: Option<Vec<String>>,
    /// The tag a signed request's signature must carry (web-bot-auth).
    required_tag: Option<String>,
    /// `true` lets test-mode tokens (`livemode: false`) through; without it they are refused.
    allow_test: Option<bool>,
}

/// The policy and origin a forward-auth URL names, and what it trusts of signed requests.
struct Configured {
    policy: Policy,
    origin: Option<String>,
    signed: RequestPolicy,
}

fn invalid(field: &'static str, message: impl Into<String>) -> ApiError {
    ValidationError::new(field, message).into()
}

fn configured(query: &str) -> Result<Configured, ApiError> {
    let mut out = Configured {
        policy: Policy::default(),
        origin: None,
        signed: RequestPolicy::default(),
    };
    for (name, value) in form_urlencoded::parse(query.as_bytes()) {
        if value.len() > MAX_VALUE_LEN {
            return Err(invalid("query", format!("{name} is over {MAX_VALUE_LEN} bytes")));
        }
        let list = match name.as_ref() {
            "audience" => {
                absolute_uri(&value).map_err(|why| invalid("audience", why))?;
                &mut out.policy.audiences
            }
            "scope" => {
                Scopes::parse(&[value.as_ref()]).map_err(ApiError::from)?;
                &mut out.policy.scopes
            }
            "issuer" => {
                let domain = IssuerDomain::parse(&value)
                    .map_err(|_| invalid("issuer", "must be a DNS host name such as example.com"))?;
                if out.policy.issuers.len() == MAX_VALUES {
                    return Err(invalid("query", format!("at most {MAX_VALUES} values of {name}")));
                }
                out.policy.issuers.push(domain.into());
                continue;
            }
            "allow_test" => {
                out.policy.allow_test = match value.as_ref() {
                    "true" => true,
                    "false" => false,
                    _ => return Err(invalid("allow_test", "must be true or false")),
                };
                continue;
            }
            "signature_agent" => {
                let mut trusted = std::mem::take(&mut out.signed.trusted);
                trusted.push(value.into_owned());
                out.signed.trusted = super::signed::trusted_agents(trusted)?;
                continue;
            }
            "required_tag" => {
                if value.is_empty() || value.len() > 64 {
                    return Err(invalid("required_tag", "must be 1 to 64 bytes"));
                }
                out.signed.tag = value.into_owned();
                continue;
            }
            "origin" => {
                if out.origin.is_some() {
                    return Err(invalid("origin", "is given twice"));
                }
                out.origin = Some(origin(&value)?);
                continue;
            }
            other => {
                return Err(invalid(
                    "query",
                    format!(
                        "{other:?} is not audience, scope, issuer, origin, signature_agent, required_tag or allow_test"
                    ),
                ))
            }
        };
        if list.len() == MAX_VALUES {
            return Err(invalid("query", format!("at most {MAX_VALUES} values of {name}")));
        }
        list.push(value.into_owned());
    }
    Ok(out)
}

/// `scheme://host[:port]`, http or https, without a path: the origin a proof's `htu` starts with.
fn origin(s: &str) -> Result<String, ApiError> {
    let rest = s
        .strip_prefix("https://")
        .or_else(|| s.strip_prefix("http://"))
        .unwrap_or("");
    let authority = rest.strip_suffix('/').unwrap_or(rest);
    let ok = !authority.is_empty()
        && authority
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-.:[]".contains(&b));
    if !ok {
        return Err(invalid(
            "origin",
            "must be scheme://host[:port] (http or https, no path), e.g. https://api.example",
        ));
    }
    Ok(s.strip_suffix('/').unwrap_or(s).to_owned())
}

/// The guarded request's method and path, from the gateway's forwarded headers, and only
/// from a trusted peer: Traefik and Caddy send `X-Forwarded-Method` and `X-Forwarded-Uri`,
/// NGINX configurations `X-Original-Method` and `X-Original-URL` (or `-URI`). The target keeps
/// its query, which a signature may cover (a DPoP proof's `htu` names the URL without it),
/// and is never read as policy.
///
/// Every line of every one of these headers must name the same request: a gateway that sets
/// one family and passes the client's headers on would otherwise let the client's other
/// family (or a second line) choose the method and path a proof or signature is held to.
/// Disagreeing lines name no request, and a check that needs one is refused.
fn forwarded(headers: &HeaderMap) -> (Option<String>, Option<String>) {
    fn one<T: PartialEq>(headers: &HeaderMap, names: &[&str], read: impl Fn(&str) -> Option<T>) -> Option<T> {
        let mut found = None;
        for value in names.iter().flat_map(|n| headers.get_all(*n)) {
            let value = value
                .to_str()
                .ok()
                .map(str::trim)
                .filter(|v| !v.is_empty() && v.len() <= MAX_VALUE_LEN)
                .and_then(&read)?;
            match &found {
                Some(f) if *f != value => return None,
                Some(_) => {}
                None => found = Some(value),
            }
        }
        found
    }
    let method = one(headers, &["x-forwarded-method", "x-original-method"], |m| {
        is_http_method(m).then(|| m.to_owned())
    });
    let target = one(
        headers,
        &["x-forwarded-uri", "x-original-url", "x-original-uri"],
        target_of,
    );
    (method, target)
}

/// The path and query of a request target, also of an absolute one
/// (`https://host/path?query`), without its fragment.
fn target_of(target: &str) -> Option<String> {
    let target = match target.split_once("://") {
        Some((_, rest)) if !target.starts_with('/') => rest.find(['/', '?']).map_or("/", |i| &rest[i..]),
        _ => target,
    };
    let target = target.split('#').next().unwrap_or("");
    let target = match target.strip_prefix('?') {
        Some(query) => format!("/?{query}"),
        None => target.to_owned(),
    };
    (target.starts_with('/') && target.bytes().all(|b| b.is_ascii_graphic())).then_some(target)
}

/// How the agent presented its token.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Scheme {
    Bearer,
    Dpop,
}

/// The challenge of a refusal, as the receiver libraries write it (RFC 6750 §3, RFC 9449 §7.1).
fn challenge(code: ErrorCode, scheme: Scheme, scopes: &[String]) -> String {
    let proof = matches!(code, ErrorCode::ProofInvalid | ErrorCode::ProofReplayed);
    let (error, extra) = match code {
        ErrorCode::InsufficientScope => ("insufficient_scope", format!(", scope=\"{}\"", scopes.join(" "))),
        _ if proof && scheme == Scheme::Dpop => ("invalid_dpop_proof", String::new()),
        _ => ("invalid_token", String::new()),
    };
    if scheme == Scheme::Dpop || proof {
        format!("DPoP error=\"{error}\"{extra}, algs=\"{DPOP_ALGS}\"")
    } else {
        format!("Bearer error=\"{error}\"{extra}")
    }
}

/// The challenge to a request that sent no token: either scheme will do.
fn bare() -> String {
    format!("Bearer, DPoP algs=\"{DPOP_ALGS}\"")
}

fn refused(code: ErrorCode, message: impl Into<String>, challenge: String) -> ApiError {
    let value = HeaderValue::from_str(&challenge).unwrap_or(HeaderValue::from_static("Bearer"));
    ApiError::new(code, message).with_header(header::WWW_AUTHENTICATE, value)
}

/// The answer to a recorded verification.
fn answer(v: &Verification, scheme: Scheme, policy: &Policy) -> Result<HttpResponse, ApiError> {
    let (code, message) = match (v.result, v.proof_error, &v.policy_error) {
        (VerifyResult::Valid, _, _) => return Ok(pass(v)),
        (_, Some(ProofError::Replayed), _) => {
            (ErrorCode::ProofReplayed, "the DPoP proof was used before".into())
        }
        (_, Some(ProofError::Invalid), _) => (
            ErrorCode::ProofInvalid,
            "no DPoP proof made with the token's key for this request".into(),
        ),
        (_, _, Some(PolicyRefusal::InsufficientScope(missing))) => (
            ErrorCode::InsufficientScope,
            format!("the token does not grant {}", missing.join(" ")),
        ),
        (_, _, Some(PolicyRefusal::NotForReceiver(why))) => (ErrorCode::TokenInvalid, why.clone()),
        (VerifyResult::Revoked, _, _) => (ErrorCode::TokenRevoked, "the agent is revoked".into()),
        (VerifyResult::Expired, _, _) => (ErrorCode::TokenExpired, "the token has expired".into()),
        _ => (ErrorCode::TokenInvalid, "the token is not valid".into()),
    };
    Err(refused(code, message, challenge(code, scheme, &policy.scopes)))
}

/// The headers a pass names the agent in, which a gateway copies over the caller's own.
const AGENT_HEADERS: [&str; 7] = [
    "x-agent-id",
    "x-agent-issuer",
    "x-agent-scopes",
    "x-agent-client-id",
    "x-agent-subject",
    "x-agent-subject-issuer",
    "x-agent-signature-agent",
];

/// 200, no body, the agent's facts in [`AGENT_HEADERS`]: every one always, empty where it
/// does not apply, so that a gateway copying them overwrites a caller's own whatever passed.
fn passed(values: [&str; 7]) -> HttpResponse {
    let mut res = HttpResponse::Ok();
    res.insert_header((header::CACHE_CONTROL, "no-store"));
    for (name, value) in AGENT_HEADERS.into_iter().zip(values) {
        let value = HeaderValue::from_str(value).unwrap_or(HeaderValue::from_static(""));
        res.insert_header((HeaderName::from_static(name), value));
    }
    res.finish()
}

/// A valid token's pass.
fn pass(v: &Verification) -> HttpResponse {
    let Some(t) = &v.valid else {
        return passed([""; 7]);
    };
    let c = &t.token.claims;
    let person = c.sub_id.as_ref();
    passed([
        c.agent_id(),
        c.issuer_domain(),
        &c.granted().join(" "),
        c.client_id.as_deref().unwrap_or(""),
        person.map_or("", |p| p.sub.as_str()),
        person.map_or("", |p| p.iss.as_str()),
        "",
    ])
}

#[utoipa::path(
    get, path = "/v1/forward-auth", tag = "verify",
    params(
        ForwardAuthParams,
        ("Authorization" = Option<String>, Header, description = "The agent's token, as it sent it: `Bearer <token>`, or `DPoP <token>` for a token bound to a key"),
        ("DPoP" = Option<String>, Header, description = "The agent's proof, for a `DPoP` token"),
        ("Signature-Input" = Option<String>, Header, description = "Instead of a token: a request the agent signed (Web Bot Auth, RFC 9421), with its Signature and Signature-Agent, checked as POST /v1/verify/request checks it for the configured origin and the forwarded path and query"),
        ("X-Forwarded-Method" = Option<String>, Header, description = "The guarded request's method (Traefik, Caddy; NGINX configurations send X-Original-Method). Read only from a peer in --forward-auth-trusted-peers"),
        ("X-Forwarded-Uri" = Option<String>, Header, description = "The guarded request's path and query (Traefik, Caddy; NGINX configurations send X-Original-URL). Read only from a peer in --forward-auth-trusted-peers"),
        ("X-Agentid-Policy" = Option<String>, Header, description = "Envoy's form, `/v1/forward-auth/<guarded path>` (ext_authz `path_prefix: /v1/forward-auth`): the policy, as this route's query string would name it; required there (empty for no policy, and a call without it is refused). There the guarded method, path and query are the call's own (from a trusted peer), the query never read as policy"),
        ("X-Agentid-Key" = Option<String>, Header, description = "The gateway's publishable key (pk_…): its organization's verify limit instead of the gateway address's"),
    ),
    responses(
        (status = 200, description = "Let the request through: the token is valid for this receiver, and recorded. No body; X-Agent-Id, X-Agent-Issuer, X-Agent-Scopes (space-separated) and, for an access token, X-Agent-Client-Id name the agent; X-Agent-Subject and X-Agent-Subject-Issuer name the person a delegated token acts for (empty for one that acts for nobody)."),
        (status = 400, description = "VALIDATION_ERROR: the gateway's URL names an unknown parameter or a malformed value, or a call on the path form (/v1/forward-auth/<path>) comes without X-Agentid-Policy", body = ErrorBody),
        (status = 401, description = "TOKEN_INVALID, TOKEN_EXPIRED, TOKEN_REVOKED, PROOF_INVALID or PROOF_REPLAYED, with the WWW-Authenticate challenge a receiver sends (RFC 6750, RFC 9449); or no token (a bare challenge); or UNAUTHORIZED: an invalid X-Agentid-Key", body = ErrorBody),
        (status = 403, description = "INSUFFICIENT_SCOPE, with `WWW-Authenticate: … error=\"insufficient_scope\", scope=\"…\"`", body = ErrorBody),
        (status = 503, description = "AUDIT_UNAVAILABLE: the call cannot be recorded, so it is not answered (Retry-After)", body = ErrorBody),
    ),
)]
pub(crate) async fn check(state: web::Data<AppState>, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    if let Auth::Rejected | Auth::NotBearer = context::auth(&req) {
        return Err(ApiError::unauthorized(
            "invalid, unknown or disabled key in X-Agentid-Key (omit it, or send a valid pk_ key)",
        ));
    }
    // Envoy's form names the guarded request in its own path, and the policy in a header its
    // configuration sets (over any copy the caller sent).
    let tail = req
        .uri()
        .path()
        .strip_prefix(FORWARD_AUTH.pattern)
        .filter(|t| !t.is_empty());
    let query = match tail {
        None => req.query_string(),
        Some(_) => match req.headers().get(POLICY_HEADER).map(HeaderValue::to_str) {
            // Without it, a gateway URL with one character too many (`/v1/forward-auth/?…`)
            // would check no policy at all: its query is never read here.
            None => {
                return Err(invalid(
                    "X-Agentid-Policy",
                    "is required on /v1/forward-auth/<path> (an empty value for no policy); the \
                     query there is the guarded request's, never a policy (did the gateway's URL \
                     end in a slash?)",
                ))
            }
            Some(Ok(v)) => v,
            Some(Err(_)) => return Err(invalid("X-Agentid-Policy", "must be ASCII")),
        },
    };
    let Configured {
        policy,
        origin,
        signed,
    } = configured(query)?;
    // An IPv4 gateway reaching a listener on `[::]` arrives as `::ffff:a.b.c.d`.
    let peer = req.peer_addr().map(|a| crate::client::canonical(a.ip()));
    let trusted = peer.is_some_and(|ip| state.forward_auth_peers.iter().any(|n| n.contains(&ip)));
    let (method, target) = match (trusted, tail) {
        (false, _) => (None, None),
        (true, None) => forwarded(req.headers()),
        (true, Some(tail)) => {
            let target = match req.uri().query() {
                Some(query) => format!("{tail}?{query}"),
                None => tail.to_owned(),
            };
            (Some(req.method().as_str().to_owned()), target_of(&target))
        }
    };
    if req.headers().get(header::AUTHORIZATION).is_none() && req.headers().contains_key("signature-input") {
        let target = match (&method, &origin, &target) {
            (Some(m), Some(o), Some(p)) => Some((m.as_str(), format!("{o}{p}"))),
            _ => None,
        };
        return signed_request(&state, &req, target, &policy, &signed).await;
    }
    // One token and one proof: the upstream may read another copy than the one checked
    // here (RFC 9449 §4.3 refuses a second DPoP header).
    if req.headers().get_all(header::AUTHORIZATION).nth(1).is_some() {
        return Err(refused(
            ErrorCode::TokenInvalid,
            "more than one Authorization header",
            bare(),
        ));
    }
    let presented = req
        .headers()
        .get(header::AUTHORIZATION)
        .map(|v| v.to_str().ok().and_then(|v| v.split_once(' ')));
    let (scheme, token) = match presented {
        None => {
            return Err(refused(
                ErrorCode::TokenInvalid,
                "no token: send Authorization: Bearer or DPoP",
                bare(),
            ));
        }
        Some(Some((s, t))) if s.eq_ignore_ascii_case("bearer") => (Scheme::Bearer, t.trim()),
        Some(Some((s, t))) if s.eq_ignore_ascii_case("dpop") => (Scheme::Dpop, t.trim()),
        Some(_) => {
            let why = "Authorization is neither Bearer <token> nor DPoP <token>";
            return Err(refused(
                ErrorCode::TokenInvalid,
                why,
                challenge(ErrorCode::TokenInvalid, Scheme::Bearer, &[]),
            ));
        }
    };
    if req.headers().get_all("dpop").nth(1).is_some() {
        let value = challenge(ErrorCode::ProofInvalid, scheme, &[]);
        return Err(refused(
            ErrorCode::ProofInvalid,
            "more than one DPoP header",
            value,
        ));
    }
    let proof = req
        .headers()
        .get("dpop")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    // RFC 9449 §4.3: the proof's htu is the URL without its query.
    let htu = match (&origin, &target) {
        (Some(o), Some(t)) => Some(format!("{o}{}", t.split('?').next().unwrap_or(t))),
        _ => None,
    };
    let how = match scheme {
        // A token bound to a key is refused without its proof.
        Scheme::Bearer => Presentation::Dpop(None),
        Scheme::Dpop => match (method.as_deref(), htu.as_deref()) {
            (Some(htm), Some(htu)) => Presentation::Dpop(Some(Presented { proof, htm, htu })),
            _ => {
                let why = if origin.is_none() {
                    "this gateway's forward-auth URL names no origin, so no DPoP proof can be checked"
                } else {
                    "the gateway did not say which request this is, or its lines disagree (X-Forwarded-Method and -Uri, or X-Original-Method and -URL, from a trusted peer, every line naming one request)"
                };
                let value = format!(
                    "DPoP error=\"invalid_token\", error_description=\"{why}\", algs=\"{DPOP_ALGS}\""
                );
                return Err(refused(ErrorCode::TokenInvalid, why, value));
            }
        },
    };
    let verified = state
        .engine
        .verify()
        .verify_for(token, how, Some(&policy), context::received(&req), fixed_part)
        .await;
    match verified {
        Ok(v) => answer(&v, scheme, &policy),
        Err(e) => Err(e.into()),
    }
}

/// A request signed by its agent (Web Bot Auth) instead of a token: checked as `POST
/// /v1/verify/request` checks it, for the guarded request (`target`: its method and the
/// receiver's origin with its path), then held to the policy's issuers and scopes (a signature
/// names no audience: it covers the receiver's authority instead).
async fn signed_request(
    state: &AppState,
    req: &HttpRequest,
    target: Option<(&str, String)>,
    policy: &Policy,
    signed: &RequestPolicy,
) -> Result<HttpResponse, ApiError> {
    let Some((method, url)) = target else {
        let why = "a signed request needs the forward-auth URL's origin and the guarded request \
                   (X-Forwarded-Method and -Uri, or X-Original-Method and -URL, from a trusted peer)";
        return Err(refused(ErrorCode::TokenInvalid, why, bare()));
    };
    // Every line, as the upstream will see it: a line that is not visible ASCII is kept (its
    // bytes read as UTF-8, lossily), so that a signature covering its header fails rather
    // than being checked over the other lines alone.
    let headers: Vec<(String, String)> = req
        .headers()
        .iter()
        .map(|(n, v)| {
            let value = match v.to_str() {
                Ok(v) => v.to_owned(),
                Err(_) => String::from_utf8_lossy(v.as_bytes()).into_owned(),
            };
            (n.as_str().to_owned(), value)
        })
        .collect();
    let request = agentid_core::httpsig::Request {
        method,
        url: &url,
        headers: &headers,
    };
    let check = state
        .engine
        .signed_requests()
        .check(&request, signed, context::received(req))
        .await?;
    let agent = match (check.result, check.agent) {
        (RequestResult::Verified, Some(agent)) => agent,
        (RequestResult::Verified, None) => {
            // A trusted third party's signer: no agent of agentid's, so no issuer or scope.
            if !policy.issuers.is_empty() || !policy.scopes.is_empty() {
                let why = "the request is signed by a trusted third party's key, which has no issuer or scopes here";
                return Err(refused(ErrorCode::TokenInvalid, why, bare()));
            }
            let agent_url = check
                .signature
                .and_then(|s| s.signature_agent)
                .unwrap_or_default();
            return Ok(passed(["", "", "", "", "", "", &agent_url]));
        }
        (result, _) => {
            let why = format!(
                "the signed request is {}: {}",
                result.as_str(),
                check.reason.unwrap_or_default()
            );
            return Err(refused(ErrorCode::TokenInvalid, why, bare()));
        }
    };
    let domain = agent.issuer_domain.to_string();
    if !policy.issuers.is_empty() && !policy.issuers.contains(&domain) {
        let why = format!("the agent's issuer {domain} is not one this receiver accepts");
        return Err(refused(ErrorCode::TokenInvalid, why, bare()));
    }
    let scopes = agent.scopes.as_slice();
    let missing: Vec<String> = policy
        .scopes
        .iter()
        .filter(|s| !scopes.contains(s))
        .cloned()
        .collect();
    if !missing.is_empty() {
        return Err(refused(
            ErrorCode::InsufficientScope,
            format!("the agent does not hold {}", missing.join(" ")),
            challenge(ErrorCode::InsufficientScope, Scheme::Bearer, &policy.scopes),
        ));
    }
    Ok(passed([
        agent.id.as_ref(),
        &domain,
        &scopes.join(" "),
        "",
        "",
        "",
        "",
    ]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_policy_is_read_strictly() {
        let c = configured("audience=https%3A%2F%2Fapi.example&scope=read:docs&scope=write:docs&issuer=Bank.Example&origin=https://api.example/")
            .unwrap();
        assert_eq!(c.policy.audiences, ["https://api.example"]);
        assert_eq!(c.policy.scopes, ["read:docs", "write:docs"]);
        assert_eq!(c.policy.issuers, ["bank.example"]);
        assert_eq!(c.origin.as_deref(), Some("https://api.example"));
        for bad in [
            "audiences=x:y",
            "scope=READ",
            "issuer=-x",
            "origin=https://a.example/path",
            "origin=ftp://a.example",
            "origin=https://a&origin=https://b",
            "audience=nouri",
        ] {
            assert!(configured(bad).is_err(), "{bad}");
        }
        let many = "scope=a:b&".repeat(MAX_VALUES + 1);
        assert!(configured(&many).is_err());
    }

    #[test]
    fn the_path_and_query_of_the_forwarded_target_count() {
        assert_eq!(target_of("/orders?id=1").as_deref(), Some("/orders?id=1"));
        assert_eq!(
            target_of("https://evil.example/orders?id=1#x").as_deref(),
            Some("/orders?id=1")
        );
        assert_eq!(target_of("https://api.example").as_deref(), Some("/"));
        assert_eq!(target_of("https://api.example?q=1").as_deref(), Some("/?q=1"));
        assert_eq!(target_of("orders"), None);
        assert_eq!(target_of("/a b"), None);
        assert_eq!(target_of("/a?b c"), None);
    }

    #[test]
    fn challenges_are_the_libraries() {
        assert_eq!(
            challenge(ErrorCode::TokenRevoked, Scheme::Bearer, &[]),
            "Bearer error=\"invalid_token\""
        );
        assert_eq!(
            challenge(
                ErrorCode::InsufficientScope,
                Scheme::Bearer,
                &["a:b".into(), "c:d".into()]
            ),
            "Bearer error=\"insufficient_scope\", scope=\"a:b c:d\""
        );
        assert_eq!(
            challenge(ErrorCode::ProofReplayed, Scheme::Dpop, &[]),
            format!("DPoP error=\"invalid_dpop_proof\", algs=\"{DPOP_ALGS}\"")
        );
        assert_eq!(
            challenge(ErrorCode::ProofInvalid, Scheme::Bearer, &[]),
            format!("DPoP error=\"invalid_token\", algs=\"{DPOP_ALGS}\"")
        );
    }
}

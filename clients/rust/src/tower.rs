//! A tower layer (axum and other tower services) that verifies the request's agent token.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use super::{Error, ResourceMetadata, Verifier};

mod metadata;
pub use metadata::ResourceMetadataService;

/// Verifies `Authorization: Bearer <token>`, or a token bound to a key as
/// `Authorization: DPoP <token>` with its proof in the `DPoP` header (checked for the
/// request's method and its URL: the receiver's [`AgentIdLayer::public_origin`] and the
/// request's path; without a public origin every DPoP-bound token is refused, and a
/// warning says so when the layer is applied), with these `scopes`, before the inner
/// service sees the request. On success the [`super::Agent`] is in the request's extensions; otherwise the
/// answer is 401 (403 for `INSUFFICIENT_SCOPE`, 503 for `UNAVAILABLE`, 500 for
/// `MISCONFIGURED`: the receiver's own configuration) with `{"error": code, "message": …}` and a
/// `WWW-Authenticate` challenge (RFC 6750, RFC 9449 §7.1).
#[derive(Clone)]
pub struct AgentIdLayer {
    verifier: Verifier,
    scopes: Arc<Vec<String>>,
    public_origin: Option<Arc<str>>,
    metadata_url: Option<Arc<str>>,
    delegated: bool,
    trusted: Arc<Vec<String>>,
    warned: Arc<std::sync::Once>,
}

impl AgentIdLayer {
    pub fn new(verifier: Verifier, scopes: &[&str]) -> Self {
        AgentIdLayer {
            verifier,
            scopes: Arc::new(scopes.iter().map(|s| s.to_string()).collect()),
            public_origin: None,
            metadata_url: None,
            delegated: false,
            trusted: Arc::new(Vec::new()),
            warned: Arc::new(std::sync::Once::new()),
        }
    }

    /// Names the receiver's protected resource metadata (RFC 9728) in the challenge of
    /// every 401 (`WWW-Authenticate: Bearer resource_metadata="…"`); serve the document
    /// with [`ResourceMetadataService`].
    pub fn resource_metadata(mut self, metadata: &ResourceMetadata) -> Self {
        self.metadata_url = Some(metadata.url().into());
        self
    }

    /// The origin agents address (`https://api.example`): a DPoP proof's URL is this
    /// origin and the request's path, never the request's `Host`, forwarded headers or an
    /// absolute-form target (the caller chooses those, so a proof made for another
    /// receiver would pass). Without it, every DPoP-bound token is refused.
    pub fn public_origin(mut self, origin: &str) -> Self {
        self.public_origin = Some(origin.trim_end_matches('/').into());
        self
    }

    /// Signature directories, beside the service's own, whose signed requests (Web Bot Auth)
    /// pass: a request without `Authorization` that an agent signed is checked by
    /// [`Verifier::verify_request`] for the public origin and the request's path and query, and
    /// goes on with the [`super::SignedRequest`] in its extensions (no [`super::Agent`]); a
    /// signature names no scopes, so a layer with scopes refuses it.
    pub fn trusted_signature_agents(mut self, urls: &[&str]) -> Self {
        self.trusted = Arc::new(urls.iter().map(|u| u.to_string()).collect());
        self
    }

    /// Lets only an agent acting for a person through ([`super::Agent::subject`]); a token
    /// that acts for nobody is `TOKEN_INVALID`.
    pub fn delegated(mut self) -> Self {
        self.delegated = true;
        self
    }
}

/// What a DPoP-bound token meets at a receiver that named no public origin.
const NO_ORIGIN: &str = "this receiver takes no DPoP-bound token: its public_origin is not configured";

/// Seconds a client is asked to wait after a 503 (the service could not be reached).
const RETRY_AFTER: &str = "5";

/// How a refused request came: with DPoP or not, without any credentials (`bare`), and
/// the scopes its route needs.
struct Came<'a> {
    dpop: bool,
    bare: bool,
    scopes: &'a [String],
    metadata_url: Option<&'a str>,
    /// A DPoP-bound token, at a receiver without a public origin.
    no_origin: bool,
}

/// The `WWW-Authenticate` value for `e` (RFC 6750 §3.1, RFC 9449 §7.1), or none for a
/// refusal that is not the credentials' fault (503, 500).
fn challenge(e: &Error, came: &Came<'_>) -> Option<String> {
    if matches!(e, Error::Unavailable(_) | Error::Misconfigured(_)) {
        return None;
    }
    if came.no_origin {
        return Some(format!(
            "DPoP error=\"invalid_token\", error_description=\"{NO_ORIGIN}\", algs=\"EdDSA Ed25519 ES256\""
        ));
    }
    let with_metadata = |challenge: String| match came.metadata_url {
        Some(url) if challenge == "Bearer" => format!("Bearer resource_metadata=\"{url}\""),
        Some(url) => format!("{challenge}, resource_metadata=\"{url}\""),
        None => challenge,
    };
    if came.bare {
        // Nothing was sent: both schemes this receiver takes (RFC 6750 §3.1, RFC 9449 §7.1).
        return Some(format!(
            "{}, DPoP algs=\"EdDSA Ed25519 ES256\"",
            with_metadata("Bearer".to_owned())
        ));
    }
    let proof = matches!(e, Error::ProofInvalid(_) | Error::ProofReplayed(_));
    let (code, extra) = match e {
        Error::InsufficientScope(_) => (
            "insufficient_scope",
            format!(", scope=\"{}\"", came.scopes.join(" ")),
        ),
        _ if came.dpop && proof => ("invalid_dpop_proof", String::new()),
        _ => ("invalid_token", String::new()),
    };
    Some(if came.dpop || proof {
        format!("DPoP error=\"{code}\"{extra}, algs=\"EdDSA Ed25519 ES256\"")
    } else {
        with_metadata(format!("Bearer error=\"{code}\"{extra}"))
    })
}

impl<S> tower_layer::Layer<S> for AgentIdLayer {
    type Service = AgentId<S>;

    fn layer(&self, inner: S) -> AgentId<S> {
        if self.public_origin.is_none() {
            self.warned.call_once(|| {
                log::warn!(
                    "AgentIdLayer has no public_origin: every DPoP-bound token is refused (set \
                     .public_origin(\"https://api.example\"), the origin agents address)"
                )
            });
        }
        AgentId {
            inner,
            layer: self.clone(),
        }
    }
}

#[derive(Clone)]
pub struct AgentId<S> {
    inner: S,
    layer: AgentIdLayer,
}

/// The answer to a refused token: 401, 403 for `INSUFFICIENT_SCOPE`, 503 with
/// `Retry-After` for `UNAVAILABLE`, 500 for `MISCONFIGURED`, with `{"error": code, "message": …}` and,
/// on a 401 or 403, the challenge of a request that used DPoP (`dpop`) or a bearer token.
pub fn refusal<B: From<String>>(e: &Error, dpop: bool) -> http::Response<B> {
    let missing = match e {
        Error::InsufficientScope(m) => m.clone(),
        _ => Vec::new(),
    };
    answer(
        e,
        &Came {
            dpop,
            bare: false,
            scopes: &missing,
            metadata_url: None,
            no_origin: false,
        },
    )
}

fn answer<B: From<String>>(e: &Error, came: &Came<'_>) -> http::Response<B> {
    let status = match e {
        Error::InsufficientScope(_) => 403,
        Error::Unavailable(_) => 503,
        Error::Misconfigured(_) => 500,
        _ => 401,
    };
    let mut res = http::Response::builder()
        .status(status)
        .header(http::header::CONTENT_TYPE, "application/json");
    if let Some(value) = challenge(e, came) {
        res = res.header(http::header::WWW_AUTHENTICATE, value);
    }
    if let Error::Unavailable(_) = e {
        res = res.header(http::header::RETRY_AFTER, RETRY_AFTER);
    }
    res.body(B::from(refusal_body(e))).expect("a valid response")
}

/// `{"error": code, "message": …}`: what every middleware answers. A refusal that is not the
/// caller's fault says nothing of the receiver's own set-up.
fn refusal_body(e: &Error) -> String {
    let message = match e {
        Error::Invalid(m) | Error::ProofInvalid(m) | Error::ProofReplayed(m) => m.clone(),
        Error::Expired => "the token has expired".into(),
        Error::Revoked => "the agent is revoked".into(),
        Error::InsufficientScope(missing) => format!("the token does not grant {}", missing.join(" ")),
        Error::Unavailable(_) => "the agent cannot be verified now: try again shortly".into(),
        Error::Misconfigured(_) => "this receiver cannot verify agents: its configuration is wrong".into(),
    };
    serde_json::json!({"error": e.code(), "message": message}).to_string()
}

impl<S, B, R> tower_service::Service<http::Request<B>> for AgentId<S>
where
    S: tower_service::Service<http::Request<B>, Response = http::Response<R>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    B: Send + 'static,
    R: From<String> + 'static,
{
    type Response = http::Response<R>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<B>) -> Self::Future {
        // The service that was polled ready answers; a clone takes its place.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let layer = self.layer.clone();
        Box::pin(async move {
            let authorization = req
                .headers()
                .get(http::header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default();
            let scheme = |s: &str| {
                authorization
                    .get(..s.len())
                    .filter(|p| p.eq_ignore_ascii_case(s))
                    .map(|_| authorization[s.len()..].trim())
                    .filter(|t| !t.is_empty())
                    .map(str::to_owned)
            };
            let (bearer, dpop) = (scheme("bearer "), scheme("dpop "));
            let is_dpop = authorization
                .get(..5)
                .is_some_and(|p| p.eq_ignore_ascii_case("dpop "));
            let scopes: Vec<&str> = layer.scopes.iter().map(String::as_str).collect();
            // An application behind the layer may read another of several (the last, say).
            let several = req
                .headers()
                .get_all(http::header::AUTHORIZATION)
                .iter()
                .nth(1)
                .is_some();
            let bare = !several && authorization.trim().is_empty();
            if bare && req.headers().contains_key("signature-input") {
                let checked = match (&layer.public_origin, layer.scopes.is_empty(), layer.delegated) {
                    (None, _, _) => Err(Error::Invalid(
                        "this receiver takes no signed request: its public_origin is not configured".into(),
                    )),
                    (Some(_), false, _) => Err(Error::InsufficientScope(layer.scopes.to_vec())),
                    (Some(_), true, true) => {
                        Err(Error::Invalid("a signed request acts for no person".into()))
                    }
                    (Some(origin), true, false) => {
                        let target = req.uri().path_and_query().map_or("/", |p| p.as_str());
                        let url = format!("{origin}{target}");
                        let headers: Vec<(String, String)> = req
                            .headers()
                            .iter()
                            .filter_map(|(n, v)| Some((n.as_str().to_owned(), v.to_str().ok()?.to_owned())))
                            .collect();
                        let trusted: Vec<&str> = layer.trusted.iter().map(String::as_str).collect();
                        layer
                            .verifier
                            .verify_request(req.method().as_str(), &url, &headers, &trusted)
                            .await
                    }
                };
                return match checked {
                    Ok(found) => {
                        req.extensions_mut().insert(found);
                        inner.call(req).await
                    }
                    Err(e) => Ok(answer(
                        &e,
                        &Came {
                            dpop: false,
                            bare: false,
                            scopes: &layer.scopes,
                            metadata_url: layer.metadata_url.as_deref(),
                            no_origin: false,
                        },
                    )),
                };
            }
            let verified = if several {
                Err(Error::Invalid("more than one Authorization header".into()))
            } else if is_dpop {
                let proofs: Vec<&str> = req
                    .headers()
                    .get_all("dpop")
                    .iter()
                    .filter_map(|v| v.to_str().ok())
                    .collect();
                let url = layer
                    .public_origin
                    .as_deref()
                    .map(|o| format!("{o}{}", req.uri().path()));
                match (dpop, proofs.as_slice(), url) {
                    (None, _, _) => Err(Error::Invalid("no token".into())),
                    (Some(_), _, None) => Err(Error::Invalid(NO_ORIGIN.into())),
                    (Some(_), [_, _, ..], _) => Err(Error::ProofInvalid("more than one DPoP header".into())),
                    (Some(t), proofs, Some(url)) => {
                        let method = req.method().as_str().to_owned();
                        layer
                            .verifier
                            .verify_dpop(&t, proofs.first().copied(), &method, &url, &scopes)
                            .await
                    }
                }
            } else {
                match bearer {
                    Some(t) => layer.verifier.verify_with_scopes(&t, &scopes).await,
                    None if bare => Err(Error::Invalid("no Authorization header".into())),
                    None => Err(Error::Invalid("no bearer token".into())),
                }
            };
            let verified = match verified {
                Ok(agent) if layer.delegated && !agent.delegated() => Err(Error::Invalid(
                    "this route takes an agent acting for a person: a token that acts for nobody".into(),
                )),
                other => other,
            };
            match verified {
                Ok(agent) => {
                    req.extensions_mut().insert(agent);
                    inner.call(req).await
                }
                Err(e) => Ok(answer(
                    &e,
                    &Came {
                        dpop: is_dpop,
                        bare,
                        scopes: &layer.scopes,
                        metadata_url: layer.metadata_url.as_deref(),
                        no_origin: matches!(&e, Error::Invalid(m) if m == NO_ORIGIN),
                    },
                )),
            }
        })
    }
}

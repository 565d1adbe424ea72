//! Signed requests (Web Bot Auth, RFC 9421) checked offline, on Cloudflare's `web-bot-auth`
//! crate (the signature, its parameters and base, `Signature-Agent`): the key comes from the
//! directory `Signature-Agent` names, the service's own (`<base>/v1/directories/<issuer>`) or
//! one the receiver trusts, fetched as the key set is (cached as it says, revalidated by
//! ETag, one fetch at a time: the module `directory`) and used past that for at most the list
//! grace when it cannot be had; then `UNAVAILABLE`. A revoked agent's key leaves its directory
//! at once: seen at the next fetch, or at once when the revocation's pushed event is taken
//! ([`Verifier::handle_set`] drops the issuer's directory).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use web_bot_auth::components::{CoveredComponent, DerivedComponent};
use web_bot_auth::message_signatures::SignedMessage;
use web_bot_auth::{SignatureAgentLink, WebBotAuthVerifier};

use crate::error::invalid;
use crate::{now_secs, Error, Verifier};

mod directory;
pub(crate) use directory::Directories;

/// The longest a signature may be valid (`expires - created`).
const MAX_VALIDITY_SECS: i64 = 24 * 60 * 60;

/// What [`Verifier::verify_request`] found of a signed request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignedRequest {
    /// The directory the key came from.
    pub signature_agent: String,
    /// The key's RFC 7638 thumbprint.
    pub keyid: String,
    pub created: SystemTime,
    pub expires: SystemTime,
    /// The agentid issuer domain whose directory it is; None for a trusted third party's.
    pub issuer: Option<String>,
}

/// The request as the receiver got it.
struct Message<'a> {
    method: &'a str,
    url: &'a str,
    headers: &'a [(String, String)],
}

impl SignedMessage for Message<'_> {
    fn lookup_component(&self, name: &CoveredComponent) -> Vec<String> {
        let (scheme, rest) = self.url.split_once("://").unwrap_or(("", self.url));
        let (authority, target) = rest.split_at(rest.find(['/', '?']).unwrap_or(rest.len()));
        let target = if target.is_empty() { "/" } else { target };
        let (path, query) = target
            .split_once('?')
            .map_or((target, None), |(p, q)| (p, Some(q)));
        let value = match name {
            CoveredComponent::HTTP(field) => {
                return self
                    .headers
                    .iter()
                    .filter(|(n, _)| n.eq_ignore_ascii_case(&field.name))
                    .map(|(_, v)| v.trim().to_owned())
                    .collect()
            }
            CoveredComponent::Derived(DerivedComponent::Authority { .. }) => authority.to_ascii_lowercase(),
            CoveredComponent::Derived(DerivedComponent::TargetUri { .. }) => self.url.to_owned(),
            CoveredComponent::Derived(DerivedComponent::Method { .. }) => self.method.to_owned(),
            CoveredComponent::Derived(DerivedComponent::Path { .. }) => path.to_owned(),
            CoveredComponent::Derived(DerivedComponent::Scheme { .. }) => scheme.to_ascii_lowercase(),
            CoveredComponent::Derived(DerivedComponent::RequestTarget { .. }) => target.to_owned(),
            CoveredComponent::Derived(DerivedComponent::Query { .. }) => format!("?{}", query.unwrap_or("")),
            _ => return Vec::new(),
        };
        vec![value]
    }
}

impl Verifier {
    /// Checks a request an agent signed (Web Bot Auth), offline: its signature tagged
    /// `web-bot-auth`, covering `@authority` (or `@target-uri`) and `Signature-Agent`, in its
    /// time (at most 24 h), by a key of the directory `Signature-Agent` names (the service's,
    /// or one of `trusted`), its nonce never seen before (`PROOF_REPLAYED`). `url` is the
    /// request's absolute URL as the agent addressed it; `headers` its fields.
    pub async fn verify_request(
        &self,
        method: &str,
        url: &str,
        headers: &[(String, String)],
        trusted: &[&str],
    ) -> Result<SignedRequest, Error> {
        let message = Message { method, url, headers };
        let parsed =
            WebBotAuthVerifier::parse(&message).map_err(|e| invalid(format!("signed request: {e:?}")))?;
        let agent = match parsed.get_signature_agents().as_slice() {
            [SignatureAgentLink::External(u)] => u.clone(),
            [] => {
                return Err(invalid(
                    "no Signature-Agent: where the key is published is unknown",
                ))
            }
            _ => return Err(invalid("Signature-Agent names no single directory URL")),
        };
        let ours = format!("{}/v1/directories/", self.inner.base);
        let issuer = agent.strip_prefix(&ours).map(str::to_owned);
        if issuer.as_deref().is_some_and(|i| !issuer_domain(i)) {
            // Another spelling of a directory (upper case, a query, a fragment) would be held
            // apart from the one a pushed revocation drops.
            return Err(invalid(format!(
                "the signature agent {agent} names no issuer domain as this service writes it"
            )));
        }
        if let (Some(i), Some(accepted)) = (&issuer, &self.inner.issuers) {
            if !accepted.contains(i) {
                // Held to the issuers as a token is, before anything is fetched for it.
                return Err(invalid(format!("issuer {i} is not accepted")));
            }
        }
        if issuer.is_none() && !trusted.contains(&agent.as_str()) {
            return Err(invalid(format!(
                "the signature agent {agent} is neither the service's directory nor a trusted one"
            )));
        }
        let details = parsed.get_parsed_label().base.parameters.details.clone();
        let (Some(created), Some(expires), Some(keyid)) = (details.created, details.expires, details.keyid)
        else {
            return Err(invalid("created, expires and keyid are required"));
        };
        if PUBLISHED_TEST_KEYS.contains(&keyid.as_str()) {
            return Err(invalid(
                "signed with one of RFC 9421's published test keys, whose private half everyone has",
            ));
        }
        let now = now_secs();
        if expires <= created || expires - created > MAX_VALIDITY_SECS {
            return Err(invalid("expires must come after created, at most 24 h later"));
        }
        if created > now.saturating_add(self.inner.leeway) || expires <= now {
            return Err(invalid("the signature is out of its time"));
        }
        let ring = self.key_ring(&agent).await?;
        parsed
            .verify(&ring, None)
            .map_err(|e| invalid(format!("the signature does not verify: {e:?}")))?;
        if let Some(nonce) = details.nonce {
            let taken = crate::dpop::Checked {
                jkt: keyid.clone(),
                jti: nonce,
                iat: expires,
            };
            self.inner
                .state
                .lock()
                .nonces
                .admit(&taken, now)
                .map_err(|_| Error::ProofReplayed("the signature's nonce was seen before".into()))?;
        }
        Ok(SignedRequest {
            signature_agent: agent,
            keyid,
            created: UNIX_EPOCH + Duration::from_secs(created.max(0) as u64),
            expires: UNIX_EPOCH + Duration::from_secs(expires.max(0) as u64),
            issuer,
        })
    }
}

/// RFC 7638 thumbprints of RFC 9421's published test keys (B.1.4 Ed25519, B.1.2 RSA-PSS, B.1.1
/// RSA), which the Web Bot Auth drafts' examples sign with: anyone can sign with them.
const PUBLISHED_TEST_KEYS: [&str; 3] = [
    "poqkLGiymh_W0uP6PZFw-dvez3QJT5SolqXBCW38r0U",
    "oD0HwocPBSfpNy5W3bpJeyFGY_IQ_YpqxSjQ3Yd-CLA",
    "BHj8s0GPnMEQtkaULIM-PLgEhLBbuGUQ1vMxmBWZzEo",
];

/// An issuer domain as the service names it in a directory's URL: lower case, two labels or
/// more, each of letters, digits and inner hyphens.
fn issuer_domain(s: &str) -> bool {
    let labels: Vec<&str> = s.split('.').collect();
    labels.len() >= 2
        && labels.iter().all(|l| {
            !l.is_empty()
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        })
}

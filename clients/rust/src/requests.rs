//! Signed requests (Web Bot Auth, RFC 9421) checked offline, on Cloudflare's `web-bot-auth`
//! crate (the signature, its parameters and base, `Signature-Agent`): the key comes from the
//! directory `Signature-Agent` names, the service's own (`<base>/v1/directories/<issuer>`) or
//! one the receiver trusts, fetched as the key set is (cached as it says, revalidated by
//! ETag) and used past that for at most the list grace when it cannot be had; then
//! `UNAVAILABLE`. A revoked agent's key leaves its directory at once: seen at the next fetch,
//! or at once when the revocation's pushed event is taken ([`Verifier::handle_set`] drops the
//! issuer's directory).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use web_bot_auth::components::{CoveredComponent, DerivedComponent};
use web_bot_auth::keyring::{JSONWebKeySet, KeyRing, Thumbprintable};
use web_bot_auth::message_signatures::SignedMessage;
use web_bot_auth::{SignatureAgentLink, WebBotAuthVerifier};

use crate::error::{invalid, unavailable};
use crate::transport::cache_for;
use crate::{now_secs, Error, Verifier};

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

/// A directory as last fetched.
pub(crate) struct Directory {
    keys: Arc<JSONWebKeySet>,
    etag: Option<String>,
    fresh_until: Instant,
    /// When it was last fetched (or revalidated).
    read_at: Instant,
    /// While its fetch fails: not fetched again before this, and the failures in a row.
    failing: Option<(Instant, u32)>,
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
        if created > now + self.inner.leeway || expires <= now {
            return Err(invalid("the signature is out of its time"));
        }
        let keys = self.directory(&agent).await?;
        let mut keys = (*keys).clone();
        keys.keys
            .retain(|k| !matches!(k, Thumbprintable::OKP { x, .. } if test_point(x)));
        let mut ring = KeyRing::default();
        ring.import_jwks(keys);
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

    /// The key set of the directory at `url`: held while fresh, else fetched (revalidated);
    /// held past that for the list grace when the fetch fails. Asked for again when a pushed
    /// revocation dropped the URL meanwhile: the answer may predate the revocation.
    async fn directory(&self, url: &str) -> Result<Arc<JSONWebKeySet>, Error> {
        for _ in 0..3 {
            let (held, epoch, failing) = {
                let s = self.inner.state.lock();
                let held = s.directories.held.get(url);
                let failing = held
                    .and_then(|d| d.failing)
                    .is_some_and(|(at, _)| at > Instant::now());
                let held = held.map(|d| (d.keys.clone(), d.etag.clone(), d.fresh_until));
                (held, s.directories.drops(url), failing)
            };
            if let Some((keys, _, until)) = &held {
                // Fresh; or stale, within the grace, and its fetch failed lately: the held one
                // serves without waiting for the service again.
                let grace = *until + self.inner.list_grace > Instant::now();
                if *until > Instant::now() || (failing && grace) {
                    return Ok(keys.clone());
                }
            }
            let answer = self
                .fetch(
                    url.to_owned(),
                    "directory",
                    "application/http-message-signatures-directory+json",
                    held.as_ref().and_then(|h| h.1.clone()),
                )
                .await;
            let current = || self.inner.state.lock().directories.drops(url) == epoch;
            let answer = match (answer, &held) {
                (Ok(a), _) => a,
                (Err(_), Some((keys, _, until)))
                    if *until + self.inner.list_grace > Instant::now() && current() =>
                {
                    if let Some(d) = self.inner.state.lock().directories.held.get_mut(url) {
                        d.failing = Some(crate::transport::failed_again(d.failing));
                    }
                    return Ok(keys.clone());
                }
                (Err(e), _) => return Err(e),
            };
            let keys = match (answer.status, held) {
                (304, Some((keys, _, _))) => keys,
                _ => Arc::new(
                    serde_json::from_slice::<JSONWebKeySet>(&answer.body)
                        .map_err(|e| unavailable(format!("{url}: not a key set ({e})")))?,
                ),
            };
            let mut s = self.inner.state.lock();
            if s.directories.drops(url) != epoch {
                continue;
            }
            s.directories.hold(
                url.to_owned(),
                Directory {
                    keys: keys.clone(),
                    etag: answer.etag,
                    fresh_until: Instant::now() + cache_for(answer.max_age),
                    read_at: Instant::now(),
                    failing: None,
                },
                crate::MAX_DIRECTORIES,
            );
            return Ok(keys);
        }
        Err(unavailable(format!(
            "{url}: revocations keep coming while it is fetched"
        )))
    }
}

/// RFC 7638 thumbprints of RFC 9421's published test keys (B.1.4 Ed25519, B.1.2 RSA-PSS, B.1.1
/// RSA), which the Web Bot Auth drafts' examples sign with: anyone can sign with them.
const PUBLISHED_TEST_KEYS: [&str; 3] = [
    "poqkLGiymh_W0uP6PZFw-dvez3QJT5SolqXBCW38r0U",
    "oD0HwocPBSfpNy5W3bpJeyFGY_IQ_YpqxSjQ3Yd-CLA",
    "BHj8s0GPnMEQtkaULIM-PLgEhLBbuGUQ1vMxmBWZzEo",
];

/// Whether `x` is RFC 9421's Ed25519 test key or its negation (the sign bit flipped): a key
/// whose private half anyone has.
fn test_point(x: &str) -> bool {
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use base64::Engine as _;
    let (Ok(mine), Ok(test)) = (
        URL_SAFE_NO_PAD.decode(x),
        URL_SAFE_NO_PAD.decode("JrQLj5P_89iXES9-vFgrIy29clF9CC_oPPsw3c5D0bs"),
    ) else {
        return false;
    };
    mine.len() == 32 && mine[..31] == test[..31] && mine[31] & 0x7f == test[31] & 0x7f
}

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

/// Directories held, by URL, and how many times a pushed revocation dropped each URL.
#[derive(Default)]
pub(crate) struct Directories {
    held: HashMap<String, Directory>,
    dropped: HashMap<String, u64>,
}

impl Directories {
    /// Holds `directory` for `url`; past `most` directories, the one held longest goes.
    fn hold(&mut self, url: String, directory: Directory, most: usize) {
        self.held.insert(url, directory);
        while self.held.len() > most.max(1) {
            let oldest = self
                .held
                .iter()
                .min_by_key(|(_, d)| d.read_at)
                .map(|(u, _)| u.clone());
            match oldest {
                Some(u) => self.held.remove(&u),
                None => break,
            };
        }
    }

    /// Forgets what is held of `url`: a fetch asked for before this stores nothing.
    pub(crate) fn drop_url(&mut self, url: String) {
        self.held.remove(&url);
        if self.dropped.len() >= crate::SEEN_SETS {
            // Every fetch across those drops is long done; one under way is asked again.
            self.dropped.clear();
        }
        *self.dropped.entry(url).or_default() += 1;
    }

    fn drops(&self, url: &str) -> u64 {
        self.dropped.get(url).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Attack: without `issuers`, each made-up issuer a caller names is a directory fetched
    /// and held: the one held longest goes past the bound.
    #[test]
    fn the_directories_held_are_bounded() {
        let mut held = Directories::default();
        let start = Instant::now();
        for i in 0..6u64 {
            let at = start + Duration::from_secs(i);
            let directory = Directory {
                keys: Arc::new(serde_json::from_str(r#"{"keys":[]}"#).unwrap()),
                etag: None,
                fresh_until: at,
                read_at: at,
                failing: None,
            };
            held.hold(
                format!("https://id.example/v1/directories/d{i}.example"),
                directory,
                3,
            );
        }
        let mut urls: Vec<&String> = held.held.keys().collect();
        urls.sort();
        assert_eq!(
            urls,
            ["d3", "d4", "d5"]
                .map(|d| format!("https://id.example/v1/directories/{d}.example"))
                .iter()
                .collect::<Vec<_>>()
        );
    }
}

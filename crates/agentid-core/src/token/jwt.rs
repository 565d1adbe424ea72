//! Compact JWS with `alg: EdDSA`, parsed strictly: exact header fields, canonical
//! base64url without padding, claims without unknown or duplicate members, a size cap.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use ed25519_dalek::{Signature, Signer, SigningKey};
use serde::{Deserialize, Serialize};

/// Tokens longer than this are refused before any parsing.
pub const MAX_TOKEN_LEN: usize = 4096;

/// The claims of an agentid token: an agent token (header `typ: JWT`: `iss` is the issuer
/// domain, `scopes` an array), or an OAuth 2 access token (RFC 9068, header `typ: at+jwt`:
/// `iss` is the service's issuer URL, with `client_id`, `aud`, a `scope` string and the
/// proven name as `issuer_domain`). Which one is said by the header and the claims alike:
/// `decode` refuses a token whose two disagree.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Claims {
    pub iss: String,
    pub sub: String,
    pub jti: String,
    pub iat: i64,
    pub exp: i64,
    /// An agent token's scopes (never empty); absent from an access token, whose `scope`
    /// says them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub scopes: Vec<String>,
    /// The agent's place in a Token Status List (tokens issued before lists have none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<Status>,
    /// `false` on a token issued with a test-mode key; live tokens carry no such claim (and
    /// `true` is refused as malformed: the service never writes it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub livemode: Option<bool>,
    /// The key the token is bound to (RFC 7800, RFC 9449 §6.1): a holder must present a DPoP
    /// proof made with it. Absent on a bearer token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cnf: Option<Confirmation>,
    /// Access tokens only (with `aud`, `scope` and `issuer_domain`): the OAuth client, which
    /// is the agent itself (equal to `sub`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_id: Option<String>,
    /// Access tokens only: the resources the token is for (RFC 8707).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aud: Option<Audience>,
    /// Access tokens only: the scopes granted, space-separated (RFC 9068 §2.2.3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
    /// Access tokens only: the name the agent's organization proved (an agent token's `iss`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub issuer_domain: Option<String>,
    /// Delegated access tokens only: the person the agents act for, as their identity
    /// provider names them (RFC 9493 `iss_sub`; `sub` is its `sub`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sub_id: Option<SubjectId>,
    /// Delegated access tokens only: the agent acting (the client), and inside it the agents
    /// that handed it the task, innermost last (RFC 8693 §4.1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub act: Option<Actor>,
}

/// The most agents a delegation chain may hold, whatever the service's setting: a bound on
/// what a token's parser follows.
pub const MAX_CHAIN: usize = 16;

/// A person as an identity provider names them (RFC 9493 §3.2.6 `iss_sub`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubjectId {
    pub format: String,
    pub iss: String,
    pub sub: String,
}

impl SubjectId {
    pub fn iss_sub(iss: &str, sub: &str) -> SubjectId {
        SubjectId {
            format: "iss_sub".to_owned(),
            iss: iss.to_owned(),
            sub: sub.to_owned(),
        }
    }
}

/// One agent of a delegation chain (RFC 8693 §4.1 `act`): its id and the name its
/// organization proved; `act` the agent that handed it the task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Actor {
    pub sub: String,
    pub issuer_domain: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub act: Option<Box<Actor>>,
}

impl Actor {
    /// The agents of the chain, outermost (the one acting) first.
    pub fn chain(&self) -> Vec<&Actor> {
        let mut out = vec![self];
        let mut at = self;
        while let Some(inner) = &at.act {
            out.push(inner);
            at = inner;
        }
        out
    }

    /// This chain with `outer` acting on top of it.
    pub fn wrapped(self, sub: &str, issuer_domain: &str) -> Actor {
        Actor {
            sub: sub.to_owned(),
            issuer_domain: issuer_domain.to_owned(),
            act: Some(Box::new(self)),
        }
    }
}

impl Claims {
    /// An agent token's claims, without the optional ones.
    pub fn agent(iss: &str, sub: &str, jti: &str, iat: i64, exp: i64, scopes: Vec<String>) -> Self {
        Claims {
            iss: iss.to_owned(),
            sub: sub.to_owned(),
            jti: jti.to_owned(),
            iat,
            exp,
            scopes,
            status: None,
            livemode: None,
            cnf: None,
            client_id: None,
            aud: None,
            scope: None,
            issuer_domain: None,
            sub_id: None,
            act: None,
        }
    }

    /// The agent the token is for: an agent token's `sub`, an access token's client (the
    /// agent acting, when it acts for a person).
    pub fn agent_id(&self) -> &str {
        self.client_id.as_deref().unwrap_or(&self.sub)
    }

    /// The agents of a delegated token's chain, outermost (the one acting) first; empty for
    /// a token that acts for nobody.
    pub fn actors(&self) -> Vec<&Actor> {
        self.act.as_ref().map_or_else(Vec::new, Actor::chain)
    }

    /// Whether these are an access token's claims (RFC 9068): it has a `client_id`.
    pub fn is_access_token(&self) -> bool {
        self.client_id.is_some()
    }

    /// The name the token's issuer proved: an agent token's `iss`, an access token's
    /// `issuer_domain`.
    pub fn issuer_domain(&self) -> &str {
        self.issuer_domain.as_deref().unwrap_or(&self.iss)
    }

    /// The scopes granted: an agent token's `scopes`, an access token's `scope` split.
    pub fn granted(&self) -> Vec<&str> {
        match &self.scope {
            Some(s) => s.split(' ').collect(),
            None => self.scopes.iter().map(String::as_str).collect(),
        }
    }

    /// The header `typ` a token with these claims carries.
    fn typ(&self) -> &'static str {
        if self.is_access_token() {
            ACCESS_TOKEN_TYP
        } else {
            "JWT"
        }
    }

    /// Whether the claims are whole for their kind: an agent token has scopes and none of an
    /// access token's claims; an access token has all of them, its client is its subject,
    /// and its scope string is scopes separated by single spaces.
    fn well_formed(&self) -> bool {
        match (&self.client_id, &self.aud, &self.scope, &self.issuer_domain) {
            (None, None, None, None) => {
                !self.scopes.is_empty() && self.act.is_none() && self.sub_id.is_none()
            }
            (Some(client), Some(aud), Some(scope), Some(domain)) => {
                let party = match (&self.act, &self.sub_id) {
                    (None, None) => *client == self.sub,
                    (Some(act), Some(id)) => {
                        let chain = act.chain();
                        act.sub == *client
                            && act.issuer_domain == *domain
                            && chain.len() <= MAX_CHAIN
                            && chain
                                .iter()
                                .all(|a| !a.sub.is_empty() && !a.issuer_domain.is_empty())
                            && id.format == "iss_sub"
                            && id.sub == self.sub
                            && !id.iss.is_empty()
                            && !id.sub.is_empty()
                    }
                    _ => false,
                };
                party
                    && self.scopes.is_empty()
                    && aud.well_formed()
                    && !domain.is_empty()
                    && !scope.is_empty()
                    && scope.split(' ').all(|s| !s.is_empty())
            }
            _ => false,
        }
    }
}

/// The header `typ` of an access token (RFC 9068 §2.1).
pub const ACCESS_TOKEN_TYP: &str = "at+jwt";

/// A JWT's `aud`: one resource as a string, several as an array (RFC 7519 §4.1.3).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Audience {
    One(String),
    Many(Vec<String>),
}

impl Audience {
    /// One resource as a string, several as an array.
    pub fn of(mut resources: Vec<String>) -> Audience {
        if resources.len() == 1 {
            Audience::One(resources.remove(0))
        } else {
            Audience::Many(resources)
        }
    }

    /// The resources, in order.
    pub fn values(&self) -> &[String] {
        match self {
            Audience::One(one) => std::slice::from_ref(one),
            Audience::Many(many) => many,
        }
    }

    pub fn contains(&self, resource: &str) -> bool {
        self.values().iter().any(|r| r == resource)
    }

    fn well_formed(&self) -> bool {
        !self.values().is_empty() && self.values().iter().all(|r| !r.is_empty())
    }
}

/// The longest resource (an audience value) taken.
pub const MAX_RESOURCE_LEN: usize = 1024;

/// A resource a token may be for (RFC 8707 §2): an absolute URI (RFC 3986 §4.3) without a
/// fragment, of printable ASCII.
pub fn absolute_uri(r: &str) -> Result<(), &'static str> {
    if r.is_empty() || r.len() > MAX_RESOURCE_LEN {
        return Err("must be 1 to 1024 bytes");
    }
    if !r.bytes().all(|b| b.is_ascii_graphic()) {
        return Err("must be printable ASCII without spaces");
    }
    if r.contains('#') {
        return Err("must have no fragment");
    }
    let Some((scheme, rest)) = r.split_once(':') else {
        return Err("must be an absolute URI (a scheme, then ':')");
    };
    let mut chars = scheme.chars();
    let scheme_ok = chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c));
    if !scheme_ok || rest.is_empty() {
        return Err("must be an absolute URI (a scheme, then ':')");
    }
    if (scheme.eq_ignore_ascii_case("http") || scheme.eq_ignore_ascii_case("https"))
        && !rest
            .strip_prefix("//")
            .is_some_and(|a| !a.is_empty() && !a.starts_with('/'))
    {
        return Err("an http(s) URI must name a host");
    }
    Ok(())
}

/// `{"jkt": "<RFC 7638 thumbprint, base64url>"}`, exactly.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Confirmation {
    pub jkt: String,
}

/// `{"status_list": {"idx": …, "uri": …}}`, exactly.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Status {
    pub status_list: StatusListRef,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StatusListRef {
    pub idx: u64,
    pub uri: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Header {
    alg: String,
    kid: String,
    #[serde(default)]
    typ: Option<String>,
}

/// Why a token is `TOKEN_INVALID`. The text goes into the audit record's `failure_reason`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RejectReason {
    TooLarge,
    Malformed,
    UnsupportedAlgorithm,
    UnknownKey,
    BadSignature,
    UnknownAgent,
}

impl RejectReason {
    pub fn describe(self) -> &'static str {
        match self {
            RejectReason::TooLarge => "token exceeds 4096 bytes",
            RejectReason::Malformed => "malformed token",
            RejectReason::UnsupportedAlgorithm => {
                "unsupported token header (only alg EdDSA, typ JWT or at+jwt is accepted)"
            }
            RejectReason::UnknownKey => "token signed with an unknown key id",
            RejectReason::BadSignature => "signature verification failed",
            RejectReason::UnknownAgent => "token names no known agent",
        }
    }
}

/// A rejected token, with the agent it names (`client_id`, else `sub`) when the payload
/// could be read (for attribution).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejected {
    pub reason: RejectReason,
    pub sub: Option<String>,
}

/// A token whose form is valid and whose signature is not yet checked.
#[derive(Debug, Clone)]
pub struct Unverified<'t> {
    pub claims: Claims,
    pub(crate) kid: String,
    pub signing_input: &'t [u8],
    pub signature: Signature,
}

pub fn encode(key: &SigningKey, kid: &str, claims: &Claims) -> String {
    let header = serde_json::json!({"alg": "EdDSA", "kid": kid, "typ": claims.typ()});
    let mut out = URL_SAFE_NO_PAD.encode(header.to_string());
    out.push('.');
    let payload = serde_json::to_vec(claims).expect("claims serialize");
    URL_SAFE_NO_PAD.encode_string(payload, &mut out);
    let sig = key.sign(out.as_bytes());
    out.push('.');
    URL_SAFE_NO_PAD.encode_string(sig.to_bytes(), &mut out);
    out
}

/// A compact JWS (EdDSA) of any JSON payload, with header `typ` (Token Status Lists).
pub fn encode_json(key: &SigningKey, kid: &str, typ: &str, payload: &serde_json::Value) -> String {
    let header = serde_json::json!({"alg": "EdDSA", "kid": kid, "typ": typ});
    let mut out = URL_SAFE_NO_PAD.encode(header.to_string());
    out.push('.');
    URL_SAFE_NO_PAD.encode_string(payload.to_string(), &mut out);
    let sig = key.sign(out.as_bytes());
    out.push('.');
    URL_SAFE_NO_PAD.encode_string(sig.to_bytes(), &mut out);
    out
}

/// Parses a token without checking its signature. Never panics.
pub fn decode(token: &str) -> Result<Unverified<'_>, Rejected> {
    let reject = |reason, sub| Err(Rejected { reason, sub });
    if token.len() > MAX_TOKEN_LEN {
        return reject(RejectReason::TooLarge, None);
    }
    let mut parts = token.split('.');
    let (Some(h), Some(p), Some(s), None) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
        return reject(RejectReason::Malformed, None);
    };
    let claims: Claims = match b64_json::<Claims>(p) {
        Some(c) if c.livemode != Some(true) => c,
        _ => return reject(RejectReason::Malformed, loose_sub(p)),
    };
    let sub = Some(claims.agent_id().to_owned());
    let header: Header = match b64_json(h) {
        Some(h) => h,
        None => return reject(RejectReason::Malformed, sub),
    };
    // RFC 9068 §4: `at+jwt`, or its full media type; an agent token says `JWT` or nothing.
    let typ = match header.typ.as_deref() {
        None | Some("JWT") => "JWT",
        Some(ACCESS_TOKEN_TYP | "application/at+jwt") => ACCESS_TOKEN_TYP,
        Some(_) => return reject(RejectReason::UnsupportedAlgorithm, sub),
    };
    if header.alg != "EdDSA" {
        return reject(RejectReason::UnsupportedAlgorithm, sub);
    }
    if typ != claims.typ() || !claims.well_formed() {
        return reject(RejectReason::Malformed, sub);
    }
    let mut sig = [0u8; 64];
    match URL_SAFE_NO_PAD.decode_slice(s, &mut sig) {
        Ok(64) => {}
        _ => return reject(RejectReason::Malformed, sub),
    }
    Ok(Unverified {
        claims,
        kid: header.kid,
        signing_input: &token.as_bytes()[..h.len() + 1 + p.len()],
        signature: Signature::from_bytes(&sig),
    })
}

/// The `sub` of a payload that failed strict parsing, read only to attribute the attempt.
fn loose_sub(part: &str) -> Option<String> {
    let v: serde_json::Value = b64_json(part)?;
    v.get("client_id")
        .or_else(|| v.get("sub"))?
        .as_str()
        .map(str::to_owned)
}

fn b64_json<T: serde::de::DeserializeOwned>(part: &str) -> Option<T> {
    let bytes = URL_SAFE_NO_PAD.decode(part).ok()?;
    serde_json::from_slice(&bytes).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claims() -> Claims {
        Claims::agent(
            "example.com",
            "agt_01jd0000000000000000000000",
            "j1",
            1,
            2,
            vec!["read:x".into()],
        )
    }

    fn access() -> Claims {
        Claims {
            iss: "https://id.example".into(),
            scopes: vec![],
            client_id: Some("agt_01jd0000000000000000000000".into()),
            aud: Some(Audience::One("https://api.example/mcp".into())),
            scope: Some("read:x write:y".into()),
            issuer_domain: Some("example.com".into()),
            ..claims()
        }
    }

    /// A delegated token: the person as `sub` and `sub_id`, the agent acting as `client_id`
    /// and the outermost `act`; any other shape is malformed whatever its signature.
    #[test]
    fn delegated_tokens_name_the_person_and_the_chain_consistently() {
        let agent = "agt_01jd0000000000000000000000";
        let inner = Actor {
            sub: "agt_01jd0000000000000000000001".into(),
            issuer_domain: "example.com".into(),
            act: None,
        };
        let delegated = Claims {
            sub: "alice".into(),
            sub_id: Some(SubjectId::iss_sub("https://idp.example", "alice")),
            act: Some(inner.clone().wrapped(agent, "example.com")),
            ..access()
        };
        let key = SigningKey::from_bytes(&[7u8; 32]);
        let encoded = encode(&key, "k1", &delegated);
        let u = decode(&encoded).unwrap();
        assert_eq!(u.claims.agent_id(), agent);
        let chain: Vec<&str> = u.claims.actors().iter().map(|a| a.sub.as_str()).collect();
        assert_eq!(chain, [agent, inner.sub.as_str()]);
        let sig = URL_SAFE_NO_PAD.encode([0u8; 64]);
        let h = URL_SAFE_NO_PAD.encode(r#"{"alg":"EdDSA","kid":"k","typ":"at+jwt"}"#);
        let good = serde_json::to_value(&delegated).unwrap();
        let with = |v: &serde_json::Value| format!("{h}.{}.{sig}", URL_SAFE_NO_PAD.encode(v.to_string()));
        assert!(decode(&with(&good)).is_ok());
        let mut deep = serde_json::json!({"sub": "agt_x", "issuer_domain": "example.com"});
        for _ in 0..MAX_CHAIN {
            deep = serde_json::json!({"sub": "agt_x", "issuer_domain": "example.com", "act": deep});
        }
        let mut cases = Vec::new();
        for (member, value) in [
            ("sub", serde_json::json!("bob")),
            (
                "act",
                serde_json::json!({"sub": "agt_other", "issuer_domain": "example.com"}),
            ),
            (
                "act",
                serde_json::json!({"sub": agent, "issuer_domain": "other.example"}),
            ),
            (
                "act",
                serde_json::json!({"sub": agent, "issuer_domain": "example.com", "x": 1}),
            ),
            (
                "act",
                serde_json::json!({"sub": agent, "issuer_domain": "example.com", "act": {"sub": "", "issuer_domain": "a"}}),
            ),
            (
                "act",
                serde_json::json!({"sub": agent, "issuer_domain": "example.com", "act": deep}),
            ),
            (
                "sub_id",
                serde_json::json!({"format": "opaque", "iss": "https://idp.example", "sub": "alice"}),
            ),
            (
                "sub_id",
                serde_json::json!({"format": "iss_sub", "iss": "", "sub": "alice"}),
            ),
        ] {
            let mut bad = good.clone();
            bad[member] = value;
            cases.push(bad);
        }
        for member in ["act", "sub_id"] {
            let mut bad = good.clone();
            bad.as_object_mut().unwrap().remove(member);
            cases.push(bad);
        }
        // An agent token never acts for anyone.
        let mut agent_token = serde_json::to_value(claims()).unwrap();
        agent_token["act"] = good["act"].clone();
        agent_token["sub_id"] = good["sub_id"].clone();
        let agent_h = URL_SAFE_NO_PAD.encode(r#"{"alg":"EdDSA","kid":"k","typ":"JWT"}"#);
        let agent_case = format!(
            "{agent_h}.{}.{sig}",
            URL_SAFE_NO_PAD.encode(agent_token.to_string())
        );
        for bad in cases.iter().map(with).chain([agent_case]) {
            assert_eq!(decode(&bad).unwrap_err().reason, RejectReason::Malformed, "{bad}");
        }
    }

    /// An access token says so in its header (`at+jwt`) and carries the claims of RFC 9068;
    /// a token whose header and claims disagree, or whose access claims are partial, is
    /// malformed whatever its signature.
    #[test]
    fn access_tokens_are_at_jwt_with_their_claims_whole() {
        let key = SigningKey::from_bytes(&[7u8; 32]);
        let t = encode(&key, "k1", &access());
        let header =
            String::from_utf8(URL_SAFE_NO_PAD.decode(t.split('.').next().unwrap()).unwrap()).unwrap();
        assert!(header.contains(r#""typ":"at+jwt""#), "{header}");
        let u = decode(&t).unwrap();
        assert_eq!(u.claims, access());
        assert!(u.claims.is_access_token());
        assert_eq!(u.claims.issuer_domain(), "example.com");
        assert_eq!(u.claims.granted(), ["read:x", "write:y"]);
        let many = Claims {
            aud: Some(Audience::of(vec![
                "https://a.example".into(),
                "https://b.example".into(),
            ])),
            ..access()
        };
        let t = encode(&key, "k1", &many);
        assert!(decode(&t)
            .unwrap()
            .claims
            .aud
            .unwrap()
            .contains("https://b.example"));

        let sig = URL_SAFE_NO_PAD.encode([0u8; 64]);
        let with = |typ: &str, claims: &serde_json::Value| {
            let h = URL_SAFE_NO_PAD.encode(format!(r#"{{"alg":"EdDSA","kid":"k","typ":"{typ}"}}"#));
            format!("{h}.{}.{sig}", URL_SAFE_NO_PAD.encode(claims.to_string()))
        };
        let good = serde_json::to_value(access()).unwrap();
        assert!(decode(&with("at+jwt", &good)).is_ok());
        assert!(decode(&with("application/at+jwt", &good)).is_ok());
        let agent = serde_json::to_value(claims()).unwrap();
        let mut cases = vec![with("JWT", &good), with("at+jwt", &agent)];
        for (member, value) in [
            ("client_id", serde_json::json!("agt_other")),
            ("aud", serde_json::json!([])),
            ("aud", serde_json::json!("")),
            ("scope", serde_json::json!("")),
            ("scope", serde_json::json!("a  b")),
            ("issuer_domain", serde_json::json!("")),
            ("scopes", serde_json::json!(["read:x"])),
        ] {
            let mut c = good.clone();
            c[member] = value;
            cases.push(with("at+jwt", &c));
        }
        for member in ["client_id", "aud", "scope", "issuer_domain"] {
            let mut c = good.clone();
            c.as_object_mut().unwrap().remove(member);
            cases.push(with("at+jwt", &c));
            // One access claim in an agent token.
            let mut a = agent.clone();
            a[member] = good[member].clone();
            cases.push(with("JWT", &a));
        }
        for t in cases {
            assert_eq!(decode(&t).unwrap_err().reason, RejectReason::Malformed, "{t}");
        }
        assert_eq!(
            decode(&with("dpop+jwt", &good)).unwrap_err().reason,
            RejectReason::UnsupportedAlgorithm
        );
    }

    #[test]
    fn round_trip_and_garbage() {
        let key = SigningKey::from_bytes(&[7u8; 32]);
        let t = encode(&key, "k1", &claims());
        let u = decode(&t).unwrap();
        assert_eq!(u.claims, claims());
        assert_eq!(u.kid, "k1");
        for bad in [
            "",
            ".",
            "..",
            "a.b.c",
            "a.b.c.d",
            &t[..t.len() - 1],
            &format!("{t}."),
        ] {
            assert!(decode(bad).is_err(), "{bad}");
        }
        let long = "a".repeat(MAX_TOKEN_LEN + 1);
        assert_eq!(decode(&long).unwrap_err().reason, RejectReason::TooLarge);
    }

    #[test]
    fn the_status_claim_is_read_in_exactly_its_shape() {
        let key = SigningKey::from_bytes(&[7u8; 32]);
        let mut c = claims();
        c.status = Some(Status {
            status_list: StatusListRef {
                idx: 7,
                uri: "https://id.example.com/v1/status/sl_1".into(),
            },
        });
        let t = encode(&key, "k1", &c);
        assert_eq!(decode(&t).unwrap().claims, c);
        let payload =
            String::from_utf8(URL_SAFE_NO_PAD.decode(t.split('.').nth(1).unwrap()).unwrap()).unwrap();
        assert!(
            payload.ends_with(
                r#""status":{"status_list":{"idx":7,"uri":"https://id.example.com/v1/status/sl_1"}}}"#
            ),
            "{payload}"
        );
    }

    #[test]
    fn duplicate_and_unknown_claims_are_malformed() {
        let h = URL_SAFE_NO_PAD.encode(r#"{"alg":"EdDSA","kid":"k","typ":"JWT"}"#);
        let sig = URL_SAFE_NO_PAD.encode([0u8; 64]);
        for payload in [
            r#"{"iss":"a","sub":"b","sub":"c","jti":"j","iat":1,"exp":2,"scopes":[]}"#,
            r#"{"iss":"a","sub":"b","jti":"j","iat":1,"exp":2,"scopes":[],"admin":true}"#,
            r#"{"iss":"a","sub":"b","jti":"j","iat":1.5,"exp":2,"scopes":[]}"#,
            r#"{"iss":"a","sub":"b","jti":"j","iat":1,"exp":2,"scopes":[],"status":{}}"#,
            r#"{"iss":"a","sub":"b","jti":"j","iat":1,"exp":2,"scopes":[],"status":{"status_list":{"idx":1}}}"#,
            r#"{"iss":"a","sub":"b","jti":"j","iat":1,"exp":2,"scopes":[],"status":{"status_list":{"idx":-1,"uri":"u"}}}"#,
            r#"{"iss":"a","sub":"b","jti":"j","iat":1,"exp":2,"scopes":[],"status":{"status_list":{"idx":1,"uri":"u","x":1}}}"#,
            r#"{"iss":"a","sub":"b","jti":"j","iat":1,"exp":2,"scopes":[],"status":{"status_list":{"idx":1,"uri":"u"},"x":1}}"#,
        ] {
            let t = format!("{h}.{}.{sig}", URL_SAFE_NO_PAD.encode(payload));
            assert_eq!(
                decode(&t).unwrap_err().reason,
                RejectReason::Malformed,
                "{payload}"
            );
        }
    }
}

/// The decoder never panics, whatever it is given: arbitrary text, arbitrary bytes, and valid
/// tokens with one byte changed or cut short (fixed seed: the same cases in every run).
#[cfg(test)]
mod props {
    use proptest::prelude::*;

    use super::*;

    fn valid() -> String {
        let key = SigningKey::from_bytes(&[3; 32]);
        let claims = Claims::agent(
            "example.com",
            "agt_01jd0000000000000000000000",
            "01jd0000000000000000000000",
            1_795_000_000,
            1_795_086_400,
            vec!["read:x".into()],
        );
        encode(&key, "kid", &claims)
    }

    proptest! {
        #![proptest_config(crate::testing::fixed_seed(31, 256))]

        #[test]
        fn any_text(s in "\\PC{0,600}") {
            let _ = decode(&s);
        }

        #[test]
        fn any_bytes(b in proptest::collection::vec(any::<u8>(), 0..5000)) {
            let _ = decode(&String::from_utf8_lossy(&b));
        }

        #[test]
        fn a_valid_token_changed_or_cut(at in any::<usize>(), byte in any::<u8>(), cut in any::<bool>()) {
            let t = valid();
            let mut b = t.into_bytes();
            let at = at % b.len();
            if cut { b.truncate(at) } else { b[at] = byte }
            let _ = decode(&String::from_utf8_lossy(&b));
        }
    }
}

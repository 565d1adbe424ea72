//! Compact JWS with `alg: EdDSA`, parsed strictly: exact header fields, canonical
//! base64url without padding, claims without unknown or duplicate members, a size cap.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use ed25519_dalek::{Signature, Signer, SigningKey};
use serde::{Deserialize, Serialize};

/// Tokens longer than this are refused before any parsing.
pub const MAX_TOKEN_LEN: usize = 4096;

/// The claims of an agentid token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Claims {
    pub iss: String,
    pub sub: String,
    pub jti: String,
    pub iat: i64,
    pub exp: i64,
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
            RejectReason::UnsupportedAlgorithm => "unsupported token header (only alg EdDSA is accepted)",
            RejectReason::UnknownKey => "token signed with an unknown key id",
            RejectReason::BadSignature => "signature verification failed",
            RejectReason::UnknownAgent => "token names no known agent",
        }
    }
}

/// A rejected token, with the `sub` claim when the payload could be read (for attribution).
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
    let header = serde_json::json!({"alg": "EdDSA", "kid": kid, "typ": "JWT"});
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
    let sub = Some(claims.sub.clone());
    let header: Header = match b64_json(h) {
        Some(h) => h,
        None => return reject(RejectReason::Malformed, sub),
    };
    if header.alg != "EdDSA" || header.typ.as_deref().is_some_and(|t| t != "JWT") {
        return reject(RejectReason::UnsupportedAlgorithm, sub);
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
    v.get("sub")?.as_str().map(str::to_owned)
}

fn b64_json<T: serde::de::DeserializeOwned>(part: &str) -> Option<T> {
    let bytes = URL_SAFE_NO_PAD.decode(part).ok()?;
    serde_json::from_slice(&bytes).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claims() -> Claims {
        Claims {
            iss: "example.com".into(),
            sub: "agt_01jd0000000000000000000000".into(),
            jti: "j1".into(),
            iat: 1,
            exp: 2,
            scopes: vec!["read:x".into()],
            status: None,
            livemode: None,
            cnf: None,
        }
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
        let claims = Claims {
            iss: "example.com".into(),
            sub: "agt_01jd0000000000000000000000".into(),
            jti: "01jd0000000000000000000000".into(),
            iat: 1_795_000_000,
            exp: 1_795_086_400,
            scopes: vec!["read:x".into()],
            status: None,
            livemode: None,
            cnf: None,
        };
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

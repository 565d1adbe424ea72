//! DPoP (RFC 9449): the public key a token is bound to, its RFC 7638 thumbprint (the token's
//! `cnf.jkt`), and the check of a proof that the caller holds the key. Pure functions: the
//! caller supplies the time, the request's method and URL, and remembers `jti`s.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use ed25519_dalek::{Signature, VerifyingKey};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

/// The longest proof read; a longer one is refused unparsed.
pub const MAX_PROOF_LEN: usize = 4096;
/// The longest `jti` remembered.
pub(crate) const MAX_JTI_LEN: usize = 256;

/// The public half of RFC 9421's Ed25519 test key (Appendix B.1.4), which the Web Bot Auth
/// drafts' examples sign with: its private half is published, so no agent may be bound to it.
pub const RFC_9421_TEST_KEY_X: &str = "JrQLj5P_89iXES9-vFgrIy29clF9CC_oPPsw3c5D0bs";
/// The `x` of RFC 9421's P-256 test key (Appendix B.1.3): its private half is published too, so
/// a token bound to that point (or its negation, the same `x`) proves nothing of its holder.
const RFC_9421_P256_TEST_KEY_X: &str = "qIVYZVLCrPZHGHjP17CTW0_-D9Lfw0EkjqF7xB4FivA";

/// Whether `key` is RFC 9421's Ed25519 test key or its negation (the same encoding with the
/// sign bit flipped): a key whose private scalar anyone can derive from the published one.
pub fn is_rfc_9421_test_point(key: &VerifyingKey) -> bool {
    let Ok(test) = URL_SAFE_NO_PAD.decode(RFC_9421_TEST_KEY_X) else {
        return false;
    };
    let mine = key.as_bytes();
    test.len() == 32 && mine[..31] == test[..31] && mine[31] & 0x7f == test[31] & 0x7f
}

/// Members a public JWK must not carry: any of them makes it a private (or symmetric) key.
const PRIVATE_MEMBERS: [&str; 8] = ["d", "p", "q", "dp", "dq", "qi", "oth", "k"];

/// A public key a token may be bound to: Ed25519 (`OKP`) or P-256 (`EC`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PublicJwk {
    /// `x` as given, and the point it encodes (decompressed once, when parsed).
    Ed25519 { x: String, key: VerifyingKey },
    /// `x` and `y` as given, and the uncompressed point (`04 ‖ x ‖ y`) they encode.
    P256 { x: String, y: String, point: Vec<u8> },
}

/// Why a JWK or a proof is refused, said so that a caller can tell which part failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct DpopError(pub String);

fn refuse<T>(why: impl Into<String>) -> Result<T, DpopError> {
    Err(DpopError(why.into()))
}

/// base64url without padding of exactly `len` bytes.
fn b64_bytes(s: &str, len: usize, what: &str) -> Result<Vec<u8>, DpopError> {
    match URL_SAFE_NO_PAD.decode(s) {
        Ok(b) if b.len() == len => Ok(b),
        _ => refuse(format!("{what} must be {len} bytes, base64url without padding")),
    }
}

fn text<'a>(jwk: &'a Map<String, Value>, name: &str) -> Result<&'a str, DpopError> {
    match jwk.get(name) {
        Some(Value::String(s)) => Ok(s),
        _ => refuse(format!("{name} is required and must be a string")),
    }
}

impl PublicJwk {
    /// A public JWK to bind a token to, as JSON: `{"kty":"OKP","crv":"Ed25519","x":…}` or
    /// `{"kty":"EC","crv":"P-256","x":…,"y":…}`, with no private member, whose point is on
    /// its curve.
    pub fn parse(value: &Value) -> Result<PublicJwk, DpopError> {
        let key = PublicJwk::read(value)?;
        match &key {
            PublicJwk::P256 { point, .. } if !on_p256(point) => {
                return refuse("x and y are not a point of P-256");
            }
            _ => {}
        }
        Ok(key)
    }

    /// The key of a proof's `jwk` header: `parse`'s form, without its costly question of a
    /// P-256 point (an ECDH agreement), which the signature check answers anyway. RFC 9421's
    /// published test keys are refused here: no token is bound to one, and no proof made with
    /// one binds a token.
    fn read(value: &Value) -> Result<PublicJwk, DpopError> {
        let Value::Object(jwk) = value else {
            return refuse("must be a JSON object (a public JWK)");
        };
        if let Some(m) = PRIVATE_MEMBERS.iter().find(|m| jwk.contains_key(**m)) {
            return refuse(format!(
                "holds the private member {m:?}: send the public key only"
            ));
        }
        match (text(jwk, "kty")?, text(jwk, "crv")?) {
            ("OKP", "Ed25519") => {
                let x = text(jwk, "x")?;
                let bytes: [u8; 32] = b64_bytes(x, 32, "x")?.try_into().expect("32 bytes");
                let key = VerifyingKey::from_bytes(&bytes)
                    .map_err(|_| DpopError("x is not an Ed25519 public key".into()))?;
                // A key of small order verifies signatures nobody made (R the identity, S 0).
                if key.is_weak() {
                    return refuse("x is a point of small order, which no key pair has");
                }
                if is_rfc_9421_test_point(&key) {
                    return refuse(
                        "is RFC 9421's published test key (Appendix B.1.4), whose private half everyone has",
                    );
                }
                Ok(PublicJwk::Ed25519 { x: x.to_owned(), key })
            }
            ("EC", "P-256") => {
                let (x, y) = (text(jwk, "x")?, text(jwk, "y")?);
                if x == RFC_9421_P256_TEST_KEY_X {
                    return refuse(
                        "is RFC 9421's published test key (Appendix B.1.3), whose private half everyone has",
                    );
                }
                let mut point = vec![4u8];
                point.extend(b64_bytes(x, 32, "x")?);
                point.extend(b64_bytes(y, 32, "y")?);
                Ok(PublicJwk::P256 {
                    x: x.to_owned(),
                    y: y.to_owned(),
                    point,
                })
            }
            (kty, crv) => refuse(format!(
                "kty {kty:?} with crv {crv:?}: only OKP/Ed25519 and EC/P-256 keys"
            )),
        }
    }

    /// A key as [`PublicJwk::canonical`] wrote it (the store keeps an agent's key so), read
    /// without `parse`'s costly question of a P-256 point, which was asked when the key was
    /// bound and which every signature check answers anyway.
    pub fn from_canonical(text: &str) -> Result<PublicJwk, DpopError> {
        let value: Value =
            serde_json::from_str(text).map_err(|_| DpopError("is not a JSON object".into()))?;
        PublicJwk::read(&value)
    }

    /// The required members in lexicographic order, no whitespace (RFC 7638 §3): what the
    /// thumbprint hashes, and how the store keeps an agent's key.
    pub fn canonical(&self) -> String {
        // Every member is base64url or a fixed name: nothing needs escaping.
        match self {
            PublicJwk::Ed25519 { x, .. } => format!(r#"{{"crv":"Ed25519","kty":"OKP","x":"{x}"}}"#),
            PublicJwk::P256 { x, y, .. } => {
                format!(r#"{{"crv":"P-256","kty":"EC","x":"{x}","y":"{y}"}}"#)
            }
        }
    }

    /// The RFC 7638 thumbprint: SHA-256 of the canonical members, base64url.
    pub fn thumbprint(&self) -> String {
        URL_SAFE_NO_PAD.encode(Sha256::digest(self.canonical().as_bytes()))
    }

    /// The JWS algorithms a signature by this key may name.
    pub fn algorithms(&self) -> &'static [&'static str] {
        match self {
            PublicJwk::Ed25519 { .. } => &["EdDSA", "Ed25519"],
            PublicJwk::P256 { .. } => &["ES256"],
        }
    }

    /// Checks `signature` over `signed` with this key, for JWS algorithm `alg`.
    pub(crate) fn verify(&self, alg: &str, signed: &[u8], signature: &[u8]) -> Result<(), DpopError> {
        match (self, alg) {
            (PublicJwk::Ed25519 { key, .. }, "EdDSA" | "Ed25519") => {
                let sig = Signature::from_slice(signature)
                    .map_err(|_| DpopError("signature is not 64 bytes".into()))?;
                key.verify_strict(signed, &sig)
                    .map_err(|_| DpopError("signature does not verify".into()))
            }
            (PublicJwk::P256 { point, .. }, "ES256") => {
                ring::signature::UnparsedPublicKey::new(&ring::signature::ECDSA_P256_SHA256_FIXED, point)
                    .verify(signed, signature)
                    .map_err(|_| DpopError("signature does not verify".into()))
            }
            _ => refuse(format!("alg {alg:?} does not fit the key in jwk")),
        }
    }
}

/// Whether `point` (uncompressed, `04 ‖ x ‖ y`) is a valid P-256 public key. ring checks a
/// peer's key fully before an ECDH agreement, and offers no other way to ask: an agreement
/// with a throwaway key is the question.
fn on_p256(point: &[u8]) -> bool {
    use ring::agreement::{agree_ephemeral, EphemeralPrivateKey, UnparsedPublicKey, ECDH_P256};
    let rng = ring::rand::SystemRandom::new();
    EphemeralPrivateKey::generate(&ECDH_P256, &rng)
        .is_ok_and(|ours| agree_ephemeral(ours, &UnparsedPublicKey::new(&ECDH_P256, point), |_| ()).is_ok())
}

/// What a proof must match: the request it was made for, the token it goes with, and now.
#[derive(Debug, Clone)]
pub struct Expected<'a> {
    /// The request's method, as the receiver saw it (`GET`).
    pub htm: &'a str,
    /// The request's URL; its query and fragment are ignored (RFC 9449 §4.3).
    pub htu: &'a str,
    /// The token the proof goes with: `ath` is its SHA-256, base64url. None at a token
    /// endpoint, where a proof goes with no token yet (RFC 9449 §5).
    pub token: Option<&'a str>,
    /// Now, in seconds since the epoch.
    pub now: i64,
    /// How far `iat` may be from `now`, either way.
    pub max_skew: i64,
}

/// A proof that checked: the thumbprint of its key (to compare with the token's `cnf.jkt`),
/// its `jti` (to refuse a replay) and its `iat`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedProof {
    pub jkt: String,
    pub jti: String,
    pub iat: i64,
}

/// A URL as `htu` is compared (RFC 9449 §4.3): without its query and fragment, normalized as
/// RFC 3986 §6.2.2 and §6.2.3 say (scheme and host in lower case, no default port, an empty
/// path as `/`, percent-encodings of unreserved characters decoded and the others' hex digits
/// in upper case, in the host lower case like the rest of it, dot segments removed), so that
/// two ways of writing one URL match. A host's trailing dot stays: it names another host.
fn htu_form(url: &str) -> String {
    let url = url.split(['?', '#']).next().unwrap_or(url);
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let scheme = scheme.to_ascii_lowercase();
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let (userinfo, host) = match authority.rsplit_once('@') {
        Some((u, h)) => (Some(u), h),
        None => (None, authority),
    };
    let mut host = percent_normal(host).to_ascii_lowercase();
    let default_port = match scheme.as_str() {
        "https" => ":443",
        "http" => ":80",
        _ => "",
    };
    if !default_port.is_empty() && host.ends_with(default_port) {
        host.truncate(host.len() - default_port.len());
    }
    if host.ends_with(':') {
        host.pop();
    }
    let path = if path.is_empty() {
        "/".to_owned()
    } else {
        remove_dot_segments(&percent_normal(path))
    };
    match userinfo {
        Some(u) => format!("{scheme}://{}@{host}{path}", percent_normal(u)),
        None => format!("{scheme}://{host}{path}"),
    }
}

/// `s` with each percent-encoding of an unreserved character decoded, and the others' hex
/// digits in upper case (RFC 3986 §6.2.2.1, §6.2.2.2).
fn percent_normal(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = String::with_capacity(s.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        if let (b'%', Some(&h), Some(&l)) = (b[i], b.get(i + 1), b.get(i + 2)) {
            if let (Some(h), Some(l)) = (hex(h), hex(l)) {
                let c = (h * 16 + l) as u8;
                if c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_' | b'~') {
                    out.push(c as char);
                } else {
                    out.push_str(&format!("%{c:02X}"));
                }
                i += 3;
                continue;
            }
        }
        let len = s[i..].chars().next().map_or(1, char::len_utf8);
        out.push_str(&s[i..i + len]);
        i += len;
    }
    out
}

/// An absolute path without its `.` and `..` segments (RFC 3986 §5.2.4).
fn remove_dot_segments(path: &str) -> String {
    let segments: Vec<&str> = path.split('/').skip(1).collect();
    let mut out: Vec<&str> = Vec::with_capacity(segments.len());
    for (i, segment) in segments.iter().enumerate() {
        let last = i + 1 == segments.len();
        match *segment {
            "." => {}
            ".." => {
                out.pop();
            }
            other => {
                out.push(other);
                continue;
            }
        }
        if last {
            out.push("");
        }
    }
    format!("/{}", out.join("/"))
}

fn part(s: &str, what: &str) -> Result<Map<String, Value>, DpopError> {
    let bytes = URL_SAFE_NO_PAD
        .decode(s)
        .map_err(|_| DpopError(format!("{what} is not base64url")))?;
    match serde_json::from_slice(&bytes) {
        Ok(Value::Object(m)) => Ok(m),
        _ => refuse(format!("{what} is not a JSON object")),
    }
}

/// A compact JWS of at most [`MAX_PROOF_LEN`] bytes (a DPoP proof, a client assertion), split:
/// its header as a JSON object, its claims' part, the bytes it signs, and its signature.
pub(crate) struct Jws<'a> {
    pub(crate) header: Map<String, Value>,
    claims: &'a str,
    signed: &'a [u8],
    signature: Vec<u8>,
}

impl<'a> Jws<'a> {
    pub(crate) fn parse(jws: &'a str) -> Result<Jws<'a>, DpopError> {
        if jws.len() > MAX_PROOF_LEN {
            return refuse(format!("longer than {MAX_PROOF_LEN} bytes"));
        }
        let mut parts = jws.split('.');
        let (Some(h), Some(p), Some(s), None) = (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return refuse("not a compact JWS of three parts");
        };
        let signature = URL_SAFE_NO_PAD
            .decode(s)
            .map_err(|_| DpopError("signature is not base64url".into()))?;
        Ok(Jws {
            header: part(h, "header")?,
            claims: p,
            signed: &jws.as_bytes()[..h.len() + 1 + p.len()],
            signature,
        })
    }

    /// Whether `key` signed it with `alg`.
    pub(crate) fn verify(&self, key: &PublicJwk, alg: &str) -> Result<(), DpopError> {
        key.verify(alg, self.signed, &self.signature)
    }

    /// Its claims, as a JSON object (read once the signature checked).
    pub(crate) fn claims(&self) -> Result<Map<String, Value>, DpopError> {
        part(self.claims, "claims")
    }
}

/// Checks a DPoP proof (RFC 9449 §4.3): a JWT with `typ` `dpop+jwt`, `alg` EdDSA, Ed25519 or
/// ES256, the public key in its `jwk` header, signed by that key, and claims `jti`, `htm`,
/// `htu`, `iat` and `ath` that match `expected`. Whether its key is the token's and whether
/// its `jti` was seen are the caller's to decide, with what this returns.
pub fn check_proof(proof: &str, expected: &Expected<'_>) -> Result<VerifiedProof, DpopError> {
    let jws = Jws::parse(proof)?;
    let header = &jws.header;
    if header.get("typ") != Some(&Value::from("dpop+jwt")) {
        return refuse("typ must be dpop+jwt");
    }
    if header.contains_key("crit") {
        return refuse("its header names critical extensions (crit), which are not understood here");
    }
    let alg = match header.get("alg") {
        Some(Value::String(a)) if matches!(a.as_str(), "EdDSA" | "Ed25519" | "ES256") => a.as_str(),
        _ => return refuse("alg must be EdDSA, Ed25519 or ES256"),
    };
    let key = PublicJwk::read(header.get("jwk").unwrap_or(&Value::Null))
        .map_err(|e| DpopError(format!("jwk: {e}")))?;
    jws.verify(&key, alg)?;

    let claims = jws.claims()?;
    let jti = match claims.get("jti") {
        Some(Value::String(j)) if !j.is_empty() && j.len() <= MAX_JTI_LEN => j.clone(),
        _ => return refuse(format!("jti must be a string of 1 to {MAX_JTI_LEN} characters")),
    };
    if claims.get("htm").and_then(Value::as_str) != Some(expected.htm) {
        return refuse(format!("htm is not {}", expected.htm));
    }
    let htu = claims.get("htu").and_then(Value::as_str).unwrap_or_default();
    let wanted = htu_form(expected.htu);
    if htu.is_empty() || htu_form(htu) != wanted {
        return refuse(format!("htu is not {wanted}"));
    }
    // A NumericDate (RFC 7519 §2): whole seconds taken, a fraction dropped (as a client that
    // writes the time as a float sends it).
    let iat = claims.get("iat").and_then(|v| {
        v.as_i64()
            .or_else(|| v.as_f64().filter(|f| f.is_finite()).map(|f| f.floor() as i64))
    });
    let Some(iat) = iat else {
        return refuse("iat must be a number");
    };
    if iat.abs_diff(expected.now) > expected.max_skew.unsigned_abs() {
        return refuse(format!("iat is more than {} s from now", expected.max_skew));
    }
    // Not asked for (RFC 9449 bounds a proof by its iat), but honoured when present.
    let date = |name: &str| claims.get(name).map(|v| v.as_f64().map(|f| f as i64));
    match date("exp") {
        Some(Some(exp)) if exp <= expected.now => return refuse("exp is past"),
        Some(None) => return refuse("exp must be a number"),
        _ => {}
    }
    match date("nbf") {
        Some(Some(nbf)) if nbf > expected.now + expected.max_skew => return refuse("nbf is in the future"),
        Some(None) => return refuse("nbf must be a number"),
        _ => {}
    }
    if let Some(token) = expected.token {
        let ath = URL_SAFE_NO_PAD.encode(Sha256::digest(token.as_bytes()));
        if claims.get("ath").and_then(Value::as_str) != Some(ath.as_str()) {
            return refuse("ath is not the token's hash");
        }
    }
    Ok(VerifiedProof {
        jkt: key.thumbprint(),
        jti,
        iat,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::token::test_jws::{self, b64};
    use ed25519_dalek::SigningKey;
    use serde_json::json;

    const NOW: i64 = 1_800_000_000;
    const TOKEN: &str = "eyJ.token.sig";

    /// RFC 9449 §4.3: `htu` is compared after RFC 3986's syntax- and scheme-based
    /// normalization; what names another resource stays apart.
    #[test]
    fn htu_matches_another_writing_of_the_same_url_only() {
        for (a, b) in [
            ("https://api.example/orders", "https://api.example:443/orders"),
            ("https://api.example/orders", "HTTPS://API.Example/orders?x=1#f"),
            ("https://api.example/~orders", "https://api.example/%7eorders"),
            ("https://api.example/a%2Fb", "https://api.example/a%2fb"),
            ("https://api.example/", "https://api.example"),
            ("https://api.example/a/c", "https://api.example/a/./b/../c"),
            ("https://api.example/a/", "https://api.example/a/b/.."),
            ("http://api.example/x", "http://api.example:80/x"),
            ("https://api.example/x", "https://api.example:/x"),
            ("https://[::1]/x", "https://[::1]:443/x"),
            ("https://api.example/é", "https://api.example/é"),
        ] {
            assert_eq!(htu_form(a), htu_form(b), "{a} {b}");
        }
        for (a, b) in [
            ("https://api.example/orders", "https://api.example/Orders"),
            ("https://api.example/x", "https://api.example:8443/x"),
            ("https://api.example/x", "http://api.example/x"),
            ("https://api.example/x", "http://api.example:443/x"),
            ("https://api.example/a%2Fb", "https://api.example/a/b"),
            ("https://api.example/x", "https://api.example./x"),
            ("https://api.example/x", "https://other.example/x"),
        ] {
            assert_ne!(htu_form(a), htu_form(b), "{a} {b}");
        }
    }

    fn expected() -> Expected<'static> {
        Expected {
            htm: "GET",
            htu: "https://api.example/orders",
            token: Some(TOKEN),
            now: NOW,
            max_skew: 60,
        }
    }

    fn claims() -> Value {
        json!({"jti": "j1", "htm": "GET", "htu": "https://api.example/orders", "iat": NOW,
               "ath": URL_SAFE_NO_PAD.encode(Sha256::digest(TOKEN.as_bytes()))})
    }

    /// A proof signed with an Ed25519 key; its key's JWK.
    fn ed_proof(header: Value, claims: &Value) -> (String, Value) {
        let (key, jwk) = test_jws::ed_key(7);
        let mut header = header;
        header["jwk"] = jwk.clone();
        (test_jws::ed_sign(&key, &header, claims), jwk)
    }

    fn es_proof(claims: &Value) -> (String, Value) {
        let (pair, jwk) = test_jws::p256();
        let header = json!({"typ": "dpop+jwt", "alg": "ES256", "jwk": jwk});
        (test_jws::es_sign(&pair, &header, claims), jwk)
    }

    #[test]
    fn the_thumbprint_is_rfc_8037s_example() {
        // RFC 8037 appendix A.3.
        let jwk = json!({"kty": "OKP", "crv": "Ed25519",
                         "x": "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"});
        assert_eq!(
            PublicJwk::parse(&jwk).unwrap().thumbprint(),
            "kPrK_qmxVWaYVA9wwBF6Iuo3vVzz7TxHCTwXBygrS4k"
        );
    }

    #[test]
    fn private_keys_other_types_and_bad_values_are_refused() {
        let x = "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo";
        for (jwk, why) in [
            (
                json!({"kty": "OKP", "crv": "Ed25519", "x": x, "d": x}),
                "private member \"d\"",
            ),
            (json!({"kty": "oct", "k": "AAAA"}), "private member \"k\""),
            (
                json!({"kty": "RSA", "crv": "x", "n": "AQAB", "e": "AQAB"}),
                "only OKP/Ed25519",
            ),
            (json!({"kty": "OKP", "crv": "X25519", "x": x}), "only OKP/Ed25519"),
            (
                json!({"kty": "OKP", "crv": "Ed25519", "x": "AAAA"}),
                "x must be 32 bytes",
            ),
            (json!({"kty": "EC", "crv": "P-256", "x": x}), "y is required"),
            (
                json!({"kty": "EC", "crv": "P-256", "x": x, "y": x}),
                "not a point of P-256",
            ),
            (json!({"kty": "OKP", "crv": "Ed25519"}), "x is required"),
            // The identity, a point of order 2 and one of order 8.
            (
                json!({"kty": "OKP", "crv": "Ed25519", "x": "AQAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"}),
                "small order",
            ),
            (
                json!({"kty": "OKP", "crv": "Ed25519", "x": "7P_______________________________________38"}),
                "small order",
            ),
            (
                json!({"kty": "OKP", "crv": "Ed25519", "x": "JuiVj8KyJ7BFw_SJ8u-Y8NXfrAXTxjM5sTgCiG1T_AU"}),
                "small order",
            ),
            (json!("a string"), "JSON object"),
        ] {
            let err = PublicJwk::parse(&jwk).unwrap_err().0;
            assert!(err.contains(why), "{jwk}: {err}");
        }
    }

    /// Attack: a proof dated at the ends of i64's range, whose distance from now would
    /// overflow (a panic in debug builds, a wrapped pass in release).
    #[test]
    fn an_iat_at_the_ends_of_its_range_is_refused_not_wrapped() {
        for iat in [i64::MIN, i64::MIN + NOW, i64::MAX] {
            let mut c = claims();
            c["iat"] = json!(iat);
            let (proof, _) = ed_proof(json!({"typ": "dpop+jwt", "alg": "EdDSA"}), &c);
            let err = check_proof(&proof, &expected()).unwrap_err().0;
            assert!(err.contains("iat is more than 60 s from now"), "{iat}: {err}");
        }
    }

    /// An `iat` is a NumericDate: a client that writes the time as a float (`time.time()`) is
    /// read to the whole second; one that is no number, or not finite, is refused.
    #[test]
    fn a_fractional_iat_is_read_to_the_second() {
        let mut c = claims();
        c["iat"] = json!(NOW as f64 + 0.75);
        let (proof, _) = ed_proof(json!({"typ": "dpop+jwt", "alg": "EdDSA"}), &c);
        assert_eq!(check_proof(&proof, &expected()).unwrap().iat, NOW);
        for bad in [json!("now"), json!(null), json!(1e300)] {
            c["iat"] = bad.clone();
            let (proof, _) = ed_proof(json!({"typ": "dpop+jwt", "alg": "EdDSA"}), &c);
            assert!(check_proof(&proof, &expected()).is_err(), "{bad}");
        }
    }

    /// Attack: a proof made with RFC 9421's published Ed25519 key (or its negation), which
    /// would bind a token to a key whose private half everyone has.
    #[test]
    fn a_proof_by_a_published_test_key_binds_nothing() {
        let d = URL_SAFE_NO_PAD
            .decode("n4Ni-HpISpVObnQMW0wOhCKROaIKqKtW_2ZYb2p9KcU")
            .unwrap();
        let key = SigningKey::from_bytes(&d.try_into().unwrap());
        let jwk = json!({"kty": "OKP", "crv": "Ed25519",
                         "x": URL_SAFE_NO_PAD.encode(key.verifying_key().as_bytes())});
        let header = json!({"typ": "dpop+jwt", "alg": "EdDSA", "jwk": jwk});
        let proof = test_jws::ed_sign(&key, &header, &claims());
        let err = check_proof(&proof, &expected()).unwrap_err().0;
        assert!(err.contains("RFC 9421"), "{err}");
        let mut negated = key.verifying_key().to_bytes();
        negated[31] ^= 0x80;
        let jwk = json!({"kty": "OKP", "crv": "Ed25519", "x": URL_SAFE_NO_PAD.encode(negated)});
        assert!(PublicJwk::parse(&jwk).unwrap_err().0.contains("RFC 9421"));
        let p256 = json!({"kty": "EC", "crv": "P-256", "x": RFC_9421_P256_TEST_KEY_X,
                          "y": "Mc4nN9LTDOBhfoUeg8Ye9WedFRhnZXZJA12Qp0zZ6F0"});
        assert!(PublicJwk::parse(&p256).unwrap_err().0.contains("RFC 9421"));
    }

    #[test]
    fn ed25519_and_es256_proofs_check_and_name_their_key() {
        for alg in ["EdDSA", "Ed25519"] {
            let (proof, jwk) = ed_proof(json!({"typ": "dpop+jwt", "alg": alg}), &claims());
            let checked = check_proof(&proof, &expected()).unwrap();
            assert_eq!(checked.jkt, PublicJwk::parse(&jwk).unwrap().thumbprint());
            assert_eq!((checked.jti.as_str(), checked.iat), ("j1", NOW));
        }
        let (proof, jwk) = es_proof(&claims());
        let checked = check_proof(&proof, &expected()).unwrap();
        assert_eq!(checked.jkt, PublicJwk::parse(&jwk).unwrap().thumbprint());
    }

    #[test]
    fn a_proof_for_another_request_token_time_or_key_is_refused() {
        let header = json!({"typ": "dpop+jwt", "alg": "EdDSA"});
        let with = |k: &str, v: Value| {
            let mut c = claims();
            c[k] = v;
            ed_proof(header.clone(), &c).0
        };
        let cases = [
            (with("htm", json!("POST")), "htm"),
            (with("htu", json!("https://api.example/other")), "htu"),
            (with("ath", json!("AAAA")), "ath"),
            (with("iat", json!(NOW - 61)), "iat"),
            (with("iat", json!(NOW + 61)), "iat"),
            (with("jti", json!("")), "jti"),
            (with("exp", json!(NOW - 1)), "exp is past"),
            (with("exp", json!("later")), "exp must be"),
            (with("nbf", json!(NOW + 61)), "nbf"),
            (
                ed_proof(
                    json!({"typ": "dpop+jwt", "alg": "EdDSA", "crit": ["exp"]}),
                    &claims(),
                )
                .0,
                "crit",
            ),
            (
                ed_proof(json!({"typ": "JWT", "alg": "EdDSA"}), &claims()).0,
                "typ",
            ),
            (
                ed_proof(json!({"typ": "dpop+jwt", "alg": "ES256"}), &claims()).0,
                "does not fit",
            ),
            (
                ed_proof(json!({"typ": "dpop+jwt", "alg": "none"}), &claims()).0,
                "alg",
            ),
            ("a.b".to_owned(), "three parts"),
            ("x".repeat(MAX_PROOF_LEN + 1), "longer than"),
        ];
        for (proof, why) in cases {
            let err = check_proof(&proof, &expected()).unwrap_err().0;
            assert!(err.contains(why), "{why}: {err}");
        }
        // A signature by another key than the one in jwk.
        let (proof, _) = ed_proof(header.clone(), &claims());
        let (other, _) = es_proof(&claims());
        let forged = format!(
            "{}.{}",
            proof.rsplit_once('.').unwrap().0,
            other.rsplit_once('.').unwrap().1
        );
        assert!(check_proof(&forged, &expected())
            .unwrap_err()
            .0
            .contains("signature"));
        // An ES256 proof whose jwk is no point of P-256: read without the binding's point
        // check, and refused by the signature check, which asks the same question.
        let (proof, jwk) = es_proof(&claims());
        let mut bad = jwk.clone();
        bad["y"] = jwk["x"].clone();
        let (h, rest) = proof.split_once('.').unwrap();
        let mut header: Value = serde_json::from_slice(&URL_SAFE_NO_PAD.decode(h).unwrap()).unwrap();
        header["jwk"] = bad;
        let off_curve = format!("{}.{rest}", b64(&header));
        assert!(check_proof(&off_curve, &expected())
            .unwrap_err()
            .0
            .contains("signature"));
        // The query and fragment of htu are not compared (RFC 9449 §4.3).
        let ok = with("htu", json!("https://api.example/orders?page=2"));
        assert!(check_proof(&ok, &expected()).is_ok());
    }

    /// At a token endpoint a proof goes with no token: no `ath` is asked for, and the rest is
    /// checked as ever.
    #[test]
    fn a_proof_for_a_token_request_needs_no_ath() {
        let header = json!({"typ": "dpop+jwt", "alg": "EdDSA"});
        let mut c = claims();
        c.as_object_mut().unwrap().remove("ath");
        let (proof, _) = ed_proof(header.clone(), &c);
        let at_token_endpoint = Expected {
            token: None,
            ..expected()
        };
        assert!(check_proof(&proof, &at_token_endpoint).is_ok());
        assert!(check_proof(&proof, &expected()).unwrap_err().0.contains("ath"));
        c["htm"] = json!("POST");
        let (proof, _) = ed_proof(header, &c);
        assert!(check_proof(&proof, &at_token_endpoint)
            .unwrap_err()
            .0
            .contains("htm"));
    }
}

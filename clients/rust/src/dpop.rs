//! DPoP proofs (RFC 9449) of the agent's key, checked as the service checks them: a JWT with
//! `typ` `dpop+jwt`, `alg` EdDSA, Ed25519 or ES256, its public key in its `jwk` header, signed
//! by that key (`ed25519-dalek`'s strict check, `ring`'s ECDSA), with `jti`, `htm`, `htu`,
//! `iat` and `ath` matching the request. And the bounded memory of proofs taken.

use std::collections::HashMap;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use ed25519_dalek::{Signature, VerifyingKey};
use ring::digest::{digest, SHA256};
use serde_json::{Map, Value};

use crate::{now_millis, Agent, Error, Verifier};

mod htu;
mod replays;
use htu::htu_form;
pub(crate) use replays::Replays;

/// The longest proof read; a longer one is `PROOF_INVALID`, unparsed.
pub const MAX_PROOF_BYTES: usize = 4096;
/// How many proofs a verifier remembers to refuse a replay.
pub const SEEN_PROOFS: usize = 100_000;
const MAX_JTI_CHARS: usize = 256;
const PRIVATE_MEMBERS: [&str; 8] = ["d", "p", "q", "dp", "dq", "qi", "oth", "k"];

fn refuse<T>(why: impl std::fmt::Display) -> Result<T, Error> {
    Err(Error::ProofInvalid(format!("DPoP proof: {why}")))
}

fn object(part: &str, what: &str) -> Result<Map<String, Value>, Error> {
    match URL_SAFE_NO_PAD
        .decode(part)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
    {
        Some(Value::Object(m)) => Ok(m),
        _ => refuse(format!("its {what} is not a base64url JSON object")),
    }
}

fn coordinate(jwk: &Map<String, Value>, name: &str) -> Result<Vec<u8>, Error> {
    match jwk
        .get(name)
        .and_then(Value::as_str)
        .map(|s| URL_SAFE_NO_PAD.decode(s))
    {
        Some(Ok(b)) if b.len() == 32 => Ok(b),
        _ => refuse(format!("jwk's {name} is not 32 bytes of base64url")),
    }
}

fn text<'a>(m: &'a Map<String, Value>, name: &str) -> &'a str {
    m.get(name).and_then(Value::as_str).unwrap_or_default()
}

/// The RFC 7638 SHA-256 thumbprint of a public OKP or EC key (already checked), base64url.
fn thumbprint(jwk: &Map<String, Value>) -> String {
    let members: &[&str] = if text(jwk, "kty") == "OKP" {
        &["crv", "kty", "x"]
    } else {
        &["crv", "kty", "x", "y"]
    };
    // serde_json's maps are sorted by key and it writes no white space: RFC 7638's form.
    let canonical: Map<String, Value> = members
        .iter()
        .map(|m| ((*m).to_owned(), jwk[*m].clone()))
        .collect();
    let json = serde_json::to_string(&canonical).expect("JSON");
    URL_SAFE_NO_PAD.encode(digest(&SHA256, json.as_bytes()))
}

/// How many agents' Ed25519 keys are kept decoded: an agent signs every request with the same
/// key, and decoding one (a point decompression) is a good part of checking its signature.
const KEYS_KEPT: usize = 1024;

/// The Ed25519 key `x` encodes, decoded once for the last [`KEYS_KEPT`] keys (all forgotten
/// together when one more comes).
fn ed25519_key(x: [u8; 32]) -> Option<VerifyingKey> {
    static KEYS: std::sync::OnceLock<parking_lot::Mutex<HashMap<[u8; 32], VerifyingKey>>> =
        std::sync::OnceLock::new();
    let keys = KEYS.get_or_init(Default::default);
    if let Some(k) = keys.lock().get(&x) {
        return Some(*k);
    }
    let key = VerifyingKey::from_bytes(&x).ok()?;
    let mut held = keys.lock();
    if held.len() >= KEYS_KEPT {
        held.clear();
    }
    held.insert(x, key);
    Some(key)
}

/// A proof that checked: its key's thumbprint, its `jti` and `iat`.
pub(crate) struct Checked {
    pub(crate) jkt: String,
    pub(crate) jti: String,
    pub(crate) iat: i64,
}

/// Checks `proof` for a `method` request to `url` with `token` at `now_ms` (milliseconds since
/// the Unix epoch: a proof's times are held to now as it is, as the Python and TypeScript
/// libraries hold them to a fractional now), its `iat` at most `max_skew` seconds from it.
pub(crate) fn check_proof(
    proof: &str,
    method: &str,
    url: &str,
    token: &str,
    now_ms: i64,
    max_skew: i64,
) -> Result<Checked, Error> {
    if proof.len() > MAX_PROOF_BYTES {
        return refuse(format!("longer than {MAX_PROOF_BYTES} bytes"));
    }
    let mut parts = proof.split('.');
    let (Some(h), Some(p), Some(s), None) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
        return refuse("not a compact JWS");
    };
    let header = object(h, "header")?;
    if header.get("typ").and_then(Value::as_str) != Some("dpop+jwt") {
        return refuse("typ must be dpop+jwt");
    }
    if header.contains_key("crit") {
        return refuse("its header names critical extensions (crit), which are not understood here");
    }
    let alg = text(&header, "alg");
    let fits = match alg {
        "EdDSA" | "Ed25519" => ("OKP", "Ed25519"),
        "ES256" => ("EC", "P-256"),
        _ => return refuse("alg must be EdDSA, Ed25519 or ES256"),
    };
    let Some(Value::Object(jwk)) = header.get("jwk") else {
        return refuse("jwk must be the public key, as a JSON object");
    };
    if let Some(m) = PRIVATE_MEMBERS.iter().find(|m| jwk.contains_key(**m)) {
        return refuse(format!("jwk holds the private member {m:?}"));
    }
    if (text(jwk, "kty"), text(jwk, "crv")) != fits {
        return refuse(format!(
            "alg {alg} does not fit a {}/{} key",
            text(jwk, "kty"),
            text(jwk, "crv")
        ));
    }
    let signature = URL_SAFE_NO_PAD
        .decode(s)
        .or_else(|_| refuse("its signature is not base64url"))?;
    let signed = &proof.as_bytes()[..h.len() + 1 + p.len()];
    let checks = if fits.0 == "OKP" {
        let x: [u8; 32] = coordinate(jwk, "x")?.try_into().expect("32 bytes");
        let sig = Signature::from_slice(&signature).or_else(|_| refuse("its signature is not 64 bytes"))?;
        ed25519_key(x).is_some_and(|k| k.verify_strict(signed, &sig).is_ok())
    } else {
        let mut point = vec![4u8];
        point.extend(coordinate(jwk, "x")?);
        point.extend(coordinate(jwk, "y")?);
        ring::signature::UnparsedPublicKey::new(&ring::signature::ECDSA_P256_SHA256_FIXED, point)
            .verify(signed, &signature)
            .is_ok()
    };
    if !checks {
        return refuse("the signature does not check with the key in jwk");
    }
    let claims = object(p, "claims")?;
    let jti = text(&claims, "jti");
    if jti.is_empty() || jti.chars().count() > MAX_JTI_CHARS {
        return refuse(format!("jti must be a string of 1 to {MAX_JTI_CHARS} characters"));
    }
    if text(&claims, "htm") != method {
        return refuse(format!("htm is not {method}"));
    }
    let htu = text(&claims, "htu");
    let wanted = htu_form(url);
    if htu.is_empty() || htu_form(htu) != wanted {
        return refuse(format!("htu is not {wanted}"));
    }
    let skew_ms = max_skew.unsigned_abs().saturating_mul(1000);
    // A NumericDate (RFC 7519 §2): whole seconds taken, a fraction dropped.
    let whole = |v: &Value| {
        v.as_i64()
            .or_else(|| v.as_f64().filter(|f| f.is_finite()).map(|f| f.floor() as i64))
    };
    let iat = match claims.get("iat").and_then(whole) {
        Some(iat) if iat.saturating_mul(1000).abs_diff(now_ms) <= skew_ms => iat,
        _ => return refuse(format!("iat is more than {max_skew} s from now")),
    };
    // Not asked for (RFC 9449 bounds a proof by its iat), but honoured when present.
    let date = |name: &str| claims.get(name).map(|v| v.as_f64().map(|f| f * 1000.0));
    match date("exp") {
        Some(Some(exp)) if exp <= now_ms as f64 => return refuse("exp is past"),
        Some(None) => return refuse("exp must be a number"),
        _ => {}
    }
    match date("nbf") {
        Some(Some(nbf)) if nbf > now_ms as f64 + skew_ms as f64 => return refuse("nbf is in the future"),
        Some(None) => return refuse("nbf must be a number"),
        _ => {}
    }
    if text(&claims, "ath") != URL_SAFE_NO_PAD.encode(digest(&SHA256, token.as_bytes())) {
        return refuse("ath is not the token's hash");
    }
    Ok(Checked {
        jkt: thumbprint(jwk),
        jti: jti.to_owned(),
        iat,
    })
}

impl Verifier {
    /// Verifies a token bound to a key with the DPoP `proof` that came with it, for a
    /// `method` request to `url` (as the agent addressed it: the receiver's public origin):
    /// the token as [`Verifier::verify_with_scopes`] does, then the proof (its signature by
    /// the token's key, `typ`, `alg`, `htm`, `htu`, `ath`, `iat` within
    /// [`Builder::dpop_max_skew`](crate::Builder::dpop_max_skew)), which passes once (`PROOF_REPLAYED` after). A token that is
    /// not bound, or a missing proof, is `PROOF_INVALID`.
    pub async fn verify_dpop(
        &self,
        token: &str,
        proof: Option<&str>,
        method: &str,
        url: &str,
        scopes: &[&str],
    ) -> Result<Agent, Error> {
        self.told(self.dpop(token, proof, method, url, scopes).await)
    }

    pub(crate) async fn dpop(
        &self,
        token: &str,
        proof: Option<&str>,
        method: &str,
        url: &str,
        scopes: &[&str],
    ) -> Result<Agent, Error> {
        let agent = self.checked(token, scopes).await?;
        let Some(bound) = agent.claims["cnf"]["jkt"].as_str() else {
            return Err(Error::ProofInvalid(
                "the token is not bound to a key: send it as a Bearer token".into(),
            ));
        };
        let Some(proof) = proof else {
            return Err(Error::ProofInvalid(
                "no DPoP proof came with a token bound to a key".into(),
            ));
        };
        let now_ms = now_millis();
        let skew = self.inner.dpop_max_skew;
        let checked = check_proof(proof, method, url, token, now_ms, skew)?;
        if checked.jkt != bound {
            return Err(Error::ProofInvalid(
                "DPoP proof signed by a key other than the one the token is bound to".into(),
            ));
        }
        self.inner
            .state
            .lock()
            .proofs
            .admit(&checked, now_ms.div_euclid(1000).saturating_sub(skew))?;
        Ok(agent)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Attack: a proof dated at the ends of i64's range. Its distance from now is taken
    /// without overflow: refused, never a panic or a wrapped pass.
    #[test]
    fn an_iat_at_the_ends_of_its_range_is_refused() {
        let now = 1_800_000_000;
        for iat in [i64::MIN, i64::MIN + now, i64::MAX] {
            let claims =
                serde_json::json!({"jti": "j", "htm": "GET", "htu": "https://a.example/x", "iat": iat});
            let got = check_proof(
                &signed(&claims),
                "GET",
                "https://a.example/x",
                "t",
                now * 1000,
                60,
            );
            assert!(matches!(&got, Err(e) if e.to_string().contains("iat")), "{iat}");
        }
    }

    /// A proof's `iat` is held to now as it is, to the millisecond: exactly the skew before
    /// now's second, a millisecond into it, is further than the skew.
    #[test]
    fn an_iat_just_past_the_skew_is_refused() {
        let now = 1_800_000_000;
        let check = |iat: i64| proof_at(serde_json::json!(iat), now * 1000 + 1);
        assert!(matches!(check(now - 60), Err(e) if e.to_string().contains("iat")));
        assert!(check(now - 59).is_ok());
        assert!(check(now + 60).is_ok());
    }

    /// A client that writes the time as a float (`time.time()`) is read to the second; an
    /// `iat` that is no number is refused.
    #[test]
    fn a_fractional_iat_is_read_to_the_second() {
        let now = 1_800_000_000;
        let check = |iat: Value| proof_at(iat, now * 1000);
        assert!(check(serde_json::json!(now as f64 + 0.75)).is_ok());
        assert!(check(serde_json::json!("now")).is_err());
        assert!(check(serde_json::json!(1e300)).is_err());
    }

    /// The check, at `now_ms` with a skew of 60 s, of a sound proof for `GET
    /// https://a.example/x` with token `t`, made at `iat`.
    fn proof_at(iat: Value, now_ms: i64) -> Result<Checked, Error> {
        let claims = serde_json::json!({"jti": "j", "htm": "GET", "htu": "https://a.example/x", "iat": iat,
            "ath": URL_SAFE_NO_PAD.encode(ring::digest::digest(&ring::digest::SHA256, b"t"))});
        check_proof(&signed(&claims), "GET", "https://a.example/x", "t", now_ms, 60)
    }

    /// A proof of `claims` by a fixed Ed25519 key.
    fn signed(claims: &Value) -> String {
        use ed25519_dalek::Signer as _;
        let key = ed25519_dalek::SigningKey::from_bytes(&[7; 32]);
        let jwk = serde_json::json!({"kty": "OKP", "crv": "Ed25519",
                                     "x": URL_SAFE_NO_PAD.encode(key.verifying_key().as_bytes())});
        let header = serde_json::json!({"typ": "dpop+jwt", "alg": "EdDSA", "jwk": jwk});
        let signed = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header.to_string()),
            URL_SAFE_NO_PAD.encode(claims.to_string())
        );
        format!(
            "{signed}.{}",
            URL_SAFE_NO_PAD.encode(key.sign(signed.as_bytes()).to_bytes())
        )
    }

    /// RFC 9449 §4.3: `htu` is compared after RFC 3986's syntax- and scheme-based
    /// normalization (as the service compares it); what names another resource stays apart.
    #[test]
    fn htu_matches_another_writing_of_the_same_url_only() {
        let now = 1_800_000_000;
        let check = |htu: &str, url: &str| {
            let claims = serde_json::json!({"jti": "j", "htm": "GET", "htu": htu, "iat": now,
                "ath": URL_SAFE_NO_PAD.encode(ring::digest::digest(&ring::digest::SHA256, b"t"))});
            check_proof(&signed(&claims), "GET", url, "t", now * 1000, 60)
        };
        let got = check("HTTPS://API.Example/%6Frders", "https://api.example:443/orders");
        assert!(got.is_ok(), "{:?}", got.err());
        let got = check("https://api.example/Orders", "https://api.example/orders");
        assert!(matches!(&got, Err(e) if e.to_string().contains("htu")));
        for (a, b) in [
            ("https://api.example/~orders", "https://api.example/%7eorders"),
            ("https://api.example/a%2Fb", "https://api.example/a%2fb"),
            ("https://api.example/", "https://api.example"),
            ("https://api.example/a/c", "https://api.example/a/./b/../c"),
            ("https://api.example/a/", "https://api.example/a/b/.."),
            ("http://api.example/x", "http://api.example:80/x"),
            ("https://api.example/x", "https://api.example:/x"),
            ("https://[::1]/x", "https://[::1]:443/x"),
        ] {
            assert_eq!(htu_form(a), htu_form(b), "{a} {b}");
        }
        for (a, b) in [
            ("https://api.example/x", "https://api.example:8443/x"),
            ("https://api.example/x", "http://api.example:443/x"),
            ("https://api.example/a%2Fb", "https://api.example/a/b"),
            ("https://api.example/x", "https://api.example./x"),
        ] {
            assert_ne!(htu_form(a), htu_form(b), "{a} {b}");
        }
    }
}

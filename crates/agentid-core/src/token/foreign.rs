//! JWTs that another issuer signed: a person's ID token or access token from an identity
//! provider, or an ID-JAG (draft-ietf-oauth-identity-assertion-authz-grant). Checked against
//! the provider's key set: `RS256`, `PS256`, `ES256`, `ES384` or `EdDSA`, the key found by
//! `kid` (or the only key of its type when the token names none), a signature by `ring`, then
//! the times (`exp` required, `nbf` and `iat` not ahead of now beyond the skew). Whose token
//! it is (`iss`, `aud`) is the caller's to judge. Never panics.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use ring::signature::{self, RsaPublicKeyComponents, UnparsedPublicKey};
use serde_json::{Map, Value};

/// The longest token read.
pub const MAX_FOREIGN_TOKEN_LEN: usize = 8192;

/// A refusal: why, and whether the token names a key the set lacks (a reason to fetch the
/// set again, once).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub reason: String,
    pub unknown_key: bool,
}

fn refuse<T>(reason: impl Into<String>) -> Result<T, Refused> {
    Err(Refused {
        reason: reason.into(),
        unknown_key: false,
    })
}

/// A token whose signature and times checked.
#[derive(Debug, Clone)]
pub struct Foreign {
    /// The header's `typ`, if any.
    pub typ: Option<String>,
    pub claims: Map<String, Value>,
}

impl Foreign {
    /// A string claim.
    pub fn text(&self, name: &str) -> Option<&str> {
        self.claims.get(name).and_then(Value::as_str)
    }

    /// An integer claim.
    pub fn int(&self, name: &str) -> Option<i64> {
        self.claims.get(name).and_then(Value::as_i64)
    }

    /// Whether `aud` (a string or an array of strings) names one of `wanted`.
    pub fn audience_is_one_of(&self, wanted: &[&str]) -> bool {
        match self.claims.get("aud") {
            Some(Value::String(a)) => wanted.contains(&a.as_str()),
            Some(Value::Array(all)) => all
                .iter()
                .any(|a| a.as_str().is_some_and(|a| wanted.contains(&a))),
            _ => false,
        }
    }
}

/// A token's `iss`, read without checking anything: which provider's keys to check it with.
pub fn unverified_issuer(token: &str) -> Option<String> {
    if token.len() > MAX_FOREIGN_TOKEN_LEN {
        return None;
    }
    let payload = token.split('.').nth(1)?;
    let v: Value = serde_json::from_slice(&URL_SAFE_NO_PAD.decode(payload).ok()?).ok()?;
    v.get("iss")?.as_str().map(str::to_owned)
}

/// Checks `token`'s signature with a key of `jwks` and its times against `now` (Unix
/// seconds), allowing `max_skew` seconds of clock difference.
pub fn verify(token: &str, jwks: &Value, now: i64, max_skew: i64) -> Result<Foreign, Refused> {
    if token.len() > MAX_FOREIGN_TOKEN_LEN {
        return refuse(format!("longer than {MAX_FOREIGN_TOKEN_LEN} bytes"));
    }
    let mut parts = token.split('.');
    let (Some(h), Some(p), Some(s), None) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
        return refuse("not a compact JWS (three base64url parts)");
    };
    let json = |part: &str| -> Option<Map<String, Value>> {
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(part).ok()?).ok()
    };
    let Some(header) = json(h) else {
        return refuse("its header is not base64url JSON");
    };
    let Some(claims) = json(p) else {
        return refuse("its payload is not a base64url JSON object");
    };
    let Ok(sig) = URL_SAFE_NO_PAD.decode(s) else {
        return refuse("its signature is not base64url");
    };
    if header.contains_key("crit") {
        return refuse("its header has crit, which is not supported");
    }
    let alg = header.get("alg").and_then(Value::as_str).unwrap_or("");
    let kty = match alg {
        "RS256" | "PS256" => "RSA",
        "ES256" | "ES384" => "EC",
        "EdDSA" => "OKP",
        other => {
            return refuse(format!(
                "alg {other:?} is not one of RS256, PS256, ES256, ES384, EdDSA"
            ))
        }
    };
    let kid = header.get("kid").and_then(Value::as_str);
    let key = find_key(jwks, kid, kty, alg)?;
    let signed = &token.as_bytes()[..h.len() + 1 + p.len()];
    check_signature(key, alg, signed, &sig)?;
    let typ = header.get("typ").and_then(Value::as_str).map(str::to_owned);
    let out = Foreign { typ, claims };
    let Some(exp) = out.int("exp") else {
        return refuse("exp is required (a number)");
    };
    if exp.saturating_add(max_skew) <= now {
        return refuse("it expired");
    }
    for (name, what) in [
        ("nbf", "is not valid yet (nbf)"),
        ("iat", "was issued in the future (iat)"),
    ] {
        match out.claims.get(name) {
            None => {}
            Some(v) => match v.as_i64() {
                Some(t) if t <= now + max_skew => {}
                Some(_) => return refuse(format!("it {what}")),
                None => return refuse(format!("{name} must be a number")),
            },
        }
    }
    Ok(out)
}

/// The key of `jwks` that `kid` names (of type `kty`, usable for `alg`); without a `kid`, the
/// set's only key of that type.
fn find_key<'a>(
    jwks: &'a Value,
    kid: Option<&str>,
    kty: &str,
    alg: &str,
) -> Result<&'a Map<String, Value>, Refused> {
    let keys = jwks
        .get("keys")
        .and_then(Value::as_array)
        .map_or(&[][..], Vec::as_slice);
    let usable = |k: &&Map<String, Value>| {
        k.get("kty").and_then(Value::as_str) == Some(kty)
            && k.get("use").and_then(Value::as_str).is_none_or(|u| u == "sig")
            && k.get("alg").and_then(Value::as_str).is_none_or(|a| a == alg)
    };
    let mut candidates = keys.iter().filter_map(Value::as_object).filter(usable);
    let found = match kid {
        Some(kid) => candidates.find(|k| k.get("kid").and_then(Value::as_str) == Some(kid)),
        None => match (candidates.next(), candidates.next()) {
            (Some(one), None) => Some(one),
            _ => None,
        },
    };
    found.ok_or_else(|| Refused {
        reason: match kid {
            Some(kid) => format!("the provider's key set has no {alg} key {kid:?}"),
            None => {
                format!("the token names no kid, and the provider's key set has not exactly one {kty} key")
            }
        },
        unknown_key: true,
    })
}

fn member(key: &Map<String, Value>, name: &str) -> Result<Vec<u8>, Refused> {
    key.get(name)
        .and_then(Value::as_str)
        .and_then(|v| URL_SAFE_NO_PAD.decode(v).ok())
        .ok_or_else(|| Refused {
            reason: format!("the provider's key has no readable {name:?}"),
            unknown_key: false,
        })
}

fn check_signature(key: &Map<String, Value>, alg: &str, signed: &[u8], sig: &[u8]) -> Result<(), Refused> {
    let ok = match alg {
        "RS256" | "PS256" => {
            let (n, e) = (member(key, "n")?, member(key, "e")?);
            let params = if alg == "RS256" {
                &signature::RSA_PKCS1_2048_8192_SHA256
            } else {
                &signature::RSA_PSS_2048_8192_SHA256
            };
            RsaPublicKeyComponents { n: &n, e: &e }
                .verify(params, signed, sig)
                .is_ok()
        }
        "ES256" | "ES384" => {
            let (crv, params, len): (_, &'static signature::EcdsaVerificationAlgorithm, _) = if alg == "ES256"
            {
                ("P-256", &signature::ECDSA_P256_SHA256_FIXED, 32)
            } else {
                ("P-384", &signature::ECDSA_P384_SHA384_FIXED, 48)
            };
            let (x, y) = (member(key, "x")?, member(key, "y")?);
            if key.get("crv").and_then(Value::as_str) != Some(crv) || x.len() != len || y.len() != len {
                return refuse(format!("the provider's key is not a {crv} key"));
            }
            let mut point = Vec::with_capacity(1 + 2 * len);
            point.push(4);
            point.extend_from_slice(&x);
            point.extend_from_slice(&y);
            UnparsedPublicKey::new(params, point).verify(signed, sig).is_ok()
        }
        _ => {
            let x = member(key, "x")?;
            if key.get("crv").and_then(Value::as_str) != Some("Ed25519") || x.len() != 32 {
                return refuse("the provider's key is not an Ed25519 key");
            }
            UnparsedPublicKey::new(&signature::ED25519, x)
                .verify(signed, sig)
                .is_ok()
        }
    };
    if ok {
        Ok(())
    } else {
        refuse("its signature does not verify with the provider's key")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ed25519_dalek::{Signer, SigningKey};
    use serde_json::json;

    fn signed(key: &SigningKey, header: Value, claims: Value) -> String {
        let mut t = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header.to_string()),
            URL_SAFE_NO_PAD.encode(claims.to_string())
        );
        let sig = key.sign(t.as_bytes());
        t.push('.');
        t.push_str(&URL_SAFE_NO_PAD.encode(sig.to_bytes()));
        t
    }

    fn set(key: &SigningKey, kid: &str) -> Value {
        json!({"keys": [{"kty": "OKP", "crv": "Ed25519", "kid": kid,
            "x": URL_SAFE_NO_PAD.encode(key.verifying_key().as_bytes())}]})
    }

    #[test]
    fn a_token_verifies_with_its_key_and_times() {
        let key = SigningKey::from_bytes(&[7; 32]);
        let now = 1_800_000_000;
        let claims = json!({"iss": "https://idp.example", "sub": "alice", "aud": ["a", "b"], "exp": now + 60, "iat": now});
        let t = signed(&key, json!({"alg": "EdDSA", "kid": "k1"}), claims.clone());
        let ok = verify(&t, &set(&key, "k1"), now, 60).unwrap();
        assert_eq!(ok.text("sub"), Some("alice"));
        assert!(ok.audience_is_one_of(&["b"]));
        assert!(!ok.audience_is_one_of(&["c"]));
        assert_eq!(unverified_issuer(&t).as_deref(), Some("https://idp.example"));
        // Without a kid: the only Ed25519 key.
        let t2 = signed(&key, json!({"alg": "EdDSA"}), claims.clone());
        assert!(verify(&t2, &set(&key, "k1"), now, 60).is_ok());
        // Another key, another kid, a tampered payload, the wrong alg, expiry, future iat.
        let other = SigningKey::from_bytes(&[8; 32]);
        assert!(verify(&t, &set(&other, "k1"), now, 60).is_err());
        let unknown = verify(&t, &set(&key, "k2"), now, 60).unwrap_err();
        assert!(unknown.unknown_key);
        let mut parts: Vec<&str> = t.split('.').collect();
        let forged = URL_SAFE_NO_PAD
            .encode(json!({"iss": "https://idp.example", "sub": "mallory", "exp": now + 60}).to_string());
        parts[1] = &forged;
        assert!(verify(&parts.join("."), &set(&key, "k1"), now, 60).is_err());
        let none = signed(&key, json!({"alg": "none", "kid": "k1"}), claims.clone());
        assert!(verify(&none, &set(&key, "k1"), now, 60).is_err());
        let hs = signed(&key, json!({"alg": "HS256", "kid": "k1"}), claims.clone());
        assert!(verify(&hs, &set(&key, "k1"), now, 60).is_err());
        assert!(verify(&t, &set(&key, "k1"), now + 200, 60).is_err());
        let ahead = signed(
            &key,
            json!({"alg": "EdDSA", "kid": "k1"}),
            json!({"exp": now + 900, "iat": now + 600}),
        );
        assert!(verify(&ahead, &set(&key, "k1"), now, 60).is_err());
        let no_exp = signed(&key, json!({"alg": "EdDSA", "kid": "k1"}), json!({"sub": "x"}));
        assert!(verify(&no_exp, &set(&key, "k1"), now, 60).is_err());
        let crit = signed(&key, json!({"alg": "EdDSA", "kid": "k1", "crit": ["x"]}), claims);
        assert!(verify(&crit, &set(&key, "k1"), now, 60).is_err());
        for junk in ["", "a.b", "a.b.c.d", "!!.!!.!!"] {
            assert!(verify(junk, &set(&key, "k1"), now, 60).is_err(), "{junk}");
        }
    }
}

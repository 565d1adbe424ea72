//! The JWT an OAuth client authenticates with (`private_key_jwt`, RFC 7523 §2.2 and
//! RFC 7521 §5.2): signed by the client's own key, naming the client as `iss` and `sub` and
//! the authorization server as `aud`, short-lived, and used once. Pure functions: the caller
//! supplies the key, the time and the audiences, and remembers `jti`s.

use serde_json::{Map, Value};

use super::dpop::{DpopError, Jws, PublicJwk};

/// The longest `jti` taken.
pub const MAX_JTI_LEN: usize = 256;

/// Why an assertion is refused, said so that the client can tell which part failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct AssertionError(pub String);

fn refuse<T>(why: impl Into<String>) -> Result<T, AssertionError> {
    Err(AssertionError(why.into()))
}

impl From<DpopError> for AssertionError {
    fn from(e: DpopError) -> Self {
        AssertionError(e.0)
    }
}

/// What an assertion must match.
#[derive(Debug, Clone)]
pub struct Expected<'a> {
    /// The client it authenticates: its `iss` and its `sub`.
    pub client_id: &'a str,
    /// Who it may be for: the issuer identifier, the token endpoint's URL. Its `aud` must
    /// name one of them.
    pub audiences: &'a [&'a str],
    /// Now, in seconds since the epoch.
    pub now: i64,
    /// The longest `exp - iat` taken.
    pub max_lifetime: i64,
    /// How far in the future `iat` and `nbf` may be.
    pub max_skew: i64,
}

/// An assertion that checked: its `jti` and until when it could pass (`exp`), which is how
/// long its `jti` must be remembered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checked {
    pub jti: String,
    pub exp: i64,
}

/// A NumericDate (RFC 7519 §2): a JSON number, whole seconds taken (a fraction is dropped).
fn numeric_date(claims: &Map<String, Value>, name: &str) -> Result<Option<i64>, AssertionError> {
    match claims.get(name) {
        None => Ok(None),
        Some(v) => match v
            .as_i64()
            .or_else(|| v.as_f64().filter(|f| f.is_finite()).map(|f| f as i64))
        {
            Some(t) => Ok(Some(t)),
            None => refuse(format!("{name} must be a number of seconds")),
        },
    }
}

/// The client an assertion says it is for (its `sub`), read without checking anything, to
/// find the key that must have signed it. `None` when it is no JWT with a string `sub`.
pub fn claimed_client(assertion: &str) -> Option<String> {
    match Jws::parse(assertion).ok()?.claims().ok()?.get("sub") {
        Some(Value::String(s)) => Some(s.clone()),
        _ => None,
    }
}

/// Checks a client assertion signed by `key`: a compact JWS of at most 4 KiB whose `alg`
/// fits the key (EdDSA for Ed25519, ES256 for P-256; `none` and every MAC refused), whose
/// header names no critical extension and no other type of token, whose signature checks,
/// and whose claims are `iss` = `sub` = the client, an `aud` naming one of `audiences`, an
/// `exp` in the future at most `max_lifetime` after `iat`, an `iat` and `nbf` not in the
/// future, and a `jti`. Whether the `jti` was used before is the caller's to decide.
pub fn check(assertion: &str, key: &PublicJwk, expected: &Expected<'_>) -> Result<Checked, AssertionError> {
    let jws = Jws::parse(assertion)?;
    let header = &jws.header;
    let alg = match header.get("alg") {
        Some(Value::String(a)) if key.algorithms().contains(&a.as_str()) => a.as_str(),
        Some(Value::String(a)) => {
            return refuse(format!(
                "alg {a:?} does not fit the client's key (it takes {})",
                key.algorithms().join(" or ")
            ))
        }
        _ => return refuse("alg is missing"),
    };
    if header.contains_key("crit") {
        return refuse("its header names critical extensions (crit), which are not understood here");
    }
    // A token of another kind (a DPoP proof, an access token) is not a client assertion,
    // however it is signed (RFC 8725 §3.11).
    match header.get("typ") {
        None => {}
        Some(Value::String(t))
            if t.eq_ignore_ascii_case("JWT") || t.eq_ignore_ascii_case("client-authentication+jwt") => {}
        Some(t) => return refuse(format!("typ {t} is not that of a client assertion")),
    }
    jws.verify(key, alg)
        .map_err(|e| AssertionError(format!("{e} with the client's key")))?;

    let claims = jws.claims()?;
    for name in ["iss", "sub"] {
        if claims.get(name).and_then(Value::as_str) != Some(expected.client_id) {
            return refuse(format!("{name} must be the client_id {}", expected.client_id));
        }
    }
    let named = |v: &Value| v.as_str().is_some_and(|a| expected.audiences.contains(&a));
    let for_us = match claims.get("aud") {
        Some(Value::Array(many)) => many.iter().any(named),
        Some(one) => named(one),
        None => false,
    };
    if !for_us {
        return refuse(format!("aud must name {}", expected.audiences.join(" or ")));
    }
    let (Some(exp), Some(iat)) = (numeric_date(&claims, "exp")?, numeric_date(&claims, "iat")?) else {
        return refuse("exp and iat are required");
    };
    if exp <= expected.now {
        return refuse("it has expired (exp is past)");
    }
    if iat > expected.now + expected.max_skew {
        return refuse("iat is in the future");
    }
    if exp.saturating_sub(iat) > expected.max_lifetime {
        return refuse(format!(
            "exp is more than {} s after iat: an assertion lives at most that long",
            expected.max_lifetime
        ));
    }
    if numeric_date(&claims, "nbf")?.is_some_and(|nbf| nbf > expected.now + expected.max_skew) {
        return refuse("it is not valid yet (nbf is in the future)");
    }
    let jti = match claims.get("jti") {
        Some(Value::String(j)) if !j.is_empty() && j.len() <= MAX_JTI_LEN => j.clone(),
        _ => return refuse(format!("jti must be a string of 1 to {MAX_JTI_LEN} characters")),
    };
    Ok(Checked { jti, exp })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::token::dpop::MAX_PROOF_LEN;
    use crate::token::test_jws::{self, b64};
    use ed25519_dalek::SigningKey;
    use serde_json::json;

    const NOW: i64 = 1_800_000_000;
    const CLIENT: &str = "agt_01jd0000000000000000000000";
    const ISSUER: &str = "https://id.example";
    const TOKEN_ENDPOINT: &str = "https://id.example/oauth/token";

    fn expected() -> Expected<'static> {
        Expected {
            client_id: CLIENT,
            audiences: &[ISSUER, TOKEN_ENDPOINT],
            now: NOW,
            max_lifetime: 300,
            max_skew: 60,
        }
    }

    fn claims() -> Value {
        json!({"iss": CLIENT, "sub": CLIENT, "aud": ISSUER, "iat": NOW, "exp": NOW + 300, "jti": "j1"})
    }

    fn ed_key() -> (SigningKey, PublicJwk) {
        let (key, jwk) = test_jws::ed_key(9);
        (key, PublicJwk::parse(&jwk).unwrap())
    }

    fn ed_signed(header: &Value, claims: &Value) -> String {
        test_jws::ed_sign(&ed_key().0, header, claims)
    }

    fn es_signed(claims: &Value) -> (String, PublicJwk) {
        let (pair, jwk) = test_jws::p256();
        let header = json!({"alg": "ES256", "typ": "JWT"});
        (
            test_jws::es_sign(&pair, &header, claims),
            PublicJwk::parse(&jwk).unwrap(),
        )
    }

    #[test]
    fn assertions_as_stock_clients_sign_them_check() {
        let (_, key) = ed_key();
        // The MCP SDK: aud the issuer, 300 s, typ JWT, no kid.
        let mcp = ed_signed(&json!({"alg": "EdDSA", "typ": "JWT"}), &claims());
        assert_eq!(
            check(&mcp, &key, &expected()).unwrap(),
            Checked {
                jti: "j1".into(),
                exp: NOW + 300
            }
        );
        // authlib: aud the token endpoint, a kid, a fractional iat.
        let mut c = claims();
        c["aud"] = json!(TOKEN_ENDPOINT);
        c["iat"] = json!(NOW as f64 + 0.5);
        let authlib = ed_signed(&json!({"alg": "EdDSA", "typ": "JWT", "kid": "k1"}), &c);
        assert!(check(&authlib, &key, &expected()).is_ok());
        // An array naming us among others, and the rfc7523bis typ.
        c["aud"] = json!(["https://other.example", ISSUER]);
        let bis = ed_signed(&json!({"alg": "EdDSA", "typ": "client-authentication+jwt"}), &c);
        assert!(check(&bis, &key, &expected()).is_ok());
        let (es, es_key) = es_signed(&claims());
        assert!(check(&es, &es_key, &expected()).is_ok());
        assert_eq!(claimed_client(&es).as_deref(), Some(CLIENT));
    }

    #[test]
    fn every_part_that_does_not_fit_is_refused_and_named() {
        let (_, key) = ed_key();
        let header = json!({"alg": "EdDSA", "typ": "JWT"});
        let with = |k: &str, v: Value| {
            let mut c = claims();
            if v.is_null() {
                c.as_object_mut().unwrap().remove(k);
            } else {
                c[k] = v;
            }
            ed_signed(&header, &c)
        };
        let cases = [
            (with("iss", json!("agt_other")), "iss must be"),
            (with("sub", json!("agt_other")), "sub must be"),
            (with("aud", json!("https://other.example")), "aud must name"),
            (with("aud", json!(["https://other.example"])), "aud must name"),
            (with("aud", Value::Null), "aud must name"),
            (with("exp", json!(NOW)), "expired"),
            (with("exp", json!(NOW + 301)), "more than 300 s"),
            // A lifetime past i64's range is past 300 s too, not a negative one.
            (
                {
                    let mut c = claims();
                    c["iat"] = json!(i64::MIN);
                    c["exp"] = json!(i64::MAX);
                    ed_signed(&header, &c)
                },
                "more than 300 s",
            ),
            (with("exp", Value::Null), "exp and iat"),
            (with("iat", Value::Null), "exp and iat"),
            (with("iat", json!(NOW + 61)), "iat is in the future"),
            (with("iat", json!("soon")), "iat must be a number"),
            (with("nbf", json!(NOW + 61)), "nbf"),
            (with("jti", Value::Null), "jti"),
            (with("jti", json!("x".repeat(257))), "jti"),
            (
                ed_signed(&json!({"alg": "EdDSA", "typ": "dpop+jwt"}), &claims()),
                "typ",
            ),
            (
                ed_signed(&json!({"alg": "EdDSA", "typ": "at+jwt"}), &claims()),
                "typ",
            ),
            (
                ed_signed(&json!({"alg": "EdDSA", "crit": ["b64"]}), &claims()),
                "crit",
            ),
            (ed_signed(&json!({"alg": "none"}), &claims()), "does not fit"),
            (ed_signed(&json!({"alg": "HS256"}), &claims()), "does not fit"),
            (ed_signed(&json!({"alg": "ES256"}), &claims()), "does not fit"),
            (ed_signed(&json!({"typ": "JWT"}), &claims()), "alg is missing"),
            ("a.b".to_owned(), "three parts"),
            ("x".repeat(MAX_PROOF_LEN + 1), "longer than"),
        ];
        for (assertion, why) in cases {
            let err = check(&assertion, &key, &expected()).unwrap_err().0;
            assert!(err.contains(why), "{why}: {err}");
        }
        // `alg: none` with an empty signature, as an attacker sends it.
        let none = format!("{}.{}.", b64(&json!({"alg": "none"})), b64(&claims()));
        assert!(check(&none, &key, &expected()).is_err());
        // Signed by another key than the client's.
        let (es, _) = es_signed(&claims());
        let (_, other) = es_signed(&claims());
        assert!(check(&es, &other, &expected())
            .unwrap_err()
            .0
            .contains("signature does not verify"));
        // An Ed25519 signature from another key.
        let forged = test_jws::ed_sign(&test_jws::ed_key(1).0, &header, &claims());
        assert!(check(&forged, &key, &expected()).is_err());
    }
}

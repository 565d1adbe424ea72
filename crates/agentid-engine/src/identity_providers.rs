//! The identity providers an organization trusts to vouch for the people its agents act for:
//! an issuer, exactly as its tokens' `iss` says it, with its public keys given inline or the
//! `https` URL it publishes them at. At most [`MAX_IDENTITY_PROVIDERS`] an organization, in
//! live mode only. Token exchange (RFC 8693) and ID-JAG, which take a person's token from one
//! of them, are built on this list.

use agentid_core::domain::{IdpId, KeyMode, Millis};
use agentid_core::records::IdentityProviderRecord;
use agentid_store::{IdpAdded, SharedStore, StoreError};
use serde_json::Value;

use crate::apikeys::Caller;

/// The most identity providers an organization trusts.
pub const MAX_IDENTITY_PROVIDERS: i64 = 10;
/// The longest issuer or key-set URL taken.
const MAX_URL_LEN: usize = 1024;
/// The most keys in a key set, inline or fetched, and an inline one's largest JSON.
pub(crate) const MAX_KEYS: usize = 20;
const MAX_JWKS_BYTES: usize = 64 * 1024;
/// Members that make a JWK private (or symmetric).
const PRIVATE_MEMBERS: [&str; 8] = ["d", "p", "q", "dp", "dq", "qi", "oth", "k"];

#[derive(Debug, thiserror::Error)]
pub enum IdentityProviderError {
    #[error("{field}: {message}")]
    Invalid { field: &'static str, message: String },
    /// A test-mode key: a person's identity is vouched for in live mode only.
    #[error("identity providers are trusted in live mode only: use a sk_live_ key")]
    TestMode,
    #[error("no identity provider with this id")]
    NotFound,
    #[error(transparent)]
    Store(#[from] StoreError),
}

fn invalid(field: &'static str, message: impl Into<String>) -> IdentityProviderError {
    IdentityProviderError::Invalid {
        field,
        message: message.into(),
    }
}

/// Where an identity provider's keys are.
#[derive(Debug, Clone)]
pub enum Keys {
    /// Its key set, as JSON.
    Inline(Value),
    /// The `https` URL it publishes it at.
    At(String),
}

/// An `https` URL with a host (and a port, if any, of 1 to 65535), without credentials or
/// fragment, of at most [`MAX_URL_LEN`] bytes. Credentials would be stored and shown back
/// with the provider; a URL that could never be fetched would fail every exchange later.
fn https_url(field: &'static str, s: &str) -> Result<(), IdentityProviderError> {
    // The host and port as every outbound call reads them.
    let https = crate::outbound::host_port(s, |_| 443).is_ok_and(|(https, _, _)| https);
    if s.len() > MAX_URL_LEN || !s.bytes().all(|b| b.is_ascii_graphic()) || s.contains('#') || !https {
        return Err(invalid(
            field,
            format!(
                "must be an https:// URL with a host (no user or password, a port of 1 to 65535 if \
                 any), no fragment, at most {MAX_URL_LEN} bytes"
            ),
        ));
    }
    Ok(())
}

/// A key set of 1 to [`MAX_KEYS`] public keys (RSA of 2048 to 8192 bits, EC P-256/P-384, OKP Ed25519), none
/// private, each with the members its type needs; its canonical JSON.
fn key_set(jwks: &Value) -> Result<String, IdentityProviderError> {
    let keys = jwks
        .get("keys")
        .and_then(Value::as_array)
        .ok_or_else(|| invalid("jwks", "must be a key set: {\"keys\": [ … ]}"))?;
    if keys.is_empty() || keys.len() > MAX_KEYS {
        return Err(invalid("jwks", format!("must hold 1 to {MAX_KEYS} keys")));
    }
    for (i, key) in keys.iter().enumerate() {
        let Some(key) = key.as_object() else {
            return Err(invalid("jwks", format!("keys[{i}] is not a JSON object")));
        };
        if let Some(m) = PRIVATE_MEMBERS.iter().find(|m| key.contains_key(**m)) {
            return Err(invalid(
                "jwks",
                format!("keys[{i}] holds the private member {m:?}"),
            ));
        }
        // A member's bytes, base64url as RFC 7518 has it.
        let member = |m: &str| {
            use base64::Engine as _;
            key.get(m)
                .and_then(Value::as_str)
                .and_then(|v| base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(v).ok())
                .unwrap_or_default()
        };
        let bytes = |m: &str| member(m).len();
        let crv = key.get("crv").and_then(Value::as_str);
        // Only keys a token can be checked with: RSA of 2048 to 8192 bits, P-256, P-384,
        // Ed25519 (no ES512 is taken), each of its curve's size.
        let fits = match key.get("kty").and_then(Value::as_str) {
            Some("RSA") => rsa_checks(&member("n"), &member("e")),
            Some("EC") => match crv {
                Some("P-256") => bytes("x") == 32 && bytes("y") == 32,
                Some("P-384") => bytes("x") == 48 && bytes("y") == 48,
                _ => false,
            },
            Some("OKP") => crv == Some("Ed25519") && bytes("x") == 32,
            _ => false,
        };
        if !fits {
            return Err(invalid(
                "jwks",
                format!(
                    "keys[{i}] is not a public key a token can be checked with: RSA of 2048 to \
                     8192 bits, EC P-256 or P-384, or Ed25519"
                ),
            ));
        }
    }
    let json = jwks.to_string();
    if json.len() > MAX_JWKS_BYTES {
        return Err(invalid("jwks", format!("must be at most {MAX_JWKS_BYTES} bytes")));
    }
    Ok(json)
}

/// Whether an RSA key of modulus `n` and exponent `e` (big-endian, as a JWK has them) can
/// check a signature: `n` of 2048 to 8192 bits, `e` odd, 3 to 2^33 - 1, neither with a
/// leading zero. A key past these passes no token, so it is refused when it is added.
fn rsa_checks(n: &[u8], e: &[u8]) -> bool {
    let bits = |b: &[u8]| match b.first() {
        Some(&top) if top != 0 => (b.len() - 1) * 8 + (8 - top.leading_zeros() as usize),
        _ => 0,
    };
    let exponent = e
        .iter()
        .fold(0u64, |v, b| v.saturating_mul(256).saturating_add(u64::from(*b)));
    (2048..=8192).contains(&bits(n))
        && bits(e) > 0
        && e.len() <= 5
        && (3..1 << 33).contains(&exponent)
        && exponent % 2 == 1
}

fn live(caller: &Caller) -> Result<(), IdentityProviderError> {
    if caller.mode == KeyMode::Live {
        Ok(())
    } else {
        Err(IdentityProviderError::TestMode)
    }
}

pub struct IdentityProviders {
    pub(crate) store: SharedStore,
    /// The key file: it seals each provider's row.
    pub(crate) keys: std::sync::Arc<agentid_core::keys::KeyRing>,
}

impl IdentityProviders {
    /// Trusts `issuer`, with `keys`: refused when the organization trusts it already or
    /// trusts [`MAX_IDENTITY_PROVIDERS`].
    pub async fn add(
        &self,
        caller: &Caller,
        issuer: &str,
        keys: Keys,
    ) -> Result<IdentityProviderRecord, IdentityProviderError> {
        live(caller)?;
        https_url("issuer", issuer)?;
        let (jwks, jwks_uri) = match keys {
            Keys::Inline(v) => (Some(key_set(&v)?), None),
            Keys::At(url) => {
                https_url("jwks_uri", &url)?;
                (None, Some(url))
            }
        };
        let mut idp = IdentityProviderRecord {
            id: IdpId::generate(),
            org_id: caller.org.id.clone(),
            issuer: issuer.to_owned(),
            jwks,
            jwks_uri,
            created_at: Millis::now(),
            mac: None,
        };
        idp.mac = Some(self.keys.identity_provider_mac(&idp.canonical()));
        match self
            .store
            .add_identity_provider(&idp, MAX_IDENTITY_PROVIDERS)
            .await?
        {
            IdpAdded::Added => Ok(idp),
            IdpAdded::Exists => Err(invalid(
                "issuer",
                "is trusted already (DELETE it first to change its keys)",
            )),
            IdpAdded::Full => Err(invalid(
                "issuer",
                format!("an organization trusts at most {MAX_IDENTITY_PROVIDERS} identity providers"),
            )),
        }
    }

    /// The organization's, oldest first.
    pub async fn list(&self, caller: &Caller) -> Result<Vec<IdentityProviderRecord>, IdentityProviderError> {
        live(caller)?;
        Ok(self.store.identity_providers(&caller.org.id).await?)
    }

    /// Revokes the person `sub` as the provider `iss` names them: every delegated token the
    /// organization's agents hold for them, issued until now, fails online at once, and a
    /// `session-revoked` event naming them goes to the organization's Shared Signals streams.
    /// The issuer need not be trusted still (a provider removed first is fine).
    pub async fn revoke_subject(
        &self,
        caller: &Caller,
        iss: &str,
        sub: &str,
    ) -> Result<Millis, IdentityProviderError> {
        live(caller)?;
        https_url("iss", iss)?;
        if sub.is_empty() || sub.len() > 255 || sub.contains('\0') {
            return Err(invalid("sub", "must be 1 to 255 bytes, none NUL"));
        }
        let at = Millis::now();
        self.store.revoke_subject(&caller.org.id, iss, sub, at).await?;
        tracing::info!(org_id = %caller.org.id, "a person's delegations revoked");
        Ok(at)
    }

    /// Stops trusting one.
    pub async fn remove(&self, caller: &Caller, id: &IdpId) -> Result<(), IdentityProviderError> {
        live(caller)?;
        if self.store.remove_identity_provider(&caller.org.id, id).await? {
            tracing::info!(org_id = %caller.org.id, idp = %id, "identity provider removed");
            Ok(())
        } else {
            Err(IdentityProviderError::NotFound)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn key_sets_hold_public_keys_only() {
        let ed = json!({"kty": "OKP", "crv": "Ed25519", "x": "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"});
        assert!(key_set(&json!({"keys": [ed]})).is_ok());
        let b64 = |n: usize| {
            use base64::Engine as _;
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(vec![0xC5u8; n])
        };
        let rsa = |bytes: usize| json!({"kty": "RSA", "n": b64(bytes), "e": "AQAB", "kid": "r"});
        assert!(key_set(&json!({"keys": [rsa(256)]})).is_ok());
        let p384 = json!({"kty": "EC", "crv": "P-384", "x": b64(48), "y": b64(48)});
        assert!(key_set(&json!({"keys": [p384]})).is_ok());
        for bad in [
            // Keys no token can be checked with: RSA under 2048 bits, P-521, a short point.
            json!({"keys": [rsa(128)]}),
            json!({"keys": [{"kty": "RSA", "n": "AQAB", "e": "AQAB"}]}),
            json!({"keys": [{"kty": "EC", "crv": "P-521", "x": b64(66), "y": b64(66)}]}),
            json!({"keys": [{"kty": "EC", "crv": "P-256", "x": b64(32), "y": b64(31)}]}),
            json!({"keys": [{"kty": "OKP", "crv": "Ed25519", "x": b64(31)}]}),
            json!({}),
            json!({"keys": []}),
            json!({"keys": [{"kty": "oct", "k": "c2VjcmV0"}]}),
            json!({"keys": [{"kty": "OKP", "crv": "Ed25519", "x": "a", "d": "b"}]}),
            json!({"keys": [{"kty": "EC", "crv": "P-192", "x": "a", "y": "b"}]}),
            json!({"keys": [7]}),
            json!({"keys": vec![ed.clone(); MAX_KEYS + 1]}),
        ] {
            assert!(key_set(&bad).is_err(), "{bad}");
        }
    }

    /// An RSA key `ring` refuses (under 2048 bits though 256 bytes long, a leading zero, an
    /// even, tiny or huge exponent) passed no token, yet was taken when it was added.
    #[test]
    fn rsa_keys_no_token_can_be_checked_with_are_refused() {
        let modulus = |top: u8, len: usize| {
            let mut n = vec![0xC5u8; len];
            n[0] = top;
            n
        };
        let e = [0x01, 0x00, 0x01];
        assert!(rsa_checks(&modulus(0x80, 256), &e));
        assert!(rsa_checks(&modulus(0xC5, 1024), &[0x03]));
        for (n, e) in [
            (modulus(0x01, 256), e.to_vec()),  // 2041 bits
            (modulus(0x00, 257), e.to_vec()),  // a leading zero
            (modulus(0x01, 1025), e.to_vec()), // over 8192 bits
            (modulus(0x80, 256), vec![0x01, 0x00, 0x00]),
            (modulus(0x80, 256), vec![0x01]),
            (modulus(0x80, 256), vec![0x02, 0x00, 0x00, 0x00, 0x01]),
            (modulus(0x80, 256), vec![0x00, 0x01, 0x00, 0x01]),
            (modulus(0x80, 256), vec![]),
        ] {
            assert!(!rsa_checks(&n, &e), "{:02x?}… {e:02x?}", &n[..2]);
        }
    }

    #[test]
    fn issuers_and_key_urls_are_https() {
        assert!(https_url("issuer", "https://idp.example").is_ok());
        assert!(https_url("issuer", "https://idp.example/tenant/v2.0").is_ok());
        assert!(https_url("jwks_uri", "https://idp.example:8443/jwks").is_ok());
        assert!(https_url("jwks_uri", "https://[2001:db8::1]:8443/jwks").is_ok());
        assert!(https_url("jwks_uri", "https://[2001:db8::1]/jwks").is_ok());
        for bad in [
            "http://idp.example",
            "https://",
            "https:///x",
            "idp.example",
            "https://idp.example/#x",
            "https://idp example",
            "https://u:p@idp.example/jwks",
            "https://idp.example:99999/jwks",
            "https://idp.example:0/",
            "https://idp.example:/",
            "https://[::1/jwks",
            "https://[::1]x/jwks",
        ] {
            assert!(https_url("issuer", bad).is_err(), "{bad}");
        }
        assert!(https_url(
            "issuer",
            &format!("https://a.example/{}", "x".repeat(MAX_URL_LEN))
        )
        .is_err());
    }
}

//! What the verify path holds: the public keys that validate tokens, by `kid` (RFC 7638 JWK
//! thumbprint), with the PEM and JWKS forms the well-known endpoints serve, and the strict
//! signature check. Nothing secret is reachable from a verification.

use std::collections::HashMap;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use ed25519_dalek::pkcs8::spki::der::pem::LineEnding;
use ed25519_dalek::pkcs8::EncodePublicKey;
use ed25519_dalek::VerifyingKey;

use super::thumbprint;
use crate::token::{RejectReason, Unverified};

/// The public keys that validate tokens, by `kid`, and the key that new tokens name.
#[derive(Debug)]
pub struct PublicKeys {
    current: String,
    by_kid: HashMap<String, VerifyingKey>,
    pem: String,
    jwks: String,
}

impl PublicKeys {
    /// The key set of one key, which is also the current one.
    pub fn single(key: VerifyingKey) -> Self {
        PublicKeys::new(&key, &[key])
    }

    /// The key set of `keys` (every key that validates tokens, in JWKS order), with `current`
    /// the one new tokens are signed with (its PEM is the one served).
    pub fn new(current: &VerifyingKey, keys: &[VerifyingKey]) -> Self {
        let pem = current
            .to_public_key_pem(LineEnding::LF)
            .expect("an Ed25519 public key encodes as SPKI");
        let jwk = |k: &VerifyingKey| {
            serde_json::json!({
                "kty": "OKP", "crv": "Ed25519", "x": URL_SAFE_NO_PAD.encode(k.as_bytes()),
                "kid": thumbprint(k), "alg": "EdDSA", "use": "sig",
            })
        };
        let jwks = serde_json::json!({"keys": keys.iter().map(jwk).collect::<Vec<_>>()}).to_string();
        PublicKeys {
            by_kid: keys.iter().map(|k| (thumbprint(k), *k)).collect(),
            current: thumbprint(current),
            pem,
            jwks,
        }
    }

    /// The `kid` of the key new tokens are signed with.
    pub fn current_kid(&self) -> &str {
        &self.current
    }

    /// The public key a token names, if the set holds it.
    pub fn get(&self, kid: &str) -> Option<&VerifyingKey> {
        self.by_kid.get(kid)
    }

    /// SPKI PEM of the current key.
    pub fn public_key_pem(&self) -> &str {
        &self.pem
    }

    pub fn jwks_json(&self) -> &str {
        &self.jwks
    }

    /// Checks a token's signature with the public key its `kid` names, by RFC 8032
    /// verification in its strict form (`ed25519_dalek::VerifyingKey::verify_strict`): it
    /// refuses non-canonical encodings and small-order points, so it accepts exactly what
    /// PyJWT and jose accept offline, whoever made the signature.
    pub fn verify(&self, token: &Unverified<'_>) -> Result<(), RejectReason> {
        let key = self.get(&token.kid).ok_or(RejectReason::UnknownKey)?;
        key.verify_strict(token.signing_input, &token.signature)
            .map_err(|_| RejectReason::BadSignature)
    }
}

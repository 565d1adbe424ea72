//! Signing JWSs in the token modules' tests: compact serialization over JSON parts, with the
//! keys a stock client would hold.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use ed25519_dalek::{Signer, SigningKey};
use ring::rand::SystemRandom;
use ring::signature::{EcdsaKeyPair, KeyPair, ECDSA_P256_SHA256_FIXED_SIGNING};
use serde_json::{json, Value};

/// A JSON value as a JWS part.
pub(crate) fn b64(v: &Value) -> String {
    URL_SAFE_NO_PAD.encode(serde_json::to_vec(v).unwrap())
}

/// The Ed25519 key of `seed`, and its public JWK.
pub(crate) fn ed_key(seed: u8) -> (SigningKey, Value) {
    let key = SigningKey::from_bytes(&[seed; 32]);
    let jwk = json!({"kty": "OKP", "crv": "Ed25519",
                     "x": URL_SAFE_NO_PAD.encode(key.verifying_key().as_bytes())});
    (key, jwk)
}

/// `header` and `claims` signed with `key`.
pub(crate) fn ed_sign(key: &SigningKey, header: &Value, claims: &Value) -> String {
    let signed = format!("{}.{}", b64(header), b64(claims));
    let sig = key.sign(signed.as_bytes());
    format!("{signed}.{}", URL_SAFE_NO_PAD.encode(sig.to_bytes()))
}

/// A new P-256 key, and its public JWK.
pub(crate) fn p256() -> (EcdsaKeyPair, Value) {
    let rng = SystemRandom::new();
    let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
    let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng).unwrap();
    let point = pair.public_key().as_ref();
    let jwk = json!({"kty": "EC", "crv": "P-256",
                     "x": URL_SAFE_NO_PAD.encode(&point[1..33]), "y": URL_SAFE_NO_PAD.encode(&point[33..])});
    (pair, jwk)
}

/// `header` and `claims` signed with `pair` (ES256).
pub(crate) fn es_sign(pair: &EcdsaKeyPair, header: &Value, claims: &Value) -> String {
    let signed = format!("{}.{}", b64(header), b64(claims));
    let sig = pair.sign(&SystemRandom::new(), signed.as_bytes()).unwrap();
    format!("{signed}.{}", URL_SAFE_NO_PAD.encode(sig.as_ref()))
}

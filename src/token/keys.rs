//! The signing key (PKCS#8 PEM on disk, created 0600 on first start) and the public keys
//! that validate tokens, by `kid` (RFC 7638 JWK thumbprint).

use std::collections::HashMap;
use std::fmt;
use std::io::Write;
use std::path::Path;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use ed25519_dalek::pkcs8::spki::der::pem::LineEnding;
use ed25519_dalek::pkcs8::{DecodePrivateKey, EncodePrivateKey, EncodePublicKey};
use ed25519_dalek::{Signer, SigningKey, VerifyingKey};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::jwt::{Claims, RejectReason, Unverified};

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("cannot read or create the signing key file {path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("the signing key file {path} is not an Ed25519 PKCS#8 PEM key")]
    Format { path: String },
}

/// Signs new tokens with the current key and validates tokens of every known key.
pub struct KeyRing {
    signing: SigningKey,
    kid: String,
    public_pem: String,
    jwks: String,
    verifying: HashMap<String, VerifyingKey>,
    /// A secret derived from the signing key for MACs the service checks itself (cursors).
    mac_secret: [u8; 32],
}

impl fmt::Debug for KeyRing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyRing")
            .field("kid", &self.kid)
            .finish_non_exhaustive()
    }
}

impl KeyRing {
    pub fn from_signing_key(signing: SigningKey) -> Self {
        let public = signing.verifying_key();
        let kid = thumbprint(&public);
        let public_pem = public
            .to_public_key_pem(LineEnding::LF)
            .expect("an Ed25519 public key encodes as SPKI");
        let jwks = serde_json::json!({"keys": [{
            "kty": "OKP", "crv": "Ed25519", "x": URL_SAFE_NO_PAD.encode(public.as_bytes()),
            "kid": kid, "alg": "EdDSA", "use": "sig",
        }]})
        .to_string();
        let mac_secret: [u8; 32] = Sha256::new()
            .chain_update(b"agentid mac secret v1")
            .chain_update(signing.to_bytes())
            .finalize()
            .into();
        let verifying = HashMap::from([(kid.clone(), public)]);
        KeyRing {
            signing,
            kid,
            public_pem,
            jwks,
            verifying,
            mac_secret,
        }
    }

    /// Reads the PEM key at `path`, or creates one (mode 0600, parent folders included).
    /// Returns whether the key was created.
    pub fn load_or_create(path: &Path) -> Result<(KeyRing, bool), KeyError> {
        let io = |source| KeyError::Io {
            path: path.display().to_string(),
            source,
        };
        match std::fs::read_to_string(path) {
            Ok(pem) => {
                let key = SigningKey::from_pkcs8_pem(&pem).map_err(|_| KeyError::Format {
                    path: path.display().to_string(),
                })?;
                Ok((KeyRing::from_signing_key(key), false))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                    std::fs::create_dir_all(dir).map_err(io)?;
                }
                let key = SigningKey::generate(&mut rand::rngs::OsRng);
                let pem = key.to_pkcs8_pem(LineEnding::LF).expect("PKCS#8 encoding");
                write_private(path, pem.as_bytes()).map_err(io)?;
                Ok((KeyRing::from_signing_key(key), true))
            }
            Err(e) => Err(io(e)),
        }
    }

    pub fn kid(&self) -> &str {
        &self.kid
    }

    pub fn public_key_pem(&self) -> &str {
        &self.public_pem
    }

    pub fn jwks_json(&self) -> &str {
        &self.jwks
    }

    pub fn mac_secret(&self) -> &[u8; 32] {
        &self.mac_secret
    }

    pub fn sign(&self, claims: &Claims) -> String {
        super::jwt::encode(&self.signing, &self.kid, claims)
    }

    /// The public key a token names, if the ring holds it.
    pub fn verifying_key(&self, kid: &str) -> Option<&VerifyingKey> {
        self.verifying.get(kid)
    }

    /// Checks a token's signature, accepting exactly what `verify_strict` accepts.
    ///
    /// Fast path for tokens of the current key: Ed25519 signatures are deterministic
    /// (RFC 8032), so the one signature this service ever made over a signing input is
    /// `sign(input)`. Recomputing it costs one fixed-base scalar multiplication, against a
    /// double-base one for verification; the comparison is constant-time so the expected
    /// signature never leaks. Any mismatch (a forgery, or a valid signature made elsewhere
    /// with the same key) falls through to `verify_strict`.
    pub fn verify(&self, token: &Unverified<'_>) -> Result<(), RejectReason> {
        if token.kid == self.kid && self.resign_matches(token) {
            return Ok(());
        }
        self.verify_strict(token)
    }

    /// True when the token carries exactly the signature this key makes over its input.
    pub fn resign_matches(&self, token: &Unverified<'_>) -> bool {
        let expected = self.signing.sign(token.signing_input).to_bytes();
        expected.ct_eq(&token.signature.to_bytes()).into()
    }

    /// Strict single-signature check (rejects non-canonical and small-order encodings).
    pub fn verify_strict(&self, token: &Unverified<'_>) -> Result<(), RejectReason> {
        let key = self.verifying_key(&token.kid).ok_or(RejectReason::UnknownKey)?;
        key.verify_strict(token.signing_input, &token.signature)
            .map_err(|_| RejectReason::BadSignature)
    }

    /// Batch verification (`ed25519_dalek::verify_batch`) with results exactly equal to
    /// calling `verify_strict` on each token. A failed batch falls back to single checks.
    /// A passed batch is not enough on its own: the batch equation is cofactored, so it also
    /// accepts a signature whose `R` carries a small-order component, which `verify_strict`
    /// rejects; each `R` of a passed batch is therefore checked to be canonical and
    /// torsion-free, and any that is not is decided by `verify_strict`.
    pub fn verify_batch(&self, tokens: &[&Unverified<'_>]) -> Vec<Result<(), RejectReason>> {
        let mut out: Vec<Result<(), RejectReason>> = vec![Err(RejectReason::BadSignature); tokens.len()];
        let mut idx = Vec::with_capacity(tokens.len());
        let mut keys = Vec::with_capacity(tokens.len());
        for (i, t) in tokens.iter().enumerate() {
            match self.verifying_key(&t.kid) {
                Some(k) => {
                    idx.push(i);
                    keys.push(*k);
                }
                None => out[i] = Err(RejectReason::UnknownKey),
            }
        }
        if idx.is_empty() {
            return out;
        }
        let msgs: Vec<&[u8]> = idx.iter().map(|&i| tokens[i].signing_input).collect();
        let sigs: Vec<ed25519_dalek::Signature> = idx.iter().map(|&i| tokens[i].signature).collect();
        let batch_ok = idx.len() > 1 && ed25519_dalek::verify_batch(&msgs, &sigs, &keys).is_ok();
        for &i in &idx {
            out[i] = if batch_ok && r_is_strict(&tokens[i].signature) {
                Ok(())
            } else {
                self.verify_strict(tokens[i])
            };
        }
        out
    }
}

/// `R` decodes canonically to a point of prime order (no small-order component).
fn r_is_strict(sig: &ed25519_dalek::Signature) -> bool {
    let r = curve25519_dalek::edwards::CompressedEdwardsY(*sig.r_bytes());
    match r.decompress() {
        Some(p) => p.compress() == r && !p.is_small_order() && p.is_torsion_free(),
        None => false,
    }
}

fn thumbprint(key: &VerifyingKey) -> String {
    // RFC 7638: members in lexicographic order, no white space.
    let jwk = format!(
        r#"{{"crv":"Ed25519","kty":"OKP","x":"{}"}}"#,
        URL_SAFE_NO_PAD.encode(key.as_bytes())
    );
    URL_SAFE_NO_PAD.encode(Sha256::digest(jwk.as_bytes()))
}

fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
    let mut f = opts.open(path)?;
    f.write_all(bytes)?;
    f.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::token::decode;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;

    #[test]
    fn created_key_is_private_and_reloads() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/key.pem");
        let (ring, created) = KeyRing::load_or_create(&path).unwrap();
        assert!(created);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        let (again, created) = KeyRing::load_or_create(&path).unwrap();
        assert!(!created);
        assert_eq!(ring.kid(), again.kid());
        assert!(ring.public_key_pem().starts_with("-----BEGIN PUBLIC KEY-----"));
        assert!(!format!("{ring:?}").contains("PRIVATE"));
    }

    #[test]
    fn foreign_key_under_same_kid_fails() {
        let ours = KeyRing::from_signing_key(SigningKey::from_bytes(&[1; 32]));
        let claims = Claims {
            iss: "a.com".into(),
            sub: "s".into(),
            jti: "j".into(),
            iat: 0,
            exp: 1,
            scopes: vec![],
        };
        let good = ours.sign(&claims);
        assert!(ours.verify(&decode(&good).unwrap()).is_ok());
        let forged = crate::token::encode(&SigningKey::from_bytes(&[2; 32]), ours.kid(), &claims);
        assert_eq!(
            ours.verify(&decode(&forged).unwrap()),
            Err(RejectReason::BadSignature)
        );
    }

    fn claims(n: i64) -> Claims {
        Claims {
            iss: "a.com".into(),
            sub: format!("agt_{n}"),
            jti: n.to_string(),
            iat: n,
            exp: n + 1,
            scopes: vec!["read:x".into()],
        }
    }

    #[test]
    fn batch_rejects_exactly_the_forged_token() {
        let ours = KeyRing::from_signing_key(SigningKey::from_bytes(&[1; 32]));
        let stranger = SigningKey::from_bytes(&[2; 32]);
        let mut tokens: Vec<String> = (0..16).map(|n| ours.sign(&claims(n))).collect();
        tokens[7] = crate::token::encode(&stranger, ours.kid(), &claims(7));
        let decoded: Vec<_> = tokens.iter().map(|t| decode(t).unwrap()).collect();
        let refs: Vec<&Unverified<'_>> = decoded.iter().collect();
        let results = ours.verify_batch(&refs);
        for (i, r) in results.iter().enumerate() {
            assert_eq!(r.is_ok(), i != 7, "token {i}: {r:?}");
        }
        let good: Vec<&Unverified<'_>> = decoded
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != 7)
            .map(|(_, u)| u)
            .collect();
        assert!(ours.verify_batch(&good).iter().all(Result::is_ok));
    }

    #[test]
    fn batch_never_accepts_a_torsioned_signature_that_strict_rejects() {
        use curve25519_dalek::constants::{ED25519_BASEPOINT_POINT, EIGHT_TORSION};
        use curve25519_dalek::scalar::Scalar;
        use sha2::Sha512;
        let signing = SigningKey::from_bytes(&[1; 32]);
        let ours = KeyRing::from_signing_key(signing.clone());
        let mut tokens: Vec<String> = (0..8).map(|n| ours.sign(&claims(n))).collect();
        // A key holder can sign with R = [r]B + T, T of small order. verify_strict always sees
        // T; dalek's batch equation is cofactorless but randomized, so it misses T whenever the
        // random coefficient kills it (for T of order 2: half the time). Find such a case.
        let input = tokens[3].rsplit_once('.').unwrap().0.to_owned();
        let a = signing.verifying_key();
        let mut found = false;
        for seed in 0u8..64 {
            let r = Scalar::from_bytes_mod_order([seed; 32]);
            let big_r = (ED25519_BASEPOINT_POINT * r + EIGHT_TORSION[4]).compress();
            let k = Scalar::from_hash(
                Sha512::new()
                    .chain_update(big_r.as_bytes())
                    .chain_update(a.as_bytes())
                    .chain_update(input.as_bytes()),
            );
            let s_scalar = r + k * signing.to_scalar();
            let mut sig = [0u8; 64];
            sig[..32].copy_from_slice(big_r.as_bytes());
            sig[32..].copy_from_slice(s_scalar.as_bytes());
            tokens[3] = format!("{input}.{}", URL_SAFE_NO_PAD.encode(sig));
            let decoded: Vec<_> = tokens.iter().map(|t| decode(t).unwrap()).collect();
            let msgs: Vec<&[u8]> = decoded.iter().map(|u| u.signing_input).collect();
            let sigs: Vec<_> = decoded.iter().map(|u| u.signature).collect();
            if ed25519_dalek::verify_batch(&msgs, &sigs, &vec![a; decoded.len()]).is_ok() {
                found = true;
                break;
            }
        }
        assert!(found, "no seed made the bare batch accept a torsioned R");
        let decoded: Vec<_> = tokens.iter().map(|t| decode(t).unwrap()).collect();
        assert!(
            ours.verify_strict(&decoded[3]).is_err(),
            "strict rejects the torsioned signature"
        );
        let refs: Vec<&Unverified<'_>> = decoded.iter().collect();
        let results = ours.verify_batch(&refs);
        for (i, r) in results.iter().enumerate() {
            assert_eq!(r.is_ok(), i != 3, "token {i}: {r:?}");
        }
        assert!(ours.verify(&decoded[3]).is_err());
    }

    #[test]
    fn resign_fast_path_accepts_ours_and_nothing_else() {
        let ours = KeyRing::from_signing_key(SigningKey::from_bytes(&[1; 32]));
        let good = ours.sign(&claims(1));
        assert!(ours.resign_matches(&decode(&good).unwrap()));
        let mut tampered = decode(&good).unwrap();
        let mut bytes = tampered.signature.to_bytes();
        bytes[40] ^= 1;
        tampered.signature = ed25519_dalek::Signature::from_bytes(&bytes);
        assert!(!ours.resign_matches(&tampered));
        assert!(ours.verify(&tampered).is_err());
    }
}

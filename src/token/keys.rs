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
use ed25519_dalek::{SigningKey, VerifyingKey};
use sha2::{Digest, Sha256};

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

    /// Strict single-signature check (rejects non-canonical and small-order encodings).
    pub fn verify(&self, token: &Unverified<'_>) -> Result<(), RejectReason> {
        let key = self.verifying_key(&token.kid).ok_or(RejectReason::UnknownKey)?;
        key.verify_strict(token.signing_input, &token.signature)
            .map_err(|_| RejectReason::BadSignature)
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
}

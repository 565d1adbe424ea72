//! The signing key (PKCS#8 PEM on disk, created 0600 on first start) and the public keys
//! that validate tokens, by `kid` (RFC 7638 JWK thumbprint).

use std::collections::HashMap;
use std::fmt;
use std::io::Write;
use std::path::Path;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use curve25519_dalek::scalar::Scalar;
use ed25519_dalek::hazmat::ExpandedSecretKey;
use ed25519_dalek::pkcs8::spki::der::pem::LineEnding;
use ed25519_dalek::pkcs8::{DecodePrivateKey, EncodePrivateKey, EncodePublicKey};
use ed25519_dalek::{Signer, SigningKey, VerifyingKey};
use sha2::{Digest, Sha256, Sha512};
use subtle::ConstantTimeEq;
use zeroize::Zeroize;

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
    /// The signing key's secret scalar and nonce prefix (RFC 8032 §5.1.5), for `s_matches`;
    /// zeroed on drop, never printed.
    expanded: ExpandedSecretKey,
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
            expanded: ExpandedSecretKey::from(signing.as_bytes()),
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

    /// Checks a token's signature (the service default): for a token of the current key,
    /// [`KeyRing::s_matches`] first; anything else, and any mismatch, goes to `verify_strict`.
    /// Accepts every token `verify_strict` accepts, and nothing else that anyone without the
    /// private key could make (assuming discrete logarithms are hard and SHA-512 behaves as a
    /// random oracle). The key holder can make tokens this accepts and standard validators
    /// reject (see `s_matches`); `verify_resigning` agrees with `verify_strict` exactly.
    pub fn verify(&self, token: &Unverified<'_>) -> Result<(), RejectReason> {
        if token.kid == self.kid && self.s_matches(token) {
            return Ok(());
        }
        self.verify_strict(token)
    }

    /// Checks a token's signature, accepting exactly what `verify_strict` accepts (the
    /// `resign` strategy).
    ///
    /// Fast path for tokens of the current key: Ed25519 signatures are deterministic
    /// (RFC 8032), so the one signature this service ever made over a signing input is
    /// `sign(input)`. Recomputing it costs one fixed-base scalar multiplication, against a
    /// double-base one for verification; the comparison is constant-time so the expected
    /// signature never leaks. Any mismatch (a forgery, or a valid signature made elsewhere
    /// with the same key) falls through to `verify_strict`.
    pub fn verify_resigning(&self, token: &Unverified<'_>) -> Result<(), RejectReason> {
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

    /// True when the token's `S` is the one this key's signing computes for the token's own
    /// `R`: `S = r + k·a (mod L)` with `r = H(prefix ‖ M)` and `k = H(R ‖ A ‖ M)` (RFC 8032
    /// §5.1.6, `a` the secret scalar, `H` SHA-512, as in dalek's `raw_sign`). It is signing
    /// without `R = r·B`, the constant-time fixed-base multiplication that is most of its
    /// cost: two hashes and a scalar multiply-add. A non-canonical `S` never equals the
    /// canonical result.
    ///
    /// The test is equivalent to `S·B = r·B + k·A`: Schnorr verification with the nonce
    /// point fixed to the one this key uses for `M`. Every signature the key made passes.
    /// A pair that passes while `verify_strict` rejects it has `R` bytes other than the
    /// encoding of `r·B`, and together with the key's own signature `(R₀, S₀)` on `M` it
    /// gives the private scalar: `a = (S − S₀)/(k − k₀)` (`k ≠ k₀` unless SHA-512 collides
    /// modulo `L` on inputs that differ in `R`). For an input the key never signed, `r` is a
    /// hash of the secret prefix no one has seen. Accept/reject answers for chosen `(R, S)`
    /// can be simulated from public data (random-oracle model), so they teach nothing. This
    /// is a reduction to the discrete logarithm, not a guessing bound: the two checks disagree
    /// only on tokens made with the private key, whose holder can sign valid tokens anyway.
    ///
    /// SECURITY: the computed `S` is a signing-oracle output for a `k` the caller chooses
    /// through `R`; its value, or any bits of it, for two `R` over one `M` reveal `a`. It is
    /// compared in constant time (curve25519-dalek ≥ 4.1.3 scalar arithmetic, RUSTSEC-2024-0344,
    /// and `subtle`), zeroed after, and never logged, returned or compared with `==`.
    pub fn s_matches(&self, token: &Unverified<'_>) -> bool {
        let m = token.signing_input;
        let mut r = wide_scalar(
            Sha512::new()
                .chain_update(self.expanded.hash_prefix)
                .chain_update(m),
        );
        let k = wide_scalar(
            Sha512::new()
                .chain_update(token.signature.r_bytes())
                .chain_update(self.public_bytes())
                .chain_update(m),
        );
        let mut s = k * self.expanded.scalar + r;
        let matches = s.as_bytes().ct_eq(token.signature.s_bytes()).into();
        r.zeroize();
        s.zeroize();
        matches
    }

    /// The current key's public key `A`, as signing hashes it.
    fn public_bytes(&self) -> &[u8; 32] {
        AsRef::<VerifyingKey>::as_ref(&self.signing).as_bytes()
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

/// A SHA-512 digest as a scalar modulo `L` (what dalek's signing does with its hashes).
fn wide_scalar(h: Sha512) -> Scalar {
    Scalar::from_bytes_mod_order_wide(&h.finalize().into())
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

    /// The group order L = 2^252 + 27742317777372353535851937790883648493, little-endian.
    const L_BYTES: [u8; 32] = [
        0xed, 0xd3, 0xf5, 0x5c, 0x1a, 0x63, 0x12, 0x58, 0xd6, 0x9c, 0xf7, 0xa2, 0xde, 0xf9, 0xde, 0x14, 0, 0,
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10,
    ];

    /// The token with its signature replaced by `R ‖ S`.
    fn with_signature<'a>(u: &Unverified<'a>, r: [u8; 32], s: [u8; 32]) -> Unverified<'a> {
        Unverified {
            signature: ed25519_dalek::Signature::from_components(r, s),
            ..u.clone()
        }
    }

    #[test]
    fn s_check_accepts_ours_and_rejects_every_change() {
        for seed in 1..=8u8 {
            s_check_case(&KeyRing::from_signing_key(SigningKey::from_bytes(&[seed; 32])));
        }
        let random = KeyRing::from_signing_key(SigningKey::generate(&mut rand::rngs::OsRng));
        s_check_case(&random);
    }

    fn s_check_case(ours: &KeyRing) {
        let stranger = KeyRing::from_signing_key(SigningKey::from_bytes(&[0xee; 32]));
        for n in 0..12 {
            let good = ours.sign(&claims(n));
            let u = decode(&good).unwrap();
            assert!(ours.s_matches(&u), "token {n}");
            assert!(ours.verify(&u).is_ok());
            // Another key's valid signature over the same input.
            let their_token = stranger.sign(&claims(n));
            let theirs = decode(&their_token).unwrap();
            let moved = with_signature(&u, *theirs.signature.r_bytes(), *theirs.signature.s_bytes());
            assert!(!ours.s_matches(&moved));
            assert!(ours.verify(&moved).is_err());
            // Any bit of R or S flipped.
            for bit in [0, 7, 100, 255, 256, 300, 511] {
                let mut sig = u.signature.to_bytes();
                sig[bit / 8] ^= 1 << (bit % 8);
                let (r, s) = sig.split_at(32);
                let flipped = with_signature(&u, r.try_into().unwrap(), s.try_into().unwrap());
                assert!(!ours.s_matches(&flipped), "token {n}, bit {bit}");
                assert!(ours.verify(&flipped).is_err(), "token {n}, bit {bit}");
            }
            // The same S plus L: the same scalar, not the canonical encoding.
            let s = u.signature.s_bytes();
            let mut wide = [0u8; 33];
            let (mut carry, l) = (0u16, L_BYTES);
            for i in 0..32 {
                let sum = s[i] as u16 + l[i] as u16 + carry;
                wide[i] = sum as u8;
                carry = sum >> 8;
            }
            wide[32] = carry as u8;
            assert_eq!(wide[32], 0, "S + L < 2^256");
            let bad = with_signature(&u, *u.signature.r_bytes(), wide[..32].try_into().unwrap());
            assert!(!ours.s_matches(&bad), "token {n}: S + L");
            assert!(ours.verify(&bad).is_err());
        }
        // Another signing input under our signature.
        let (ta, tb) = (ours.sign(&claims(1)), ours.sign(&claims(2)));
        let (a, b) = (decode(&ta).unwrap(), decode(&tb).unwrap());
        let swapped = with_signature(&b, *a.signature.r_bytes(), *a.signature.s_bytes());
        assert!(!ours.s_matches(&swapped));
        assert!(ours.verify(&swapped).is_err());
        // A token naming another key never takes the fast path.
        let elsewhere = Unverified {
            kid: "another-kid".into(),
            ..a.clone()
        };
        assert!(matches!(ours.verify(&elsewhere), Err(RejectReason::UnknownKey)));
    }

    /// What the S check does not check: that `R = r·B`. A pair with another `R` passes only if
    /// its `S` was computed with the private scalar, and two passing pairs for one input give
    /// that scalar back, so no one without the key can make one.
    #[test]
    fn s_check_disagrees_with_strict_only_on_pairs_that_reveal_the_key() {
        let ours = KeyRing::from_signing_key(SigningKey::from_bytes(&[1; 32]));
        let token = ours.sign(&claims(1));
        let u = decode(&token).unwrap();
        let h = |parts: &[&[u8]]| {
            let mut d = Sha512::new();
            for p in parts {
                d.update(p);
            }
            wide_scalar(d)
        };
        let m = u.signing_input;
        let (r0, s0) = (
            *u.signature.r_bytes(),
            Scalar::from_canonical_bytes(*u.signature.s_bytes()).unwrap(),
        );
        let k0 = h(&[&r0, ours.public_bytes(), m]);
        let r1 = curve25519_dalek::constants::ED25519_BASEPOINT_POINT
            .compress()
            .to_bytes();
        let k1 = h(&[&r1, ours.public_bytes(), m]);
        let nonce = h(&[&ours.expanded.hash_prefix, m]);
        let s1 = nonce + k1 * ours.expanded.scalar;
        let other = with_signature(&u, r1, s1.to_bytes());
        assert!(ours.s_matches(&other));
        assert!(ours.verify_strict(&other).is_err());
        assert!(ours.verify_resigning(&other).is_err());
        assert_eq!((s1 - s0) * (k1 - k0).invert(), ours.expanded.scalar);
        // Even an `R` that is no point at all: its bytes are only hashed.
        let not_a_point = [0xff; 32];
        let k2 = h(&[&not_a_point, ours.public_bytes(), m]);
        let s2 = nonce + k2 * ours.expanded.scalar;
        let junk = with_signature(&u, not_a_point, s2.to_bytes());
        assert!(ours.s_matches(&junk));
        assert!(ours.verify_strict(&junk).is_err());
        assert_eq!((s2 - s0) * (k2 - k0).invert(), ours.expanded.scalar);
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

//! What the verify path holds: the public keys that validate tokens, by `kid` (RFC 7638 JWK
//! thumbprint), with the PEM and JWKS forms the well-known endpoints serve, and the strict
//! signature check. Nothing secret is reachable from a verification.

use std::collections::HashMap;
use std::sync::OnceLock;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use curve25519_dalek::constants::ED25519_BASEPOINT_TABLE;
use curve25519_dalek::edwards::EdwardsBasepointTable;
use curve25519_dalek::scalar::Scalar;
use curve25519_dalek::traits::BasepointTable as _;
use ed25519_dalek::pkcs8::spki::der::pem::LineEnding;
use ed25519_dalek::pkcs8::EncodePublicKey;
use ed25519_dalek::VerifyingKey;
use sha2::{Digest, Sha512};

use super::thumbprint;
use crate::token::{RejectReason, Unverified};

/// The public keys that validate tokens, by `kid`, and the key that new tokens name.
#[derive(Debug)]
pub struct PublicKeys {
    current: String,
    by_kid: HashMap<String, CheckKey>,
    pem: String,
    jwks: String,
}

impl PublicKeys {
    /// The key set of one key, which is also the current one.
    pub(crate) fn single(key: VerifyingKey) -> Self {
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
            by_kid: keys.iter().map(|k| (thumbprint(k), CheckKey::new(k))).collect(),
            current: thumbprint(current),
            pem,
            jwks,
        }
    }

    /// The Ed25519 keys of a key set as `/.well-known/jwks.json` serves it (others passed
    /// over), each under the `kid` its own thumbprint gives; `None` when it holds none.
    pub fn from_jwks(jwks: &serde_json::Value) -> Option<Self> {
        let keys: Vec<VerifyingKey> = jwks["keys"]
            .as_array()?
            .iter()
            .filter(|k| k["kty"] == "OKP" && k["crv"] == "Ed25519")
            .filter_map(|k| {
                let x = URL_SAFE_NO_PAD.decode(k["x"].as_str()?).ok()?;
                VerifyingKey::from_bytes(&x.try_into().ok()?).ok()
            })
            .collect();
        Some(PublicKeys::new(keys.first()?, &keys))
    }

    /// The `kid` of the key new tokens are signed with.
    pub fn current_kid(&self) -> &str {
        &self.current
    }

    /// The public key a token names, if the set holds it.
    pub fn get(&self, kid: &str) -> Option<&VerifyingKey> {
        self.by_kid.get(kid).map(|c| &c.key)
    }

    /// SPKI PEM of the current key.
    pub fn public_key_pem(&self) -> &str {
        &self.pem
    }

    pub fn jwks_json(&self) -> &str {
        &self.jwks
    }

    /// Checks a token's signature with the public key its `kid` names, by RFC 8032
    /// verification in its strict form: it accepts exactly what
    /// `ed25519_dalek::VerifyingKey::verify_strict` accepts (non-canonical encodings and
    /// small-order points refused), so exactly what PyJWT and jose accept offline, whoever
    /// made the signature. See [`CheckKey::verify`] for how.
    pub fn verify(&self, token: &Unverified<'_>) -> Result<(), RejectReason> {
        let key = self.by_kid.get(&token.kid).ok_or(RejectReason::UnknownKey)?;
        if key.verify(token.signing_input, &token.signature) {
            Ok(())
        } else {
            Err(RejectReason::BadSignature)
        }
    }
}

/// A public key ready for the strict check: with a fixed-base table of `-A` (30 KiB), built
/// on the key's first check, so that the check is two fixed-base multiplications instead of
/// one double-base multiplication with a table of `A` built on every call. Built lazily: the
/// key set is rebuilt (and mostly thrown away unchanged) at every refresh of the fleet's
/// keys, and a table costs many checks.
struct CheckKey {
    key: VerifyingKey,
    /// `None` inside for a small-order `A`, which the strict check refuses whatever the
    /// signature.
    minus_a: OnceLock<Option<Box<EdwardsBasepointTable>>>,
}

impl std::fmt::Debug for CheckKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("CheckKey").field(&self.key).finish()
    }
}

impl CheckKey {
    fn new(key: &VerifyingKey) -> Self {
        CheckKey {
            key: *key,
            minus_a: OnceLock::new(),
        }
    }

    /// `verify_strict`'s acceptance, computed another way. `verify_strict` accepts when `s`
    /// is canonical, `R` decompresses to a point not of small order, `A` is not of small
    /// order, and `encode([s]B - [k]A) == R` byte for byte, with
    /// `k = SHA-512(R ‖ A ‖ M) mod ℓ`. Here the point `P = [s]B + [k](-A)` comes from two
    /// fixed-base tables, and `R` is not decompressed: when `encode(P) == R`, `R` is the
    /// canonical encoding of `P` and decompresses to `P`, so "R not of small order" is "P
    /// not of small order"; when `encode(P) != R` both refuse. The property test
    /// `the_check_accepts_exactly_what_verify_strict_accepts` holds the two together.
    fn verify(&self, message: &[u8], signature: &ed25519_dalek::Signature) -> bool {
        let minus_a = self.minus_a.get_or_init(|| {
            let key = &self.key;
            (!key.is_weak()).then(|| Box::new(EdwardsBasepointTable::create(&-key.to_edwards())))
        });
        let Some(minus_a) = minus_a else {
            return false;
        };
        let Some(s) = Option::<Scalar>::from(Scalar::from_canonical_bytes(*signature.s_bytes())) else {
            return false;
        };
        let r = signature.r_bytes();
        let mut h = Sha512::new();
        h.update(r);
        h.update(self.key.as_bytes());
        h.update(message);
        let k = Scalar::from_bytes_mod_order_wide(&h.finalize().into());
        let p = &**minus_a * &k + ED25519_BASEPOINT_TABLE * &s;
        p.compress().as_bytes() == r && !p.is_small_order()
    }
}

#[cfg(test)]
mod tests {
    use curve25519_dalek::constants::{ED25519_BASEPOINT_POINT, EIGHT_TORSION};
    use curve25519_dalek::edwards::CompressedEdwardsY;
    use ed25519_dalek::{Signature, Signer, SigningKey};
    use rand::{Rng, RngCore, SeedableRng};

    use super::*;

    /// `(R, S)` with `S = r + H(R ‖ A ‖ M)·a` for any `R` and key scalar `a`, valid or not.
    fn forge(a: Scalar, public: &[u8; 32], msg: &[u8], r: Scalar, big_r: [u8; 32]) -> Signature {
        let k = Scalar::from_bytes_mod_order_wide(
            &Sha512::new()
                .chain_update(big_r)
                .chain_update(public)
                .chain_update(msg)
                .finalize()
                .into(),
        );
        Signature::from_components(big_r, (r + k * a).to_bytes())
    }

    /// Encodings of the same `y` plus `p` (2^255 - 19), where that still fits: non-canonical.
    fn plus_p(enc: [u8; 32]) -> Option<[u8; 32]> {
        let sign = enc[31] & 0x80;
        let mut y = enc;
        y[31] &= 0x7f;
        // p = 2^255 - 19: y + p < 2^255 only when y < 19.
        if y[1..].iter().any(|&b| b != 0) || y[0] >= 19 {
            return None;
        }
        let mut out = [0xffu8; 32];
        out[0] = 0xed + y[0];
        out[31] = 0x7f | sign;
        Some(out)
    }

    /// The check and `verify_strict` agree on honest signatures, every bit flipped, `R`s of
    /// small order, with a torsion component, non-canonical or not on the curve, `S` not
    /// reduced, keys of small and of mixed order.
    #[test]
    fn the_check_accepts_exactly_what_verify_strict_accepts() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(41);
        let mut keys: Vec<(Scalar, VerifyingKey, Option<SigningKey>)> = Vec::new();
        for _ in 0..4 {
            let sk = SigningKey::generate(&mut rng);
            keys.push((sk.to_scalar(), sk.verifying_key(), Some(sk)));
        }
        // Public keys of mixed order (aB + T) and of small order (T): not keys a ring holds,
        // but the check must still refuse exactly what verify_strict refuses.
        for t in [1, 4, 0] {
            let a = Scalar::from_bytes_mod_order([7 + t as u8; 32]);
            let point = if t == 0 {
                EIGHT_TORSION[3]
            } else {
                ED25519_BASEPOINT_POINT * a + EIGHT_TORSION[t]
            };
            let vk = VerifyingKey::from_bytes(point.compress().as_bytes()).unwrap();
            let a = if t == 0 { Scalar::ZERO } else { a };
            keys.push((a, vk, None));
        }
        let (mut accepted, mut cases) = (0, 0);
        for (a, vk, sk) in &keys {
            let ours = CheckKey::new(vk);
            let mut agree = |msg: &[u8], sig: &Signature| {
                let strict = vk.verify_strict(msg, sig).is_ok();
                assert_eq!(ours.verify(msg, sig), strict, "key {vk:?} sig {sig:?}");
                cases += 1;
                accepted += usize::from(strict);
            };
            for n in 0..24 {
                let mut msg = vec![0u8; rng.gen_range(0..200)];
                rng.fill_bytes(&mut msg);
                let r = Scalar::from_bytes_mod_order(rng.gen());
                let rb = ED25519_BASEPOINT_POINT * r;
                let mut sigs = vec![forge(*a, vk.as_bytes(), &msg, r, rb.compress().to_bytes())];
                if let Some(sk) = sk {
                    sigs.push(sk.sign(&msg));
                }
                for t in EIGHT_TORSION {
                    let torsioned = (rb + t).compress().to_bytes();
                    sigs.push(forge(*a, vk.as_bytes(), &msg, r, torsioned));
                    sigs.push(forge(
                        *a,
                        vk.as_bytes(),
                        &msg,
                        Scalar::ZERO,
                        t.compress().to_bytes(),
                    ));
                    if let Some(enc) = plus_p(t.compress().to_bytes()) {
                        sigs.push(forge(*a, vk.as_bytes(), &msg, Scalar::ZERO, enc));
                    }
                }
                let mut random_r = [0u8; 32];
                rng.fill_bytes(&mut random_r);
                sigs.push(forge(*a, vk.as_bytes(), &msg, r, random_r));
                let good = sigs[0].to_bytes();
                let bit = (n * 37) % 512;
                let mut flipped = good;
                flipped[bit / 8] ^= 1 << (bit % 8);
                sigs.push(Signature::from_bytes(&flipped));
                // S + L: the same scalar, not canonical.
                let mut s = good;
                let l = Scalar::ZERO - Scalar::ONE;
                let mut carry = 1u16; // L = (L - 1) + 1
                for i in 0..32 {
                    let sum = u16::from(s[32 + i]) + u16::from(l.as_bytes()[i]) + carry;
                    s[32 + i] = sum as u8;
                    carry = sum >> 8;
                }
                if carry == 0 {
                    sigs.push(Signature::from_bytes(&s));
                }
                for sig in &sigs {
                    agree(&msg, sig);
                }
            }
        }
        // The non-canonical `R`s tried above decode to real points (y + p with y < 19 still
        // decompresses), so both refuse them for the encoding, not for a failed decoding.
        assert!(
            CompressedEdwardsY(plus_p(EIGHT_TORSION[0].compress().to_bytes()).unwrap())
                .decompress()
                .is_some()
        );
        assert!(
            accepted >= 4 * 24 * 2 + 2 * 24,
            "honest signatures accepted: {accepted} of {cases}"
        );
    }
}

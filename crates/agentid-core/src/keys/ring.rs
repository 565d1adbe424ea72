//! The key file's key: [`KeyRing`] reads or creates the PKCS#8 PEM file (0600), derives the
//! service's secrets from it (the cursor MAC secret, the log key, the key that seals rotated
//! signing keys in the database) and seals and opens those keys.

use std::fmt;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use ed25519_dalek::pkcs8::spki::der::pem::LineEnding;
use ed25519_dalek::pkcs8::{DecodePrivateKey, EncodePrivateKey};
use ed25519_dalek::{SigningKey, VerifyingKey};
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

use super::PublicKeys;
use crate::domain::Millis;
use crate::tlog::note::LogKey;

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("cannot read or create the signing key file {path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("the signing key file {path} is not an Ed25519 PKCS#8 PEM key")]
    Format { path: String },
    #[error(
        "the signing key file {path} can be read by others (mode {mode:o}): it must be readable by \
         its owner only. Run: chmod 600 {path}"
    )]
    Exposed { path: String, mode: u32 },
    /// The keys the database records cannot make a key set.
    #[error("{0}")]
    Recorded(String),
}

/// The signing key and what is derived from it.
pub struct KeyRing {
    signing: SigningKey,
    public: Arc<PublicKeys>,
    /// A secret derived from the signing key for MACs the service checks itself (cursors).
    mac_secret: [u8; 32],
}

impl fmt::Debug for KeyRing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyRing")
            .field("kid", &self.public.current_kid())
            .finish_non_exhaustive()
    }
}

impl KeyRing {
    pub fn from_signing_key(signing: SigningKey) -> Self {
        let mac_secret: [u8; 32] = Sha256::new()
            .chain_update(b"agentid mac secret v1")
            .chain_update(signing.to_bytes())
            .finalize()
            .into();
        KeyRing {
            public: Arc::new(PublicKeys::single(signing.verifying_key())),
            signing,
            mac_secret,
        }
    }

    /// Reads the PEM key at `path`; `None` when there is no such file. Refuses a file that
    /// its group or others may read, as ssh does.
    pub fn load(path: &Path) -> Result<Option<KeyRing>, KeyError> {
        #[cfg(unix)]
        if let Ok(meta) = std::fs::metadata(path) {
            use std::os::unix::fs::PermissionsExt;
            let mode = meta.permissions().mode() & 0o777;
            if mode & 0o077 != 0 {
                return Err(KeyError::Exposed {
                    path: path.display().to_string(),
                    mode,
                });
            }
        }
        match std::fs::read_to_string(path) {
            Ok(pem) => {
                let key = SigningKey::from_pkcs8_pem(&pem).map_err(|_| KeyError::Format {
                    path: path.display().to_string(),
                })?;
                Ok(Some(KeyRing::from_signing_key(key)))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(KeyError::Io {
                path: path.display().to_string(),
                source,
            }),
        }
    }

    /// Makes a new key and writes it to `path` (mode 0600, parent folders included; never
    /// over an existing file).
    pub fn create(path: &Path) -> Result<KeyRing, KeyError> {
        let io = |source| KeyError::Io {
            path: path.display().to_string(),
            source,
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        let key = SigningKey::generate(&mut rand::rngs::OsRng);
        // PKCS#8 v1 (RFC 5208, no public key attached): what `openssl pkey` and Python's
        // `cryptography` read; v2 with the public key is refused by both.
        let v1 = ed25519_dalek::pkcs8::KeypairBytes {
            secret_key: key.to_bytes(),
            public_key: None,
        };
        let pem = v1.to_pkcs8_pem(LineEnding::LF).expect("PKCS#8 encoding");
        write_private(path, pem.as_bytes()).map_err(io)?;
        Ok(KeyRing::from_signing_key(key))
    }

    /// The public key, as the fleet records it.
    pub fn public_key_bytes(&self) -> [u8; 32] {
        self.signing.verifying_key().to_bytes()
    }

    /// The `kid` new tokens carry.
    pub fn kid(&self) -> &str {
        self.public.current_kid()
    }

    /// The public side, which is all the verify path holds.
    pub fn public(&self) -> &Arc<PublicKeys> {
        &self.public
    }

    pub fn mac_secret(&self) -> &[u8; 32] {
        &self.mac_secret
    }

    /// Seals the seed of another signing key (`kid`, signing from `activates`) for the
    /// database, under a key derived from this one: AES-256-GCM with the `kid` and the
    /// activation time as associated data, so that neither can be changed in the database
    /// without the seal failing to open. `2 ‖ nonce ‖ ciphertext`.
    pub fn seal_key(&self, kid: &str, activates: Millis, seed: &[u8; 32]) -> Vec<u8> {
        use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM};
        let key = LessSafeKey::new(UnboundKey::new(&AES_256_GCM, &self.kek()).expect("a 32-byte key"));
        let mut nonce = [0u8; 12];
        rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut nonce);
        let mut sealed = seed.to_vec();
        key.seal_in_place_append_tag(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(sealed_aad(SEALED_V2, kid, activates)),
            &mut sealed,
        )
        .expect("sealing 32 bytes");
        let mut out = vec![SEALED_V2];
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&sealed);
        out
    }

    /// Opens what `seal_key` sealed for `kid` and `activates`; `None` when it was sealed under
    /// another key file, for another `kid` or activation time, or altered. (Keys sealed by
    /// versions before 2 bound the `kid` only.)
    pub(crate) fn open_key(&self, kid: &str, activates: Millis, sealed: &[u8]) -> Option<SigningKey> {
        use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM};
        let (&version, rest) = sealed.split_first()?;
        if !matches!(version, SEALED_V1 | SEALED_V2) || rest.len() != 12 + 32 + 16 {
            return None;
        }
        let (nonce, ciphertext) = rest.split_at(12);
        let key = LessSafeKey::new(UnboundKey::new(&AES_256_GCM, &self.kek()).ok()?);
        let mut buf = ciphertext.to_vec();
        let seed = key
            .open_in_place(
                Nonce::try_assume_unique_for_key(nonce).ok()?,
                Aad::from(sealed_aad(version, kid, activates)),
                &mut buf,
            )
            .ok()?;
        let seed: [u8; 32] = seed.try_into().ok()?;
        Some(SigningKey::from_bytes(&seed))
    }

    /// The key-encryption key: derived from this key, never stored.
    fn kek(&self) -> [u8; 32] {
        Sha256::new()
            .chain_update(b"agentid key-encryption key v1")
            .chain_update(self.signing.to_bytes())
            .finalize()
            .into()
    }

    /// This key's signing half, for the signing key set it belongs to.
    pub(crate) fn signing_key(&self) -> &SigningKey {
        &self.signing
    }

    /// A key derived from this one for `purpose`, never stored.
    fn derived(&self, purpose: &[u8]) -> [u8; 32] {
        Sha256::new()
            .chain_update(purpose)
            .chain_update(self.signing.to_bytes())
            .finalize()
            .into()
    }

    /// HMAC-SHA-256, keyed with the key derived for `purpose`, ready for its message.
    fn keyed(&self, purpose: &[u8]) -> Hmac<Sha256> {
        <Hmac<Sha256> as Mac>::new_from_slice(&self.derived(purpose)).expect("HMAC takes any key length")
    }

    /// HMAC-SHA-256 of `bytes` under the key derived for `purpose`.
    fn hmac(&self, purpose: &[u8], parts: &[&[u8]]) -> [u8; 32] {
        let mut m = self.keyed(purpose);
        for p in parts {
            m.update(p);
        }
        m.finalize().into_bytes().into()
    }

    /// Whether `mac` is the HMAC of `bytes` under the key derived for `purpose` (constant time).
    fn mac_checks(&self, purpose: &[u8], bytes: &[u8], mac: &[u8]) -> bool {
        let mut m = self.keyed(purpose);
        m.update(bytes);
        m.verify_slice(mac).is_ok()
    }

    /// The MAC of an event of the issuer-domain holdings (`DomainEvent::canonical`): an
    /// event counts only when the key file vouches for it, so a row written with database
    /// access alone gives nobody a name.
    pub fn domain_event_mac(&self, canonical: &[u8]) -> [u8; 32] {
        self.hmac(DOMAIN_HOLDINGS, &[canonical])
    }

    /// The MAC of an identity provider's row (`IdentityProviderRecord::canonical`): a row
    /// written or changed with database access alone vouches for no one.
    pub fn identity_provider_mac(&self, canonical: &[u8]) -> [u8; 32] {
        self.hmac(IDENTITY_PROVIDERS, &[canonical])
    }

    /// The MAC of a row's canonical bytes that says what `sealed` grants (see [`Sealed`]): a
    /// row written with database access alone has none that checks, and grants nothing.
    pub fn seal(&self, sealed: Sealed, canonical: &[u8]) -> [u8; 32] {
        self.hmac(sealed.purpose(), &[canonical])
    }

    /// Whether `mac` is the seal of `canonical` as `sealed` (constant time).
    pub fn vouches(&self, sealed: Sealed, canonical: &[u8], mac: &[u8; 32]) -> bool {
        self.mac_checks(sealed.purpose(), canonical, mac)
    }

    /// What seals a block of the audit log (the MAC of `domain::audit::block_seal_input`): a
    /// block written with database access alone has no seal that checks, so no checkpoint
    /// covers it unseen. Its key is made once: the audit writer seals every block with it.
    pub fn audit_block_sealer(&self) -> impl Fn(&[u8]) -> [u8; 32] + Send + Sync + 'static {
        let keyed = self.keyed(AUDIT_BLOCKS);
        move |sealed| keyed.clone().chain_update(sealed).finalize().into_bytes().into()
    }

    /// Whether `mac` is a block's seal (constant time).
    pub fn audit_block_vouched(&self, sealed: &[u8], mac: &[u8]) -> bool {
        self.mac_checks(AUDIT_BLOCKS, sealed, mac)
    }

    /// Whether `mac` is the MAC of an identity provider's canonical bytes (constant time).
    pub fn identity_provider_vouched(&self, canonical: &[u8], mac: &[u8; 32]) -> bool {
        self.mac_checks(IDENTITY_PROVIDERS, canonical, mac)
    }

    /// Whether `mac` is the MAC of an event's canonical bytes (constant time).
    pub(crate) fn domain_event_vouched(&self, canonical: &[u8], mac: &[u8; 32]) -> bool {
        self.mac_checks(DOMAIN_HOLDINGS, canonical, mac)
    }

    /// Whether the key file vouches for an issuer-domain event: its MAC checks, or it is a
    /// holding the migration carried over (unsealed, numbered from 1 and before the first
    /// `migrated` event, at `migrated`), or that event itself. Anything else, a row numbered
    /// 0 or below among them, was written with database access alone.
    pub fn vouches_for_domain_event(
        &self,
        e: &crate::domain::holding::DomainEvent,
        migrated: Option<i64>,
    ) -> bool {
        use crate::domain::holding::{EventKind, ProofMethod};
        match &e.mac {
            Some(mac) => self.domain_event_vouched(&e.canonical(), mac),
            None => match e.kind {
                EventKind::Hold => {
                    e.method == Some(ProofMethod::Existing)
                        && e.seq >= 1
                        && migrated.is_some_and(|m| e.seq < m)
                }
                EventKind::Migrated => e.seq >= 1 && migrated == Some(e.seq),
                EventKind::Release => false,
            },
        }
    }

    /// The challenge value an organization publishes to prove a name: bound to the
    /// organization, the name and the claim's random `nonce`, so one organization's value
    /// proves nothing for another, and nobody can compute it without the key file (not even
    /// from the database).
    pub fn domain_challenge(&self, org_id: &str, domain: &str, nonce: &str) -> String {
        let mac = self.hmac(
            b"agentid domain challenge v1",
            &[
                org_id.as_bytes(),
                b"\n",
                domain.as_bytes(),
                b"\n",
                nonce.as_bytes(),
            ],
        );
        URL_SAFE_NO_PAD.encode(mac)
    }

    /// The key that signs the audit log's checkpoints, named `name`: derived from this key,
    /// so every instance of a fleet has the same one.
    pub fn log_key(&self, name: &str) -> LogKey {
        LogKey::derive(name, &self.signing.to_bytes())
    }

    /// Signs with the key file's key, whatever key the fleet signs with now (tests only: the
    /// service signs with `SigningKeys`, which follows rotations).
    #[cfg(any(test, feature = "test-hooks"))]
    pub fn sign(&self, claims: &crate::token::Claims) -> String {
        crate::token::encode(&self.signing, self.kid(), claims)
    }
}

/// A short content hash of a text (base64url SHA-256), for ETags.
pub fn thumbprint_of_text(text: &str) -> String {
    URL_SAFE_NO_PAD.encode(Sha256::digest(text.as_bytes()))
}

/// The version byte of a sealed signing key: 1 bound the `kid`, 2 binds the activation
/// time too.
/// What the key file's MACs are for: each its own key, derived from the file's.
const DOMAIN_HOLDINGS: &[u8] = b"agentid domain holdings v1";
const IDENTITY_PROVIDERS: &[u8] = b"agentid identity providers v1";
const AUDIT_BLOCKS: &[u8] = b"agentid audit blocks v1";

/// What a row sealed by [`KeyRing::seal`] grants; each kind is sealed under its own key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sealed {
    /// An API key's row (`records::api_key_canonical`).
    ApiKey,
    /// An organization's plan and limits (`OrgRecord::canonical`).
    Organization,
    /// An agent's key binding (`AgentRecord::key_canonical`).
    AgentKey,
    /// An agent's client secret (`records::client_secret_canonical`).
    ClientSecret,
}

impl Sealed {
    fn purpose(self) -> &'static [u8] {
        match self {
            Sealed::ApiKey => b"agentid api keys v1",
            Sealed::Organization => b"agentid organizations v1",
            Sealed::AgentKey => b"agentid agent keys v1",
            Sealed::ClientSecret => b"agentid client secrets v1",
        }
    }
}

const SEALED_V1: u8 = 1;
const SEALED_V2: u8 = 2;

/// The associated data of a sealed key of `version`.
fn sealed_aad(version: u8, kid: &str, activates: Millis) -> Vec<u8> {
    let mut aad = kid.as_bytes().to_vec();
    if version >= SEALED_V2 {
        aad.push(0);
        aad.extend_from_slice(&activates.0.to_be_bytes());
    }
    aad
}

/// The RFC 7638 thumbprint of a key: its `kid`.
pub fn thumbprint(key: &VerifyingKey) -> String {
    // RFC 7638: members in lexicographic order, no white space.
    let jwk = format!(
        r#"{{"crv":"Ed25519","kty":"OKP","x":"{}"}}"#,
        URL_SAFE_NO_PAD.encode(key.as_bytes())
    );
    URL_SAFE_NO_PAD.encode(Sha256::digest(jwk.as_bytes()))
}

/// Writes `bytes` to a new file at `path`, readable by its owner alone, whole or not at all:
/// they go to a file of their own beside it first, synced, then take the name (a hard link,
/// which never replaces a file), and the folder is synced so that the name lasts a crash.
/// Where the file system takes no hard link (or refuses one), the file is written in place.
fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".{:016x}.tmp", rand::random::<u64>()));
    let tmp = dir.join(name);
    write_new(&tmp, bytes)?;
    let linked = std::fs::hard_link(&tmp, path);
    let _ = std::fs::remove_file(&tmp);
    match linked {
        Ok(()) => {}
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::Unsupported | std::io::ErrorKind::PermissionDenied
            ) =>
        {
            write_new(path, bytes)?
        }
        Err(e) => return Err(e),
    }
    #[cfg(unix)]
    std::fs::File::open(dir)?.sync_all()?;
    Ok(())
}

fn write_new(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
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
    use crate::token::{Claims, RejectReason, Unverified};
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use curve25519_dalek::constants::{ED25519_BASEPOINT_POINT, EIGHT_TORSION};
    use curve25519_dalek::scalar::Scalar;
    use sha2::Sha512;

    use super::*;
    use crate::token::decode;

    /// A block's seal checks for that block alone: not at another place of its ledger, in
    /// another ledger, over other hashes, or under another key file.
    #[test]
    fn a_blocks_seal_names_its_place_and_its_hashes() {
        use crate::domain::audit::block_seal_input;
        use crate::domain::{KeyMode, Ledger};
        let ring = KeyRing::from_signing_key(SigningKey::from_bytes(&[1; 32]));
        let other = KeyRing::from_signing_key(SigningKey::from_bytes(&[2; 32]));
        let live = Ledger {
            org_id: "org_a".into(),
            mode: KeyMode::Live,
        };
        let test = Ledger {
            mode: KeyMode::Test,
            ..live.clone()
        };
        let input = block_seal_input(&live, 4, 9, &[1; 32], &[2; 32]);
        let seal = ring.audit_block_sealer()(&input);
        assert!(ring.audit_block_vouched(&input, &seal));
        for moved in [
            block_seal_input(&live, 5, 9, &[1; 32], &[2; 32]),
            block_seal_input(&live, 4, 10, &[1; 32], &[2; 32]),
            block_seal_input(&test, 4, 9, &[1; 32], &[2; 32]),
            block_seal_input(&live, 4, 9, &[3; 32], &[2; 32]),
            block_seal_input(&live, 4, 9, &[1; 32], &[3; 32]),
        ] {
            assert!(!ring.audit_block_vouched(&moved, &seal));
        }
        assert!(!other.audit_block_vouched(&input, &seal));
        assert!(!ring.audit_block_vouched(&input, &seal[..31]));
    }

    /// Two processes starting at once on one key file: the one that does not make it reads
    /// the other's whole, never a file half written.
    #[test]
    fn a_key_file_is_never_seen_half_written() {
        let dir = tempfile::tempdir().unwrap();
        for i in 0..300 {
            let path = dir.path().join(format!("{i}/key.pem"));
            let reader = {
                let path = path.clone();
                std::thread::spawn(move || loop {
                    match std::fs::read(&path) {
                        Ok(bytes) => return bytes,
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => std::hint::spin_loop(),
                        Err(e) => panic!("{e}"),
                    }
                })
            };
            let ring = KeyRing::create(&path).unwrap();
            let seen = reader.join().unwrap();
            let read = SigningKey::from_pkcs8_pem(std::str::from_utf8(&seen).unwrap());
            assert!(read.is_ok(), "run {i}: {} bytes seen", seen.len());
            assert_eq!(KeyRing::from_signing_key(read.unwrap()).kid(), ring.kid());
            // Nothing is left beside it.
            assert_eq!(
                std::fs::read_dir(dir.path().join(i.to_string())).unwrap().count(),
                1
            );
        }
    }

    #[test]
    fn created_key_is_private_and_reloads() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/key.pem");
        assert!(KeyRing::load(&path).unwrap().is_none());
        let ring = KeyRing::create(&path).unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        let again = KeyRing::load(&path).unwrap().expect("written");
        assert_eq!(ring.kid(), again.kid());
        assert!(KeyRing::create(&path).is_err(), "never over an existing file");
        assert!(ring
            .public()
            .public_key_pem()
            .starts_with("-----BEGIN PUBLIC KEY-----"));
        assert!(!format!("{ring:?}").contains("PRIVATE"));
    }

    /// A rotated key is stored sealed: only the same key file opens it, and only for its kid.
    #[test]
    fn sealed_keys_open_only_under_their_key_file_and_kid() {
        let root = KeyRing::from_signing_key(SigningKey::from_bytes(&[1; 32]));
        let other = KeyRing::from_signing_key(SigningKey::from_bytes(&[2; 32]));
        let seed = [7u8; 32];
        let at = Millis(1_000);
        let sealed = root.seal_key("kid-a", at, &seed);
        assert_eq!(sealed.len(), 1 + 12 + 32 + 16);
        assert!(!sealed.windows(32).any(|w| w == seed), "never in the clear");
        assert_eq!(root.open_key("kid-a", at, &sealed).unwrap().to_bytes(), seed);
        assert!(root.open_key("kid-b", at, &sealed).is_none());
        assert!(
            root.open_key("kid-a", Millis(999), &sealed).is_none(),
            "activation moved"
        );
        assert!(other.open_key("kid-a", at, &sealed).is_none());
        let mut bent = sealed.clone();
        bent[20] ^= 1;
        assert!(root.open_key("kid-a", at, &bent).is_none());
        let mut downgraded = sealed.clone();
        downgraded[0] = SEALED_V1;
        assert!(
            root.open_key("kid-a", at, &downgraded).is_none(),
            "no way back to version 1"
        );
        assert_ne!(
            root.seal_key("kid-a", at, &seed),
            sealed,
            "a fresh nonce each time"
        );
    }

    /// The key file is PKCS#8 v1 (version 0, no public key attached), which OpenSSL and
    /// Python's cryptography read.
    #[test]
    fn the_key_file_is_pkcs8_v1() {
        use base64::engine::general_purpose::STANDARD;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("key.pem");
        let ring = KeyRing::create(&path).unwrap();
        let pem = std::fs::read_to_string(&path).unwrap();
        let body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
        assert!(pem.starts_with("-----BEGIN PRIVATE KEY-----\n"));
        let der = STANDARD.decode(body).unwrap();
        // SEQUENCE { INTEGER 0 (v1), AlgorithmIdentifier { id-Ed25519 }, OCTET STRING {
        // OCTET STRING seed } }: 48 bytes, nothing after the seed (v2 would attach the key).
        let mut want = vec![
            0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20,
        ];
        want.extend_from_slice(&ring.signing.to_bytes());
        assert_eq!(der, want);
    }

    #[cfg(unix)]
    #[test]
    fn a_key_file_others_may_read_is_refused_with_the_fix() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("key.pem");
        KeyRing::create(&path).unwrap();
        for mode in [0o640, 0o604, 0o644] {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            let err = KeyRing::load(&path).unwrap_err().to_string();
            assert!(err.contains("chmod 600"), "{err}");
        }
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o400)).unwrap();
        assert!(KeyRing::load(&path).unwrap().is_some());
    }

    fn claims(n: i64) -> Claims {
        Claims::agent(
            "a.com",
            &format!("agt_{n}"),
            &n.to_string(),
            n,
            n + 1,
            vec!["read:x".into()],
        )
    }

    #[test]
    fn foreign_key_under_same_kid_fails() {
        let ours = KeyRing::from_signing_key(SigningKey::from_bytes(&[1; 32]));
        let good = ours.sign(&claims(1));
        assert!(ours.public().verify(&decode(&good).unwrap()).is_ok());
        let forged = crate::token::encode(&SigningKey::from_bytes(&[2; 32]), ours.kid(), &claims(1));
        assert_eq!(
            ours.public().verify(&decode(&forged).unwrap()),
            Err(RejectReason::BadSignature)
        );
        let elsewhere = Unverified {
            kid: "another-kid".into(),
            ..decode(&good).unwrap()
        };
        assert_eq!(ours.public().verify(&elsewhere), Err(RejectReason::UnknownKey));
    }

    /// A signature `(R, S)` over `input`, made with the private key: `S = r + H(R ‖ A ‖ M)·a`
    /// for the nonce `r` and any `R` the caller picks (`r·B` for an honest signature).
    fn sign_with(key: &SigningKey, input: &str, r: Scalar, big_r: [u8; 32]) -> String {
        let k = Scalar::from_hash(
            Sha512::new()
                .chain_update(big_r)
                .chain_update(key.verifying_key().as_bytes())
                .chain_update(input.as_bytes()),
        );
        let s = r + k * key.to_scalar();
        let mut sig = [0u8; 64];
        sig[..32].copy_from_slice(&big_r);
        sig[32..].copy_from_slice(s.as_bytes());
        format!("{input}.{}", URL_SAFE_NO_PAD.encode(sig))
    }

    /// The nonce RFC 8032 signing derives for `input`: `H(prefix ‖ M)`.
    fn deterministic_nonce(key: &SigningKey, input: &str) -> Scalar {
        let prefix = &Sha512::digest(key.as_bytes())[32..];
        Scalar::from_hash(Sha512::new().chain_update(prefix).chain_update(input.as_bytes()))
    }

    /// Online verification agrees with RFC 8032 strict verification (what PyJWT and jose
    /// do offline) on signatures the key holder makes, whatever nonce it used: one with a
    /// random nonce is valid; one whose `R` is not its nonce's point, or carries a
    /// small-order component, is not, even with the deterministic nonce's `S`.
    #[test]
    fn key_holder_signatures_pass_exactly_when_strict_verification_passes() {
        let key = SigningKey::from_bytes(&[1; 32]);
        let ours = KeyRing::from_signing_key(key.clone());
        let token = ours.sign(&claims(1));
        let input = token.rsplit_once('.').unwrap().0.to_owned();
        let check = |t: &str| ours.public().verify(&decode(t).unwrap());
        let r = deterministic_nonce(&key, &input);
        let point = |s: Scalar| (ED25519_BASEPOINT_POINT * s).compress().to_bytes();

        assert_eq!(sign_with(&key, &input, r, point(r)), token, "RFC 8032 signing");
        assert!(check(&token).is_ok());
        let random = Scalar::from_bytes_mod_order([9; 32]);
        assert!(check(&sign_with(&key, &input, random, point(random))).is_ok());

        let other_r = ED25519_BASEPOINT_POINT.compress().to_bytes();
        assert_eq!(
            check(&sign_with(&key, &input, r, other_r)),
            Err(RejectReason::BadSignature)
        );
        let not_a_point = [0xff; 32];
        assert!(check(&sign_with(&key, &input, r, not_a_point)).is_err());
        let torsioned = (ED25519_BASEPOINT_POINT * r + EIGHT_TORSION[4])
            .compress()
            .to_bytes();
        assert!(check(&sign_with(&key, &input, r, torsioned)).is_err());
    }

    /// The group order L = 2^252 + 27742317777372353535851937790883648493, little-endian.
    const L_BYTES: [u8; 32] = [
        0xed, 0xd3, 0xf5, 0x5c, 0x1a, 0x63, 0x12, 0x58, 0xd6, 0x9c, 0xf7, 0xa2, 0xde, 0xf9, 0xde, 0x14, 0, 0,
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10,
    ];

    #[test]
    fn any_changed_bit_or_a_non_canonical_s_is_refused() {
        let ours = KeyRing::from_signing_key(SigningKey::from_bytes(&[4; 32]));
        for n in 0..8 {
            let good = decode(&ours.sign(&claims(n))).unwrap().signature.to_bytes();
            let token = ours.sign(&claims(n));
            let with_sig = |sig: [u8; 64]| {
                let input = token.rsplit_once('.').unwrap().0;
                format!("{input}.{}", URL_SAFE_NO_PAD.encode(sig))
            };
            for bit in [0, 7, 100, 255, 256, 300, 511] {
                let mut sig = good;
                sig[bit / 8] ^= 1 << (bit % 8);
                let t = with_sig(sig);
                assert!(ours.public().verify(&decode(&t).unwrap()).is_err(), "bit {bit}");
            }
            // S + L: the same scalar, not its canonical encoding.
            let mut sig = good;
            let mut carry = 0u16;
            for (i, l) in L_BYTES.iter().enumerate() {
                let sum = u16::from(sig[32 + i]) + u16::from(*l) + carry;
                sig[32 + i] = sum as u8;
                carry = sum >> 8;
            }
            assert_eq!(carry, 0, "S + L < 2^256");
            let t = with_sig(sig);
            assert!(ours.public().verify(&decode(&t).unwrap()).is_err(), "S + L");
        }
    }
}

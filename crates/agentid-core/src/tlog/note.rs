//! Checkpoints as C2SP signed notes (`tlog-checkpoint` in a `signed-note`, Ed25519).
//!
//! A checkpoint's text is `<origin>\n<tree size>\n<root, standard base64>\n`; the note is that
//! text, an empty line, and one line per signature: `— <key name> <base64(key hash ‖
//! signature)>`. The key hash is the first 4 bytes of `SHA-256(key name ‖ 0x0A ‖ 0x01 ‖
//! public key)`; the verifier key is written `<key name>+<key hash, 8 hex digits>+<base64(0x01
//! ‖ public key)>`. The log key is derived from the signing key file, so every instance of a
//! fleet signs with the same one, and a token key rotation does not change it.

use std::fmt;

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use sha2::{Digest, Sha256};

use crate::domain::hex;
use crate::tlog::tree::Hash;

/// The Ed25519 signature type of C2SP signed notes.
const ED25519: u8 = 0x01;
/// The signature line's prefix: an em dash and a space.
const SIG_PREFIX: &str = "\u{2014} ";
/// Notes larger than this are refused unread (a checkpoint is ~150 bytes).
pub(crate) const MAX_NOTE_LEN: usize = 16 * 1024;

/// A tree head: the origin names the ledger.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    pub origin: String,
    pub size: u64,
    pub root: Hash,
    /// Extension lines after the root (see `tlog::commit`), signed with the rest.
    pub extensions: Vec<String>,
}

impl Checkpoint {
    /// The signed text: origin, size, root and any extension lines, each on its line.
    pub(crate) fn text(&self) -> String {
        let mut text = format!("{}\n{}\n{}\n", self.origin, self.size, STANDARD.encode(self.root));
        for line in &self.extensions {
            text.push_str(line);
            text.push('\n');
        }
        text
    }

    /// Parses a checkpoint's text, extension lines after the root included.
    pub fn parse(text: &str) -> Result<Checkpoint, NoteError> {
        let body = text
            .strip_suffix('\n')
            .ok_or(NoteError::Format("text must end with a newline"))?;
        let mut lines = body.split('\n');
        let origin = lines
            .next()
            .filter(|o| !o.is_empty())
            .ok_or(NoteError::Format("no origin"))?;
        let size = lines.next().ok_or(NoteError::Format("no tree size"))?;
        if size.is_empty()
            || !size.bytes().all(|b| b.is_ascii_digit())
            || (size.len() > 1 && size.starts_with('0'))
        {
            return Err(NoteError::Format("the tree size is not a decimal number"));
        }
        let size = size
            .parse()
            .map_err(|_| NoteError::Format("the tree size is too large"))?;
        let root = lines.next().ok_or(NoteError::Format("no root hash"))?;
        let root = STANDARD
            .decode(root)
            .ok()
            .and_then(|r| Hash::try_from(r).ok())
            .ok_or(NoteError::Format(
                "the root hash is not 32 bytes of standard base64",
            ))?;
        let extensions: Vec<String> = lines.map(str::to_owned).collect();
        if extensions.iter().any(String::is_empty) {
            return Err(NoteError::Format("empty extension line"));
        }
        Ok(Checkpoint {
            origin: origin.to_owned(),
            size,
            root,
            extensions,
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoteError {
    #[error("not a signed note: {0}")]
    Format(&'static str),
    #[error("the note carries no signature by the log key {0}")]
    NotSigned(String),
    #[error("the signature of the log key {0} does not verify")]
    BadSignature(String),
    #[error("not a verifier key ({0}); expected <name>+<8 hex digits>+<base64 key>")]
    Key(&'static str),
}

/// The log's signing key: signs checkpoints.
pub struct LogKey {
    key: SigningKey,
    verifier: LogVerifier,
}

impl fmt::Debug for LogKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LogKey")
            .field("name", &self.verifier.name)
            .finish_non_exhaustive()
    }
}

impl LogKey {
    /// The log key named `name`, derived from the seed of the signing key.
    pub fn derive(name: &str, signing_seed: &[u8; 32]) -> LogKey {
        let seed: [u8; 32] = Sha256::new()
            .chain_update(b"agentid log key v1")
            .chain_update(signing_seed)
            .finalize()
            .into();
        let key = SigningKey::from_bytes(&seed);
        LogKey {
            verifier: LogVerifier::new(name, key.verifying_key()),
            key,
        }
    }

    pub fn verifier(&self) -> &LogVerifier {
        &self.verifier
    }

    /// The signed note of a checkpoint.
    pub fn sign(&self, checkpoint: &Checkpoint) -> String {
        let text = checkpoint.text();
        let sig = self.key.sign(text.as_bytes());
        let mut blob = Vec::with_capacity(68);
        blob.extend_from_slice(&self.verifier.id);
        blob.extend_from_slice(&sig.to_bytes());
        format!(
            "{text}\n{SIG_PREFIX}{} {}\n",
            self.verifier.name,
            STANDARD.encode(blob)
        )
    }
}

/// The public side of the log key, as `/.well-known/log-key` serves it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogVerifier {
    name: String,
    id: [u8; 4],
    key: VerifyingKey,
}

impl LogVerifier {
    pub fn new(name: &str, key: VerifyingKey) -> LogVerifier {
        LogVerifier {
            id: key_id(name, &key),
            name: name.to_owned(),
            key,
        }
    }

    /// Parses `<name>+<hash>+<base64(0x01 ‖ key)>`; the hash must be the key's.
    pub fn parse(line: &str) -> Result<LogVerifier, NoteError> {
        let mut parts = line.trim().splitn(3, '+');
        let (Some(name), Some(hash), Some(key)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(NoteError::Key("three parts joined by +"));
        };
        if !valid_name(name) {
            return Err(NoteError::Key("the name is empty or holds a space or +"));
        }
        let bytes = STANDARD
            .decode(key)
            .map_err(|_| NoteError::Key("the key is not base64"))?;
        let key = match bytes.split_first() {
            Some((&ED25519, k)) => <[u8; 32]>::try_from(k)
                .ok()
                .and_then(|k| VerifyingKey::from_bytes(&k).ok())
                .ok_or(NoteError::Key("not an Ed25519 public key"))?,
            _ => return Err(NoteError::Key("not an Ed25519 key (type 0x01)")),
        };
        let v = LogVerifier::new(name, key);
        if hash.len() != 8 || hash != hex(&v.id) {
            return Err(NoteError::Key("the key hash does not match the name and key"));
        }
        Ok(v)
    }

    /// Checks a signed note's signature by this key and returns its checkpoint.
    pub fn open(&self, note: &str) -> Result<Checkpoint, NoteError> {
        if note.len() > MAX_NOTE_LEN {
            return Err(NoteError::Format("too large"));
        }
        let split = note
            .rfind("\n\n")
            .ok_or(NoteError::Format("no empty line before the signatures"))?;
        let (text, sigs) = (&note[..split + 1], &note[split + 2..]);
        let sigs = sigs
            .strip_suffix('\n')
            .ok_or(NoteError::Format("must end with a newline"))?;
        let mut found = false;
        for line in sigs.split('\n') {
            let rest = line
                .strip_prefix(SIG_PREFIX)
                .ok_or(NoteError::Format("a signature line"))?;
            let (name, blob) = rest
                .split_once(' ')
                .ok_or(NoteError::Format("a signature line"))?;
            if name != self.name {
                continue;
            }
            let blob = STANDARD
                .decode(blob)
                .map_err(|_| NoteError::Format("a signature is not base64"))?;
            if blob.len() != 68 || blob[..4] != self.id {
                continue;
            }
            found = true;
            let sig =
                Signature::from_slice(&blob[4..]).map_err(|_| NoteError::BadSignature(self.name.clone()))?;
            self.key
                .verify_strict(text.as_bytes(), &sig)
                .map_err(|_| NoteError::BadSignature(self.name.clone()))?;
        }
        if !found {
            return Err(NoteError::NotSigned(self.name.clone()));
        }
        Checkpoint::parse(text)
    }
}

impl fmt::Display for LogVerifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut key = vec![ED25519];
        key.extend_from_slice(self.key.as_bytes());
        write!(f, "{}+{}+{}", self.name, hex(&self.id), STANDARD.encode(key))
    }
}

fn key_id(name: &str, key: &VerifyingKey) -> [u8; 4] {
    let h = Sha256::new()
        .chain_update(name.as_bytes())
        .chain_update([b'\n', ED25519])
        .chain_update(key.as_bytes())
        .finalize();
    [h[0], h[1], h[2], h[3]]
}

fn valid_name(name: &str) -> bool {
    !name.is_empty() && !name.chars().any(|c| c == '+' || c.is_whitespace())
}

/// A checkpoint from outside the database: where it came from, and its signed note.
#[derive(Debug, Clone)]
pub struct GivenNote {
    pub source: String,
    pub note: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> LogKey {
        LogKey::derive("example.com/agentid", &[7; 32])
    }

    fn cp() -> Checkpoint {
        Checkpoint {
            origin: "example.com/agentid/org_1/live".into(),
            size: 12,
            root: [9; 32],
            extensions: vec!["agentid-x 1".into()],
        }
    }

    #[test]
    fn a_signed_checkpoint_opens_with_its_verifier_key() {
        let k = key();
        let note = k.sign(&cp());
        assert!(note.starts_with("example.com/agentid/org_1/live\n12\nCQkJ"));
        assert!(note.contains("\n\n\u{2014} example.com/agentid "));
        let line = k.verifier().to_string();
        let v = LogVerifier::parse(&line).unwrap();
        assert_eq!(v.open(&note).unwrap(), cp());
    }

    /// The key hash is the first four bytes of SHA-256(name ‖ LF ‖ 0x01 ‖ key), as C2SP
    /// signed-note defines it, computed here step by step.
    #[test]
    fn the_key_hash_is_the_signed_note_one() {
        let k = key();
        let mut input = b"example.com/agentid\n\x01".to_vec();
        input.extend_from_slice(k.verifier().key.as_bytes());
        let h = Sha256::digest(&input);
        let line = k.verifier().to_string();
        assert_eq!(line.split('+').nth(1).unwrap(), hex(&h[..4]));
    }

    #[test]
    fn tampered_notes_and_other_keys_are_refused() {
        let k = key();
        let note = k.sign(&cp());
        let v = k.verifier();
        assert!(matches!(
            v.open(&note.replace("\n12\n", "\n13\n")),
            Err(NoteError::BadSignature(_))
        ));
        let other = LogKey::derive("example.com/agentid", &[8; 32]);
        assert!(matches!(
            other.verifier().open(&note),
            Err(NoteError::NotSigned(_))
        ));
        assert!(v.open("no note").is_err());
        assert!(v.open(&note[..note.len() - 1]).is_err());
        assert!(LogVerifier::parse("a+00000000+AQ==").is_err());
        let line = v.to_string();
        assert!(LogVerifier::parse(&line.replacen('+', "x+", 1)).is_err());
    }

    #[test]
    fn checkpoint_text_is_strict() {
        assert!(Checkpoint::parse("o\n012\nCQkJCQkJCQkJCQkJCQkJCQkJCQkJCQkJCQkJCQkJCQk=\n").is_err());
        assert!(Checkpoint::parse("o\n12\nCQkJ\n").is_err());
        assert!(Checkpoint::parse("\n12\nCQkJCQkJCQkJCQkJCQkJCQkJCQkJCQkJCQkJCQkJCQk=\n").is_err());
        let c = Checkpoint::parse("o\n12\nCQkJCQkJCQkJCQkJCQkJCQkJCQkJCQkJCQkJCQkJCQk=\next\n").unwrap();
        assert_eq!(c.size, 12);
        assert_eq!(c.extensions, ["ext"]);
    }
}

//! JWT tokens: Ed25519 key ring, encoding and strict decoding. Pure functions, no I/O
//! except reading and creating the key file.

mod jwt;
mod keys;
mod note;

pub use jwt::{decode, encode, Claims, RejectReason, Rejected, Unverified, MAX_TOKEN_LEN};
pub use keys::{thumbprint, thumbprint_of_text, KeyError, KeyRing, PublicKeys};
pub use note::{Checkpoint, LogKey, LogVerifier, NoteError, MAX_NOTE_LEN};

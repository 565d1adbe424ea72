//! One-time credentials (an ID-JAG, a signed request's nonce): what the store remembers a
//! used one by, fleet-wide.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use sha2::{Digest, Sha256};

/// The SHA-256 of `parts`, each ended by a zero byte, in base64url.
pub(crate) fn used_key(parts: &[&str]) -> String {
    let mut key = Sha256::new();
    for part in parts {
        key.update(part.as_bytes());
        key.update([0]);
    }
    URL_SAFE_NO_PAD.encode(key.finalize())
}

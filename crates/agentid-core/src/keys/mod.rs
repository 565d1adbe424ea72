//! Keys: the key file's key and what it derives and seals ([`KeyRing`]), the public keys the
//! verify path checks signatures with ([`PublicKeys`]), and the fleet's signing keys as
//! recorded, each one's state, and the key set in force ([`SigningKeys`]). Pure: the engine
//! reads the records from the store and hands them in.

mod public;
mod ring;
mod set;

pub use public::PublicKeys;
pub use ring::{thumbprint, thumbprint_of_text, KeyError, KeyRing, Sealed};
pub use set::{
    states, vouch, vouched, KeySet, KeyState, KeyView, Refreshed, SigningKeyRecord, SigningKeys, Unvouched,
};

//! JWT tokens: encoding and strict decoding, and DPoP proofs of possession. Pure functions.

pub mod dpop;
mod jwt;

pub use jwt::{
    decode, encode, encode_json, Claims, Confirmation, RejectReason, Rejected, Status, StatusListRef,
    Unverified, MAX_TOKEN_LEN,
};

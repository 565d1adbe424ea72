//! JWT tokens: encoding and strict decoding (agent tokens and OAuth access tokens), DPoP
//! proofs of possession, the JWTs an OAuth client authenticates with, and a receiver's policy.
//! Pure functions.

pub mod assertion;
pub mod dpop;
mod jwt;
pub mod policy;

pub use jwt::{
    absolute_uri, decode, encode, encode_json, Audience, Claims, Confirmation, RejectReason, Rejected,
    Status, StatusListRef, Unverified, ACCESS_TOKEN_TYP, MAX_RESOURCE_LEN, MAX_TOKEN_LEN,
};

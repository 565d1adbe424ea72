//! JWT tokens: encoding and strict decoding (agent tokens and OAuth access tokens), DPoP
//! proofs of possession, the JWTs an OAuth client authenticates with, and a receiver's policy.
//! Pure functions.

pub mod assertion;
pub mod dpop;
pub mod foreign;
mod jwt;
pub mod policy;
#[cfg(test)]
mod test_jws;

pub use jwt::{
    absolute_uri, decode, encode, encode_json, Actor, Audience, Claims, Confirmation, RejectReason, Rejected,
    Status, StatusListRef, SubjectId, Unverified, ACCESS_TOKEN_TYP, MAX_CHAIN, MAX_RESOURCE_LEN,
    MAX_TOKEN_LEN,
};

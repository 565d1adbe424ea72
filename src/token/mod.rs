//! JWT tokens: encoding and strict decoding. Pure functions.

mod jwt;

pub use jwt::{decode, encode, Claims, RejectReason, Rejected, Unverified, MAX_TOKEN_LEN};

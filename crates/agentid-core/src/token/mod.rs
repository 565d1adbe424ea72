//! JWT tokens: encoding and strict decoding. Pure functions.

mod jwt;

pub use jwt::{
    decode, encode, encode_json, Claims, RejectReason, Rejected, Status, StatusListRef, Unverified,
    MAX_TOKEN_LEN,
};

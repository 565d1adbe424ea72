//! Validated values of the problem domain: agents, organizations, plans, keys, audit records.
//! Nothing here knows about HTTP or SQL; everything deeper than a handler sees only these types.

mod agent;
pub mod audit;
pub mod fields;
mod gcra;
pub mod holding;
mod ids;
pub mod org;
mod status;
pub mod streams;
mod time;

pub use agent::{AgentFields, AgentStatus, Description, ExpirySeconds, IssuerDomain, Name, Scopes};
pub use gcra::Gcra;
pub use ids::{agent_bits, new_id, AgentId, IdPrefix, IdpId, ListId, OrgId, StreamId};
pub use org::{ApiKeyKind, KeyMode, Ledger, OrgLimits, Plan, RevokeReason};
pub use status::{takes_new_places, StatusBits, StatusPlace, MAX_LIST_SIZE, MIN_LIST_SIZE};
pub use time::Millis;

/// A value broke one of the field rules. `field` is the request field it came from.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct ValidationError {
    pub(crate) field: &'static str,
    pub(crate) message: String,
}

impl ValidationError {
    pub fn new(field: &'static str, message: impl Into<String>) -> Self {
        Self {
            field,
            message: message.into(),
        }
    }
}

/// Whether `m` is an HTTP method as a request line carries it ([`fields::HTTP_METHOD`]).
pub fn is_http_method(m: &str) -> bool {
    let tchar = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    (1..=fields::HTTP_METHOD.max()).contains(&m.len()) && m.bytes().all(tchar)
}

/// Result of one verification, as the audit log and the metrics name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum VerifyResult {
    Valid,
    Invalid,
    Expired,
    Revoked,
}

impl VerifyResult {
    pub const ALL: [VerifyResult; 4] = [
        VerifyResult::Valid,
        VerifyResult::Invalid,
        VerifyResult::Expired,
        VerifyResult::Revoked,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            VerifyResult::Valid => "valid",
            VerifyResult::Invalid => "invalid",
            VerifyResult::Expired => "expired",
            VerifyResult::Revoked => "revoked",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.as_str() == s)
    }

    /// Its place in [`VerifyResult::ALL`]: the index of running totals ([`Totals`]).
    pub fn index(self) -> usize {
        self as usize
    }

    /// Its bit in a set of results (which results a stored block of records holds).
    pub fn bit(self) -> i32 {
        1 << self.index()
    }
}

/// Running totals of a ledger or an agent, per result, indexed by [`VerifyResult::index`].
pub type Totals = [i64; 4];

/// Lower-case hex of bytes (record hashes, proof hashes, key ids).
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// 32 bytes from 64 hex digits (either case).
pub fn unhex32(s: &str) -> Option<[u8; 32]> {
    if s.len() != 64 || !s.is_ascii() {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

//! What a refusal is: [`Error`], its code, and the escaping of what a token or proof says.

/// Why a token may not be trusted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("TOKEN_INVALID: {0}")]
    Invalid(String),
    #[error("TOKEN_EXPIRED")]
    Expired,
    #[error("TOKEN_REVOKED")]
    Revoked,
    #[error("INSUFFICIENT_SCOPE: missing {0:?}")]
    InsufficientScope(Vec<String>),
    /// A token bound to a key without a proof made with that key for this request, a proof
    /// with a bearer token, or a proof that does not check.
    #[error("PROOF_INVALID: {0}")]
    ProofInvalid(String),
    /// A proof already taken (its `jti`, with its key).
    #[error("PROOF_REPLAYED: {0}")]
    ProofReplayed(String),
    /// The service cannot be reached, redirects, or answers something unusable.
    #[error("UNAVAILABLE: {0}")]
    Unavailable(String),
    /// The receiver's own configuration is wrong: the service refused the API key given to
    /// [`Verifier::verify_online`](crate::Verifier::verify_online) (401, 403), or the [`Builder`](crate::Builder) was given a bad value.
    #[error("MISCONFIGURED: {0}")]
    Misconfigured(String),
}

impl Error {
    /// The service's code: `TOKEN_INVALID`, `TOKEN_EXPIRED`, `TOKEN_REVOKED`,
    /// `INSUFFICIENT_SCOPE` or `UNAVAILABLE`; `MISCONFIGURED` for the receiver's own fault.
    pub fn code(&self) -> &'static str {
        match self {
            Error::Invalid(_) => "TOKEN_INVALID",
            Error::Expired => "TOKEN_EXPIRED",
            Error::Revoked => "TOKEN_REVOKED",
            Error::InsufficientScope(_) => "INSUFFICIENT_SCOPE",
            Error::ProofInvalid(_) => "PROOF_INVALID",
            Error::ProofReplayed(_) => "PROOF_REPLAYED",
            Error::Unavailable(_) => "UNAVAILABLE",
            Error::Misconfigured(_) => "MISCONFIGURED",
        }
    }
}

pub(crate) fn bound_as_bearer() -> Error {
    Error::ProofInvalid("the token is bound to a key: it passes only with a DPoP proof (verify_dpop)".into())
}

pub(crate) fn invalid(why: impl Into<String>) -> Error {
    Error::Invalid(why.into())
}

pub(crate) fn unavailable(why: impl Into<String>) -> Error {
    Error::Unavailable(why.into())
}

/// `jws` (a `what`), refused unparsed when longer than any the service issues (`limit` bytes).
pub(crate) fn sized<'a>(jws: &'a str, limit: usize, what: &str) -> Result<&'a str, Error> {
    if jws.len() > limit {
        return Err(invalid(format!("not a {what} of at most {limit} bytes")));
    }
    Ok(jws)
}

/// `text` with every character a token's or a proof's fields could plant in a log or a
/// terminal written as `\u{…}`: controls (C0, DEL, C1), line and paragraph separators and
/// bidirectional overrides.
pub fn printable(text: &str) -> String {
    let unsafe_char = |c: char| {
        c.is_control()
            || matches!(c, '\u{2028}' | '\u{2029}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    };
    if !text.chars().any(unsafe_char) {
        return text.to_owned();
    }
    text.chars()
        .map(|c| {
            if unsafe_char(c) {
                format!("\\u{{{:04x}}}", c as u32)
            } else {
                c.to_string()
            }
        })
        .collect()
}

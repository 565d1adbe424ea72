//! The fields of an agent, each parsed once from untrusted input.

use super::{fields, Millis, ValidationError};

/// Human-readable agent name: 1–128 characters, no control characters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Name(String);

impl Name {
    pub fn parse(s: &str) -> Result<Self, ValidationError> {
        let count = s.chars().count();
        if s.trim().is_empty() {
            return Err(ValidationError::new("name", "must not be empty"));
        }
        if count > fields::NAME.max() {
            return Err(ValidationError::new("name", fields::NAME.too_long()));
        }
        if s.chars().any(char::is_control) {
            return Err(ValidationError::new(
                "name",
                "must not contain control characters",
            ));
        }
        Ok(Name(s.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A DNS host name (letters, digits, hyphens; labels of 1–63; at most 253 in all), stored lower-case.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(transparent)]
pub struct IssuerDomain(String);

impl IssuerDomain {
    pub fn parse(s: &str) -> Result<Self, ValidationError> {
        let err = |m: &str| Err(ValidationError::new("issuer_domain", m));
        if s.is_empty() {
            return err("must not be empty");
        }
        if s.len() > fields::ISSUER_DOMAIN.max() {
            return err(&fields::ISSUER_DOMAIN.too_long());
        }
        let lower = s.to_ascii_lowercase();
        for label in lower.split('.') {
            let valid = !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
            if !valid {
                return err("must be a DNS host name such as example.com");
            }
        }
        Ok(IssuerDomain(lower))
    }

    /// A name as stored: exactly the form `parse` returns, or none.
    pub fn read(s: &str) -> Option<Self> {
        Self::parse(s).ok().filter(|d| d.0 == s)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for IssuerDomain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<IssuerDomain> for String {
    fn from(d: IssuerDomain) -> String {
        d.0
    }
}

impl AsRef<str> for IssuerDomain {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

/// 1–64 distinct scope strings, each `action:resource`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(transparent)]
pub struct Scopes(Vec<String>);

impl Scopes {
    pub(crate) const MAX: usize = 64;

    pub fn parse<S: AsRef<str>>(items: &[S]) -> Result<Self, ValidationError> {
        if items.is_empty() {
            return Err(ValidationError::new("scopes", "must hold at least one scope"));
        }
        if items.len() > Self::MAX {
            return Err(ValidationError::new("scopes", "must hold at most 64 scopes"));
        }
        let mut out: Vec<String> = Vec::with_capacity(items.len());
        for item in items {
            let s = item.as_ref();
            if !is_scope(s) {
                return Err(ValidationError::new(
                    "scopes",
                    format!("{s:?} is not of the form action:resource (lower-case, at most 128 characters)"),
                ));
            }
            if out.iter().any(|x| x == s) {
                return Err(ValidationError::new("scopes", format!("{s:?} is listed twice")));
            }
            out.push(s.to_owned());
        }
        Ok(Scopes(out))
    }

    pub fn into_vec(self) -> Vec<String> {
        self.0
    }

    pub fn as_slice(&self) -> &[String] {
        &self.0
    }
}

impl std::ops::Deref for Scopes {
    type Target = [String];

    fn deref(&self) -> &[String] {
        &self.0
    }
}

/// `[a-z0-9_.-]+:[a-z0-9_.*/-]+`, at most 128 characters.
fn is_scope(s: &str) -> bool {
    let Some((action, resource)) = s.split_once(':') else {
        return false;
    };
    let action_ok = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit() || b"_.-".contains(&b);
    let resource_ok = |b: u8| action_ok(b) || b"*/".contains(&b);
    s.len() <= fields::SCOPE.max()
        && !action.is_empty()
        && !resource.is_empty()
        && action.bytes().all(action_ok)
        && resource.bytes().all(resource_ok)
}

/// Optional context, at most 1024 characters.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Description(String);

impl Description {
    pub fn parse(s: &str) -> Result<Self, ValidationError> {
        if s.chars().count() > fields::DESCRIPTION.max() {
            return Err(ValidationError::new(
                "description",
                fields::DESCRIPTION.too_long(),
            ));
        }
        if s.chars().any(|c| c.is_control() && c != '\n' && c != '\t') {
            return Err(ValidationError::new(
                "description",
                "must not contain control characters other than newline and tab",
            ));
        }
        Ok(Description(s.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Token lifetime in seconds: a positive integer (the plan caps it separately).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExpirySeconds(u64);

impl ExpirySeconds {
    pub const DEFAULT: ExpirySeconds = ExpirySeconds(86_400);

    pub fn parse(v: u64) -> Result<Self, ValidationError> {
        if v == 0 {
            return Err(ValidationError::new(
                "expiry_seconds",
                "must be a positive integer",
            ));
        }
        Ok(ExpirySeconds(v))
    }

    /// From a JSON number: a whole one, however written (`86400`, `86400.0`, `8.64e4`, as JSON
    /// Schema's `integer` reads them); one past `u64` stands at `u64::MAX`, for the plan to
    /// refuse as too long.
    pub fn from_number(n: &serde_json::Number) -> Result<Self, ValidationError> {
        if let Some(v) = n.as_u64() {
            return Self::parse(v);
        }
        match n.as_f64() {
            Some(f) if f.is_finite() && f >= 1.0 && f.fract() == 0.0 => {
                // `as` saturates: 1e23 is u64::MAX.
                Self::parse(f as u64)
            }
            _ => Err(ValidationError::new(
                "expiry_seconds",
                "must be a positive integer",
            )),
        }
    }

    pub fn get(self) -> u64 {
        self.0
    }
}

/// A registration, fully parsed.
#[derive(Debug, Clone)]
pub struct AgentFields {
    pub name: Name,
    pub issuer_domain: IssuerDomain,
    pub scopes: Scopes,
    pub description: Description,
    /// `None`: the default, or the organization's longest lifetime when that is shorter.
    pub expiry: Option<ExpirySeconds>,
}

/// Lifecycle status as the API reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AgentStatus {
    Active,
    Expired,
    Revoked,
}

impl AgentStatus {
    pub fn of(revoked: bool, expires_at: Millis, now: Millis) -> Self {
        if revoked {
            AgentStatus::Revoked
        } else if expires_at <= now {
            AgentStatus::Expired
        } else {
            AgentStatus::Active
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            AgentStatus::Active => "active",
            AgentStatus::Expired => "expired",
            AgentStatus::Revoked => "revoked",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert!(Name::parse("Billing bot").is_ok());
        assert!(Name::parse("").is_err());
        assert!(Name::parse("   ").is_err());
        assert!(Name::parse("a\u{7}b").is_err());
        assert!(Name::parse(&"x".repeat(128)).is_ok());
        assert!(Name::parse(&"x".repeat(129)).is_err());
        assert!(Name::parse(&"é".repeat(128)).is_ok());
    }

    #[test]
    fn issuer_domains() {
        assert_eq!(
            IssuerDomain::parse("Acme.Example.COM").unwrap().as_str(),
            "acme.example.com"
        );
        assert!(IssuerDomain::parse("localhost").is_ok());
        for bad in [
            "",
            "a..b",
            "-a.com",
            "a-.com",
            "a_b.com",
            "a.com.",
            "ex ample.com",
            "ümlaut.de",
        ] {
            assert!(IssuerDomain::parse(bad).is_err(), "{bad}");
        }
        assert!(IssuerDomain::parse(&format!("{}.com", "a".repeat(64))).is_err());
    }

    #[test]
    fn scopes() {
        assert!(Scopes::parse(&["read:orders", "write:docs/*", "a.b-c_d:x.y"]).is_ok());
        assert!(Scopes::parse::<&str>(&[]).is_err());
        for bad in ["read", ":x", "x:", "Read:orders", "read:ord ers", "a:b:c"] {
            assert!(Scopes::parse(&[bad]).is_err(), "{bad}");
        }
        assert!(Scopes::parse(&["read:x", "read:x"]).is_err());
        let many: Vec<String> = (0..65).map(|i| format!("read:r{i}")).collect();
        assert!(Scopes::parse(&many).is_err());
        assert!(Scopes::parse(&many[..64]).is_ok());
        assert!(Scopes::parse(&[format!("a:{}", "b".repeat(127))]).is_err());
    }

    #[test]
    fn expiry() {
        assert!(ExpirySeconds::parse(0).is_err());
        assert_eq!(ExpirySeconds::parse(60).unwrap().get(), 60);
    }
}

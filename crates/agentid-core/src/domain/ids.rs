//! Public identifiers: a type prefix and a lower-case ULID (`agt_01jd…`).

use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdPrefix {
    Agent,
    Org,
    Log,
    Request,
    StatusList,
    Stream,
    Event,
}

impl IdPrefix {
    pub fn as_str(self) -> &'static str {
        match self {
            IdPrefix::Agent => "agt_",
            IdPrefix::Org => "org_",
            IdPrefix::Log => "log_",
            IdPrefix::Request => "req_",
            IdPrefix::StatusList => "sl_",
            IdPrefix::Stream => "ssf_",
            IdPrefix::Event => "evt_",
        }
    }
}

/// A fresh identifier: prefix + ULID in lower case (time-ordered, 80 random bits).
pub fn new_id(prefix: IdPrefix) -> String {
    // Encoded on the stack and lower-cased in place: one allocation per id (every request
    // and every audit record takes one).
    let mut buf = [0u8; ulid::ULID_LEN];
    let ulid = ulid::Ulid::new().array_to_str(&mut buf);
    ulid.make_ascii_lowercase();
    let mut s = String::with_capacity(prefix.as_str().len() + ulid::ULID_LEN);
    s.push_str(prefix.as_str());
    s.push_str(ulid);
    s
}

/// `agt_` followed by 26 characters of Crockford base32 in lower case.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AgentId(String);

impl AgentId {
    pub fn generate() -> Self {
        AgentId(new_id(IdPrefix::Agent))
    }

    /// Accepts only the exact form the service issues.
    pub fn parse(s: &str) -> Option<Self> {
        let rest = s.strip_prefix(IdPrefix::Agent.as_str())?;
        let ok = rest.len() == 26 && rest.bytes().all(|b| b.is_ascii_digit() || b.is_ascii_lowercase());
        ok.then(|| AgentId(s.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for AgentId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_ids_parse_and_foreign_forms_do_not() {
        let id = AgentId::generate();
        assert_eq!(AgentId::parse(id.as_str()), Some(id.clone()));
        assert!(AgentId::parse("agt_").is_none());
        assert!(AgentId::parse(&id.as_str().to_uppercase()).is_none());
        assert!(AgentId::parse(&format!("{}x", id.as_str())).is_none());
        assert!(AgentId::parse("org_01jd0000000000000000000000").is_none());
    }

    #[test]
    fn new_ids_are_prefixed_lower_case_ulids() {
        let id = new_id(IdPrefix::Log);
        assert_eq!(id.len(), 30);
        let ulid = ulid::Ulid::from_string(&id[4..].to_ascii_uppercase()).unwrap();
        assert_eq!(id, format!("log_{}", ulid.to_string().to_ascii_lowercase()));
        assert_ne!(new_id(IdPrefix::Log), id);
    }
}

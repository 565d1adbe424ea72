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
    ApiKey,
    IdentityProvider,
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
            IdPrefix::ApiKey => "key_",
            IdPrefix::IdentityProvider => "idp_",
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

macro_rules! prefixed_id {
    ($(#[$m:meta])* $name:ident, $prefix:ident) => {
        $(#[$m])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(String);

        impl $name {
            pub fn generate() -> Self {
                $name(new_id(IdPrefix::$prefix))
            }

            /// Accepts only the exact form the service issues: the prefix and 26 characters
            /// of Crockford base32 in lower case.
            pub fn parse(s: &str) -> Option<Self> {
                is_id(IdPrefix::$prefix, s).then(|| $name(s.to_owned()))
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl From<$name> for String {
            fn from(id: $name) -> String {
                id.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        /// Hashes and compares as its text, so that maps keyed by it are looked up by `&str`.
        impl std::borrow::Borrow<str> for $name {
            fn borrow(&self) -> &str {
                &self.0
            }
        }

        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                self.0 == other
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(&self.0)
            }
        }
    };
}

fn is_id(prefix: IdPrefix, s: &str) -> bool {
    s.strip_prefix(prefix.as_str()).is_some_and(|rest| {
        rest.len() == ulid::ULID_LEN && rest.bytes().all(|b| b.is_ascii_digit() || b.is_ascii_lowercase())
    })
}

prefixed_id!(
    /// An agent: `agt_…`.
    AgentId,
    Agent
);
prefixed_id!(
    /// An organization: `org_…`.
    OrgId,
    Org
);
prefixed_id!(
    /// A Shared Signals stream: `ssf_…`.
    StreamId,
    Stream
);
prefixed_id!(
    /// A Token Status List: `sl_…`.
    ListId,
    StatusList
);
prefixed_id!(
    /// An identity provider an organization trusts: `idp_…`.
    IdpId,
    IdentityProvider
);

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
        assert!(OrgId::parse("org_01jd0000000000000000000000").is_some());
        assert!(ListId::parse(ListId::generate().as_str()).is_some());
        assert!(StreamId::parse("ssf_01jd000000000000000000000").is_none());
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

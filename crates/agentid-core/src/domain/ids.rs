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

            /// Accepts only the form the service issues (see `is_id`).
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

/// The prefix and 26 lower-case letters and digits; an agent's, a ULID as the service writes
/// it (lower-case Crockford base32, the first letter at most 7: 26 letters of 5 bits hold
/// 130, a ULID 128), for the revocation index holds agents by its bits (`agent_bits`).
fn is_id(prefix: IdPrefix, s: &str) -> bool {
    s.strip_prefix(prefix.as_str()).is_some_and(|rest| match prefix {
        IdPrefix::Agent => ulid_bits(rest.as_bytes()).is_some(),
        _ => ulid_shaped(rest),
    })
}

/// 26 lower-case letters and digits.
fn ulid_shaped(rest: &str) -> bool {
    rest.len() == ulid::ULID_LEN && rest.bytes().all(|b| b.is_ascii_digit() || b.is_ascii_lowercase())
}

/// The value of 26 letters of a ULID, `None` when they are not one.
fn ulid_bits(letters: &[u8]) -> Option<u128> {
    if letters.len() != ulid::ULID_LEN || BASE32_VALUES[usize::from(*letters.first()?)] > 7 {
        return None;
    }
    letters.iter().try_fold(0u128, |bits, &b| {
        let value = BASE32_VALUES[usize::from(b)];
        (value < 32).then_some((bits << 5) | u128::from(value))
    })
}

/// The letters of lower-case Crockford base32 (no i, l, o, u), in the order of their values.
const BASE32: &[u8; 32] = b"0123456789abcdefghjkmnpqrstvwxyz";

/// Each byte's value in [`BASE32`], or 32 for a byte not in it.
const BASE32_VALUES: [u8; 256] = {
    let mut values = [32u8; 256];
    let mut i = 0;
    while i < 32 {
        values[BASE32[i] as usize] = i as u8;
        i += 1;
    }
    values
};

/// The 128 bits of an agent id's ULID, for an index that holds many agents in 16 bytes each:
/// `None` for a string that is no agent id ([`AgentId::parse`] refuses it). Each agent id
/// has its own bits.
pub fn agent_bits(s: &str) -> Option<u128> {
    ulid_bits(s.strip_prefix(IdPrefix::Agent.as_str())?.as_bytes())
}

prefixed_id!(
    /// An agent: `agt_…`.
    AgentId,
    Agent
);
impl AgentId {
    /// An agent id as a record of the log may name it: besides [`AgentId::parse`]'s form, the
    /// shape agent ids were read in before they were read as ULIDs (26 lower-case letters and
    /// digits), which a forged token's name recorded then may have. Only for reading such
    /// records back: no agent has such an id, and the revocation index knows none.
    pub fn parse_recorded(s: &str) -> Option<Self> {
        let rest = s.strip_prefix(IdPrefix::Agent.as_str())?;
        ulid_shaped(rest).then(|| AgentId(s.to_owned()))
    }
}

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
    fn an_agent_ids_bits_are_its_ulids_and_only_issued_forms_have_any() {
        for _ in 0..100 {
            let id = AgentId::generate();
            let ulid = ulid::Ulid::from_string(&id.as_str()[4..].to_ascii_uppercase()).unwrap();
            assert_eq!(agent_bits(id.as_str()), Some(ulid.0));
        }
        let max = format!("agt_7{}", "z".repeat(25));
        assert_eq!(agent_bits(&max), Some(u128::MAX));
        assert_eq!(agent_bits("agt_00000000000000000000000000"), Some(0));
        for foreign in [
            format!("agt_8{}", "0".repeat(25)),
            format!("agt_0{}", "0".repeat(24)),
            format!("agt_0{}", "0".repeat(26)),
            format!("agt_0{}i", "0".repeat(24)),
            format!("agt_0{}l", "0".repeat(24)),
            format!("agt_0{}o", "0".repeat(24)),
            format!("agt_0{}u", "0".repeat(24)),
            format!("agt_0{}A", "0".repeat(24)),
            format!("org_{}", "0".repeat(26)),
            "agt_".to_owned(),
            String::new(),
        ] {
            assert_eq!(agent_bits(&foreign), None, "{foreign}");
            assert_eq!(AgentId::parse(&foreign), None, "{foreign}");
        }
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

//! The rules of the fields a caller sends, each written once. The parsers of this module's
//! siblings (`Name`, `IssuerDomain`, `Scopes`, `Description`, `RevokeReason`, the ids) check
//! them; the API's schema states them from here (`agentid-http`'s `openapi`), so that what
//! the document promises and what the service accepts cannot drift apart. A test below holds
//! each parser to its pattern.

/// What one text field must be: a pattern the whole value matches (ECMA-262, the dialect of
/// JSON Schema, written so that the `regex` crate reads it the same) and bounds on its length
/// in characters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FieldRule {
    pub pattern: &'static str,
    pub min_length: Option<usize>,
    pub max_length: Option<usize>,
}

impl FieldRule {
    /// The longest value in characters (unbounded: `usize::MAX`).
    pub const fn max(&self) -> usize {
        match self.max_length {
            Some(n) => n,
            None => usize::MAX,
        }
    }

    /// "must be at most N characters".
    pub(crate) fn too_long(&self) -> String {
        format!("must be at most {} characters", self.max())
    }
}

/// An agent's name: not only white space, no control characters.
pub const NAME: FieldRule = FieldRule {
    pattern: r"^[^\u0000-\u001f\u007f-\u009f]*[^\s\u0000-\u001f\u007f-\u009f][^\u0000-\u001f\u007f-\u009f]*$",
    min_length: Some(1),
    max_length: Some(128),
};

/// A DNS host name: labels of letters, digits and inner hyphens (any case: it is stored
/// lower-case).
pub const ISSUER_DOMAIN: FieldRule = FieldRule {
    pattern: r"^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$",
    min_length: None,
    max_length: Some(253),
};

/// One scope: `action:resource`, lower-case.
pub const SCOPE: FieldRule = FieldRule {
    pattern: r"^[a-z0-9_.-]+:[a-z0-9_.*/-]+$",
    min_length: None,
    max_length: Some(128),
};

/// An agent's description: no control characters but newline and tab.
pub const DESCRIPTION: FieldRule = FieldRule {
    pattern: r"^[^\u0000-\u0008\u000b-\u001f\u007f-\u009f]*$",
    min_length: None,
    max_length: Some(1024),
};

/// Why an agent was revoked: no control characters.
pub const REVOKE_REASON: FieldRule = FieldRule {
    pattern: r"^[^\u0000-\u001f\u007f-\u009f]*$",
    min_length: None,
    max_length: Some(512),
};

/// An HTTP method as a request line carries it: token characters (RFC 9110 §9.1), at most 32.
pub const HTTP_METHOD: FieldRule = FieldRule {
    pattern: "^[!#$%&'*+.^_`|~0-9A-Za-z-]+$",
    min_length: Some(1),
    max_length: Some(32),
};

/// An agent's id, as the service issues it.
pub const AGENT_ID: FieldRule = FieldRule {
    pattern: "^agt_[0-7][0-9a-hjkmnp-tv-z]{25}$",
    min_length: None,
    max_length: None,
};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{is_http_method, AgentId, Description, IssuerDomain, Name, RevokeReason, Scopes};
    use proptest::prelude::*;

    /// Whether `s` keeps `rule`, as a JSON Schema validator would judge it.
    fn keeps(rule: &FieldRule, s: &str) -> bool {
        let n = s.chars().count();
        regex::Regex::new(rule.pattern).unwrap().is_match(s)
            && rule.min_length.is_none_or(|m| n >= m)
            && rule.max_length.is_none_or(|m| n <= m)
    }

    /// Characters on both sides of every rule: letters of both cases, digits, the punctuation
    /// the rules name, white space, controls (C0, DEL, C1) and a few beyond ASCII.
    fn text(max: usize) -> impl Strategy<Value = String> {
        let chars: Vec<char> = "aZz09-_.:*/ \t\nx\u{0}\u{1f}\u{7f}\u{85}\u{9f}\u{a0}éß\u{2003}?@"
            .chars()
            .collect();
        proptest::collection::vec(proptest::sample::select(chars), 0..max).prop_map(String::from_iter)
    }

    proptest! {
        #[test]
        fn each_parser_accepts_exactly_what_its_pattern_says(s in text(12)) {
            prop_assert_eq!(Name::parse(&s).is_ok(), keeps(&NAME, &s), "name {:?}", s);
            prop_assert_eq!(IssuerDomain::parse(&s).is_ok(), keeps(&ISSUER_DOMAIN, &s), "domain {:?}", s);
            prop_assert_eq!(Scopes::parse(&[&s]).is_ok(), keeps(&SCOPE, &s), "scope {:?}", s);
            prop_assert_eq!(Description::parse(&s).is_ok(), keeps(&DESCRIPTION, &s), "description {:?}", s);
            prop_assert_eq!(RevokeReason::parse(&s).is_ok(), keeps(&REVOKE_REASON, &s), "reason {:?}", s);
            prop_assert_eq!(is_http_method(&s), keeps(&HTTP_METHOD, &s), "method {:?}", s);
        }

        #[test]
        fn an_agent_id_is_what_its_pattern_says(id in agent_ids()) {
            prop_assert_eq!(AgentId::parse(&id).is_some(), keeps(&AGENT_ID, &id), "id {:?}", id);
        }
    }

    /// Agent ids as the service writes them, and such ids with a letter changed (to one of
    /// the Crockford letters, past 7 first, or to none of them), one letter more or less.
    fn agent_ids() -> impl Strategy<Value = String> {
        let crockford: Vec<char> = "0123456789abcdefghjkmnpqrstvwxyz".chars().collect();
        let other: Vec<char> = "0789azilouAZ-é".chars().collect();
        (
            proptest::sample::select(crockford[..8].to_vec()),
            proptest::collection::vec(proptest::sample::select(crockford), 25),
            0..30usize,
            proptest::sample::select(other),
        )
            .prop_map(|(first, rest, at, c)| {
                let mut id: Vec<char> = std::iter::once(first).chain(rest).collect();
                match at {
                    26 => id.push(c),
                    27 => {
                        id.pop();
                    }
                    28 | 29 => {}
                    _ => id[at] = c,
                }
                format!("agt_{}", String::from_iter(id))
            })
    }

    #[test]
    fn the_length_bounds_are_the_parsers() {
        for (rule, ok) in [
            (
                &NAME,
                Name::parse(&"é".repeat(128)).is_ok() && Name::parse(&"é".repeat(129)).is_err(),
            ),
            (
                &DESCRIPTION,
                Description::parse(&"é".repeat(1024)).is_ok()
                    && Description::parse(&"é".repeat(1025)).is_err(),
            ),
            (
                &REVOKE_REASON,
                RevokeReason::parse(&"é".repeat(512)).is_ok()
                    && RevokeReason::parse(&"é".repeat(513)).is_err(),
            ),
        ] {
            assert!(ok, "{rule:?}");
        }
        let long_domain = format!("{}com", "a.".repeat(125));
        assert_eq!(long_domain.len(), 253);
        assert!(keeps(&ISSUER_DOMAIN, &long_domain) && IssuerDomain::parse(&long_domain).is_ok());
        let too_long = format!("b{long_domain}");
        assert!(!keeps(&ISSUER_DOMAIN, &too_long) && IssuerDomain::parse(&too_long).is_err());
        let scope = format!("read:{}", "x".repeat(123));
        assert!(keeps(&SCOPE, &scope) && Scopes::parse(&[&scope]).is_ok());
        let scope = format!("{scope}x");
        assert!(!keeps(&SCOPE, &scope) && Scopes::parse(&[&scope]).is_err());
        let id = AgentId::generate();
        assert!(keeps(&AGENT_ID, id.as_str()));
        let method = "M".repeat(32);
        assert!(keeps(&HTTP_METHOD, &method) && is_http_method(&method));
        let method = format!("{method}M");
        assert!(!keeps(&HTTP_METHOD, &method) && !is_http_method(&method));
    }
}

//! What a receiver accepts beyond a valid token: the audiences it answers to, the issuer
//! domains it trusts and the scopes a request needs. A gateway names it in its forward-auth
//! URL; the engine checks it before the verification is recorded, so the record says why a
//! token was refused there.

use super::Claims;

/// A receiver's policy; an empty list accepts any.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Policy {
    /// The token's `aud` names one of these (an agent token names none, so it never passes).
    pub audiences: Vec<String>,
    /// The token's issuer domain is one of these.
    pub issuers: Vec<String>,
    /// The token grants every one of these.
    pub scopes: Vec<String>,
    /// A test-mode token (`livemode: false`) passes too; refused unless set.
    pub allow_test: bool,
}

/// Why a valid token does not meet a policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PolicyRefusal {
    /// Not for this receiver: a wrong (or no) audience, or an issuer it does not trust.
    NotForReceiver(String),
    /// For this receiver, but without these scopes (RFC 6750 `insufficient_scope`).
    InsufficientScope(Vec<String>),
}

impl PolicyRefusal {
    /// The audit record's failure reason.
    pub fn describe(&self) -> String {
        match self {
            PolicyRefusal::NotForReceiver(why) => why.clone(),
            PolicyRefusal::InsufficientScope(missing) => {
                format!("the token does not grant {}", missing.join(" "))
            }
        }
    }
}

impl Policy {
    /// Whether `claims` (of a token that passed every other check) meet the policy.
    pub fn check(&self, claims: &Claims) -> Result<(), PolicyRefusal> {
        if claims.livemode == Some(false) && !self.allow_test {
            return Err(PolicyRefusal::NotForReceiver(
                "a test-mode token (livemode false): this receiver takes live tokens only".into(),
            ));
        }
        if !self.audiences.is_empty() {
            let named = claims
                .aud
                .as_ref()
                .is_some_and(|aud| self.audiences.iter().any(|a| aud.contains(a)));
            if !named {
                return Err(PolicyRefusal::NotForReceiver(match &claims.aud {
                    Some(aud) => format!("the token is for {}, not this receiver", aud.values().join(" ")),
                    None => "the token names no audience (an agent token): this receiver takes access tokens for it".into(),
                }));
            }
        }
        let issuer = claims.issuer_domain();
        if !self.issuers.is_empty() && !self.issuers.iter().any(|i| i == issuer) {
            return Err(PolicyRefusal::NotForReceiver(format!(
                "issuer {issuer} is not one this receiver trusts"
            )));
        }
        let granted = claims.granted();
        let missing: Vec<String> = self
            .scopes
            .iter()
            .filter(|s| !granted.contains(&s.as_str()))
            .cloned()
            .collect();
        if !missing.is_empty() {
            return Err(PolicyRefusal::InsufficientScope(missing));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::token::Audience;

    fn agent_token(scopes: &[&str]) -> Claims {
        Claims::agent(
            "bank.example",
            "agt_01jd0000000000000000000000",
            "j",
            0,
            1,
            scopes.iter().map(|s| (*s).to_owned()).collect(),
        )
    }

    fn policy(audiences: &[&str], issuers: &[&str], scopes: &[&str]) -> Policy {
        let v = |l: &[&str]| l.iter().map(|s| (*s).to_owned()).collect();
        Policy {
            audiences: v(audiences),
            issuers: v(issuers),
            scopes: v(scopes),
            allow_test: false,
        }
    }

    #[test]
    fn a_test_mode_token_passes_only_a_policy_that_allows_it() {
        let mut token = agent_token(&["read:docs"]);
        token.livemode = Some(false);
        assert!(matches!(
            Policy::default().check(&token),
            Err(PolicyRefusal::NotForReceiver(why)) if why.contains("test-mode")
        ));
        let allowing = Policy {
            allow_test: true,
            ..Policy::default()
        };
        assert!(allowing.check(&token).is_ok());
        token.livemode = None;
        assert!(Policy::default().check(&token).is_ok());
    }

    #[test]
    fn an_empty_policy_takes_any_valid_token() {
        assert!(Policy::default().check(&agent_token(&[])).is_ok());
    }

    #[test]
    fn audiences_issuers_and_scopes_are_each_checked() {
        let agent = agent_token(&["read:docs", "write:docs"]);
        assert!(policy(&[], &["bank.example"], &["read:docs"])
            .check(&agent)
            .is_ok());
        assert!(matches!(
            policy(&[], &["other.example"], &[]).check(&agent),
            Err(PolicyRefusal::NotForReceiver(_))
        ));
        assert_eq!(
            policy(&[], &[], &["read:docs", "pay:x", "admin:y"]).check(&agent),
            Err(PolicyRefusal::InsufficientScope(vec![
                "pay:x".into(),
                "admin:y".into()
            ]))
        );
        // An agent token names no audience: a receiver with one refuses it.
        assert!(matches!(
            policy(&["https://api.example"], &[], &[]).check(&agent),
            Err(PolicyRefusal::NotForReceiver(_))
        ));
        let mut access = agent_token(&[]);
        access.aud = Some(Audience::Many(vec![
            "https://a.example".into(),
            "https://api.example".into(),
        ]));
        access.scope = Some("tools:call".into());
        access.issuer_domain = Some("bank.example".into());
        assert!(
            policy(&["https://api.example"], &["bank.example"], &["tools:call"])
                .check(&access)
                .is_ok()
        );
        assert!(policy(&["https://b.example"], &[], &[]).check(&access).is_err());
        assert!(matches!(
            policy(&["https://api.example"], &[], &["read:docs"]).check(&access),
            Err(PolicyRefusal::InsufficientScope(_))
        ));
    }
}

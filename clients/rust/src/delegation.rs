//! Delegated tokens: the person an agent acts for ([`Subject`]) and the chain of agents
//! ([`Actor`]), read from a token's claims or an online answer; a delegated token's other
//! links as pushed events told of them.

use serde_json::{json, Value};

use crate::error::invalid;
use crate::{Error, Verifier, SEEN_SETS};

/// The longest a delegated token lives: the service's `--access-token-seconds` at most.
const MAX_DELEGATED_LIFETIME: i64 = 3600;

/// The most agents a chain may hold (the service's own bound).
pub const MAX_CHAIN: usize = 16;

/// The person a delegated token acts for, as the identity provider that vouched for them
/// names them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subject {
    /// The person's `sub` at the provider.
    pub sub: String,
    /// The provider's issuer URL.
    pub iss: String,
}

impl Subject {
    /// The person as RFC 9493 has it: `{"format": "iss_sub", "iss": …, "sub": …}`.
    pub fn sub_id(&self) -> Value {
        json!({"format": "iss_sub", "iss": self.iss, "sub": self.sub})
    }
}

/// One agent of a delegated token's chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Actor {
    pub agent_id: String,
    /// The name its organization proved.
    pub issuer: String,
}

/// The person and the chain of agents of `doc` (a token's claims or an online answer): both
/// absent for a token that acts for nobody, both present for a delegated one.
pub(crate) fn delegation(doc: &Value) -> Result<(Option<Subject>, Vec<Actor>), Error> {
    let (mut act, id) = (doc.get("act"), doc.get("sub_id"));
    if act.is_none() && id.is_none() {
        return Ok((None, Vec::new()));
    }
    let subject = match id {
        Some(id) if id["format"] == "iss_sub" && id["sub"] == doc["sub"] => {
            match (id["iss"].as_str(), id["sub"].as_str()) {
                (Some(iss), Some(sub)) => Subject {
                    sub: sub.to_owned(),
                    iss: iss.to_owned(),
                },
                _ => return Err(invalid("a delegated token needs sub_id (iss_sub) naming its sub")),
            }
        }
        _ => return Err(invalid("a delegated token needs sub_id (iss_sub) naming its sub")),
    };
    let mut actors = Vec::new();
    while let Some(a) = act {
        let (Some(sub), Some(domain)) = (a["sub"].as_str(), a["issuer_domain"].as_str()) else {
            return Err(invalid("malformed act"));
        };
        if actors.len() >= MAX_CHAIN {
            return Err(invalid("malformed act"));
        }
        actors.push(Actor {
            agent_id: sub.to_owned(),
            issuer: domain.to_owned(),
        });
        act = a.get("act");
    }
    if actors.is_empty() {
        return Err(invalid("a delegated token needs act"));
    }
    Ok((Some(subject), actors))
}

impl Verifier {
    /// A delegated token's other links, as pushed events told of them: any agent of the chain
    /// revoked, or its person revoked since the token was issued (`iat`).
    pub(crate) fn admit_chain(
        &self,
        subject: Option<&Subject>,
        actors: &[Actor],
        iat: i64,
    ) -> Result<(), Error> {
        let Some(subject) = subject else {
            return Ok(());
        };
        let s = self.inner.state.lock();
        if actors.iter().any(|a| s.revoked.contains(&a.agent_id)) {
            return Err(Error::Revoked);
        }
        match s
            .revoked_subjects
            .get(&(subject.iss.clone(), subject.sub.clone()))
        {
            Some(at) if iat <= *at => Err(Error::Revoked),
            _ if iat <= s.subjects_floor => Err(Error::Revoked),
            _ => Ok(()),
        }
    }

    /// Notes that the person `(iss, sub)` was revoked at `at` (Unix s). Past [`SEEN_SETS`]
    /// people, the revocations older than any delegated token go first (a token lives an hour
    /// at most); then the earliest, and every person's token from then or before is refused:
    /// any organization whose stream reaches the receiver can send revocations, and a flood of
    /// them must not bring another's revoked person back.
    pub(crate) fn person_revoked(&self, iss: &str, sub: &str, at: i64) {
        let mut s = self.inner.state.lock();
        let held = s
            .revoked_subjects
            .entry((iss.to_owned(), sub.to_owned()))
            .or_insert(at);
        *held = (*held).max(at);
        if s.revoked_subjects.len() > SEEN_SETS {
            let moot = crate::now_secs()
                .saturating_sub(MAX_DELEGATED_LIFETIME)
                .saturating_sub(self.inner.leeway);
            s.revoked_subjects.retain(|_, at| *at > moot);
        }
        if s.revoked_subjects.len() > SEEN_SETS {
            if let Some((oldest, at)) = s
                .revoked_subjects
                .iter()
                .min_by_key(|(_, at)| **at)
                .map(|(k, at)| (k.clone(), *at))
            {
                s.revoked_subjects.remove(&oldest);
                s.subjects_floor = s.subjects_floor.max(at);
            }
        }
    }
}

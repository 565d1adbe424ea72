//! Shared Signals streams: which of them a revocation reaches.

/// A stream as the revocation rule sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamFacts<'a> {
    /// `enabled`, `paused` or `disabled`.
    pub status: &'a str,
    /// It asked for revocations (`session-revoked`).
    pub revocations: bool,
    /// It was given subjects: it carries their events alone, also once all were removed.
    pub narrowed: bool,
    /// The revoked agent is one of its subjects.
    pub names_agent: bool,
}

/// Whether a stream of the revoked agent's organization and mode gets the revocation's event:
/// it carries revocations, it is enabled or paused (a disabled stream drops its events, a
/// paused one keeps them for later), and it was never narrowed to subjects or names the agent
/// among them.
pub fn receives_revocation(s: &StreamFacts) -> bool {
    s.revocations && matches!(s.status, "enabled" | "paused") && (!s.narrowed || s.names_agent)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_revocation_reaches_the_streams_that_carry_it() {
        let base = StreamFacts {
            status: "enabled",
            revocations: true,
            narrowed: false,
            names_agent: false,
        };
        assert!(receives_revocation(&base));
        assert!(receives_revocation(&StreamFacts {
            status: "paused",
            ..base
        }));
        assert!(!receives_revocation(&StreamFacts {
            status: "disabled",
            ..base
        }));
        assert!(!receives_revocation(&StreamFacts {
            revocations: false,
            ..base
        }));
        let others = StreamFacts {
            narrowed: true,
            ..base
        };
        assert!(!receives_revocation(&others));
        assert!(receives_revocation(&StreamFacts {
            names_agent: true,
            ..others
        }));
    }
}

//! DPoP-bound tokens checked online (RFC 9449): the proof that goes with a token, and the
//! memory of proofs already used. A proof is checked only once its token passed; its failure
//! is an answer (`PROOF_INVALID`, `PROOF_REPLAYED`) recorded like any other.

use std::collections::{BTreeSet, HashSet};

use parking_lot::Mutex;
use sha2::{Digest, Sha256};

use agentid_core::token::dpop::{check_proof, Expected};
use agentid_core::token::Claims;

/// How many proofs an instance remembers at most (about 72 MiB when full).
pub const MAX_REMEMBERED_PROOFS: usize = 1_000_000;

/// A proof as the receiver passed it on: the `DPoP` header's value, and the method and URL of
/// the request it came with.
#[derive(Debug, Clone, Copy)]
pub struct Presented<'a> {
    pub proof: &'a str,
    pub htm: &'a str,
    pub htu: &'a str,
}

/// Why a proof did not do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProofError {
    /// Missing for a bound token, present for a bearer one, or not a proof for this request,
    /// token, key and time.
    Invalid,
    /// Its `jti` was already used with this key.
    Replayed,
}

/// A refused proof: which way, and the audit record's `failure_reason`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refused {
    pub(crate) error: ProofError,
    pub(crate) reason: String,
}

fn invalid(why: impl std::fmt::Display) -> Refused {
    Refused {
        error: ProofError::Invalid,
        reason: format!("DPoP proof: {why}"),
    }
}

/// The proof check of `POST /v1/verify`.
pub(crate) struct ProofCheck {
    pub(crate) max_skew_secs: i64,
    pub(crate) seen: Replays,
}

impl ProofCheck {
    pub(crate) fn new(max_skew_secs: i64, capacity: usize) -> Self {
        ProofCheck {
            max_skew_secs,
            seen: Replays::new(capacity),
        }
    }

    /// Checks what was presented with `token` (whose claims passed) at `now_secs`.
    pub(crate) fn check(
        &self,
        token: &str,
        claims: &Claims,
        presented: Option<&Presented<'_>>,
        now_secs: i64,
    ) -> Result<(), Refused> {
        let (bound, presented) = match (&claims.cnf, presented) {
            (None, None) => return Ok(()),
            (None, Some(_)) => return Err(invalid("sent with a token that is not bound to a key")),
            (Some(_), None) => return Err(invalid("missing: the token is bound to a key")),
            (Some(cnf), Some(p)) => (cnf, p),
        };
        let expected = Expected {
            htm: presented.htm,
            htu: presented.htu,
            token: Some(token),
            now: now_secs,
            max_skew: self.max_skew_secs,
        };
        let checked = check_proof(presented.proof, &expected).map_err(invalid)?;
        if checked.jkt != bound.jkt {
            return Err(invalid(
                "signed by a key other than the one the token is bound to",
            ));
        }
        self.seen.admit(
            &checked.jkt,
            &checked.jti,
            checked.iat,
            now_secs - self.max_skew_secs,
        )
    }
}

/// The proofs used lately, by key and `jti`: each is kept while its `iat` could still pass
/// the time check. At most `capacity`; past that the earliest-made are forgotten, and every
/// proof made at or before the last one forgotten is refused (it might be one of them), so
/// that a replay is never let through, however full the memory.
pub(crate) struct Replays {
    capacity: usize,
    inner: Mutex<Seen>,
}

#[derive(Default)]
struct Seen {
    ids: HashSet<[u8; 16]>,
    by_iat: BTreeSet<(i64, [u8; 16])>,
    /// Proofs made at or before this time are refused (`i64::MIN` until one was forgotten).
    floor: i64,
}

impl Replays {
    pub(crate) fn new(capacity: usize) -> Self {
        Replays {
            capacity: capacity.max(1),
            inner: Mutex::new(Seen {
                floor: i64::MIN,
                ..Seen::default()
            }),
        }
    }

    /// Remembers the proof of `jkt` and `jti` made at `iat`, or refuses it as a replay.
    /// Proofs made before `oldest_valid` can no longer pass, and are forgotten.
    pub(crate) fn admit(&self, jkt: &str, jti: &str, iat: i64, oldest_valid: i64) -> Result<(), Refused> {
        let mut h = Sha256::new();
        h.update(jkt.as_bytes());
        h.update([0]);
        h.update(jti.as_bytes());
        let id: [u8; 16] = h.finalize()[..16].try_into().expect("16 bytes");
        let mut seen = self.inner.lock();
        while let Some(&(at, old)) = seen.by_iat.first() {
            if at >= oldest_valid {
                break;
            }
            seen.by_iat.pop_first();
            seen.ids.remove(&old);
        }
        if iat <= seen.floor {
            return Err(Refused {
                error: ProofError::Replayed,
                reason: format!(
                    "DPoP proof made at or before {}, when the memory of used proofs is full: it might be a replay",
                    seen.floor
                ),
            });
        }
        if !seen.ids.insert(id) {
            return Err(Refused {
                error: ProofError::Replayed,
                reason: "DPoP proof replayed: its jti was already used with this key".into(),
            });
        }
        seen.by_iat.insert((iat, id));
        while seen.ids.len() > self.capacity {
            let (at, old) = seen.by_iat.pop_first().expect("as many entries as ids");
            seen.ids.remove(&old);
            seen.floor = seen.floor.max(at);
        }
        Ok(())
    }

    /// How many proofs are remembered.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.inner.lock().ids.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_jti_is_refused_a_second_time_for_its_key_only() {
        let r = Replays::new(10);
        assert!(r.admit("k1", "j", 100, 0).is_ok());
        assert_eq!(
            r.admit("k1", "j", 100, 0).unwrap_err().error,
            ProofError::Replayed
        );
        assert!(r.admit("k2", "j", 100, 0).is_ok());
        // "k1" + "\0j" and "k1\0" + "j" are different pairs.
        assert!(r.admit("k1\0", "j", 100, 0).is_ok());
    }

    #[test]
    fn proofs_too_old_to_pass_are_forgotten() {
        let r = Replays::new(10);
        for i in 0..5 {
            r.admit("k", &i.to_string(), 100 + i, 0).unwrap();
        }
        r.admit("k", "late", 200, 103).unwrap();
        assert_eq!(r.len(), 3);
    }

    #[test]
    fn when_full_the_earliest_are_forgotten_and_nothing_older_passes() {
        let r = Replays::new(3);
        for (jti, iat) in [("a", 10), ("b", 30), ("c", 20), ("d", 40)] {
            r.admit("k", jti, iat, 0).unwrap();
        }
        assert_eq!(r.len(), 3);
        // "a" (made at 10) was forgotten: a replay of it is still refused, by its age.
        assert_eq!(r.admit("k", "a", 10, 0).unwrap_err().error, ProofError::Replayed);
        assert_eq!(
            r.admit("k", "new", 10, 0).unwrap_err().error,
            ProofError::Replayed
        );
        assert_eq!(r.admit("k", "b", 30, 0).unwrap_err().error, ProofError::Replayed);
        assert!(r.admit("k", "e", 11, 0).is_ok());
        assert_eq!(r.len(), 3);
    }
}

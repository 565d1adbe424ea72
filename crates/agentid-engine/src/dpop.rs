//! DPoP-bound tokens checked online (RFC 9449): the proof that goes with a token, and the
//! memory of proofs already used. A proof is checked only once its token passed; its failure
//! is an answer (`PROOF_INVALID`, `PROOF_REPLAYED`) recorded like any other.

use std::collections::{BTreeSet, HashMap, HashSet};

use parking_lot::Mutex;
use sha2::{Digest, Sha256};

use agentid_core::domain::Millis;
use agentid_core::token::dpop::{check_proof, Expected, VerifiedProof};
use agentid_core::token::Claims;

/// How far back (seconds) the wall clock may read before the replay memory takes it for a
/// clock stepped back.
const CLOCK_STEP: i64 = 60;

/// How many proofs an instance remembers at most (about 57 MiB when full, 98 MiB when each
/// proof has a key of its own).
pub const MAX_REMEMBERED_PROOFS: usize = 500_000;

/// A proof as the receiver passed it on: the `DPoP` header's value, and the method and URL of
/// the request it came with.
#[derive(Clone, Copy)]
pub struct Presented<'a> {
    pub proof: &'a str,
    pub htm: &'a str,
    pub htu: &'a str,
}

impl std::fmt::Debug for Presented<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Presented")
            .field("proof", &"…")
            .field("htm", &self.htm)
            .field("htu", &self.htu)
            .finish()
    }
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

    /// Checks what was presented with `token` (whose claims passed) at `now_secs`: the proof
    /// taken, if one was.
    pub(crate) fn check(
        &self,
        token: &str,
        claims: &Claims,
        presented: Option<&Presented<'_>>,
        now_secs: i64,
    ) -> Result<Option<TakenProof>, Refused> {
        let (bound, presented) = match (&claims.cnf, presented) {
            (None, None) => return Ok(None),
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
        self.seen.take(checked, now_secs - self.max_skew_secs).map(Some)
    }
}

/// A proof the memory took: given back when the verification it came with is not answered
/// (503), so that the caller, told to try again, may.
#[derive(Debug)]
pub(crate) struct TakenProof {
    jkt: String,
    jti: String,
    iat: i64,
}

impl TakenProof {
    /// The thumbprint of the proof's key.
    pub(crate) fn jkt(&self) -> &str {
        &self.jkt
    }
}

/// The proofs used lately, by key and `jti`: each is kept while its `iat` could still pass
/// the time check. At most `capacity`; past that, the key holding the most proofs forgets its
/// earliest-made, and every proof of that key made at or before the last one it forgot is
/// refused (it might be one of them). A replay is never let through, however full the memory,
/// and a key that fills it (with proofs dated ahead, say) raises the floor of no other key.
/// Only when every key holds a single proof is the earliest-made forgotten whatever its key,
/// and then every proof made at or before it is refused.
pub(crate) struct Replays {
    capacity: usize,
    inner: Mutex<Seen>,
}

struct Seen {
    /// Every proof held as (`iat`, key, `jti`), earliest made first: the order they expire in.
    by_iat: BTreeSet<(i64, u64, u64)>,
    /// The same as (key, `iat`, `jti`): each key's earliest made first.
    by_key: BTreeSet<(u64, i64, u64)>,
    /// The (key, `jti`) pairs held.
    ids: HashSet<(u64, u64)>,
    /// Each key holding a proof: how many it holds, and its floor (its proofs made at or
    /// before it are refused; `i64::MIN` until it forgot one). The floor is never above the
    /// key's earliest proof, so when that has expired and the key goes, the floor refuses
    /// nothing the time check would pass.
    keys: HashMap<u64, (usize, i64)>,
    /// The keys by how many proofs they hold.
    by_count: BTreeSet<(usize, u64)>,
    /// Proofs made at or before this time are refused, whatever their key (`i64::MIN` until
    /// a proof was forgotten while every key held one).
    floor: i64,
    /// The latest `oldest_valid` a caller gave: what was made before it may have been
    /// forgotten, so a proof made before it is refused (a caller that read the time before
    /// another's call forgot it cannot take it again).
    horizon: i64,
    /// The wall clock at the last call (seconds): one that reads more than a minute before it
    /// stepped back (a caller that read the time late, after waiting on the store, did not).
    clock: i64,
}

/// The first 8 bytes of the SHA-256 of `bytes`: a key's, or within a key a `jti`'s, name in
/// the memory. A caller chooses its own `jti`s, so a collision it finds costs only its key.
fn short_hash(bytes: &[u8]) -> u64 {
    let digest = Sha256::digest(bytes);
    u64::from_be_bytes(digest[..8].try_into().expect("8 bytes"))
}

fn full(floor: i64) -> Refused {
    Refused {
        error: ProofError::Replayed,
        reason: format!(
            "DPoP proof made at or before {floor}, when the memory of used proofs is full: it might be a replay"
        ),
    }
}

impl Seen {
    /// Sets how many proofs `key` holds, from `before` to `after`; a key left with none goes.
    fn recount(&mut self, key: u64, before: usize, after: usize, floor: i64) {
        self.by_count.remove(&(before, key));
        if after == 0 {
            self.keys.remove(&key);
        } else {
            self.by_count.insert((after, key));
            self.keys.insert(key, (after, floor));
        }
    }

    /// Forgets the proof (`iat`, `key`, `jti`), which is held, raising the key's floor to
    /// `floor` at least.
    fn forget(&mut self, iat: i64, key: u64, jti: u64, floor: i64) {
        self.by_iat.remove(&(iat, key, jti));
        self.by_key.remove(&(key, iat, jti));
        self.ids.remove(&(key, jti));
        let (count, held) = self.keys.get(&key).copied().unwrap_or((1, i64::MIN));
        self.recount(key, count, count.saturating_sub(1), held.max(floor));
    }

    /// Forgets one proof: the earliest of the key holding most, or, when every key holds
    /// one, the earliest of all. False when none is held.
    fn forget_one(&mut self) -> bool {
        let Some(&(count, key)) = self.by_count.last() else {
            return false;
        };
        if count > 1 {
            if let Some(&(_, iat, jti)) = self.by_key.range((key, i64::MIN, 0)..).next() {
                self.forget(iat, key, jti, iat);
            }
        } else if let Some(&(iat, key, jti)) = self.by_iat.first() {
            self.floor = self.floor.max(iat);
            self.forget(iat, key, jti, i64::MIN);
        }
        true
    }
}

impl Replays {
    pub(crate) fn new(capacity: usize) -> Self {
        Replays {
            capacity: capacity.max(1),
            inner: Mutex::new(Seen {
                by_iat: BTreeSet::new(),
                by_key: BTreeSet::new(),
                ids: HashSet::new(),
                keys: HashMap::new(),
                by_count: BTreeSet::new(),
                floor: i64::MIN,
                horizon: i64::MIN,
                clock: i64::MIN,
            }),
        }
    }

    /// Remembers the proof of `jkt` and `jti` made at `iat`, or refuses it as a replay.
    /// Proofs made before `oldest_valid` can no longer pass, and are forgotten.
    pub(crate) fn admit(&self, jkt: &str, jti: &str, iat: i64, oldest_valid: i64) -> Result<(), Refused> {
        self.admit_at(jkt, jti, iat, oldest_valid, Millis::now().as_secs())
    }

    /// [`Replays::admit`] with the wall clock reading `clock` (seconds).
    fn admit_at(&self, jkt: &str, jti: &str, iat: i64, oldest_valid: i64, clock: i64) -> Result<(), Refused> {
        let key = short_hash(jkt.as_bytes());
        let jti = short_hash(jti.as_bytes());
        let mut seen = self.inner.lock();
        // A clock stepped back over a minute takes the horizon with it: honest proofs would
        // otherwise be refused until it caught up (what was forgotten meanwhile could pass).
        // A caller that read the time late never does.
        seen.horizon = if clock < seen.clock.saturating_sub(CLOCK_STEP) {
            oldest_valid
        } else {
            seen.horizon.max(oldest_valid)
        };
        seen.clock = clock;
        while let Some(&(at, k, j)) = seen.by_iat.first() {
            if at >= seen.horizon {
                break;
            }
            seen.forget(at, k, j, i64::MIN);
        }
        if iat < seen.horizon {
            return Err(Refused {
                error: ProofError::Replayed,
                reason: format!(
                    "DPoP proof made at {iat}, before {}: proofs that old are no longer remembered, it might be a replay",
                    seen.horizon
                ),
            });
        }
        let (count, floor) = seen.keys.get(&key).copied().unwrap_or((0, i64::MIN));
        if iat <= seen.floor.max(floor) {
            return Err(full(seen.floor.max(floor)));
        }
        if !seen.ids.insert((key, jti)) {
            return Err(Refused {
                error: ProofError::Replayed,
                reason: "DPoP proof replayed: its jti was already used with this key".into(),
            });
        }
        seen.by_iat.insert((iat, key, jti));
        seen.by_key.insert((key, iat, jti));
        seen.recount(key, count, count + 1, floor);
        while seen.by_iat.len() > self.capacity && seen.forget_one() {}
        Ok(())
    }

    /// [`Replays::admit`] of a checked proof: the proof taken, to give back with
    /// [`Replays::release`] when what it came with is not answered.
    pub(crate) fn take(&self, checked: VerifiedProof, oldest_valid: i64) -> Result<TakenProof, Refused> {
        self.admit(&checked.jkt, &checked.jti, checked.iat, oldest_valid)?;
        Ok(TakenProof {
            jkt: checked.jkt,
            jti: checked.jti,
            iat: checked.iat,
        })
    }

    /// Forgets the proof `taken`, if it is still held: as if it had never come.
    pub(crate) fn release(&self, taken: &TakenProof) {
        let (key, jti) = (short_hash(taken.jkt.as_bytes()), short_hash(taken.jti.as_bytes()));
        let mut seen = self.inner.lock();
        // A key's last proof stays when the key has a floor: forgetting it would forget the
        // key and its floor with it, and the proofs under the floor could pass again.
        let floored = matches!(seen.keys.get(&key), Some(&(1, floor)) if floor > i64::MIN);
        if !floored && seen.by_iat.contains(&(taken.iat, key, jti)) {
            seen.forget(taken.iat, key, jti, i64::MIN);
        }
    }

    /// How many proofs are remembered.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.inner.lock().by_iat.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Attack: with the memory full, a key forgot a proof and took a floor; its one proof
    /// left was then given back (its verification not recorded), the key went with its
    /// floor, and the forgotten proof passed again.
    #[test]
    fn giving_a_proof_back_keeps_its_keys_floor() {
        let r = Replays::new(3);
        r.admit("a", "1", 90, 0).unwrap();
        r.admit("b", "1", 91, 0).unwrap();
        r.admit("k", "p1", 100, 0).unwrap();
        r.admit("k", "p3", 101, 0).unwrap(); // k forgets p1: its floor is 100
        let p3 = TakenProof {
            jkt: "k".into(),
            jti: "p3".into(),
            iat: 101,
        };
        r.release(&p3);
        assert_eq!(
            r.admit("k", "p1", 100, 0).unwrap_err().error,
            ProofError::Replayed
        );
    }

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

    #[test]
    fn a_key_that_fills_the_memory_raises_no_other_keys_floor() {
        let r = Replays::new(100);
        // Now is 100; a key holder fills the memory with proofs dated up to a minute ahead.
        for i in 0..200 {
            r.admit("greedy", &format!("g{i}"), 141 + i / 10, 40).unwrap();
        }
        assert_eq!(r.len(), 100);
        // Other keys' proofs made now still pass, one after another in the same second.
        for i in 0..5 {
            r.admit("honest", &format!("h{i}"), 100, 40).unwrap();
            r.admit("other", &format!("o{i}"), 100, 40).unwrap();
        }
        assert_eq!(r.len(), 100);
        // The greedy key's forgotten proofs are still refused, by its own floor.
        assert_eq!(
            r.admit("greedy", "g0", 141, 40).unwrap_err().error,
            ProofError::Replayed
        );
        assert_eq!(
            r.admit("greedy", "fresh", 150, 40).unwrap_err().error,
            ProofError::Replayed
        );
        // And the honest ones' held proofs as replays.
        assert_eq!(
            r.admit("honest", "h4", 100, 40).unwrap_err().error,
            ProofError::Replayed
        );
    }

    #[test]
    fn when_every_key_holds_one_proof_the_earliest_is_forgotten_for_all() {
        let r = Replays::new(3);
        for (key, iat) in [("a", 10), ("b", 30), ("c", 20), ("d", 40)] {
            r.admit(key, "j", iat, 0).unwrap();
        }
        assert_eq!(r.len(), 3);
        assert_eq!(r.admit("a", "j", 10, 0).unwrap_err().error, ProofError::Replayed);
        assert_eq!(r.admit("e", "j", 10, 0).unwrap_err().error, ProofError::Replayed);
        assert!(r.admit("e", "j", 11, 0).is_ok());
        // Expired proofs take their keys with them.
        r.admit("f", "j", 50, 45).unwrap();
        assert_eq!(r.len(), 1);
        let seen = r.inner.lock();
        assert_eq!(
            (seen.keys.len(), seen.by_count.len(), seen.by_key.len()),
            (1, 1, 1)
        );
    }

    /// A caller that read the time before another forgot a proof cannot take it again.
    #[test]
    fn a_proof_older_than_what_was_forgotten_is_refused() {
        let r = Replays::new(10);
        r.admit("k", "p", 100, 40).unwrap();
        // A later call forgets everything made before 101 ...
        r.admit("k", "q", 130, 101).unwrap();
        // ... so a replay of "p", checked against a clock read over a minute earlier (a call
        // that waited on the store), is still refused.
        assert_eq!(
            r.admit("k", "p", 100, 40).unwrap_err().error,
            ProofError::Replayed
        );
        // The wall clock stepped back over a minute: proofs made by it pass.
        let stepped = Millis::now().as_secs() - 200;
        r.admit_at("k", "after", 30, 0, stepped).unwrap();
    }
}

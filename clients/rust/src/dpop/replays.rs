//! The bounded memory of proofs (and nonces) taken, to refuse a replay.

use std::collections::{BTreeSet, HashMap, HashSet};

use ring::digest::{digest, SHA256};

use super::{Checked, SEEN_PROOFS};
use crate::{now_secs, Error};

/// The proofs taken lately, by key and `jti`, each while its `iat` could still pass: at most
/// [`SEEN_PROOFS`]. Past that the key holding the most forgets its earliest made (by `iat`,
/// not the first taken), and every proof of that key made at or before the latest `iat` it
/// forgot is refused, so that no replay passes however full, and a key that fills the memory
/// (with proofs dated ahead, say) raises no other key's floor. Only when every key holds one
/// proof is the earliest made of all forgotten, under a floor for every key.
pub(crate) struct Replays {
    /// Every proof as (`iat`, key, `jti`): the order they expire in.
    by_iat: BTreeSet<(i64, u64, u64)>,
    /// The same as (key, `iat`, `jti`): each key's earliest first.
    by_key: BTreeSet<(u64, i64, u64)>,
    ids: HashSet<(u64, u64)>,
    /// Each key holding a proof: how many, and its own floor.
    keys: HashMap<u64, (usize, Option<i64>)>,
    /// The keys by how many proofs they hold.
    by_count: BTreeSet<(usize, u64)>,
    floor: Option<i64>,
    /// The latest `oldest_valid` given: what was made before it may have been forgotten.
    horizon: i64,
    /// The wall clock at the last call: one that reads over a minute before it stepped back.
    clock: i64,
    capacity: usize,
}

impl Default for Replays {
    fn default() -> Self {
        Replays {
            by_iat: BTreeSet::new(),
            by_key: BTreeSet::new(),
            ids: HashSet::new(),
            keys: HashMap::new(),
            by_count: BTreeSet::new(),
            floor: None,
            horizon: i64::MIN,
            clock: i64::MIN,
            capacity: SEEN_PROOFS,
        }
    }
}

/// A name of 8 bytes for a key, or a `jti` within its key (SHA-256's first).
fn short_hash(s: &str) -> u64 {
    u64::from_be_bytes(
        digest(&SHA256, s.as_bytes()).as_ref()[..8]
            .try_into()
            .expect("8 bytes"),
    )
}

impl Replays {
    pub(crate) fn admit(&mut self, proof: &Checked, oldest_valid: i64) -> Result<(), Error> {
        self.admit_at(proof, oldest_valid, now_secs())
    }

    /// [`Replays::admit`] with the wall clock reading `clock` (seconds).
    fn admit_at(&mut self, proof: &Checked, oldest_valid: i64, clock: i64) -> Result<(), Error> {
        // A clock stepped back over a minute takes the horizon with it: honest proofs would
        // otherwise be refused until it caught up (what was forgotten meanwhile could pass).
        // A caller that read the time late never does.
        self.horizon = if clock < self.clock.saturating_sub(60) {
            oldest_valid
        } else {
            self.horizon.max(oldest_valid)
        };
        self.clock = clock;
        while let Some(&(iat, key, jti)) = self.by_iat.first() {
            if iat >= self.horizon {
                break;
            }
            self.forget(iat, key, jti, None);
        }
        if proof.iat < self.horizon {
            // A caller that read the time before another's call forgot it.
            return Err(Error::ProofReplayed(format!(
                "made before {}: proofs that old are no longer remembered",
                self.horizon
            )));
        }
        let (key, jti) = (short_hash(&proof.jkt), short_hash(&proof.jti));
        let (count, floor) = self.keys.get(&key).copied().unwrap_or((0, None));
        if let Some(floor) = self.floor.max(floor).filter(|f| proof.iat <= *f) {
            return Err(Error::ProofReplayed(format!(
                "made at or before {floor}, when the memory of used proofs is full"
            )));
        }
        if !self.ids.insert((key, jti)) {
            return Err(Error::ProofReplayed(
                "its jti was already used with this key".into(),
            ));
        }
        self.by_iat.insert((proof.iat, key, jti));
        self.by_key.insert((key, proof.iat, jti));
        self.recount(key, count, count + 1, floor);
        while self.by_iat.len() > self.capacity {
            let Some(&(count, key)) = self.by_count.last() else {
                break;
            };
            if count > 1 {
                if let Some(&(_, iat, jti)) = self.by_key.range((key, i64::MIN, 0)..).next() {
                    self.forget(iat, key, jti, Some(iat));
                }
            } else if let Some(&(iat, key, jti)) = self.by_iat.first() {
                self.floor = self.floor.max(Some(iat));
                self.forget(iat, key, jti, None);
            }
        }
        Ok(())
    }

    /// Forgets a proof held, raising its key's floor to `floor` at least; a key left with
    /// none goes (its floor is then below what the time check takes, or the shared one covers
    /// it).
    fn forget(&mut self, iat: i64, key: u64, jti: u64, floor: Option<i64>) {
        self.by_iat.remove(&(iat, key, jti));
        self.by_key.remove(&(key, iat, jti));
        self.ids.remove(&(key, jti));
        let (count, held) = self.keys.get(&key).copied().unwrap_or((1, None));
        self.recount(key, count, count.saturating_sub(1), held.max(floor));
    }

    fn recount(&mut self, key: u64, before: usize, after: usize, floor: Option<i64>) {
        self.by_count.remove(&(before, key));
        if after == 0 {
            self.keys.remove(&key);
        } else {
            self.by_count.insert((after, key));
            self.keys.insert(key, (after, floor));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proof(jti: &str, iat: i64) -> Checked {
        Checked {
            jkt: "k".into(),
            jti: jti.into(),
            iat,
        }
    }

    /// Attack: one proof dated a minute ahead, taken first, then enough others to fill the
    /// memory. The earliest made are forgotten, not the first taken: an honest proof made now
    /// still passes, where the floor would otherwise have risen to the future proof's `iat`.
    #[test]
    fn a_proof_dated_ahead_does_not_lock_out_honest_ones() {
        let now = 1_800_000_000;
        let mut r = Replays {
            capacity: 100,
            ..Replays::default()
        };
        r.admit(&proof("ahead", now + 60), now - 60).unwrap();
        for i in 0..100 {
            r.admit(&proof(&format!("p{i}"), now - 30), now - 60).unwrap();
        }
        assert!(r.admit(&proof("honest", now), now - 60).is_ok());
        // What was forgotten is refused by its age; the proof dated ahead is still known.
        assert!(r.admit(&proof("p0", now - 30), now - 60).is_err());
        assert!(r.admit(&proof("ahead", now + 60), now - 60).is_err());
    }

    /// Attack: a key holder fills the memory with proofs dated up to a minute ahead. Its own
    /// earliest are forgotten, under its own floor: other keys' proofs made now, several in
    /// one second, still pass.
    #[test]
    fn a_key_that_fills_the_memory_raises_no_other_keys_floor() {
        let now = 1_800_000_000;
        let mut r = Replays {
            capacity: 100,
            ..Replays::default()
        };
        let of = |jkt: &str, jti: &str, iat| Checked {
            jkt: jkt.into(),
            jti: jti.into(),
            iat,
        };
        for i in 0..200 {
            r.admit(&of("greedy", &format!("g{i}"), now + 41 + i / 10), now - 60)
                .unwrap();
        }
        for i in 0..5 {
            r.admit(&of("honest", &format!("h{i}"), now), now - 60).unwrap();
            r.admit(&of("other", &format!("o{i}"), now), now - 60).unwrap();
        }
        assert_eq!(r.by_iat.len(), 100);
        assert!(r.admit(&of("greedy", "g0", now + 41), now - 60).is_err());
        assert!(r.admit(&of("honest", "h4", now), now - 60).is_err());
        // When every key holds one, the earliest of all goes, and a floor for all with it.
        let mut r = Replays {
            capacity: 2,
            ..Replays::default()
        };
        for (key, iat) in [("a", now), ("b", now + 2), ("c", now + 1)] {
            r.admit(&of(key, "j", iat), now - 60).unwrap();
        }
        assert!(r.admit(&of("d", "j", now), now - 60).is_err());
        assert!(r.admit(&of("d", "j", now + 1), now - 60).is_ok());
        assert_eq!((r.keys.len(), r.by_count.len(), r.by_key.len()), (2, 2, 2));
    }

    /// A caller that read the time before another forgot a proof cannot take it again.
    #[test]
    fn a_proof_older_than_what_was_forgotten_is_refused() {
        let mut r = Replays::default();
        let of = |jti: &str, iat| Checked {
            jkt: "k".into(),
            jti: jti.into(),
            iat,
        };
        r.admit(&of("p", 100), 40).unwrap();
        r.admit(&of("q", 130), 101).unwrap();
        assert!(r.admit(&of("p", 100), 40).is_err());
        // The wall clock stepped back over a minute: proofs made by it pass.
        assert!(r.admit_at(&of("after", 30), 0, now_secs() - 200).is_ok());
    }
}

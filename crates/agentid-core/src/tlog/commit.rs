//! What a checkpoint commits to besides its ledger's records: the ledger's revocations, the
//! fleet's key retirements, and the fleet's issuer-domain holdings. Each is an append-only
//! list (revocations in the order of the revocation epoch, retirements in the order of their
//! time, holding events in order), committed to as a hash chain: its length and the hash
//! after its last entry. A checkpoint note carries them as extension lines, signed with the
//! rest. `audit verify` recomputes them from the database at every stored or given
//! checkpoint, and the witness checks that each new checkpoint's lists extend the ones it saw
//! before. So putting an earlier row back (an agent unrevoked, a key un-retired, a name
//! handed back) is caught like a log that did not only grow.

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use sha2::{Digest, Sha256};

use super::tree::Hash;
use crate::domain::Millis;

/// The lists a checkpoint commits to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum List {
    /// The ledger's revoked agents: `(agent id, revoked at)`.
    Revocations,
    /// The fleet's retired signing keys: `(kid, retired at)`.
    RetiredKeys,
    /// The fleet's issuer-domain holding events: `(DomainEvent::commitment_id, at)`.
    Domains,
}

impl List {
    pub const ALL: [List; 3] = [List::Revocations, List::RetiredKeys, List::Domains];

    /// The extension line's first word.
    pub(crate) fn name(self) -> &'static str {
        match self {
            List::Revocations => "agentid-revocations",
            List::RetiredKeys => "agentid-retired-keys",
            List::Domains => "agentid-domains",
        }
    }

    /// Its entries' name in `GET /v1/log/commitments` (and its `…_from` parameter).
    pub fn param(self) -> &'static str {
        match self {
            List::Revocations => "revocations",
            List::RetiredKeys => "retired_keys",
            List::Domains => "domains",
        }
    }

    /// What one entry is, in words.
    pub fn entry(self) -> &'static str {
        match self {
            List::Revocations => "revocation",
            List::RetiredKeys => "key retirement",
            List::Domains => "issuer-domain event",
        }
    }
}

/// A list's length and the chain hash after its last entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Commitment {
    pub count: u64,
    pub(crate) hash: Hash,
}

impl Commitment {
    /// The empty list's.
    pub const EMPTY: Commitment = Commitment {
        count: 0,
        hash: [0; 32],
    };

    /// The commitment after one more entry: `SHA-256(name ‖ 0x0A ‖ hash ‖ id ‖ 0x0A ‖ at ‖
    /// 0x0A)`, `at` in decimal milliseconds.
    pub(crate) fn then(&self, list: List, id: &str, at: Millis) -> Commitment {
        // The time as `/v1/log/commitments` shows it, which is what a witness recomputes from:
        // a row's time out of that range (written with database access alone) would otherwise
        // read as a commitment undone, at every witness run from then on.
        let at = at.shown();
        Commitment {
            count: self.count + 1,
            hash: Sha256::new()
                .chain_update(list.name().as_bytes())
                .chain_update(b"\n")
                .chain_update(self.hash)
                .chain_update(id.as_bytes())
                .chain_update(b"\n")
                .chain_update(at.0.to_string().as_bytes())
                .chain_update(b"\n")
                .finalize()
                .into(),
        }
    }

    /// The commitment to `entries`, in order.
    pub fn of<'a>(list: List, entries: impl IntoIterator<Item = (&'a str, Millis)>) -> Commitment {
        entries
            .into_iter()
            .fold(Commitment::EMPTY, |c, (id, at)| c.then(list, id, at))
    }

    /// The commitment after each prefix of `entries`: element `i` is that of the first `i`.
    #[cfg(test)]
    pub(crate) fn prefixes<'a>(
        list: List,
        entries: impl IntoIterator<Item = (&'a str, Millis)>,
    ) -> Vec<Commitment> {
        let mut out = vec![Commitment::EMPTY];
        for (id, at) in entries {
            let next = out[out.len() - 1].then(list, id, at);
            out.push(next);
        }
        out
    }

    /// The extension line: `<list name> <count> <base64 hash>`.
    pub(crate) fn line(&self, list: List) -> String {
        format!("{} {} {}", list.name(), self.count, STANDARD.encode(self.hash))
    }
}

/// What a checkpoint commits to, read from its extension lines; `None` when it has none
/// (checkpoints made before they carried them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Commitments {
    pub revocations: Commitment,
    pub retired_keys: Commitment,
    /// Empty in a checkpoint made before checkpoints committed to it.
    pub domains: Commitment,
}

impl Commitments {
    /// The extension lines of a checkpoint.
    pub fn lines(&self) -> Vec<String> {
        List::ALL.iter().map(|l| self.get(*l).line(*l)).collect()
    }

    /// The commitment to one list.
    pub fn get(&self, list: List) -> Commitment {
        match list {
            List::Revocations => self.revocations,
            List::RetiredKeys => self.retired_keys,
            List::Domains => self.domains,
        }
    }

    /// Reads the commitments of a checkpoint's extension lines: revocations and retirements
    /// both or none; a checkpoint made before it committed to the domains commits to none.
    pub fn parse(extensions: &[String]) -> Result<Option<Commitments>, String> {
        let find = |list: List| -> Result<Option<Commitment>, String> {
            let mut found = None;
            for line in extensions {
                let mut words = line.split(' ');
                if words.next() != Some(list.name()) {
                    continue;
                }
                let bad = || {
                    format!(
                        "the extension line {line:?} is not `{} <count> <hash>`",
                        list.name()
                    )
                };
                let count = words.next().and_then(|c| c.parse().ok()).ok_or_else(bad)?;
                let hash = words
                    .next()
                    .and_then(|h| STANDARD.decode(h).ok())
                    .and_then(|h| Hash::try_from(h).ok())
                    .ok_or_else(bad)?;
                if words.next().is_some() || found.is_some() {
                    return Err(bad());
                }
                found = Some(Commitment { count, hash });
            }
            Ok(found)
        };
        let domains = find(List::Domains)?;
        match (find(List::Revocations)?, find(List::RetiredKeys)?) {
            (Some(revocations), Some(retired_keys)) => Ok(Some(Commitments {
                revocations,
                retired_keys,
                domains: domains.unwrap_or(Commitment::EMPTY),
            })),
            (None, None) if domains.is_none() => Ok(None),
            _ => Err("a checkpoint commits to one list without the other".into()),
        }
    }
}

/// Whether the first `c.count` of `entries` (a whole list, in order) are what `c` commits to.
pub fn holds(list: List, entries: &[(String, Millis)], c: &Commitment) -> bool {
    usize::try_from(c.count).is_ok_and(|n| n <= entries.len())
        && Commitment::of(
            list,
            entries[..c.count as usize]
                .iter()
                .map(|(id, at)| (id.as_str(), *at)),
        ) == *c
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A time out of what RFC 3339 text shows (a row written with database access alone) is
    /// committed to as shown: a witness recomputing from the shown entries agrees.
    #[test]
    fn a_time_is_committed_to_as_it_is_shown() {
        for raw in [-1, i64::MIN, 253_402_300_800_000, i64::MAX] {
            let shown = crate::tlog::witness::rfc3339_millis(&Millis(raw).to_rfc3339()).unwrap();
            assert_eq!(
                Commitment::of(List::Revocations, [("agt_1", Millis(raw))]),
                Commitment::of(List::Revocations, [("agt_1", shown)]),
                "{raw}"
            );
        }
    }

    #[test]
    fn commitments_chain_and_read_back() {
        let entries = [("agt_a", Millis(1)), ("agt_b", Millis(2)), ("agt_c", Millis(3))];
        let all = Commitment::of(List::Revocations, entries);
        let prefixes = Commitment::prefixes(List::Revocations, entries);
        assert_eq!(prefixes.len(), 4);
        assert_eq!(prefixes[3], all);
        assert_eq!(prefixes[0], Commitment::EMPTY);
        let extended = entries[1..]
            .iter()
            .fold(prefixes[1], |c, (id, at)| c.then(List::Revocations, id, *at));
        assert_eq!(extended, all);
        // One entry taken out, another put in its place: the same length, another hash.
        let swapped = [("agt_a", Millis(1)), ("agt_x", Millis(2)), ("agt_c", Millis(3))];
        assert_ne!(extended, Commitment::of(List::Revocations, swapped));
        // The lists do not share hashes.
        assert_ne!(Commitment::of(List::RetiredKeys, entries), all);
        let c = Commitments {
            revocations: all,
            retired_keys: Commitment::EMPTY,
            domains: Commitment::of(List::Domains, entries),
        };
        assert_eq!(Commitments::parse(&c.lines()), Ok(Some(c)));
        assert_eq!(Commitments::parse(&[]), Ok(None));
        assert!(Commitments::parse(&c.lines()[..1]).is_err());
        assert!(Commitments::parse(&c.lines()[2..]).is_err());
        // A checkpoint made before the domains were committed to commits to none.
        let before = Commitments::parse(&c.lines()[..2]).unwrap().unwrap();
        assert_eq!(before.domains, Commitment::EMPTY);
        assert!(Commitments::parse(&["agentid-revocations 1".into(), c.lines()[1].clone()]).is_err());
    }
}

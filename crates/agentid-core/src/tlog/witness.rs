//! What a witness concludes, without I/O: from the checkpoint it saved, the one the log serves
//! now and what the log answers when asked (a consistency proof, the entries of a committed
//! list, its newest record), whether the log only grew and still checkpoints its records.
//! `agentid audit witness` (the binary) fetches and keeps the state folder; this decides.

use super::commit::{Commitment, Commitments, List};
use super::note::Checkpoint;
use super::tree::{self, Hash};
use crate::domain::{unhex32, Millis};

/// Why a witness run fails.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Finding {
    /// The log broke its promise: it shrank, forked, cannot prove it only grew, undid a
    /// committed entry, or stopped checkpointing.
    #[error("{0}")]
    Log(String),
    /// The check could not be made (network, files, arguments).
    #[error("{0}")]
    Check(String),
}

/// How the served checkpoint stands to the saved one, from the two alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Growth {
    /// The same tree.
    Same,
    /// Grown from the empty tree, which every tree extends.
    FromEmpty,
    /// Grown: a consistency proof from the saved size to the new one must show it.
    NeedsProof,
}

/// Whether `new` can extend `old` (same ledger, no fewer records, not another tree of the
/// same size), and what else that takes.
pub fn growth(old: &Checkpoint, new: &Checkpoint) -> Result<Growth, Finding> {
    if new.origin != old.origin {
        return Err(Finding::Check(format!(
            "the checkpoint is of {}, the saved one of {}: use one state folder per ledger",
            new.origin, old.origin
        )));
    }
    if new.size < old.size {
        return Err(Finding::Log(format!(
            "the log shrank: {} holds {} records, it held {} before",
            new.origin, new.size, old.size
        )));
    }
    if new.size == old.size {
        return if new.root == old.root {
            Ok(Growth::Same)
        } else {
            Err(Finding::Log(format!(
                "the log forked: two different trees of {} records of {}",
                new.size, new.origin
            )))
        };
    }
    Ok(if old.size == 0 {
        Growth::FromEmpty
    } else {
        Growth::NeedsProof
    })
}

/// Whether the log's answer to "prove that `new` extends `old`" proves it (RFC 9162
/// §2.1.4.2). A log that cannot answer (`answer` is `Err`) has not proved it either.
pub fn consistent(old: &Checkpoint, new: &Checkpoint, answer: Result<&str, String>) -> Result<(), Finding> {
    let proof = answer
        .and_then(|body| parse_proof(body, old.size, new.size))
        .map_err(|e| {
            Finding::Log(format!(
                "the log cannot prove that its {} records extend the {} seen before: {e}",
                new.size, old.size
            ))
        })?;
    tree::verify_consistency(old.size, new.size, &old.root, &new.root, &proof).map_err(|e| {
        Finding::Log(format!(
            "the log did not only grow: the tree of {} records of {} does not extend the one of {} \
             seen before ({e})",
            new.size, new.origin, old.size
        ))
    })
}

/// The proof of a consistency answer, which must be for the sizes asked.
fn parse_proof(body: &str, from: u64, to: u64) -> Result<Vec<Hash>, String> {
    #[derive(serde::Deserialize)]
    struct Answer {
        from: u64,
        to: u64,
        proof: Vec<String>,
    }
    let a: Answer = serde_json::from_str(body).map_err(|e| format!("not a consistency proof: {e}"))?;
    if (a.from, a.to) != (from, to) {
        return Err(format!("asked for {from}..{to}, answered {}..{}", a.from, a.to));
    }
    a.proof
        .iter()
        .map(|h| unhex32(h).ok_or_else(|| format!("{h:?} is not a 32-byte hex hash")))
        .collect()
}

/// How many pages of one list a run reads at most: the service's pages hold 1,000 entries,
/// so 100 million entries a list; a log answering one entry a page to a count near 2^64 is
/// an error, not a run that never ends.
const MAX_PAGES: u64 = 100_000;

/// Whether every list `new` commits to (the ledger's revocations, the fleet's key
/// retirements and issuer-domain events) extends what `old` committed to; with no `old`,
/// what the empty lists did. `page(list, from)` is the log's answer to `GET
/// /v1/log/commitments?<list>_from=<from>`. An entry taken out (a revocation undone in the
/// database, a key un-retired) is a log that did not only grow; so is a checkpoint that
/// commits to no lists after one that did (the next would start again from empty lists).
/// Entries are folded in as each page comes: a run holds one page, however long the lists.
pub fn lists_extend(
    old: Option<&Checkpoint>,
    new: &Checkpoint,
    mut page: impl FnMut(List, u64) -> Result<String, Finding>,
) -> Result<(), Finding> {
    let before = match old {
        Some(o) => Commitments::parse(&o.extensions).map_err(Finding::Log)?,
        None => None,
    };
    let Some(now) = Commitments::parse(&new.extensions).map_err(Finding::Log)? else {
        return match before {
            Some(_) => Err(Finding::Log(format!(
                "the log did not only grow: {} commits to no lists, and did before",
                new.origin
            ))),
            None => Ok(()), // the log commits to no lists
        };
    };
    let before = before.unwrap_or(Commitments {
        revocations: Commitment::EMPTY,
        retired_keys: Commitment::EMPTY,
        domains: Commitment::EMPTY,
    });
    for list in List::ALL {
        let (earlier, later, what) = (before.get(list), now.get(list), list.entry());
        if later.count < earlier.count {
            return Err(Finding::Log(format!(
                "the log did not only grow: {} commits to {} {what}s, {} before: one was undone",
                new.origin, later.count, earlier.count
            )));
        }
        let mut folded = earlier;
        let mut pages = 0;
        while folded.count < later.count {
            pages += 1;
            if pages > MAX_PAGES {
                return Err(Finding::Check(format!(
                    "GET /v1/log/commitments: more than {MAX_PAGES} pages of {what}s"
                )));
            }
            let body = page(list, folded.count)?;
            let got = parse_entries(&body, list.param())
                .map_err(|e| Finding::Check(format!("GET /v1/log/commitments: {e}")))?;
            if got.is_empty() {
                break;
            }
            let left = later.count - folded.count;
            let walk = got.iter().take(usize::try_from(left).unwrap_or(usize::MAX));
            folded = walk.fold(folded, |c, (id, at)| c.then(list, id, *at));
        }
        if folded != later {
            return Err(Finding::Log(format!(
                "the log did not only grow: the {what}s {} commits to ({}) do not extend the {} seen \
                 before: one was undone",
                new.origin, later.count, earlier.count
            )));
        }
    }
    Ok(())
}

/// The entries of one list of a `GET /v1/log/commitments` answer.
fn parse_entries(body: &str, list: &str) -> Result<Vec<(String, Millis)>, String> {
    let v: serde_json::Value = serde_json::from_str(body).map_err(|e| e.to_string())?;
    let entries = v[list]["entries"]
        .as_array()
        .ok_or_else(|| format!("no {list}.entries"))?;
    entries
        .iter()
        .map(|e| {
            let id = e["id"].as_str().ok_or("an entry without an id")?;
            let at = e["at"]
                .as_str()
                .and_then(rfc3339_millis)
                .ok_or("an entry without a readable time")?;
            Ok((id.to_owned(), at))
        })
        .collect()
}

/// An RFC 3339 time as milliseconds since the epoch.
pub fn rfc3339_millis(t: &str) -> Option<Millis> {
    let d = humantime::parse_rfc3339(t)
        .ok()?
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?;
    Some(Millis(d.as_millis() as i64))
}

/// Records no checkpoint covers yet, as a witness noted them: `records` held at `since`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Uncovered {
    pub records: u64,
    pub since: Millis,
}

/// What the witness keeps about coverage after a run that found no alarm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coverage {
    /// The checkpoint covers every record: forget any note.
    Covered,
    /// Records are uncovered but younger than the limit: keep this note (the one saved, or a
    /// new one).
    Note(Uncovered),
}

/// Whether the checkpoint `cp` still covers the ledger's records within `limit`: the newest
/// record (`held` records, the newest made at `newest_made`), if no checkpoint covers it, must
/// be younger; and records the witness noted uncovered on an earlier run (`noted`) must be
/// covered once `limit` has passed since.
pub fn coverage(
    cp: &Checkpoint,
    held: u64,
    newest_made: Option<Millis>,
    noted: Option<Uncovered>,
    now: Millis,
    limit_ms: i64,
) -> Result<Coverage, Finding> {
    if held <= cp.size {
        return Ok(Coverage::Covered);
    }
    let stale = |records: u64, since: Millis| {
        Finding::Log(format!(
            "checkpoints stopped: {} holds {records} records, no checkpoint covers more than {} of \
             them, and the uncovered ones have been there for {} s (allowed: {} s)",
            cp.origin,
            cp.size,
            now.0.saturating_sub(since.0) / 1000,
            limit_ms / 1000
        ))
    };
    let made = newest_made
        .ok_or_else(|| Finding::Check("GET /v1/log: a record without a readable requested_at".into()))?;
    if now.0.saturating_sub(made.0) > limit_ms {
        return Err(stale(held, made));
    }
    match noted {
        Some(n) if n.records > cp.size => {
            // A note dated ahead of the clock (the clock was set back) counts from now: kept
            // as it was, it would hold off the alarm until the clock caught up.
            let n = Uncovered {
                since: n.since.min(now),
                ..n
            };
            if now.0.saturating_sub(n.since.0) > limit_ms {
                Err(stale(n.records, n.since))
            } else {
                Ok(Coverage::Note(n))
            }
        }
        _ => Ok(Coverage::Note(Uncovered {
            records: held,
            since: now,
        })),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tlog::tree::{consistency_ranges, leaf_hash, node_hash};

    fn record(i: u64) -> Hash {
        let mut h = [0u8; 32];
        h[..8].copy_from_slice(&i.to_be_bytes());
        h
    }

    /// RFC 9162's MTH of leaves `r` of the records `0..`.
    fn mth(r: std::ops::Range<u64>) -> Hash {
        let n = r.end - r.start;
        if n == 1 {
            return leaf_hash(&record(r.start));
        }
        let k = n.next_power_of_two() / 2;
        let k = if k == n { n / 2 } else { k };
        node_hash(&mth(r.start..r.start + k), &mth(r.start + k..r.end))
    }

    fn cp(size: u64, root: Hash) -> Checkpoint {
        Checkpoint {
            origin: "id.example/agentid/org_1/live".into(),
            size,
            root,
            extensions: Vec::new(),
        }
    }

    fn proof(from: u64, to: u64) -> String {
        let hashes: Vec<String> = consistency_ranges(from, to)
            .into_iter()
            .map(|r| crate::domain::hex(&mth(r)))
            .collect();
        serde_json::json!({"from": from, "to": to, "proof": hashes}).to_string()
    }

    #[test]
    fn a_log_that_grew_passes_and_one_that_shrank_or_forked_does_not() {
        let (old, new) = (cp(5, mth(0..5)), cp(9, mth(0..9)));
        assert_eq!(growth(&old, &new), Ok(Growth::NeedsProof));
        assert_eq!(consistent(&old, &new, Ok(&proof(5, 9))), Ok(()));
        assert_eq!(growth(&old, &old), Ok(Growth::Same));
        assert_eq!(growth(&cp(0, tree::empty_root()), &new), Ok(Growth::FromEmpty));

        fn log<T>(r: Result<T, Finding>) -> bool {
            matches!(r, Err(Finding::Log(_)))
        }
        assert!(log(growth(&new, &old)), "shrank");
        assert!(log(growth(&old, &cp(5, mth(1..6)))), "forked");
        assert!(
            log(consistent(&old, &cp(9, mth(1..10)), Ok(&proof(5, 9)))),
            "another tree"
        );
        assert!(
            log(consistent(&old, &new, Ok(&proof(4, 9)))),
            "a proof for other sizes"
        );
        assert!(log(consistent(&old, &new, Ok("{}"))), "no proof");
        assert!(log(consistent(&old, &new, Err("503".into()))), "no answer");
        let mut other = new.clone();
        other.origin = "id.example/agentid/org_2/live".into();
        assert!(
            matches!(growth(&old, &other), Err(Finding::Check(_))),
            "another ledger"
        );
    }

    #[test]
    fn records_left_uncovered_past_the_limit_are_an_alarm() {
        let c = cp(10, mth(0..10));
        let (now, limit) = (Millis(100_000), 60_000);
        assert_eq!(coverage(&c, 10, None, None, now, limit), Ok(Coverage::Covered));
        let fresh = coverage(&c, 12, Some(Millis(90_000)), None, now, limit);
        let noted = Uncovered {
            records: 12,
            since: now,
        };
        assert_eq!(fresh, Ok(Coverage::Note(noted)));
        // The newest record is old and uncovered.
        assert!(matches!(
            coverage(&c, 12, Some(Millis(1_000)), None, now, limit),
            Err(Finding::Log(_))
        ));
        // Records noted long ago are still uncovered, though newer ones keep coming.
        let old_note = Uncovered {
            records: 11,
            since: Millis(10_000),
        };
        let r = coverage(&c, 14, Some(Millis(99_000)), Some(old_note), now, limit);
        assert!(matches!(r, Err(Finding::Log(m)) if m.contains("checkpoints stopped")));
        // A note dated at the far end of the past is stale, not an overflow.
        let ancient = Uncovered {
            records: 11,
            since: Millis(i64::MIN),
        };
        let r = coverage(&c, 14, Some(Millis(99_000)), Some(ancient), now, limit);
        assert!(matches!(r, Err(Finding::Log(m)) if m.contains("checkpoints stopped")));
        // A note dated ahead of the clock counts from now, and is saved so: the alarm comes
        // a limit later, not when the clock catches up with the note.
        let ahead = Uncovered {
            records: 11,
            since: Millis(10_000_000),
        };
        let r = coverage(&c, 14, Some(Millis(99_000)), Some(ahead), now, limit);
        assert_eq!(
            r,
            Ok(Coverage::Note(Uncovered {
                records: 11,
                since: now
            }))
        );
        // A note the checkpoint has since covered is replaced.
        let covered = Uncovered {
            records: 9,
            since: Millis(10_000),
        };
        let r = coverage(&c, 14, Some(Millis(99_000)), Some(covered), now, limit);
        assert_eq!(
            r,
            Ok(Coverage::Note(Uncovered {
                records: 14,
                since: now
            }))
        );
    }

    #[test]
    fn a_committed_list_that_lost_an_entry_is_an_alarm() {
        let a = Commitment::EMPTY.then(List::Revocations, "agt_1", Millis(1));
        let ab = a.then(List::Revocations, "agt_2", Millis(2));
        let with = |revocations: Commitment| {
            let mut c = cp(3, mth(0..3));
            c.extensions = Commitments {
                revocations,
                retired_keys: Commitment::EMPTY,
                domains: Commitment::EMPTY,
            }
            .lines();
            c
        };
        let entries = |from: u64| {
            let all = [
                ("agt_1", "1970-01-01T00:00:00.001Z"),
                ("agt_2", "1970-01-01T00:00:00.002Z"),
            ];
            let page: Vec<_> = all[from as usize..]
                .iter()
                .map(|(id, at)| serde_json::json!({"id": id, "at": at}))
                .collect();
            serde_json::json!({"revocations": {"entries": page}}).to_string()
        };
        let pages = |list: List, from: u64| {
            assert_eq!(list, List::Revocations);
            Ok(entries(from))
        };
        assert_eq!(lists_extend(Some(&with(a)), &with(ab), pages), Ok(()));
        assert_eq!(lists_extend(None, &with(ab), pages), Ok(()));
        let log = |r: Result<(), Finding>| matches!(r, Err(Finding::Log(_)));
        assert!(log(lists_extend(Some(&with(ab)), &with(a), pages)), "one fewer");
        let other = Commitment::EMPTY.then(List::Revocations, "agt_9", Millis(1));
        assert!(
            log(lists_extend(Some(&with(other)), &with(ab), pages)),
            "another first entry"
        );
        // A checkpoint without the lines, after one with them: the run after would have
        // started from empty lists again, and taken a list with an entry undone.
        let bare = cp(3, mth(0..3));
        assert!(log(lists_extend(Some(&with(ab)), &bare, pages)), "lines dropped");
        assert_eq!(lists_extend(Some(&bare), &bare, pages), Ok(()));
        // A count near 2^64, answered one entry a page: an error after a bounded run, with
        // one page held at a time.
        let endless = Commitment {
            count: u64::MAX,
            ..ab
        };
        let mut asked = 0_u64;
        let one = |_: List, from: u64| {
            asked += 1;
            Ok(serde_json::json!({"revocations": {"entries": [
                {"id": format!("agt_{from}"), "at": "1970-01-01T00:00:00.001Z"}]}})
            .to_string())
        };
        let r = lists_extend(None, &with(endless), one);
        assert!(matches!(r, Err(Finding::Check(_))), "{r:?}");
        assert_eq!(asked, MAX_PAGES);
    }
}

//! `agentid audit witness`: what an organization runs from cron on its own machine to hold
//! the service to its log. Each run fetches the ledger's latest checkpoint, checks its
//! signature with the log key (pinned in the state folder at the first run), asks for a
//! consistency proof from the checkpoint it saved last time, checks it (RFC 9162 §2.1.4.2),
//! and saves the new checkpoint. A log that shrank, forked or cannot prove that it only grew
//! is reported, and the saved checkpoint is kept, so every later run reports it too.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use agentid_core::domain::Millis;
use agentid_core::tlog::commit::{self, Commitment, Commitments, List};
use agentid_core::tlog::note::{Checkpoint, LogVerifier};
use agentid_core::tlog::tree::{self, Hash};

/// The file of the state folder holding the last checkpoint seen.
pub(crate) const CHECKPOINT_FILE: &str = "checkpoint";
/// The file of the state folder holding the log key, pinned at the first run.
pub(crate) const LOG_KEY_FILE: &str = "log-key";
/// The file of the state folder holding `<records> <unix ms>`: the ledger held that many
/// records, more than its checkpoint covered, at that time.
pub(crate) const UNCOVERED_FILE: &str = "uncovered";

#[derive(Debug, Clone)]
pub(crate) struct Witness {
    /// The service's base URL.
    pub(crate) url: String,
    /// A secret key of the organization (it names the ledger: its org and mode).
    pub(crate) key: String,
    pub(crate) state: PathBuf,
    /// The log key, when given (else fetched at the first run and pinned).
    pub(crate) log_key: Option<String>,
    /// Records that no checkpoint has covered for longer are an alarm.
    pub(crate) stale_after: Duration,
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum WitnessError {
    /// The log misbehaved: it shrank, forked, or cannot prove it only grew.
    #[error("{0}")]
    Log(String),
    /// The check could not be made (network, files, arguments).
    #[error("{0}")]
    Check(String),
}

/// What a run found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Seen {
    pub(crate) origin: String,
    pub(crate) previous: Option<u64>,
    pub(crate) size: u64,
}

impl Witness {
    pub fn run(&self) -> Result<Seen, WitnessError> {
        std::fs::create_dir_all(&self.state)
            .map_err(|e| check(format!("state folder {}: {e}", self.state.display())))?;
        let agent = ureq::AgentBuilder::new().timeout(Duration::from_secs(30)).build();
        let base = self.url.trim_end_matches('/');
        let verifier = self.verifier(&agent, base)?;

        let note = get(&agent, &format!("{base}/v1/log/checkpoint"), Some(&self.key))?;
        let new = verifier
            .open(&note)
            .map_err(|e| WitnessError::Log(format!("the service's checkpoint does not verify: {e}")))?;
        let saved_path = self.state.join(CHECKPOINT_FILE);
        let old = match read_optional(&saved_path)? {
            Some(old_note) => Some(verifier.open(&old_note).map_err(|e| {
                check(format!(
                    "the saved checkpoint {} does not verify: {e}",
                    saved_path.display()
                ))
            })?),
            None => None,
        };
        if let Some(old) = &old {
            self.judge(&agent, base, old, &new)?;
        }
        self.lists(&agent, base, old.as_ref(), &new)?;
        write_atomic(&saved_path, note.as_bytes())
            .map_err(|e| check(format!("cannot save {}: {e}", saved_path.display())))?;
        self.coverage(&agent, base, &new)?;
        Ok(Seen {
            origin: new.origin,
            previous: old.map(|o| o.size),
            size: new.size,
        })
    }

    /// Whether the lists `new` commits to (the ledger's revocations, the fleet's key
    /// retirements) extend what `old` committed to: an entry taken out (a revocation undone
    /// in the database, a key un-retired) is a log that did not only grow.
    fn lists(
        &self,
        agent: &ureq::Agent,
        base: &str,
        old: Option<&Checkpoint>,
        new: &Checkpoint,
    ) -> Result<(), WitnessError> {
        let log = WitnessError::Log;
        let Some(now) = Commitments::parse(&new.extensions).map_err(log)? else {
            return Ok(()); // the service commits to no lists
        };
        let before = match old {
            Some(o) => Commitments::parse(&o.extensions).map_err(log)?,
            None => None,
        };
        let before = before.unwrap_or(Commitments {
            revocations: Commitment::EMPTY,
            retired_keys: Commitment::EMPTY,
            domains: Commitment::EMPTY,
        });
        for list in List::ALL {
            let (earlier, later, param, what) = (before.get(list), now.get(list), list.param(), list.entry());
            if later.count < earlier.count {
                return Err(WitnessError::Log(format!(
                    "the log did not only grow: {} commits to {} {what}s, {} before: one was undone",
                    new.origin, later.count, earlier.count
                )));
            }
            let mut entries: Vec<(String, Millis)> = Vec::new();
            while (earlier.count + entries.len() as u64) < later.count {
                let from = earlier.count + entries.len() as u64;
                let body = get(
                    agent,
                    &format!("{base}/v1/log/commitments?{param}_from={from}"),
                    Some(&self.key),
                )?;
                let page = parse_entries(&body, param)
                    .map_err(|e| check(format!("GET /v1/log/commitments: {e}")))?;
                if page.is_empty() {
                    break;
                }
                entries.extend(page);
            }
            let walk = entries.iter().map(|(id, at)| (id.as_str(), *at));
            if !commit::extends(list, &earlier, &later, walk) {
                return Err(WitnessError::Log(format!(
                    "the log did not only grow: the {what}s {} commits to ({}) do not extend the {} seen \
                     before: one was undone",
                    new.origin, later.count, earlier.count
                )));
            }
        }
        Ok(())
    }

    /// Whether the checkpoint still covers the ledger's records within `stale_after`: the
    /// newest record, if no checkpoint covers it, must be younger; and records this witness
    /// saw uncovered on an earlier run must be covered once `stale_after` has passed since.
    fn coverage(&self, agent: &ureq::Agent, base: &str, cp: &Checkpoint) -> Result<(), WitnessError> {
        let page = get(agent, &format!("{base}/v1/log?limit=1"), Some(&self.key))?;
        let page: serde_json::Value =
            serde_json::from_str(&page).map_err(|e| check(format!("GET /v1/log: {e}")))?;
        let newest = page["data"].get(0);
        let held = newest.and_then(|r| r["seq"].as_u64()).unwrap_or(0);
        let now = Millis::now();
        let limit = self.stale_after.as_millis() as i64;
        let path = self.state.join(UNCOVERED_FILE);
        let stale = |records: u64, since: i64| {
            WitnessError::Log(format!(
                "checkpoints stopped: {} holds {records} records, no checkpoint covers more than {} \
                 of them, and the uncovered ones have been there for {} s (allowed: {} s)",
                cp.origin,
                cp.size,
                (now.0 - since) / 1000,
                limit / 1000
            ))
        };
        if held <= cp.size {
            return match std::fs::remove_file(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    Err(check(format!("cannot remove {}: {e}", path.display())))
                }
                _ => Ok(()),
            };
        }
        let made = newest
            .and_then(|r| r["requested_at"].as_str())
            .and_then(|t| humantime::parse_rfc3339(t).ok())
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map(|d| d.as_millis() as i64)
            .ok_or_else(|| check("GET /v1/log: a record without a readable requested_at".into()))?;
        if now.0 - made > limit {
            return Err(stale(held, made));
        }
        let saved = read_optional(&path)?.and_then(|s| {
            let (n, t) = s.trim().split_once(' ')?;
            Some((n.parse::<u64>().ok()?, t.parse::<i64>().ok()?))
        });
        match saved {
            Some((n, since)) if n > cp.size => {
                if now.0 - since > limit {
                    return Err(stale(n, since));
                }
            }
            _ => write_atomic(&path, format!("{held} {}\n", now.0).as_bytes())
                .map_err(|e| check(format!("cannot save {}: {e}", path.display())))?,
        }
        Ok(())
    }

    /// The log key: as given or as served, and the same as the one pinned before.
    fn verifier(&self, agent: &ureq::Agent, base: &str) -> Result<LogVerifier, WitnessError> {
        let pinned_path = self.state.join(LOG_KEY_FILE);
        let pinned = read_optional(&pinned_path)?;
        let line = match (&self.log_key, &pinned) {
            (Some(k), _) => k.trim().to_owned(),
            (None, Some(p)) => p.trim().to_owned(),
            (None, None) => get(agent, &format!("{base}/.well-known/log-key"), None)?
                .trim()
                .to_owned(),
        };
        let verifier = LogVerifier::parse(&line).map_err(|e| check(format!("log key: {e}")))?;
        match pinned {
            Some(p) if p.trim() != line => {
                return Err(WitnessError::Log(format!(
                    "the log key {line} is not the one pinned in {} ({}); a log that changes its key \
                     cannot be held to what it signed before",
                    pinned_path.display(),
                    p.trim()
                )))
            }
            Some(_) => {}
            None => write_atomic(&pinned_path, format!("{line}\n").as_bytes())
                .map_err(|e| check(format!("cannot save {}: {e}", pinned_path.display())))?,
        }
        Ok(verifier)
    }

    /// Whether `new` extends `old`.
    fn judge(
        &self,
        agent: &ureq::Agent,
        base: &str,
        old: &Checkpoint,
        new: &Checkpoint,
    ) -> Result<(), WitnessError> {
        if new.origin != old.origin {
            return Err(check(format!(
                "the checkpoint is of {}, the saved one of {}: use one state folder per ledger",
                new.origin, old.origin
            )));
        }
        if new.size < old.size {
            return Err(WitnessError::Log(format!(
                "the log shrank: {} holds {} records, it held {} before",
                new.origin, new.size, old.size
            )));
        }
        if new.size == old.size {
            return if new.root == old.root {
                Ok(())
            } else {
                Err(WitnessError::Log(format!(
                    "the log forked: two different trees of {} records of {}",
                    new.size, new.origin
                )))
            };
        }
        if old.size == 0 {
            return Ok(()); // every tree extends the empty one
        }
        let url = format!(
            "{base}/v1/log/proof/consistency?from={}&to={}",
            old.size, new.size
        );
        let body = get(agent, &url, Some(&self.key)).map_err(|e| match e {
            WitnessError::Log(m) | WitnessError::Check(m) => WitnessError::Log(format!(
                "the log cannot prove that its {} records extend the {} seen before: {m}",
                new.size, old.size
            )),
        })?;
        let proof = parse_proof(&body, old.size, new.size).map_err(WitnessError::Log)?;
        tree::verify_consistency(old.size, new.size, &old.root, &new.root, &proof).map_err(|e| {
            WitnessError::Log(format!(
                "the log did not only grow: the tree of {} records of {} does not extend the one of {} \
                 seen before ({e})",
                new.size, new.origin, old.size
            ))
        })
    }
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
                .and_then(|t| humantime::parse_rfc3339(t).ok())
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .ok_or("an entry without a readable time")?;
            Ok((id.to_owned(), Millis(at.as_millis() as i64)))
        })
        .collect()
}

fn check(msg: String) -> WitnessError {
    WitnessError::Check(msg)
}

fn get(agent: &ureq::Agent, url: &str, key: Option<&str>) -> Result<String, WitnessError> {
    let mut req = agent.get(url);
    if let Some(k) = key {
        req = req.set("Authorization", &format!("Bearer {k}"));
    }
    match req.call() {
        Ok(res) => {
            let mut bytes = Vec::new();
            std::io::Read::read_to_end(&mut std::io::Read::take(res.into_reader(), 1 << 20), &mut bytes)
                .map_err(|e| check(format!("GET {url}: {e}")))?;
            Ok(String::from_utf8_lossy(&bytes).into_owned())
        }
        Err(ureq::Error::Status(code, res)) => {
            let body = res.into_string().unwrap_or_default();
            Err(check(format!("GET {url}: {code} {}", body.trim())))
        }
        Err(e) => Err(check(format!("GET {url}: {e}"))),
    }
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
        .map(|h| agentid_core::domain::unhex32(h).ok_or_else(|| format!("{h:?} is not a 32-byte hex hash")))
        .collect()
}

fn read_optional(path: &Path) -> Result<Option<String>, WitnessError> {
    match std::fs::read_to_string(path) {
        Ok(s) => Ok(Some(s)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(check(format!("{}: {e}", path.display()))),
    }
}

/// Writes a file whole or not at all: a temporary file, synced, renamed over it.
fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

/// The signed notes in a file (one or more, each ending after its signature lines) or in
/// every file of a folder.
pub(crate) fn notes_in(path: &std::path::Path) -> Result<Vec<agentid_core::tlog::note::GivenNote>, String> {
    let mut files = Vec::new();
    if path.is_dir() {
        let io = |e: std::io::Error| format!("{}: {e}", path.display());
        for entry in std::fs::read_dir(path).map_err(io)? {
            let p = entry.map_err(io)?.path();
            // A witness's state folder also holds its pinned log key and, briefly, a file
            // being written.
            let skip =
                p.file_name().is_some_and(|n| n == LOG_KEY_FILE) || p.extension().is_some_and(|e| e == "tmp");
            if p.is_file() && !skip {
                files.push(p);
            }
        }
        files.sort();
    } else {
        files.push(path.to_owned());
    }
    let mut notes = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).map_err(|e| format!("{}: {e}", f.display()))?;
        // Notes follow one another: each is its text, an empty line, and signature lines.
        let mut current = String::new();
        let mut in_sigs = false;
        for line in text.split_inclusive('\n') {
            if in_sigs && !line.starts_with('\u{2014}') {
                notes.push(agentid_core::tlog::note::GivenNote {
                    source: f.display().to_string(),
                    note: std::mem::take(&mut current),
                });
                in_sigs = false;
            }
            if line == "\n" && !current.is_empty() {
                in_sigs = true;
            }
            if !(current.is_empty() && line.trim().is_empty()) {
                current.push_str(line);
            }
        }
        if !current.trim().is_empty() {
            notes.push(agentid_core::tlog::note::GivenNote {
                source: f.display().to_string(),
                note: current,
            });
        }
    }
    Ok(notes)
}

#[cfg(test)]
mod notes_tests {
    use agentid_core::tlog::note::{Checkpoint, LogKey};

    use super::notes_in;

    /// A file of several signed notes, with or without blank lines between them, gives each.
    #[test]
    fn a_file_of_notes_gives_each_note() {
        let key = LogKey::derive("h/agentid", &[1; 32]);
        let note = |size| {
            key.sign(&Checkpoint {
                origin: "h/agentid/org_1/live".into(),
                size,
                root: [size as u8; 32],
                extensions: Vec::new(),
            })
        };
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("notes");
        std::fs::write(&file, format!("{}{}\n{}", note(1), note(2), note(3))).unwrap();
        let got: Vec<String> = notes_in(&file).unwrap().into_iter().map(|g| g.note).collect();
        assert_eq!(got, vec![note(1), note(2), note(3)]);
        for n in &got {
            key.verifier().open(n).unwrap();
        }
    }
}

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
use agentid_core::tlog::note::{Checkpoint, LogVerifier};
use agentid_core::tlog::witness::{self, Coverage, Finding, Growth, Uncovered};

/// The file of the state folder holding the last checkpoint seen.
pub(crate) const CHECKPOINT_FILE: &str = "checkpoint";
/// The file of the state folder holding the log key, pinned at the first run.
pub(crate) const LOG_KEY_FILE: &str = "log-key";
/// The file of the state folder holding `<records> <unix ms>`: the ledger held that many
/// records, more than its checkpoint covered, at that time.
pub(crate) const UNCOVERED_FILE: &str = "uncovered";
/// The file of the state folder a run holds locked: one run at a time (a slow run that
/// overlapped the next could save its older checkpoint over the newer one).
pub(crate) const LOCK_FILE: &str = "lock";

#[derive(Clone)]
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

impl std::fmt::Debug for Witness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Witness")
            .field("url", &self.url)
            .field("key", &"…")
            .field("state", &self.state)
            .field("log_key", &self.log_key)
            .field("stale_after", &self.stale_after)
            .finish()
    }
}

/// Why a run failed: the log broke its promise, or the check could not be made.
pub(crate) type WitnessError = Finding;

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
        let lock = self.state.join(LOCK_FILE);
        let held = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(&lock)
            .map_err(|e| check(format!("{}: {e}", lock.display())))?;
        match held.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(check(format!(
                    "another witness run holds {} (one run at a time)",
                    self.state.display()
                )))
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(check(format!("{}: {e}", lock.display()))),
        }
        let agent = crate::fetch::agent(Duration::from_secs(30));
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

    /// Whether the lists `new` commits to extend what `old` committed to (core's
    /// `witness::lists_extend`, with the log's pages of entries fetched here).
    fn lists(
        &self,
        agent: &ureq::Agent,
        base: &str,
        old: Option<&Checkpoint>,
        new: &Checkpoint,
    ) -> Result<(), WitnessError> {
        witness::lists_extend(old, new, |list, from| {
            get(
                agent,
                &format!("{base}/v1/log/commitments?{}_from={from}", list.param()),
                Some(&self.key),
            )
        })
    }

    /// Whether the checkpoint still covers the ledger's records within `stale_after` (core's
    /// `witness::coverage`), with the newest record fetched here and the note of records seen
    /// uncovered kept in the state folder.
    fn coverage(&self, agent: &ureq::Agent, base: &str, cp: &Checkpoint) -> Result<(), WitnessError> {
        let page = get(agent, &format!("{base}/v1/log?limit=1"), Some(&self.key))?;
        let page: serde_json::Value =
            serde_json::from_str(&page).map_err(|e| check(format!("GET /v1/log: {e}")))?;
        let newest = page["data"].get(0);
        let held = newest.and_then(|r| r["seq"].as_u64()).unwrap_or(0);
        let made = newest
            .and_then(|r| r["requested_at"].as_str())
            .and_then(witness::rfc3339_millis);
        let path = self.state.join(UNCOVERED_FILE);
        // A note that does not read is an error, not a note forgotten: forgetting it would
        // start the staleness clock again.
        let noted = match read_optional(&path)? {
            None => None,
            Some(s) => Some(
                s.trim()
                    .split_once(' ')
                    .and_then(|(n, t)| {
                        Some(Uncovered {
                            records: n.parse().ok()?,
                            since: Millis(t.parse().ok()?),
                        })
                    })
                    .ok_or_else(|| {
                        check(format!(
                            "{} is not \"<records> <ms>\": remove it to start counting again",
                            path.display()
                        ))
                    })?,
            ),
        };
        let limit = self.stale_after.as_millis() as i64;
        match witness::coverage(cp, held, made, noted, Millis::now(), limit)? {
            Coverage::Covered => match std::fs::remove_file(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    Err(check(format!("cannot remove {}: {e}", path.display())))
                }
                _ => Ok(()),
            },
            Coverage::Note(n) if Some(n) == noted => Ok(()),
            Coverage::Note(n) => write_atomic(&path, format!("{} {}\n", n.records, n.since.0).as_bytes())
                .map_err(|e| check(format!("cannot save {}: {e}", path.display()))),
        }
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

    /// Whether `new` extends `old` (core's `witness::growth` and `witness::consistent`,
    /// with the consistency proof fetched here).
    fn judge(
        &self,
        agent: &ureq::Agent,
        base: &str,
        old: &Checkpoint,
        new: &Checkpoint,
    ) -> Result<(), WitnessError> {
        if witness::growth(old, new)? != Growth::NeedsProof {
            return Ok(());
        }
        let url = format!(
            "{base}/v1/log/proof/consistency?from={}&to={}",
            old.size, new.size
        );
        match get(agent, &url, Some(&self.key)) {
            Ok(body) => witness::consistent(old, new, Ok(&body)),
            Err(e) => witness::consistent(old, new, Err(e.to_string())),
        }
    }
}

fn check(msg: String) -> WitnessError {
    WitnessError::Check(msg)
}

/// The body of `url`'s 200 answer, as text (`crate::fetch::get`).
fn get(agent: &ureq::Agent, url: &str, key: Option<&str>) -> Result<String, WitnessError> {
    let body = crate::fetch::get(agent, url, key).map_err(check)?;
    Ok(String::from_utf8_lossy(&body).into_owned())
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
            // A witness's state folder also holds its pinned log key, its note of records
            // past the checkpoint, its lock and, briefly, a file being written.
            let skip = p
                .file_name()
                .is_some_and(|n| n == LOG_KEY_FILE || n == UNCOVERED_FILE || n == LOCK_FILE)
                || p.extension().is_some_and(|e| e == "tmp");
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

    /// The witness's API key never shows in `Debug`.
    #[test]
    fn debug_shows_no_key() {
        let witness = super::Witness {
            url: "https://id.example".into(),
            key: "sk_live_S3CRET".into(),
            state: "state".into(),
            log_key: None,
            stale_after: std::time::Duration::from_secs(60),
        };
        let shown = format!("{witness:?}");
        assert!(
            !shown.contains("S3CRET") && shown.contains("id.example"),
            "{shown}"
        );
    }

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

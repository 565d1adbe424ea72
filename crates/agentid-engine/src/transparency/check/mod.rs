//! `agentid audit verify`: recomputes everything the audit log claims from its records.
//!
//! Per ledger, block by block: the hash chain (every record's hash, every link), the block
//! rows' derived columns (`last_hash`, `results`, running totals) and the per-agent rows, the
//! Merkle tree's stored subtree hashes, and the root at every checkpoint: the ones stored
//! in the database (their signatures too) and any given from outside (a witness's). A damaged
//! block is reported and passed over, so every ledger is checked; every failure names its
//! ledger and, where it has one, the `seq`.

mod blocks;
mod tree;

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::time::Duration;

use super::lists::committed_lists;
use agentid_core::domain::audit::AuditRecord;
use agentid_core::domain::{Ledger, Millis, Totals};
use agentid_core::keys::KeyRing;
use agentid_core::tlog::commit::{self, Commitments, List};
pub use agentid_core::tlog::note::GivenNote;
use agentid_core::tlog::note::LogVerifier;
use agentid_core::tlog::tree::{Frontier, Hash, Subtree};
use agentid_store::{AgentBlockRow, DecodedBlock, SharedStore, StoreError};

/// Blocks read per query.
const PAGE: u32 = 256;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub ledger: Ledger,
    pub seq: Option<u64>,
    pub what: String,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.seq {
            Some(seq) => write!(f, "{} seq {seq}: {}", self.ledger, self.what),
            None => write!(f, "{}: {}", self.ledger, self.what),
        }
    }
}

/// What was checked of one ledger.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerSummary {
    pub ledger: Ledger,
    pub records: u64,
    /// Checkpoints whose root was recomputed (stored and given).
    pub checkpoints: usize,
}

#[derive(Debug, Default)]
pub struct Report {
    pub ledgers: Vec<LedgerSummary>,
    pub failures: Vec<Failure>,
}

impl Report {
    pub fn ok(&self) -> bool {
        self.failures.is_empty()
    }
}

/// A checkpoint a ledger's tree must match.
#[derive(Debug, Clone)]
struct Claim {
    size: u64,
    root: Hash,
    source: String,
    /// What it commits to besides the records, if it says (`tlog::commit`).
    extensions: Vec<String>,
}

/// Checks every ledger. `given`: checkpoints from outside, each checked with `verifier`.
/// `keys`: the key file, when at hand, checks each block's seal.
/// `stale_after`: a ledger whose records no checkpoint has covered for longer fails (the
/// checkpointer stopped, or was stopped).
pub async fn check(
    store: &SharedStore,
    verifier: &LogVerifier,
    keys: Option<&KeyRing>,
    given: &[GivenNote],
    stale_after: Duration,
) -> Result<Report, StoreError> {
    let mut report = Report::default();
    let mut claims: BTreeMap<Ledger, Vec<Claim>> = BTreeMap::new();
    for g in given {
        match verifier.open(&g.note) {
            Ok(cp) => match Ledger::from_origin(&cp.origin) {
                Some(ledger) => claims.entry(ledger).or_default().push(Claim {
                    size: cp.size,
                    root: cp.root,
                    source: g.source.clone(),
                    extensions: cp.extensions,
                }),
                None => report.failures.push(Failure {
                    ledger: Ledger::service(),
                    seq: None,
                    what: format!("{}: origin {:?} names no ledger", g.source, cp.origin),
                }),
            },
            Err(e) => report.failures.push(Failure {
                ledger: Ledger::service(),
                seq: None,
                what: format!("{}: {e}", g.source),
            }),
        }
    }
    let mut ledgers = store.ledgers().await?;
    for l in claims.keys() {
        if !ledgers.contains(l) {
            ledgers.push(l.clone());
        }
    }
    ledgers.sort();
    let mut agent_counts: HashMap<Ledger, HashMap<String, i64>> = HashMap::new();
    for (ledger, agent, n) in store.agent_row_counts().await? {
        agent_counts.entry(ledger).or_default().insert(agent, n);
    }
    for ledger in ledgers {
        let given = claims.remove(&ledger).unwrap_or_default();
        let counts = agent_counts.remove(&ledger).unwrap_or_default();
        let mut c = LedgerCheck::new(store, verifier, keys, ledger, counts, stale_after);
        c.run(given).await?;
        report.ledgers.push(c.summary);
        report.failures.extend(c.failures);
    }
    Ok(report)
}

struct LedgerCheck<'a> {
    store: &'a SharedStore,
    verifier: &'a LogVerifier,
    keys: Option<&'a KeyRing>,
    ledger: Ledger,
    stored_agent_rows: HashMap<String, i64>,
    stale_after: Duration,
    summary: LedgerSummary,
    failures: Vec<Failure>,
}

/// Where the walk through a ledger's blocks stands.
struct Walk {
    /// The next `seq` expected.
    next: u64,
    /// The hash the next record must follow.
    prev: Hash,
    totals: Totals,
    agent_totals: HashMap<String, Totals>,
    expected_agent_rows: HashMap<String, Vec<AgentBlockRow>>,
    /// Whether a block so far carries a seal (every block after it must).
    sealed: bool,
    /// The tree so far; `None` once a record is missing or unreadable.
    tree: Option<Frontier>,
    /// Stored-height subtrees computed and not yet compared with the stored ones.
    nodes: Vec<(Subtree, Hash)>,
}

impl<'a> LedgerCheck<'a> {
    fn new(
        store: &'a SharedStore,
        verifier: &'a LogVerifier,
        keys: Option<&'a KeyRing>,
        ledger: Ledger,
        counts: HashMap<String, i64>,
        stale_after: Duration,
    ) -> Self {
        LedgerCheck {
            store,
            verifier,
            keys,
            stale_after,
            summary: LedgerSummary {
                ledger: ledger.clone(),
                records: 0,
                checkpoints: 0,
            },
            ledger,
            stored_agent_rows: counts,
            failures: Vec::new(),
        }
    }

    fn fail(&mut self, seq: Option<u64>, what: impl Into<String>) {
        self.failures.push(Failure {
            ledger: self.ledger.clone(),
            seq,
            what: what.into(),
        });
    }

    async fn run(&mut self, given: Vec<Claim>) -> Result<(), StoreError> {
        let mut claims = given;
        let stored = self.store.checkpoints(&self.ledger).await?;
        // Subtree hashes are stored up to the latest checkpoint the log key signed (rows it
        // did not sign are junk, reported below).
        let mut nodes_until = 0;
        for cp in &stored {
            let source = format!("stored checkpoint of {} records", cp.size);
            let mut extensions = Vec::new();
            match self.verifier.open(&cp.note) {
                Ok(note) => {
                    if Ledger::from_origin(&note.origin).as_ref() != Some(&self.ledger)
                        || note.size != cp.size
                        || note.root != cp.root
                    {
                        self.fail(
                            None,
                            format!(
                                "{source}: its signed note says {} at {} records",
                                note.origin, note.size
                            ),
                        );
                    } else {
                        nodes_until = nodes_until.max(cp.size);
                    }
                    extensions = note.extensions;
                }
                Err(e) => self.fail(None, format!("{source}: {e}")),
            }
            claims.push(Claim {
                size: cp.size,
                root: cp.root,
                source,
                extensions,
            });
        }
        self.check_commitments(&claims).await?;
        // The empty tree has one root, and every ledger extends it: nothing more to check of a
        // checkpoint of it; one of size 0 with another root no log could sign.
        for c in claims.iter().filter(|c| c.size == 0) {
            if c.root != agentid_core::tlog::tree::empty_root() {
                self.fail(
                    None,
                    format!(
                        "{}: a checkpoint of 0 records whose root is not the empty tree's",
                        c.source
                    ),
                );
            }
        }
        claims.retain(|c| c.size > 0);
        claims.sort_by_key(|c| c.size);
        let mut pending = claims.into_iter().peekable();

        let mut walk = Walk {
            next: 1,
            prev: agentid_core::domain::audit::GENESIS,
            totals: [0; 4],
            agent_totals: HashMap::new(),
            expected_agent_rows: HashMap::new(),
            sealed: false,
            tree: Some(Frontier::default()),
            nodes: Vec::new(),
        };
        let before = self.store.blocks_before_first(&self.ledger).await?;
        if before > 0 {
            self.fail(
                None,
                format!(
                    "{before} blocks start before record 1 (written with database access alone: \
                     the log lists them first, and no chain holds them)"
                ),
            );
        }
        // The first record no checkpoint covers, and when it was made.
        let mut first_uncovered: Option<(u64, Millis)> = None;
        let mut after = 0i64;
        loop {
            let blocks = self.store.read_blocks(&self.ledger, after, PAGE).await?;
            if first_uncovered.is_none() {
                first_uncovered = blocks
                    .iter()
                    .filter_map(|b| b.records.as_ref().ok())
                    .flatten()
                    .find(|r| r.seq as u64 > nodes_until)
                    .map(|r| (r.seq as u64, r.requested_at));
            }
            let Some(last) = blocks.last() else { break };
            after = last.seal.first_seq;
            for b in &blocks {
                self.block(b, &mut walk, &mut pending);
            }
            self.compare_nodes(&mut walk.nodes, nodes_until).await?;
        }
        // Roots at sizes the walk passed were compared there; these lie beyond its end.
        for claim in pending {
            if claim.size == 0 {
                continue;
            }
            let held = walk.next - 1;
            if held == 0 && walk.tree.is_some() {
                self.fail(
                    None,
                    format!(
                        "{}: the ledger is gone ({} records were checkpointed)",
                        claim.source, claim.size
                    ),
                );
            } else if claim.size > held {
                self.fail(
                    Some(held + 1),
                    format!(
                        "{}: the ledger ends at {held} records, the checkpoint holds {}: records were cut off",
                        claim.source, claim.size
                    ),
                );
            } else {
                self.fail(
                    None,
                    format!(
                        "{}: its root cannot be recomputed past a missing or unreadable record",
                        claim.source
                    ),
                );
            }
        }
        if let Some((seq, at)) = first_uncovered {
            let age = Millis::now().0.saturating_sub(at.0);
            if age > self.stale_after.as_millis() as i64 {
                self.fail(
                    Some(seq),
                    format!(
                        "no checkpoint covers the records from here on, the first made {} s ago (allowed: \
                         {} s): checkpoints stopped",
                        age / 1000,
                        self.stale_after.as_secs()
                    ),
                );
            }
        }
        self.compare_agent_rows(walk.expected_agent_rows).await?;
        self.summary.records = walk.next - 1;
        Ok(())
    }
}

//! The audit log as a transparency log: each ledger's Merkle tree (`tree`), signed
//! checkpoints (`note::LogKey`), and inclusion and consistency proofs.
//!
//! The audit writer notes which ledgers grew ([`GrownLedgers`]); the checkpointer task signs a new
//! checkpoint of each at most every interval, off the verify path. A checkpoint is made from
//! what is committed: the previous checkpoint's tree edge (from stored subtree hashes) and the
//! new records' hashes, read from their blocks. It is stored with the subtree hashes the new
//! records completed, in one transaction that first checks that the previous checkpoint is
//! still the latest, so instances of a fleet checkpointing the same ledger never disagree.
//! Proofs reach only up to the latest checkpoint, where every stored subtree hash exists.
//!
//! Stored rows are checked, not trusted: the tree edge read from stored subtree hashes must
//! give the latest checkpoint's (signed) root, else it is recomputed from the records; and a
//! row found where a new subtree hash goes (junk written into the database) neither stops
//! the checkpoint nor takes its place. Both are integrity alarms. How far checkpoints lag
//! behind the records is a metric, and `audit verify` and the witness fail on a lag of
//! several intervals.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use agentid_core::domain::audit::{AuditEntry, Event};
use agentid_core::domain::{Ledger, Millis, VerifyResult};
use agentid_core::keys::KeyRing;
use agentid_core::tlog::commit::Commitments;
use agentid_core::tlog::note::{Checkpoint, LogKey, LogVerifier};
use agentid_core::tlog::tree::{self, Frontier};
use agentid_store::{Added, SharedStore, StoreError, StoredCheckpoint};

use crate::audit::{AuditHandle, GrownLedgers};

use super::domain_list::DomainListWatch;
use super::lists::{broken_commitments, committed_lists, CommittedLists};
use super::subtrees::subtree_hashes;
use super::{alarm, block_sealed};

/// Most records one checkpoint adds to a tree; a ledger that grew more (a log that predates
/// checkpoints) gets there in steps, each a checkpoint of its own.
pub(crate) const MAX_STEP: u64 = 1 << 20;
/// Checkpoint rows read, largest first, to find the latest one the log key signed.
const JUNK_READ: u32 = 64;
/// Record hashes read per query while a checkpoint is made.
const READ_CHUNK: u64 = 1 << 16;

/// The log's signing key, its name, and what it signs.
pub struct Transparency {
    pub(super) store: SharedStore,
    pub(super) key: LogKey,
    /// The key file: checks the blocks' seals.
    keys: Arc<KeyRing>,
    /// Blocks of a ledger (by first `seq`) whose seal does not check, alarmed once.
    unsealed: Mutex<HashSet<(Ledger, i64)>>,
    host: String,
    interval: Duration,
    grown: Arc<GrownLedgers>,
    /// Per ledger with records no checkpoint covers: since when the checkpointer has seen
    /// it so (for the lag metrics).
    uncovered: Mutex<HashMap<Ledger, (u64, Millis)>>,
    /// Checkpoint sizes of a ledger that junk rows hold.
    taken: Mutex<HashSet<(Ledger, u64)>>,
    /// Watches the issuer-domain list, and appends a record to the service's ledger when it
    /// grows (an engine's; not a bench's).
    pub(super) domain_list: Option<(AuditHandle, Arc<DomainListWatch>)>,
}

impl std::fmt::Debug for Transparency {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transparency")
            .field("host", &self.host)
            .field("interval", &self.interval)
            .finish_non_exhaustive()
    }
}

/// The log key's name for a public host: `<host>/agentid`.
pub fn log_key_name(host: &str) -> String {
    format!("{host}/agentid")
}

impl Transparency {
    /// The checkpointer of `store`'s ledgers, its log key `keys`' for `host`.
    pub fn new(
        store: SharedStore,
        keys: Arc<KeyRing>,
        host: &str,
        interval: Duration,
        grown: Arc<GrownLedgers>,
    ) -> Self {
        Transparency {
            store,
            key: keys.log_key(&log_key_name(host)),
            keys,
            unsealed: Mutex::default(),
            host: host.to_owned(),
            interval,
            grown,
            uncovered: Mutex::default(),
            taken: Mutex::default(),
            domain_list: None,
        }
    }

    /// Watches the issuer-domain list too (`domain_list`), recording its growth through `audit`.
    pub(crate) fn watching_domains(mut self, audit: AuditHandle, watch: Arc<DomainListWatch>) -> Self {
        self.domain_list = Some((audit, watch));
        self
    }

    pub fn verifier(&self) -> &LogVerifier {
        self.key.verifier()
    }

    /// The lists a checkpoint of `ledger` commits to, as the database holds them now.
    pub async fn committed(&self, ledger: &Ledger) -> Result<CommittedLists, StoreError> {
        committed_lists(&self.store, ledger).await
    }

    /// The signed note of a ledger's latest checkpoint; for a ledger without one, a
    /// checkpoint of the empty tree, signed now (true of every ledger, so nothing to store).
    pub async fn latest_note(&self, ledger: &Ledger) -> Result<String, StoreError> {
        let size = self.store.ledger_size(ledger).await?;
        Ok(match self.latest_signed(ledger, size, false).await? {
            Some(cp) => cp.note,
            None => self.key.sign(&Checkpoint {
                origin: ledger.origin(&self.host),
                size: 0,
                root: tree::empty_root(),
                extensions: Vec::new(),
            }),
        })
    }

    /// Runs for as long as the engine does: every interval, checkpoints the ledgers that
    /// grew (at start, every ledger: records may have been appended since the last one).
    /// Each tick first looks at the issuer-domain list (`domain_list`).
    pub async fn run(self: Arc<Self>) {
        let mut first = true;
        // Ticks four times an interval, so a ledger waits at most a quarter interval past
        // the age its latest checkpoint must reach.
        let mut ticks = tokio::time::interval((self.interval / 4).max(Duration::from_millis(5)));
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            if first {
                match self.store.ledgers().await {
                    Ok(all) => {
                        for l in all {
                            self.grown.put_back(l);
                        }
                        first = false;
                    }
                    Err(e) => tracing::warn!(error = %e, "checkpoints: cannot list the ledgers"),
                }
            }
            if let Some((audit, watch)) = &self.domain_list {
                if let Err(e) = self.watch_domain_list(audit, watch).await {
                    tracing::warn!(error = %e, "cannot read the issuer-domain list's length");
                }
            }
            for ledger in self.grown.take() {
                match self.checkpoint(&ledger).await {
                    Ok(Step::Done) => {}
                    Ok(Step::More) => self.grown.put_back(ledger),
                    Err(e) => {
                        metrics::counter!("agentid_checkpoint_failures_total").increment(1);
                        tracing::warn!(%ledger, error = %e, "checkpoint failed; trying again");
                        self.grown.put_back(ledger);
                    }
                }
            }
        }
    }

    /// Signs and stores one checkpoint of `ledger` if it grew since its latest one and that
    /// one is at least an interval old.
    pub async fn checkpoint(&self, ledger: &Ledger) -> Result<Step, StoreError> {
        let started = std::time::Instant::now();
        let size = self.store.ledger_size(ledger).await?;
        let latest = self.latest_signed(ledger, size, true).await?;
        let now = Millis::now();
        let after = latest.as_ref().map_or(0, |c| c.size);
        // Paced by the latest one's age; one dated ahead of now (written into the database)
        // paces nothing, or it would hold the ledger off until then.
        if let Some(c) = &latest {
            let age = now.0.saturating_sub(c.created_at.0);
            if (0..self.interval.as_millis() as i64).contains(&age) {
                return Ok(Step::More);
            }
        }
        self.note_lag(ledger, after, size, now);
        if size <= after {
            return Ok(Step::Done);
        }
        let mut target = size.min(after + MAX_STEP);
        {
            // Sizes a junk row holds: a checkpoint a record short of one is as good.
            let taken = self.taken.lock();
            while target > after + 1 && taken.contains(&(ledger.clone(), target)) {
                target -= 1;
            }
        }
        let stored_edge = match self.frontier(ledger, after).await {
            Err(StoreError::Corrupt(e)) => Err(e),
            Err(e) => return Err(e),
            Ok(f) => match &latest {
                Some(c) if f.root() != c.root => Err("they do not give its root".to_owned()),
                _ => Ok(f),
            },
        };
        let mut frontier = match stored_edge {
            Ok(f) => f,
            Err(why) => {
                alarm(
                    "tree_node",
                    &format!(
                        "ledger {ledger}: the stored subtree hashes up to the checkpoint of {after} records \
                         cannot be used ({why}); the tree edge is recomputed from the records"
                    ),
                );
                self.frontier_from_records(ledger, after).await?
            }
        };
        if let Some(c) = latest.as_ref().filter(|c| frontier.root() != c.root) {
            return Err(StoreError::Corrupt(format!(
                "ledger {ledger}: its first {} records do not give the root of their checkpoint",
                c.size
            )));
        }
        let mut nodes = Vec::new();
        let mut next = after + 1;
        while next <= target {
            let last = target.min(next + READ_CHUNK - 1);
            let hashes = self.store.record_hashes(ledger, next, last).await?;
            if hashes.len() as u64 != last - next + 1 {
                return Err(StoreError::Corrupt(format!(
                    "ledger {ledger}: records {next}..={last} are missing"
                )));
            }
            for h in &hashes {
                frontier.push(h, |s, h| nodes.push((s, h)));
            }
            self.check_seals(ledger, next, last).await?;
            next = last + 1;
        }
        let lists = committed_lists(&self.store, ledger).await?;
        let commitments = lists.commitments();
        if let Some(c) = &latest {
            for (what, message) in broken_commitments(self.key.verifier(), ledger, c, &lists) {
                alarm(what, &message);
            }
        }
        let checkpoint = Checkpoint {
            origin: ledger.origin(&self.host),
            size: target,
            root: frontier.root(),
            extensions: commitments.lines(),
        };
        let stored = StoredCheckpoint {
            ledger: ledger.clone(),
            size: target,
            root: checkpoint.root,
            note: self.key.sign(&checkpoint),
            created_at: now,
        };
        let ours = |c: &StoredCheckpoint| self.signed(ledger, c);
        let foreign = match self.store.add_checkpoint(&stored, after, &nodes, &ours).await? {
            Added::Stored(foreign) => Some(foreign),
            Added::Raced => None,
            Added::SizeTaken => {
                alarm(
                    "checkpoint",
                    &format!(
                        "ledger {ledger}: a checkpoint row the log key did not sign holds size {target}; \
                         the checkpoint is made a record short of it"
                    ),
                );
                self.taken.lock().insert((ledger.clone(), target));
                return Ok(Step::More);
            }
        };
        if let Some(foreign) = foreign {
            metrics::counter!("agentid_checkpoints_total").increment(1);
            metrics::histogram!("agentid_checkpoint_duration_seconds")
                .record(started.elapsed().as_secs_f64());
            tracing::debug!(%ledger, size = target, "checkpoint signed");
            for s in foreign {
                alarm(
                    "tree_node",
                    &format!(
                        "ledger {ledger}: a subtree hash the service did not write is stored at height {} \
                         index {}; the checkpoint of {target} records is signed over the records",
                        s.height, s.index
                    ),
                );
            }
            self.note_lag(ledger, target, size, now);
        }
        Ok(if target < size { Step::More } else { Step::Done })
    }

    /// Alarms, once each, the blocks holding records `from..=to` that the key file does not
    /// vouch for: written with database access alone. The checkpoint covers them still (the
    /// records after them chain to them, and a ledger whose checkpoints stopped would prove
    /// nothing more); `audit verify` names them.
    async fn check_seals(&self, ledger: &Ledger, from: u64, to: u64) -> Result<(), StoreError> {
        // From the latest sealed block before them: after it, every block must be sealed.
        let seals = self.store.block_seals(ledger, from as i64, to as i64).await?;
        let mut sealed_before = false;
        for s in seals {
            let sealed = block_sealed(&self.keys, ledger, &s, sealed_before);
            sealed_before |= s.mac.is_some();
            if !sealed && self.unsealed.lock().insert((ledger.clone(), s.first_seq)) {
                alarm(
                    "audit_block",
                    &format!(
                        "ledger {ledger}: records {}..={} are in a block the key file did not seal: \
                         written with database access alone",
                        s.first_seq, s.last_seq
                    ),
                );
            }
        }
        Ok(())
    }

    /// Notes that `ledger` holds `size` records of which its checkpoints cover `covered`,
    /// and sets the lag gauges to the largest lag of any ledger.
    fn note_lag(&self, ledger: &Ledger, covered: u64, size: u64, now: Millis) {
        let mut uncovered = self.uncovered.lock();
        if size > covered {
            let since = uncovered.get(ledger).map_or(now, |(_, since)| *since);
            uncovered.insert(ledger.clone(), (size - covered, since));
        } else {
            uncovered.remove(ledger);
        }
        let records = uncovered.values().map(|(n, _)| *n).max().unwrap_or(0);
        let seconds = uncovered
            .values()
            .map(|(_, since)| (now.0 - since.0).max(0))
            .max()
            .unwrap_or(0);
        metrics::gauge!("agentid_checkpoint_lag_records").set(records as f64);
        metrics::gauge!("agentid_checkpoint_lag_seconds").set(seconds as f64 / 1000.0);
    }

    /// The tree's edge at `size` leaves, from the records themselves.
    async fn frontier_from_records(&self, ledger: &Ledger, size: u64) -> Result<Frontier, StoreError> {
        let mut frontier = Frontier::at(0, &[]).ok_or_else(|| StoreError::Corrupt("tree edge".into()))?;
        let mut next = 1;
        while next <= size {
            let last = size.min(next + READ_CHUNK - 1);
            for h in self.store.record_hashes(ledger, next, last).await? {
                frontier.push(&h, |_, _| {});
            }
            next = last + 1;
        }
        Ok(frontier)
    }

    /// The tree's edge at `size` leaves, from stored subtree hashes.
    async fn frontier(&self, ledger: &Ledger, size: u64) -> Result<Frontier, StoreError> {
        let hashes = subtree_hashes(&self.store, ledger, 0..size).await?;
        Frontier::at(size, &hashes).ok_or_else(|| StoreError::Corrupt("tree edge".into()))
    }

    /// The ledger's latest checkpoint of at most `size` records that this log key signed,
    /// as stored. Other rows are junk written into the database: passed over (an alarm when
    /// `report`), read `JUNK_READ` at a time, largest first, however many there are.
    pub async fn latest_signed(
        &self,
        ledger: &Ledger,
        size: u64,
        report: bool,
    ) -> Result<Option<StoredCheckpoint>, StoreError> {
        let (mut at_most, mut junk, mut found) = (size, 0, None);
        loop {
            let rows = self.store.latest_checkpoints(ledger, at_most, JUNK_READ).await?;
            if let Some(i) = rows.iter().position(|c| self.signed(ledger, c)) {
                junk += i;
                found = Some(rows[i].clone());
                break;
            }
            junk += rows.len();
            match rows.last() {
                // Sizes are unique: the next read starts below the smallest one read.
                Some(c) if rows.len() == JUNK_READ as usize && c.size > 0 => at_most = c.size - 1,
                _ => break,
            }
        }
        if report && junk > 0 {
            alarm(
                "checkpoint",
                &format!("ledger {ledger}: {junk} checkpoint rows the log key did not sign; passed over"),
            );
        }
        Ok(found)
    }

    /// Whether a stored checkpoint is this log key's signature of exactly its ledger, size
    /// and root.
    fn signed(&self, ledger: &Ledger, c: &StoredCheckpoint) -> bool {
        self.key.verifier().open(&c.note).is_ok_and(|n| {
            n.origin == ledger.origin(&self.host)
                && n.size == c.size
                && n.root == c.root
                && &c.ledger == ledger
        })
    }
}

/// Whether a ledger needs another checkpoint soon.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Done,
    /// It grew more than one step, or its latest checkpoint is younger than an interval.
    More,
}

/// The issuer-domain list, looked at each tick (`domain_list`).
impl Transparency {
    /// One look at the list: an alarm when it is shorter than before, and a record of the
    /// service's ledger when it grew past what such a record last said.
    pub(super) async fn watch_domain_list(
        &self,
        audit: &AuditHandle,
        watch: &DomainListWatch,
    ) -> Result<(), StoreError> {
        let now = self.store.domain_list_size().await?;
        if let Some(seen) = watch.read(now) {
            alarm(
                "domain_list",
                &format!(
                    "the issuer-domain list holds {} events up to number {}, fewer than the {} up to number \
                     {} this instance read or appended before: who holds a name was rewritten",
                    now.rows, now.newest, seen.rows, seen.newest
                ),
            );
        }
        if now.rows <= watch.recorded() {
            return Ok(());
        }
        // Grown past what this instance recorded: perhaps a checkpoint commits to it already
        // (another instance's record, or a later checkpoint than this instance's record).
        let committed = self.domains_committed().await?;
        if now.rows <= committed {
            watch.record(committed);
            return Ok(());
        }
        let entry = AuditEntry {
            ledger: Ledger::service(),
            event: Event::DomainList,
            agent_id: String::new(),
            result: VerifyResult::Valid,
            failure_reason: Some(format!(
                "the issuer-domain list holds {} events, the newest numbered {}",
                now.rows, now.newest
            )),
            latency_us: 0,
            requested_at: Millis::now(),
            // Names no agent: nothing to re-check against revocations.
            revocations_seen: i64::MAX,
        };
        match audit.append(entry).await {
            Ok(_) => watch.record(now.rows),
            Err(e) => {
                tracing::warn!(error = %e, "cannot record that the issuer-domain list grew; trying again")
            }
        }
        Ok(())
    }

    /// How many issuer-domain events the service ledger's latest checkpoint commits to.
    async fn domains_committed(&self) -> Result<u64, StoreError> {
        let ledger = Ledger::service();
        let size = self.store.ledger_size(&ledger).await?;
        let Some(latest) = self.latest_signed(&ledger, size, false).await? else {
            return Ok(0);
        };
        Ok(self
            .key
            .verifier()
            .open(&latest.note)
            .ok()
            .and_then(|cp| Commitments::parse(&cp.extensions).ok().flatten())
            .map_or(0, |c| c.domains.count))
    }
}

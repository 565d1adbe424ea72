//! The audit writer: the one task that appends to the audit log. Requests hand it entries
//! and wait; it writes everything that queued up while the previous transaction ran as one
//! batch (group commit), then answers every waiter with its committed record.
//!
//! Entries travel through a bounded `tokio::sync::mpsc` channel, and the writer takes what
//! queued with `recv_many`, up to a batch. A full channel refuses an entry at once (fail
//! closed, bounded memory). The store call of each batch runs as a task of its own: a failed,
//! timed-out or panicked flush fails only its own batch (503 to those waiters: nothing was
//! acknowledged), and the writer goes on with the entries queued behind it.
//!
//! The writer runs on a thread (an actix arbiter) of its own for its whole life; its database
//! connections are opened and driven there. When it stops (with the engine), the channel is
//! dropped with whatever is still queued, and those waiters are answered `Stopped`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::Arbiter;
use tokio::sync::{mpsc, oneshot};

use std::collections::HashSet;

use parking_lot::Mutex;

use agentid_core::domain::audit::{AuditEntry, AuditRecord};
use agentid_core::domain::Ledger;
use agentid_core::keys::KeyRing;
use agentid_store::{BlockSealer, SharedStore};

#[derive(Debug, Clone)]
pub struct WriterConfig {
    /// Most entries in one transaction.
    pub max_batch: usize,
    /// How long a non-full batch may wait for company before it is written.
    pub linger: Duration,
    /// Entries waiting beyond this are refused at once (fail closed, bounded memory).
    pub max_queue: usize,
    /// A flush that takes longer fails its batch.
    pub flush_timeout: Duration,
}

impl Default for WriterConfig {
    fn default() -> Self {
        WriterConfig {
            max_batch: 512,
            linger: Duration::ZERO,
            max_queue: 65_536,
            flush_timeout: Duration::from_secs(10),
        }
    }
}

/// Why an entry was not recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AuditError {
    #[error("the audit store did not accept the batch")]
    StoreFailed,
    #[error("the audit queue is full")]
    QueueFull,
    #[error("the audit writer is not running")]
    Stopped,
}

type Reply = oneshot::Sender<Result<AuditRecord, AuditError>>;

/// What the handles send the writer.
enum Msg {
    Entry {
        entry: AuditEntry,
        reply: Reply,
    },
    /// Answered once every entry sent before it is committed or failed.
    Drain(oneshot::Sender<()>),
}

/// A cheap, cloneable handle to the writer.
#[derive(Clone)]
pub(crate) struct AuditHandle {
    tx: mpsc::Sender<Msg>,
}

/// The writer's thread. It stops when this is dropped (with the engine), and the writer
/// with it, answering whatever is still queued.
pub(crate) struct WriterThread(Arbiter);

impl Drop for WriterThread {
    fn drop(&mut self) {
        self.0.stop();
    }
}

impl AuditHandle {
    /// Starts the writer on an arbiter thread of its own.
    /// Each block it writes is sealed by `keys` (`KeyRing::audit_block_sealer`).
    pub fn start(
        store: SharedStore,
        cfg: WriterConfig,
        grown: Arc<GrownLedgers>,
        keys: Arc<KeyRing>,
    ) -> (Self, WriterThread) {
        let thread = Arbiter::new();
        let (tx, rx) = mpsc::channel(cfg.max_queue.max(1));
        let handle = AuditHandle { tx };
        let sealer: BlockSealer = Arc::new(keys.audit_block_sealer());
        let writer = Writer {
            store,
            cfg,
            grown,
            sealer,
        };
        thread.spawn(writer.run(rx));
        (handle, WriterThread(thread))
    }

    /// Hands in an entry and waits until it is committed (or refused).
    pub(crate) async fn append(&self, entry: AuditEntry) -> Result<AuditRecord, AuditError> {
        let (reply, rx) = oneshot::channel();
        match self.tx.try_send(Msg::Entry { entry, reply }) {
            Ok(()) => rx.await.unwrap_or(Err(AuditError::Stopped)),
            Err(mpsc::error::TrySendError::Full(_)) => Err(AuditError::QueueFull),
            Err(mpsc::error::TrySendError::Closed(_)) => Err(AuditError::Stopped),
        }
    }

    /// Waits until everything handed in so far is committed or failed.
    pub async fn drain(&self) {
        let (tx, rx) = oneshot::channel();
        if self.tx.send(Msg::Drain(tx)).await.is_ok() {
            let _ = rx.await;
        }
    }
}

struct Writer {
    store: SharedStore,
    cfg: WriterConfig,
    /// Told which ledgers each committed batch grew (for their checkpoints).
    grown: Arc<GrownLedgers>,
    sealer: BlockSealer,
}

impl Writer {
    /// Takes what queued (up to a batch), writes it, answers it; until every handle is gone
    /// or the thread stops.
    async fn run(self, mut rx: mpsc::Receiver<Msg>) {
        let max = self.cfg.max_batch.max(1);
        let mut msgs = Vec::with_capacity(max);
        loop {
            if rx.recv_many(&mut msgs, max).await == 0 {
                return; // every handle is gone
            }
            if msgs.len() < max && !self.cfg.linger.is_zero() {
                tokio::time::sleep(self.cfg.linger).await;
                while msgs.len() < max {
                    match rx.try_recv() {
                        Ok(m) => msgs.push(m),
                        Err(_) => break,
                    }
                }
            }
            metrics::gauge!("agentid_audit_queue_depth").set(rx.len() as f64);
            let mut entries = Vec::with_capacity(msgs.len());
            let mut replies = Vec::with_capacity(msgs.len());
            let mut drains = Vec::new();
            for m in msgs.drain(..) {
                match m {
                    Msg::Entry { entry, reply } => {
                        entries.push(entry);
                        replies.push(reply);
                    }
                    Msg::Drain(d) => drains.push(d),
                }
            }
            if !entries.is_empty() {
                self.flush(entries, replies).await;
            }
            for d in drains {
                let _ = d.send(());
            }
        }
    }

    async fn flush(&self, entries: Vec<AuditEntry>, replies: Vec<Reply>) {
        let (store, sealer) = (self.store.clone(), self.sealer.clone());
        let timeout = self.cfg.flush_timeout;
        // A batch that fails may have committed all the same (its answer lost, or cut off by
        // the timeout): its ledgers are checkpointed either way, or its records would wait
        // for the ledger's next one.
        let mut ledgers: Vec<Ledger> = Vec::new();
        for e in &entries {
            if !ledgers.contains(&e.ledger) {
                ledgers.push(e.ledger.clone());
            }
        }
        let started = Instant::now();
        // The store call runs as a task of its own: a panic inside it ends that task only.
        let task =
            tokio::spawn(
                async move { tokio::time::timeout(timeout, store.append_audit(entries, sealer)).await },
            );
        // A batch the store could not write, or could not find out about (a commit of unknown
        // outcome), within its outage wait, fails: never answered as written.
        let failed = match task.await {
            Ok(Ok(appended)) => {
                let elapsed = started.elapsed();
                let committed = appended.records.iter().flatten().count();
                tracing::debug!(batch = committed, ?elapsed, "audit batch committed");
                metrics::histogram!("agentid_audit_batch_size").record(committed as f64);
                metrics::histogram!("agentid_audit_flush_duration_seconds").record(elapsed.as_secs_f64());
                metrics::counter!("agentid_audit_records_total").increment(committed as u64);
                self.grown.note(&appended.records);
                let mut refused = Vec::new();
                for (reply, rec) in replies.into_iter().zip(appended.records) {
                    match rec {
                        Some(rec) => {
                            let _ = reply.send(Ok(rec));
                        }
                        None => refused.push(reply),
                    }
                }
                appended.failure.map(|e| (refused, format!("store error: {e}")))
            }
            Ok(Err(_)) => Some((replies, "flush timed out".to_owned())),
            Err(e) => Some((replies, format!("flush task failed: {e}"))),
        };
        if let Some((replies, why)) = failed {
            ledgers.into_iter().for_each(|l| self.grown.put_back(l));
            fail(replies, &why);
        }
    }
}

fn fail(replies: Vec<Reply>, why: &str) {
    tracing::error!(batch = replies.len(), error = why, "audit batch not recorded");
    metrics::counter!("agentid_audit_flush_failures_total").increment(1);
    for reply in replies {
        let _ = reply.send(Err(AuditError::StoreFailed));
    }
}

/// The ledgers the audit writer appended to since the checkpointer last looked.
#[derive(Debug, Default)]
pub struct GrownLedgers(Mutex<HashSet<Ledger>>);

impl GrownLedgers {
    /// Notes the ledgers of committed records (one lock per batch; a ledger is cloned only
    /// the first time).
    pub(crate) fn note(&self, records: &[Option<AuditRecord>]) {
        let mut last: Option<&Ledger> = None;
        let mut set = self.0.lock();
        for r in records.iter().flatten() {
            if last != Some(&r.ledger) {
                if !set.contains(&r.ledger) {
                    set.insert(r.ledger.clone());
                }
                last = Some(&r.ledger);
            }
        }
    }

    pub(crate) fn take(&self) -> HashSet<Ledger> {
        std::mem::take(&mut *self.0.lock())
    }

    pub(crate) fn put_back(&self, ledger: Ledger) {
        self.0.lock().insert(ledger);
    }
}

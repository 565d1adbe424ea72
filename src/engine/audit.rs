//! The audit writer: an actor that owns the append path of the audit log. Requests hand it
//! entries and wait; it writes everything that queued up while the previous transaction ran
//! as one batch (group commit), then answers every waiter with its committed record.
//! A failed or panicked flush fails only its own batch (503 to those waiters: nothing was
//! acknowledged); the writer itself goes on, and the next batch retries the store.
//!
//! The writer runs on an arbiter (a thread) of its own for its whole life, under an actix
//! `Supervisor`: a crashed flush stops it and the supervisor starts it again on the same
//! thread with the same queue. Its database connections are opened and driven there.
//!
//! Entries travel through a queue shared with the handles, not through the actor's mailbox:
//! a request pushes under a mutex and sends the actor a message only when the writer is
//! parked (nothing queued, nothing in flight), so under load the writer is woken about once
//! per flush instead of once per entry. Because the queue belongs to the handles, it
//! outlives a restart of the writer.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use parking_lot::Mutex;
use tokio::sync::oneshot;

use crate::domain::audit::{AuditEntry, AuditRecord};
use crate::store::SharedStore;

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

struct Pending {
    entry: AuditEntry,
    reply: Reply,
}

/// What the handles and the writer share.
struct Shared {
    state: Mutex<QueueState>,
    max_queue: usize,
    /// Fault injection: the next flush task panics. Set directly, not through the mailbox,
    /// so a flush the writer starts before reading a message still sees it.
    #[cfg(feature = "test-hooks")]
    panic_next_flush: std::sync::atomic::AtomicBool,
}

impl Shared {
    /// With no writer left (its thread stopped): answers everything queued `Stopped` and
    /// leaves the queue parked, so later entries find no one to wake and are taken back.
    fn answer_stopped(&self) {
        let mut st = self.state.lock();
        for p in st.queue.drain(..) {
            let _ = p.reply.send(Err(AuditError::Stopped));
        }
        st.parked = true;
    }

    /// Whether this flush should fail (a test's fault injection).
    fn take_injected_panic(&self) -> bool {
        #[cfg(feature = "test-hooks")]
        {
            self.panic_next_flush
                .swap(false, std::sync::atomic::Ordering::SeqCst)
        }
        #[cfg(not(feature = "test-hooks"))]
        {
            false
        }
    }
}

struct QueueState {
    queue: VecDeque<Pending>,
    /// The writer found nothing to do and waits for a `Wake`: the next entry must send one.
    parked: bool,
}

/// Sent by the first entry that arrives while the writer is parked.
#[derive(Message)]
#[rtype(result = "()")]
struct Wake;

/// Answers once every entry handed in before it is committed or failed.
#[derive(Message)]
#[rtype(result = "()")]
struct Drain(oneshot::Sender<()>);

pub struct AuditWriter {
    store: SharedStore,
    cfg: WriterConfig,
    /// Told which ledgers each committed batch grew (for their checkpoints).
    grown: Arc<super::transparency::Grown>,
    shared: Arc<Shared>,
    flushing: bool,
    linger_armed: bool,
    drain_waiters: Vec<oneshot::Sender<()>>,
}

impl Actor for AuditWriter {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        // Requests must never wait on a full mailbox; the queue bound applies instead. (Not
        // `usize::MAX`: cloning an address subtracts the capacity from actix's maximum.)
        ctx.set_mailbox_capacity(usize::MAX >> 2);
        // After a restart, pick up whatever queued meanwhile, and answer the drains that
        // waited for the crashed batch when nothing is left to write.
        self.schedule(ctx);
        self.notify_drained();
    }
}

/// The writer is dropped only when its thread stops (the service is going away): nobody
/// will write what is still queued, so its waiters are told now instead of waiting forever.
impl Drop for AuditWriter {
    fn drop(&mut self) {
        self.shared.answer_stopped();
    }
}

/// A crashed writer is restarted by its supervisor with its queue intact: entries already
/// acknowledged are committed, entries of the crashed batch were answered 503, and entries
/// still queued are written by the restarted writer.
impl actix::Supervised for AuditWriter {
    fn restarting(&mut self, _: &mut Self::Context) {
        tracing::warn!(
            queued = self.shared.state.lock().queue.len(),
            "audit writer restarting"
        );
        metrics::counter!("agentid_audit_writer_restarts_total").increment(1);
        self.flushing = false;
        self.linger_armed = false;
    }
}

impl Handler<Wake> for AuditWriter {
    type Result = ();

    fn handle(&mut self, _: Wake, ctx: &mut Self::Context) {
        self.schedule(ctx);
    }
}

impl Handler<Drain> for AuditWriter {
    type Result = ();

    fn handle(&mut self, msg: Drain, _: &mut Self::Context) {
        self.drain_waiters.push(msg.0);
        self.notify_drained();
    }
}

impl AuditWriter {
    /// Flushes when there is work and no flush in flight; parks when there is none.
    fn schedule(&mut self, ctx: &mut Context<Self>) {
        if self.flushing {
            return; // the flush's completion schedules again
        }
        let queued = {
            let mut st = self.shared.state.lock();
            if st.queue.is_empty() && !self.linger_armed {
                st.parked = true;
            }
            st.queue.len()
        };
        if queued == 0 {
            return;
        }
        if queued < self.cfg.max_batch && !self.cfg.linger.is_zero() {
            if !self.linger_armed {
                self.linger_armed = true;
                ctx.run_later(self.cfg.linger, |act, ctx| {
                    act.linger_armed = false;
                    act.flush(ctx);
                });
            }
            return;
        }
        self.flush(ctx);
    }

    fn flush(&mut self, ctx: &mut Context<Self>) {
        if self.flushing {
            return;
        }
        let (batch, left): (Vec<Pending>, usize) = {
            let mut st = self.shared.state.lock();
            let take = st.queue.len().min(self.cfg.max_batch);
            (st.queue.drain(..take).collect(), st.queue.len())
        };
        if batch.is_empty() {
            self.schedule(ctx); // parks
            return;
        }
        let (entries, replies): (Vec<AuditEntry>, Vec<Reply>) =
            batch.into_iter().map(|p| (p.entry, p.reply)).unzip();
        self.flushing = true;
        metrics::gauge!("agentid_audit_queue_depth").set(left as f64);
        let store = self.store.clone();
        let timeout = self.cfg.flush_timeout;
        let started = Instant::now();
        let inject_panic = self.shared.take_injected_panic();
        // The store call runs as a task of its own: a panic inside it ends that task only,
        // and the writer learns of it from the task's outcome.
        let task = tokio::spawn(async move {
            assert!(!inject_panic, "injected audit flush failure");
            tokio::time::timeout(timeout, store.append_audit(entries)).await
        });
        ctx.spawn(task.into_actor(self).map(move |outcome, act, ctx| {
            act.flushing = false;
            let elapsed = started.elapsed();
            match outcome {
                Ok(Ok(appended)) => {
                    let committed = appended.records.iter().flatten().count();
                    tracing::debug!(batch = committed, ?elapsed, "audit batch committed");
                    metrics::histogram!("agentid_audit_batch_size").record(committed as f64);
                    metrics::histogram!("agentid_audit_flush_duration_seconds").record(elapsed.as_secs_f64());
                    metrics::counter!("agentid_audit_records_total").increment(committed as u64);
                    act.grown.note(&appended.records);
                    let mut refused = Vec::new();
                    for (reply, rec) in replies.into_iter().zip(appended.records) {
                        match rec {
                            Some(rec) => {
                                let _ = reply.send(Ok(rec));
                            }
                            None => refused.push(reply),
                        }
                    }
                    if let Some(e) = appended.failure {
                        fail(refused, &format!("store error: {e}"));
                    }
                }
                Ok(Err(_)) => fail(replies, "flush timed out"),
                Err(e) => {
                    fail(replies, &format!("flush task failed: {e}"));
                    // Crashed: let the supervisor restart the writer (queue kept).
                    ctx.stop();
                    return;
                }
            }
            act.schedule(ctx);
            act.notify_drained();
        }));
    }

    fn notify_drained(&mut self) {
        if !self.flushing && self.shared.state.lock().queue.is_empty() {
            for w in self.drain_waiters.drain(..) {
                let _ = w.send(());
            }
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

/// A cheap, cloneable handle to the writer.
#[derive(Clone)]
pub struct AuditHandle {
    shared: Arc<Shared>,
    writer: Addr<AuditWriter>,
}

/// The writer's thread. It stops when this is dropped (with the engine), and the writer
/// with it, answering whatever is still queued.
pub struct WriterThread(Arbiter);

impl Drop for WriterThread {
    fn drop(&mut self) {
        self.0.stop();
    }
}

impl AuditHandle {
    /// Starts the writer on an arbiter thread of its own.
    pub fn start(
        store: SharedStore,
        cfg: WriterConfig,
        grown: Arc<super::transparency::Grown>,
    ) -> (Self, WriterThread) {
        let thread = Arbiter::new();
        let shared = Arc::new(Shared {
            state: Mutex::new(QueueState {
                queue: VecDeque::new(),
                parked: true,
            }),
            max_queue: cfg.max_queue,
            #[cfg(feature = "test-hooks")]
            panic_next_flush: std::sync::atomic::AtomicBool::new(false),
        });
        let writer = AuditWriter {
            store,
            cfg,
            grown,
            shared: shared.clone(),
            flushing: false,
            linger_armed: false,
            drain_waiters: Vec::new(),
        };
        let writer = actix::Supervisor::start_in_arbiter(&thread.handle(), move |_| writer);
        (AuditHandle { shared, writer }, WriterThread(thread))
    }

    /// Hands in an entry and waits until it is committed (or refused).
    pub async fn append(&self, entry: AuditEntry) -> Result<AuditRecord, AuditError> {
        let (tx, rx) = oneshot::channel();
        let wake = {
            let mut st = self.shared.state.lock();
            if st.queue.len() >= self.shared.max_queue {
                return Err(AuditError::QueueFull);
            }
            st.queue.push_back(Pending { entry, reply: tx });
            std::mem::replace(&mut st.parked, false)
        };
        // With the writer gone, this takes back what nobody will write (this entry included).
        if wake && !self.send(Wake) {
            self.shared.answer_stopped();
        }
        rx.await.unwrap_or(Err(AuditError::Stopped))
    }

    /// Waits until everything handed in so far is committed or failed.
    pub async fn drain(&self) {
        let (tx, rx) = oneshot::channel();
        if self.send(Drain(tx)) {
            let _ = rx.await;
        }
    }

    /// Sends to the writer; false when it is gone for good (its thread stopped).
    fn send<M>(&self, msg: M) -> bool
    where
        M: Message<Result = ()> + Send + 'static,
        AuditWriter: Handler<M>,
    {
        match self.writer.try_send(msg) {
            Ok(()) => true,
            // Until the writer first runs, its mailbox is bounded; `do_send` is not.
            Err(SendError::Full(m)) => {
                self.writer.do_send(m);
                true
            }
            Err(SendError::Closed(_)) => false,
        }
    }

    /// The next batch's flush panics: its waiters get 503 and the writer restarts.
    #[cfg(feature = "test-hooks")]
    pub fn inject_flush_panic(&self) {
        self.shared
            .panic_next_flush
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

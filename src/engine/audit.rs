//! The audit writer: an actor that owns the append path of the audit log. Requests hand it
//! entries and wait; it writes everything that queued up while the previous transaction ran
//! as one batch (group commit), then answers every waiter with its committed record.
//! A failed or panicked flush fails only its own batch (503 to those waiters: nothing was
//! acknowledged); the writer itself goes on, and the next batch retries the store.
//!
//! Entries travel through a queue shared with the handles, not through the actor's mailbox:
//! a request pushes under a mutex and sends the actor a message only when the writer is
//! parked (nothing queued, nothing in flight). Under load the writer is woken about once per
//! flush instead of once per entry: its thread went from 24 % to 19 % of agentid's CPU under
//! hot load (perf), agentid from ~38 to ~35 µs per verify (see load/README.md).
//!
//! Where the writer runs: it starts on a thread of its own (its fallback) and, when the HTTP
//! server starts, moves to the first HTTP worker (`host_here`). There, the requests of that
//! worker hand it entries and get its answers without waking another thread, and its
//! database connections are driven by that worker's runtime too: on two shared cores every
//! thread crossing is a wait for a core (load/README.md, eleventh session). A move happens
//! between flushes, with the queue intact. When its host stops (shutdown, a worker that
//! died), the writer is dropped there and starts again on its fallback with the queue
//! intact; only a batch in flight at that moment is answered 503, as after a crash.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use actix::dev::ToEnvelope;
use actix::prelude::*;
use parking_lot::{Mutex, RwLock};
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
    /// Whether the writer moves to the first HTTP worker when the server starts (else it
    /// stays on its own thread).
    pub on_http_worker: bool,
}

impl Default for WriterConfig {
    fn default() -> Self {
        WriterConfig {
            max_batch: 512,
            linger: Duration::ZERO,
            max_queue: 65_536,
            flush_timeout: Duration::from_secs(10),
            on_http_worker: true,
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
    /// Fault injection for tests: the next flush task panics. Set directly, not through the
    /// mailbox, so a flush the writer starts before reading a message still sees it.
    panic_next_flush: AtomicBool,
    /// Fault injection for tests: milliseconds a hand-over waits between starting the
    /// successor and making it the running writer (widens the window of that race).
    handover_pause_ms: AtomicU64,
    /// The running writer (replaced when it moves; set once `AuditHandle::start` returns).
    writer: RwLock<Slot>,
    /// The generation of the last writer started (each successor takes the next one).
    generations: AtomicU64,
    /// The writer's own thread: where it starts, and where it goes back when its host stops.
    fallback: ArbiterHandle,
    /// The writer is on, or on its way to, an HTTP worker.
    hosted: AtomicBool,
    /// Sent home for good (the server is stopping): no HTTP worker hosts it again.
    home_for_good: AtomicBool,
    /// The thread the writer last started on (for tests).
    thread: Mutex<Option<ThreadId>>,
}

/// The address requests send to, and the generation of the writer behind it. A successor is
/// installed only over an older generation: a hand-over that finishes late (its successor
/// already stopped and handed over in turn) cannot put a dead address back.
struct Slot {
    generation: u64,
    addr: Option<Addr<AuditWriter>>,
}

impl Shared {
    fn writer(&self) -> Option<Addr<AuditWriter>> {
        self.writer.read().addr.clone()
    }

    /// Sends to the running writer. A writer that moved meanwhile leaves a closed address
    /// behind: the message goes to its successor instead. Returns the message when no
    /// writer is running.
    fn send<M>(&self, mut msg: M) -> Result<(), M>
    where
        M: Message<Result = ()> + Send + 'static,
        AuditWriter: Handler<M>,
        <AuditWriter as Actor>::Context: ToEnvelope<AuditWriter, M>,
    {
        let Some(mut addr) = self.writer() else {
            return Err(msg);
        };
        loop {
            match addr.try_send(msg) {
                Ok(()) => return Ok(()),
                // Before the writer first started its mailbox is bounded; `do_send` is not.
                Err(SendError::Full(m)) => {
                    addr.do_send(m);
                    return Ok(());
                }
                Err(SendError::Closed(m)) => match self.writer() {
                    Some(now) if now != addr => (addr, msg) = (now, m),
                    _ => return Err(m),
                },
            }
        }
    }

    /// Wakes the running writer; with none left, answers everything queued `Stopped`.
    fn wake(&self) {
        if self.send(Wake).is_err() {
            self.answer_stopped();
        }
    }

    /// With no writer left: answers everything queued `Stopped` and leaves the queue parked.
    fn answer_stopped(&self) {
        let mut st = self.state.lock();
        for p in st.queue.drain(..) {
            let _ = p.reply.send(Err(AuditError::Stopped));
        }
        st.parked = true;
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

/// Moves the writer to another arbiter once no flush is in flight.
#[derive(Message)]
#[rtype(result = "()")]
struct MoveTo {
    to: ArbiterHandle,
    /// `to` is the writer's own thread.
    fallback: bool,
    /// Answered once the writer runs there.
    moved: Option<oneshot::Sender<()>>,
}

pub struct AuditWriter {
    store: SharedStore,
    cfg: WriterConfig,
    shared: Arc<Shared>,
    flushing: bool,
    linger_armed: bool,
    drain_waiters: Vec<oneshot::Sender<()>>,
    /// Runs on its fallback thread (else on a host that may stop).
    on_fallback: bool,
    /// Started on a thread it had not run on: its store connections are opened anew.
    new_thread: bool,
    /// Where to move at the end of the flush in flight.
    moving: Option<MoveTo>,
    /// Answered once this writer has started (after a move).
    on_started: Option<oneshot::Sender<()>>,
    /// Handed over to a successor: it forwards what it still receives and writes nothing.
    retired: bool,
}

impl Actor for AuditWriter {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        // Not when it is being dropped (see `schedule`): an arbiter that never ran it polls it
        // once as it exits, outside any runtime, where no connection can open.
        if self.retired || !ctx.state().alive() {
            return;
        }
        // Requests must never wait on a full mailbox; the queue bound applies instead. (Not
        // `usize::MAX`: cloning an address subtracts the capacity from actix's maximum.)
        ctx.set_mailbox_capacity(usize::MAX >> 2);
        if std::mem::take(&mut self.new_thread) {
            self.store.rebind_writer();
            *self.shared.thread.lock() = Some(std::thread::current().id());
        }
        if let Some(tx) = self.on_started.take() {
            let _ = tx.send(());
        }
        // After a restart or a move, pick up whatever queued meanwhile, and answer drain
        // waiters handed over with nothing left to write.
        self.schedule(ctx);
        self.notify_drained();
    }
}

/// The writer is dropped without a successor when its arbiter stops. On a host (an HTTP
/// worker) it starts again on its fallback with the queue intact; on its fallback (the
/// system is stopping) nobody will write what is still queued, so its waiters are told now
/// instead of waiting forever.
impl Drop for AuditWriter {
    fn drop(&mut self) {
        if self.retired {
            return;
        }
        if self.on_fallback {
            // Later entries find the writer parked and their `Wake` undeliverable: see `append`.
            self.shared.answer_stopped();
            return;
        }
        tracing::info!("the audit writer's host stopped; it goes back to its own thread");
        self.shared.hosted.store(false, Ordering::SeqCst);
        // If the fallback is gone too, the successor is dropped unstarted and answers
        // everything queued (`on_fallback`). A move home waiting for this flush is answered
        // once the successor runs there.
        let moved = self.moving.take().and_then(|m| m.moved);
        self.hand_over(MoveTo {
            to: self.shared.fallback.clone(),
            fallback: true,
            moved,
        });
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
        if self.retired {
            self.shared.wake();
            return;
        }
        self.schedule(ctx);
    }
}

impl Handler<Drain> for AuditWriter {
    type Result = ();

    fn handle(&mut self, msg: Drain, _: &mut Self::Context) {
        if self.retired {
            let _ = self.shared.send(msg);
            return;
        }
        self.drain_waiters.push(msg.0);
        self.notify_drained();
    }
}

impl Handler<MoveTo> for AuditWriter {
    type Result = ();

    fn handle(&mut self, msg: MoveTo, ctx: &mut Self::Context) {
        if self.retired {
            let _ = self.shared.send(msg);
            return;
        }
        if msg.fallback && self.on_fallback {
            // Home already (a later move elsewhere is cancelled).
            self.moving = None;
            if let Some(tx) = msg.moved {
                let _ = tx.send(());
            }
            return;
        }
        self.moving = Some(msg);
        self.schedule(ctx);
    }
}

impl AuditWriter {
    fn new(store: SharedStore, cfg: WriterConfig, shared: Arc<Shared>) -> Self {
        AuditWriter {
            store,
            cfg,
            shared,
            flushing: false,
            linger_armed: false,
            drain_waiters: Vec::new(),
            on_fallback: true,
            new_thread: true,
            moving: None,
            on_started: None,
            retired: false,
        }
    }

    /// Starts a successor with this writer's queue and drain waiters where `to` says, makes
    /// it the running writer, and retires this one.
    fn hand_over(&mut self, to: MoveTo) {
        let generation = self.shared.generations.fetch_add(1, Ordering::SeqCst) + 1;
        let mut next = AuditWriter::new(self.store.clone(), self.cfg.clone(), self.shared.clone());
        next.drain_waiters = std::mem::take(&mut self.drain_waiters);
        next.on_fallback = to.fallback;
        next.on_started = to.moved;
        self.retired = true;
        // Until the address is replaced, what reaches this writer is forwarded (`retired`).
        let addr = actix::Supervisor::start_in_arbiter(&to.to, move |_| next);
        let pause = self.shared.handover_pause_ms.load(Ordering::Relaxed);
        if pause > 0 {
            std::thread::sleep(Duration::from_millis(pause));
        }
        // Installed even if it is gone already (its arbiter had stopped): then requests find a
        // closed address and are refused (503), never left waiting, until a writer after it
        // (its own successor, if it handed over) installs itself.
        {
            let mut slot = self.shared.writer.write();
            if slot.generation < generation {
                *slot = Slot {
                    generation,
                    addr: Some(addr),
                };
            }
        }
        // A `Wake` sent to this writer as it was being dropped (its mailbox outlives `drop`)
        // is lost, and the entry that sent it un-parked the queue: wake the successor.
        self.shared.wake();
    }

    /// Flushes when there is work and no flush in flight; parks when there is none.
    fn schedule(&mut self, ctx: &mut Context<Self>) {
        if self.flushing || self.retired {
            return; // the flush's completion schedules again
        }
        // Being dropped (its arbiter stopped): actix stops the context and polls it once more,
        // outside any runtime, where a flush cannot be spawned. `Drop` hands the queue over.
        if !ctx.state().alive() {
            return;
        }
        if let Some(to) = self.moving.take() {
            let whereto = if to.fallback {
                "its own thread"
            } else {
                "an HTTP worker"
            };
            tracing::debug!("audit writer moving to {whereto}");
            self.hand_over(to);
            return;
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
        if self.flushing || self.retired {
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
        let inject_panic = self.shared.panic_next_flush.swap(false, Ordering::SeqCst);
        // The store call runs as its own task: a panic inside it ends that task only. A
        // runtime task, not a local one: if the host stops mid-flush, the runtime drops it
        // with its context entered, where the store's connections can clean up (sqlx
        // panics when a pooled connection is dropped outside a runtime, as the local tasks
        // of a stopping arbiter are).
        let task = tokio::spawn(async move {
            assert!(!inject_panic, "injected audit flush failure");
            tokio::time::timeout(timeout, store.append_audit(entries)).await
        });
        ctx.spawn(task.into_actor(self).map(move |outcome, act, ctx| {
            act.flushing = false;
            let elapsed = started.elapsed();
            match outcome {
                Ok(Ok(Ok(records))) => {
                    tracing::debug!(batch = records.len(), ?elapsed, "audit batch committed");
                    metrics::histogram!("agentid_audit_batch_size").record(records.len() as f64);
                    metrics::histogram!("agentid_audit_flush_duration_seconds").record(elapsed.as_secs_f64());
                    metrics::counter!("agentid_audit_records_total").increment(records.len() as u64);
                    for (reply, rec) in replies.into_iter().zip(records) {
                        let _ = reply.send(Ok(rec));
                    }
                }
                Ok(Ok(Err(e))) => fail(replies, &format!("store error: {e}")),
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
    on_http_worker: bool,
}

impl AuditHandle {
    /// Starts the writer on its own arbiter thread.
    pub fn start(store: SharedStore, cfg: WriterConfig) -> Self {
        let fallback = Arbiter::new().handle();
        let shared = Arc::new(Shared {
            state: Mutex::new(QueueState {
                queue: VecDeque::new(),
                parked: true,
            }),
            max_queue: cfg.max_queue,
            panic_next_flush: AtomicBool::new(false),
            handover_pause_ms: AtomicU64::new(0),
            writer: RwLock::new(Slot {
                generation: 0,
                addr: None,
            }),
            generations: AtomicU64::new(0),
            fallback: fallback.clone(),
            hosted: AtomicBool::new(false),
            home_for_good: AtomicBool::new(false),
            thread: Mutex::new(None),
        });
        let on_http_worker = cfg.on_http_worker;
        let writer = AuditWriter::new(store, cfg, shared.clone());
        let addr = actix::Supervisor::start_in_arbiter(&fallback, move |_| writer);
        shared.writer.write().addr = Some(addr);
        AuditHandle {
            shared,
            on_http_worker,
        }
    }

    /// Called on each HTTP worker as it starts: moves the writer to the first one (again after
    /// its host stopped), unless configured to stay on its own thread.
    pub fn host_here(&self) {
        if !self.on_http_worker
            || self.shared.home_for_good.load(Ordering::SeqCst)
            || self.shared.hosted.swap(true, Ordering::SeqCst)
        {
            return;
        }
        if let Some(to) = Arbiter::try_current() {
            let _ = self.shared.send(MoveTo {
                to,
                fallback: false,
                moved: None,
            });
        }
    }

    /// Moves the writer back to its own thread for good (no worker hosts it again), and
    /// waits until it runs there. The server calls it before its workers stop: they stop one
    /// by one, and requests still running on the others need the writer.
    pub async fn go_home(&self) {
        self.shared.home_for_good.store(true, Ordering::SeqCst);
        let (tx, rx) = oneshot::channel();
        let home = MoveTo {
            to: self.shared.fallback.clone(),
            fallback: true,
            moved: Some(tx),
        };
        if self.shared.send(home).is_ok() {
            let _ = rx.await;
        }
    }

    /// Moves the writer to `arbiter` (a test hook: the HTTP server uses `host_here`).
    #[doc(hidden)]
    pub fn move_to(&self, arbiter: &ArbiterHandle) {
        self.shared.hosted.store(true, Ordering::SeqCst);
        let _ = self.shared.send(MoveTo {
            to: arbiter.clone(),
            fallback: false,
            moved: None,
        });
    }

    /// The thread the writer last started on (for tests).
    #[doc(hidden)]
    pub fn thread(&self) -> Option<ThreadId> {
        *self.shared.thread.lock()
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
        if wake {
            self.shared.wake();
        }
        rx.await.unwrap_or(Err(AuditError::Stopped))
    }

    /// Test hook: the next batch's flush panics (its waiters get 503, the writer restarts).
    #[doc(hidden)]
    pub fn inject_flush_panic(&self) {
        self.shared.panic_next_flush.store(true, Ordering::SeqCst);
    }

    /// Test hook: each hand-over from now on waits `pause` between starting its successor and
    /// installing it (on the thread handing over: a host's, as it stops).
    #[doc(hidden)]
    pub fn pause_handovers(&self, pause: Duration) {
        let ms = u64::try_from(pause.as_millis()).unwrap_or(u64::MAX);
        self.shared.handover_pause_ms.store(ms, Ordering::Relaxed);
    }

    /// Waits until everything handed in so far is committed or failed.
    pub async fn drain(&self) {
        let (tx, rx) = oneshot::channel();
        let _ = self.shared.send(Drain(tx));
        let _ = rx.await;
    }
}

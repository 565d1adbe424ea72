//! A name changing hands revokes what other organizations issued under it. The move itself
//! (the events, the end of the claim, a note of the move) takes the lock every change of
//! who holds what takes, for a time that does not grow with the agents under the name; the
//! revocations follow in bounded batches outside it, each visible to verify once it commits
//! (the audit transaction re-checks a valid answer against revocations committed since).
//!
//! Whoever moved the name revokes first: an API proof for up to [`INLINE_BUDGET`] before it
//! answers (all of a small move's agents, so its answer is final), the operator's grant to
//! the end. What is left, and what a stopped instance left, the [`Mover`] task of every
//! instance takes up. Two of them on one move are safe: an agent is revoked once.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use agentid_core::domain::Millis;
use agentid_core::records::{AgentRecord, NameMove};
use agentid_store::{SharedStore, StoreError};

use crate::revocations::Revocations;

/// Agents revoked per transaction: a few hundred milliseconds of row locks at most.
pub(crate) const BATCH: u32 = 256;
/// How long an API proof revokes before it answers, leaving the rest to the mover.
pub(crate) const INLINE_BUDGET: Duration = Duration::from_secs(2);
/// How often the mover looks for moves left by others, when nothing wakes it.
const POLL: Duration = Duration::from_secs(1);

/// Revokes `m`'s agents in batches until it is done, or `budget` has passed (`None`: no
/// limit); `each` is told of every batch's revocations as it commits. Whether it is done.
pub async fn follow(
    store: &SharedStore,
    m: &NameMove,
    budget: Option<Duration>,
    mut each: impl FnMut(&[(AgentRecord, Option<i64>)]),
) -> Result<bool, StoreError> {
    let started = Instant::now();
    loop {
        let batch = store.revoke_moved(m, BATCH).await?;
        metrics::counter!("agentid_name_move_revocations_total").increment(batch.revoked.len() as u64);
        each(&batch.revoked);
        if batch.done {
            return Ok(true);
        }
        if budget.is_some_and(|b| started.elapsed() >= b) {
            return Ok(false);
        }
        if batch.revoked.is_empty() {
            // What is left, another mover's batch holds: until it commits.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// The instance's task for moves: those an API proof left unfinished, and those another
/// instance left.
pub struct Mover {
    store: SharedStore,
    revocations: Arc<Revocations>,
    wake: Notify,
}

impl Mover {
    pub(crate) fn new(store: SharedStore, revocations: Arc<Revocations>) -> Self {
        Mover {
            store,
            revocations,
            wake: Notify::new(),
        }
    }

    /// Revokes what `m` owes for up to `budget`; wakes the task for the rest.
    pub(crate) async fn start(&self, m: &NameMove, budget: Duration) -> Result<(), StoreError> {
        let done = follow(&self.store, m, Some(budget), |r| self.revocations.committed(r)).await?;
        if !done {
            tracing::info!(domain = %m.domain, "the name changed hands; its former holders' agents are being revoked");
            self.wake.notify_one();
        }
        Ok(())
    }

    /// Runs for as long as the engine does. A move younger than [`INLINE_BUDGET`] is its
    /// mover's own, unless this instance was woken for it.
    pub(crate) async fn run(self: Arc<Self>) {
        loop {
            let woken = tokio::select! {
                () = self.wake.notified() => true,
                () = tokio::time::sleep(POLL) => false,
            };
            if let Err(e) = self.finish_moves(woken).await {
                tracing::warn!(error = %e, "cannot revoke what a name that changed hands owes; trying again");
            }
        }
    }

    async fn finish_moves(&self, woken: bool) -> Result<(), StoreError> {
        let now = Millis::now();
        for m in self.store.name_moves().await? {
            if !woken && now.0 - m.at.0 < INLINE_BUDGET.as_millis() as i64 {
                continue;
            }
            let mut revoked = 0;
            follow(&self.store, &m, None, |r| {
                revoked += r.len();
                self.revocations.committed(r);
            })
            .await?;
            tracing::info!(domain = %m.domain, revoked, "a name that changed hands: its former holders' agents are revoked");
        }
        Ok(())
    }
}

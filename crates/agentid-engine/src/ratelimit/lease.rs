//! Organization buckets in the store a fleet shares, leased out in cells: an instance takes
//! about a hundredth of the limit at a time, hands those out itself, and gives back what it
//! did not use within a second.

use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;
use parking_lot::Mutex;

use super::local::LocalBuckets;
use super::{bucket_key, decision, Class, Clock, Decision, LEASE_IDLE};
use agentid_store::{SharedStore, StoreError, Taken};

/// The cells an instance leased from one shared bucket.
#[derive(Debug)]
struct Lease {
    limit: u32,
    /// Leased and not handed out yet.
    cells: u32,
    /// Cells the shared bucket held after the last lease.
    shared_left: u32,
    /// When the shared bucket is full again, as of the last lease (clock time).
    full_at: Duration,
    /// The shared bucket had no cell to lease: refuse until then without asking again.
    refused_until: Duration,
    /// The store could not lease: decide from this instance's own bucket until then, without
    /// asking again (each caller waiting its turn at the store would otherwise wait out every
    /// one before it).
    failing_until: Duration,
    /// The last time a cell was handed out or leased.
    used_at: Duration,
}

impl Lease {
    fn decision(&self, now: Duration, refused: bool) -> Decision {
        let wait = refused.then(|| self.refused_until.saturating_sub(now));
        decision(
            self.limit,
            self.cells + self.shared_left,
            self.full_at.saturating_sub(now),
            wait,
        )
    }
}

/// One shared bucket as this instance sees it: its lease, and a lock that one caller holds
/// while it takes a new lease (the others wait for what it brings).
#[derive(Debug)]
struct Leased {
    lease: Mutex<Lease>,
    refill: tokio::sync::Mutex<()>,
}

impl Leased {
    /// A bucket of `limit` a minute with nothing leased yet, first used at `now`.
    fn new(limit: u32, now: Duration) -> Self {
        Leased {
            lease: Mutex::new(Lease {
                limit,
                cells: 0,
                shared_left: limit,
                full_at: Duration::ZERO,
                refused_until: Duration::ZERO,
                failing_until: Duration::ZERO,
                used_at: now,
            }),
            refill: tokio::sync::Mutex::new(()),
        }
    }
}

/// Organization buckets in the store a fleet shares, by class and organization.
pub(crate) struct Leases {
    store: SharedStore,
    buckets: [DashMap<String, Arc<Leased>>; 3],
    /// While the store cannot lease (down, or every connection busy: an overload a flood of
    /// calls may cause), each organization's calls are held to its limit by this instance
    /// alone: a fleet of N passes at most N times it, never everything.
    fallback: [LocalBuckets<String>; 3],
}

/// How long a call waits for the store to lease cells: a store that does not answer (a
/// connection that hangs) sends the call to the instance's own bucket then, as one that fails
/// does.
const LEASE_WAIT: Duration = Duration::from_secs(3);
/// After a lease failed: how long the organization's calls go to the instance's own bucket
/// without asking the store again.
const ALONE_FOR: Duration = Duration::from_secs(1);

/// Cells an instance leases at once from a bucket of `limit` a minute.
fn lease_size(limit: u32) -> u32 {
    (limit / 100).max(1)
}

impl Leases {
    pub(crate) fn new(store: SharedStore) -> Self {
        Leases {
            store,
            buckets: [DashMap::new(), DashMap::new(), DashMap::new()],
            fallback: [LocalBuckets::new(), LocalBuckets::new(), LocalBuckets::new()],
        }
    }

    /// Buckets currently tracked.
    pub(crate) fn tracked(&self) -> usize {
        self.buckets.iter().map(DashMap::len).sum::<usize>()
            + self.fallback.iter().map(|b| b.map.len()).sum::<usize>()
    }

    /// Forgets the instance's own buckets that are full again.
    pub(crate) fn evict_full(&self, now: Duration) {
        self.fallback.iter().for_each(|b| b.evict_full(now));
    }

    fn bucket(&self, class: Class, org_id: &str, limit: u32, now: Duration) -> Arc<Leased> {
        let map = &self.buckets[class as usize];
        if let Some(b) = map.get(org_id) {
            return b.clone();
        }
        map.entry(org_id.to_owned())
            .or_insert_with(|| Arc::new(Leased::new(limit, now)))
            .clone()
    }

    pub async fn check<C: Clock>(&self, clock: &C, class: Class, org_id: &str, limit: u32) -> Decision {
        let bucket = self.bucket(class, org_id, limit, clock.now());
        let alone = |now| self.fallback[class as usize].check(org_id, limit, now, true);
        loop {
            let now = clock.now();
            if let Some(d) = Self::from_lease(&bucket, now, limit, || alone(now)) {
                return d;
            }
            let _refill = bucket.refill.lock().await;
            // Someone else may have leased while this caller waited.
            let now = clock.now();
            if let Some(d) = Self::from_lease(&bucket, now, limit, || alone(now)) {
                return d;
            }
            let buckets = self.store.shared_buckets().expect("leases run on shared buckets");
            let key = bucket_key(org_id, class);
            let asked = tokio::time::timeout(LEASE_WAIT, buckets.take_cells(&key, limit, lease_size(limit)));
            match asked
                .await
                .unwrap_or_else(|_| Err(StoreError::OutcomeUnknown("no answer in time".into())))
            {
                Ok(taken) => {
                    let now = clock.now();
                    let mut lease = bucket.lease.lock();
                    metrics::counter!("agentid_rate_limit_leases_total",
                        "outcome" => if taken.granted > 0 { "granted" } else { "empty" })
                    .increment(1);
                    apply(&mut lease, &taken, now, limit);
                }
                Err(e) => {
                    // The store cannot lease (down, or too busy): this call and those of the
                    // next second are held to the limit by this instance's own bucket,
                    // without asking again.
                    tracing::warn!(error = %e, "cannot lease rate-limit cells; this instance limits alone for a second");
                    let now = clock.now();
                    bucket.lease.lock().failing_until = now + ALONE_FOR;
                    return alone(now);
                }
            }
        }
    }

    /// A decision from the lease alone: a leased cell, a refusal while the shared bucket is
    /// known to be empty, or `alone`'s (the instance's own bucket) while the store cannot
    /// lease. `None`: a new lease is needed.
    fn from_lease(
        bucket: &Leased,
        now: Duration,
        limit: u32,
        alone: impl FnOnce() -> Decision,
    ) -> Option<Decision> {
        let mut lease = bucket.lease.lock();
        if lease.limit != limit {
            // The plan changed: what was leased under the old limit is worth other cells. No
            // more of them are handed out than a lease under the new one holds (a plan moved
            // down would otherwise pass the old lease's on top of the new limit); the rest
            // are dropped, not given back: the fleet passes fewer, never more.
            lease.limit = limit;
            lease.cells = lease.cells.min(lease_size(limit));
            lease.refused_until = Duration::ZERO;
        }
        if lease.cells > 0 {
            lease.cells -= 1;
            lease.used_at = now;
            return Some(lease.decision(now, false));
        }
        if now < lease.failing_until {
            drop(lease);
            return Some(alone());
        }
        (now < lease.refused_until).then(|| lease.decision(now, true))
    }

    pub fn peek<C: Clock>(&self, clock: &C, class: Class, org_id: &str, limit: u32) -> Decision {
        match self.buckets[class as usize].get(org_id) {
            Some(b) => b.lease.lock().decision(clock.now(), false),
            None => decision(limit, limit, Duration::ZERO, None),
        }
    }

    /// Puts back one cell a call took from this instance's lease (a call that turned out not
    /// to count): the next call takes it, or the lease gives it back to the shared bucket.
    pub fn return_cell(&self, class: Class, org_id: &str) {
        if let Some(bucket) = self.buckets[class as usize].get(org_id) {
            bucket.lease.lock().cells += 1;
        }
    }

    /// Gives back cells that went unused for a while (all of them with `all`), and forgets
    /// buckets with nothing leased that were idle for a minute.
    pub async fn give_back<C: Clock>(&self, clock: &C, all: bool) {
        let now = clock.now();
        let mut back = Vec::new();
        for class in [Class::Verify, Class::Other, Class::Publishable] {
            self.buckets[class as usize].retain(|org_id, b| {
                let mut lease = b.lease.lock();
                let idle = now.saturating_sub(lease.used_at);
                if lease.cells > 0 && (all || idle >= LEASE_IDLE) {
                    let cells = std::mem::take(&mut lease.cells);
                    back.push((bucket_key(org_id, class), lease.limit, cells));
                }
                lease.cells > 0 || idle < Duration::from_secs(60)
            });
        }
        let Some(buckets) = self.store.shared_buckets() else {
            return;
        };
        for (key, limit, cells) in back {
            if let Err(e) = buckets.return_cells(&key, limit, cells).await {
                tracing::warn!(error = %e, "cannot give leased rate-limit cells back");
            }
        }
    }
}

/// A new lease's cells and what it says of the shared bucket.
fn apply(lease: &mut Lease, taken: &Taken, now: Duration, limit: u32) {
    lease.limit = limit;
    lease.cells += taken.granted;
    lease.shared_left = taken.remaining;
    lease.full_at = now + taken.full_in;
    lease.used_at = now;
    lease.refused_until = if taken.granted == 0 {
        now + taken.retry_in
    } else {
        Duration::ZERO
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ratelimit::FakeClock;

    /// The instance's own bucket, as these tests have it: empty.
    fn refuse() -> Decision {
        decision(1, 0, Duration::ZERO, Some(Duration::from_secs(1)))
    }

    #[test]
    fn a_lease_hands_out_its_cells_then_asks_again() {
        let clock = FakeClock::default();
        let bucket = Leased::new(500, Duration::ZERO);
        assert!(
            Leases::from_lease(&bucket, clock.now(), 500, refuse).is_none(),
            "nothing leased yet"
        );
        let taken = Taken {
            granted: 5,
            remaining: 480,
            full_in: Duration::from_secs(2),
            retry_in: Duration::ZERO,
        };
        apply(&mut bucket.lease.lock(), &taken, clock.now(), 500);
        for left in (0..5).rev() {
            let d = Leases::from_lease(&bucket, clock.now(), 500, refuse).expect("a leased cell");
            assert!(d.allowed);
            assert_eq!(d.remaining, 480 + left);
        }
        assert!(Leases::from_lease(&bucket, clock.now(), 500, refuse).is_none());
        // An empty shared bucket is not asked again before its next cell.
        let empty = Taken {
            granted: 0,
            remaining: 0,
            full_in: Duration::from_secs(60),
            retry_in: Duration::from_millis(120),
        };
        apply(&mut bucket.lease.lock(), &empty, clock.now(), 500);
        let refused = Leases::from_lease(&bucket, clock.now(), 500, refuse).expect("known empty");
        assert!(!refused.allowed);
        assert_eq!(refused.retry_after, Some(1));
        clock.advance(Duration::from_millis(120));
        assert!(
            Leases::from_lease(&bucket, clock.now(), 500, refuse).is_none(),
            "ask again"
        );
        // After a lease the store failed, the instance's own bucket decides for a second,
        // without asking.
        bucket.lease.lock().failing_until = clock.now() + ALONE_FOR;
        let alone = Leases::from_lease(&bucket, clock.now(), 500, refuse).expect("decided alone");
        assert_eq!(alone, refuse());
        clock.advance(ALONE_FOR);
        assert!(
            Leases::from_lease(&bucket, clock.now(), 500, refuse).is_none(),
            "ask again once the second is over"
        );
    }

    /// A plan moved down hands out no more of what was leased under the old one than a lease
    /// under the new one holds.
    #[test]
    fn a_plan_moved_down_keeps_no_more_cells_than_its_own_lease() {
        let clock = FakeClock::default();
        let bucket = Leased::new(50_000, Duration::ZERO);
        {
            let mut lease = bucket.lease.lock();
            lease.cells = 500;
            lease.shared_left = 40_000;
        }
        let mut passed = 0;
        while Leases::from_lease(&bucket, clock.now(), 60, refuse).is_some_and(|d| d.allowed) {
            passed += 1;
        }
        assert_eq!(passed, lease_size(60));
    }

    #[test]
    fn lease_sizes_are_a_hundredth_of_the_limit_and_at_least_one() {
        assert_eq!(lease_size(60), 1);
        assert_eq!(lease_size(500), 5);
        assert_eq!(lease_size(50_000), 500);
    }
}

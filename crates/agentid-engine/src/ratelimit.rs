//! Rate limits (the spec's table): per organization and endpoint class for keyed calls, per
//! client address for anonymous ones. Every bucket is GCRA with a burst of its per-minute
//! limit: N calls pass at once, call N+1 waits for a cell to come back (one every 60/N s).
//!
//! Where a bucket lives:
//! - Anonymous addresses and the unknown-key look-up budget: in this process.
//! - Organizations: in this process on a store that serves one instance (SQLite); in the
//!   store on one that a fleet shares (PostgreSQL), so that the limit holds for the fleet.
//!   An instance does not ask the store for every call: it takes a *lease* of cells (about
//!   a hundredth of the limit, at least one) and hands them out itself, takes another when
//!   they are gone, and gives back what it did not use within a second. Every cell handed
//!   out was taken from the shared bucket, so the fleet never passes more than the limit.
//!
//! The buckets run on the clock they are given: monotonic in the service, one the tests move
//! by hand.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use dashmap::DashMap;
use parking_lot::Mutex;

use agentid_core::domain::Gcra;
use agentid_store::{SharedStore, Taken};

/// Unauthenticated calls: the spec's lowest tier.
pub const ANON_VERIFY_PER_MINUTE: u32 = 100;
pub const ANON_OTHER_PER_MINUTE: u32 = 20;
/// Database look-ups of API keys the cache has not seen, per client address: bounds what a
/// flood of random keys costs the store. Refreshing a key the cache held is not charged.
pub const KEY_LOOKUPS_PER_MINUTE: u32 = 60;
/// A leased cell that goes unused this long goes back to the shared bucket.
const LEASE_IDLE: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Class {
    Verify,
    Other,
    /// The share of an organization's verify limit that calls with its publishable keys may
    /// take (they take a cell of `Verify` too): a `pk_` key ships inside apps, so anyone may
    /// hold it, and must not be able to spend what the secret-key receivers need.
    Publishable,
}

impl Class {
    pub fn as_str(self) -> &'static str {
        match self {
            Class::Verify => "verify",
            Class::Other => "other",
            Class::Publishable => "verify_publishable",
        }
    }
}

/// What the publishable keys of an organization with a verify limit of `verify_limit` may
/// take a minute, together: half of it (at least one call).
pub fn publishable_share(verify_limit: u32) -> u32 {
    (verify_limit / 2).max(1)
}

/// Whose bucket a call is taken from.
#[derive(Debug, Clone, Copy)]
pub enum Caller<'a> {
    Org { org_id: &'a str, per_minute: u32 },
    Anonymous(IpAddr),
}

/// The outcome, with what the `X-RateLimit-*` headers say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    pub allowed: bool,
    pub limit: u32,
    pub remaining: u32,
    /// Unix seconds when the bucket is full again.
    pub reset: u64,
    /// Seconds until the next call can pass (refused calls only).
    pub retry_after: Option<u64>,
}

/// A monotonic clock: the time since some fixed start.
pub trait Clock: Send + Sync + 'static {
    fn now(&self) -> Duration;
}

pub struct MonotonicClock(Instant);

impl Default for MonotonicClock {
    fn default() -> Self {
        MonotonicClock(Instant::now())
    }
}

impl Clock for MonotonicClock {
    fn now(&self) -> Duration {
        self.0.elapsed()
    }
}

/// `now` + `ahead`, as Unix seconds rounded up.
fn unix_after(ahead: Duration) -> u64 {
    let at = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default() + ahead;
    at.as_secs() + u64::from(at.subsec_nanos() > 0)
}

fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// What the headers say of a bucket with `remaining` cells that is full again in
/// `full_in`; refused when `wait` is set.
fn decision(limit: u32, remaining: u32, full_in: Duration, wait: Option<Duration>) -> Decision {
    Decision {
        allowed: wait.is_none(),
        limit,
        remaining,
        reset: unix_after(full_in),
        retry_after: wait.map(|w| ceil_secs(w).max(1)),
    }
}

/// Buckets kept in this process, by key; each entry is its limit and `tat`.
struct LocalBuckets<K> {
    map: DashMap<K, (u32, u64)>,
}

impl<K: std::hash::Hash + Eq> LocalBuckets<K> {
    fn new() -> Self {
        LocalBuckets { map: DashMap::new() }
    }

    /// Takes a cell (`take`) or only looks. A key is copied only for a bucket seen first.
    fn check<Q>(&self, key: &Q, limit: u32, now: Duration, take: bool) -> Decision
    where
        K: std::borrow::Borrow<Q>,
        Q: std::hash::Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let g = Gcra { limit };
        let now = nanos(now);
        let (tat, granted) = if take {
            let take_one = |entry: &mut (u32, u64)| {
                let (granted, after) = g.take(entry.1, now, 1);
                *entry = (limit, after);
                (after, granted == 1)
            };
            match self.map.get_mut(key) {
                Some(mut entry) => take_one(&mut entry),
                None => take_one(&mut self.map.entry(key.to_owned()).or_insert((limit, now))),
            }
        } else {
            (self.map.get(key).map_or(now, |e| e.1), true)
        };
        let full_in = Duration::from_nanos(tat.saturating_sub(now));
        let wait = (!granted).then(|| Duration::from_nanos(g.wait(tat, now)));
        decision(limit, g.available(tat, now), full_in, wait)
    }

    /// Forgets buckets that are full again (indistinguishable from new ones).
    fn evict_full(&self, now: Duration) {
        let now = nanos(now);
        self.map.retain(|_, (_, tat)| *tat > now);
        self.map.shrink_to_fit();
    }
}

/// The key of an anonymous caller's buckets: its IPv4 address, or the /64 of its IPv6 one
/// (a single host commonly holds a whole /64).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AddressKey(IpAddr);

impl From<IpAddr> for AddressKey {
    fn from(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(v4) => AddressKey(IpAddr::V4(v4)),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => AddressKey(IpAddr::V4(v4)),
                None => {
                    let s = v6.segments();
                    AddressKey(IpAddr::from([s[0], s[1], s[2], s[3], 0, 0, 0, 0]))
                }
            },
        }
    }
}

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

/// Organization buckets in the store a fleet shares, by class and organization.
struct Leases {
    store: SharedStore,
    buckets: [DashMap<String, Arc<Leased>>; 3],
}

/// Cells an instance leases at once from a bucket of `limit` a minute.
fn lease_size(limit: u32) -> u32 {
    (limit / 100).max(1)
}

impl Leases {
    fn bucket(&self, class: Class, org_id: &str, limit: u32, now: Duration) -> Arc<Leased> {
        let map = &self.buckets[class as usize];
        if let Some(b) = map.get(org_id) {
            return b.clone();
        }
        map.entry(org_id.to_owned())
            .or_insert_with(|| {
                Arc::new(Leased {
                    lease: Mutex::new(Lease {
                        limit,
                        cells: 0,
                        shared_left: limit,
                        full_at: Duration::ZERO,
                        refused_until: Duration::ZERO,
                        used_at: now,
                    }),
                    refill: tokio::sync::Mutex::new(()),
                })
            })
            .clone()
    }

    async fn check<C: Clock>(&self, clock: &C, class: Class, org_id: &str, limit: u32) -> Decision {
        let bucket = self.bucket(class, org_id, limit, clock.now());
        loop {
            if let Some(d) = Self::from_lease(&bucket, clock.now(), limit) {
                return d;
            }
            let _refill = bucket.refill.lock().await;
            // Someone else may have leased while this caller waited.
            if let Some(d) = Self::from_lease(&bucket, clock.now(), limit) {
                return d;
            }
            let buckets = self.store.shared_buckets().expect("leases run on shared buckets");
            let key = bucket_key(org_id, class);
            match buckets.take_cells(&key, limit, lease_size(limit)).await {
                Ok(taken) => {
                    let now = clock.now();
                    let mut lease = bucket.lease.lock();
                    metrics::counter!("agentid_rate_limit_leases_total",
                        "outcome" => if taken.granted > 0 { "granted" } else { "empty" })
                    .increment(1);
                    apply(&mut lease, &taken, now, limit);
                }
                Err(e) => {
                    // The store is unreachable: the call will most likely fail there too.
                    // Let it through rather than answer 429 for the store's outage.
                    tracing::warn!(error = %e, "cannot lease rate-limit cells; the call passes");
                    let lease = bucket.lease.lock();
                    return decision(limit, lease.shared_left, Duration::ZERO, None);
                }
            }
        }
    }

    /// A decision from the lease alone: a leased cell, or a refusal while the shared bucket
    /// is known to be empty. `None`: a new lease is needed.
    fn from_lease(bucket: &Leased, now: Duration, limit: u32) -> Option<Decision> {
        let mut lease = bucket.lease.lock();
        if lease.limit != limit {
            // The plan changed: what was leased under the old limit is worth other cells.
            lease.limit = limit;
            lease.refused_until = Duration::ZERO;
        }
        if lease.cells > 0 {
            lease.cells -= 1;
            lease.used_at = now;
            return Some(lease.decision(now, false));
        }
        (now < lease.refused_until).then(|| lease.decision(now, true))
    }

    fn peek<C: Clock>(&self, clock: &C, class: Class, org_id: &str, limit: u32) -> Decision {
        match self.buckets[class as usize].get(org_id) {
            Some(b) => b.lease.lock().decision(clock.now(), false),
            None => decision(limit, limit, Duration::ZERO, None),
        }
    }

    /// Gives back cells that went unused for a while (all of them with `all`), and forgets
    /// buckets with nothing leased that were idle for a minute.
    async fn give_back<C: Clock>(&self, clock: &C, all: bool) {
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

enum OrgBuckets {
    /// By class, then organization.
    Local([LocalBuckets<String>; 3]),
    Shared(Leases),
}

pub struct RateLimits<C: Clock = MonotonicClock> {
    clock: C,
    anon_verify: LocalBuckets<AddressKey>,
    anon_other: LocalBuckets<AddressKey>,
    key_lookups: LocalBuckets<AddressKey>,
    orgs: OrgBuckets,
}

impl RateLimits {
    /// Organization buckets in `store` when it shares them with a fleet, else here.
    pub fn new(store: &SharedStore) -> Self {
        let shared = store.shared_buckets().is_some().then(|| store.clone());
        RateLimits::with_clock(shared, MonotonicClock::default())
    }

    /// Every bucket in this process.
    pub fn in_memory() -> Self {
        RateLimits::with_clock(None, MonotonicClock::default())
    }
}

impl<C: Clock> RateLimits<C> {
    /// Organization buckets leased from `shared` (a store that has shared buckets), or here.
    pub fn with_clock(shared: Option<SharedStore>, clock: C) -> Self {
        let orgs = match shared {
            Some(store) => OrgBuckets::Shared(Leases {
                store,
                buckets: [DashMap::new(), DashMap::new(), DashMap::new()],
            }),
            None => OrgBuckets::Local([LocalBuckets::new(), LocalBuckets::new(), LocalBuckets::new()]),
        };
        RateLimits {
            clock,
            anon_verify: LocalBuckets::new(),
            anon_other: LocalBuckets::new(),
            key_lookups: LocalBuckets::new(),
            orgs,
        }
    }

    /// May this address have one more unknown key looked up in the store?
    pub fn check_key_lookup(&self, ip: IpAddr) -> Decision {
        self.key_lookups
            .check(&ip.into(), KEY_LOOKUPS_PER_MINUTE, self.clock.now(), true)
    }

    /// Takes a cell of the caller's bucket for the class.
    pub async fn check(&self, caller: Caller<'_>, class: Class) -> Decision {
        match (caller, &self.orgs) {
            (Caller::Anonymous(ip), _) => self.anonymous(ip, class, true),
            (Caller::Org { org_id, per_minute }, OrgBuckets::Local(b)) => {
                b[class as usize].check(org_id, per_minute, self.clock.now(), true)
            }
            (Caller::Org { org_id, per_minute }, OrgBuckets::Shared(l)) => {
                l.check(&self.clock, class, org_id, per_minute).await
            }
        }
    }

    /// A verify call with a publishable key: a cell of the organization's publishable share,
    /// then one of its verify bucket. Returns the verify bucket's decision, with what the
    /// caller has left being the smaller of the two; or, when the share refused, the share's
    /// decision and `true`.
    pub async fn check_publishable_verify(&self, org_id: &str, verify_limit: u32) -> (Decision, bool) {
        let share = Caller::Org {
            org_id,
            per_minute: publishable_share(verify_limit),
        };
        let first = self.check(share, Class::Publishable).await;
        if !first.allowed {
            return (first, true);
        }
        let all = Caller::Org {
            org_id,
            per_minute: verify_limit,
        };
        let mut second = self.check(all, Class::Verify).await;
        second.remaining = second.remaining.min(first.remaining);
        (second, false)
    }

    /// What the caller's bucket for the class holds, taking nothing (for calls that never
    /// count, which still carry the headers).
    pub fn peek(&self, caller: Caller<'_>, class: Class) -> Decision {
        match (caller, &self.orgs) {
            (Caller::Anonymous(ip), _) => self.anonymous(ip, class, false),
            (Caller::Org { org_id, per_minute }, OrgBuckets::Local(b)) => {
                b[class as usize].check(org_id, per_minute, self.clock.now(), false)
            }
            (Caller::Org { org_id, per_minute }, OrgBuckets::Shared(l)) => {
                l.peek(&self.clock, class, org_id, per_minute)
            }
        }
    }

    fn anonymous(&self, ip: IpAddr, class: Class, take: bool) -> Decision {
        let (buckets, limit) = match class {
            Class::Verify | Class::Publishable => (&self.anon_verify, ANON_VERIFY_PER_MINUTE),
            Class::Other => (&self.anon_other, ANON_OTHER_PER_MINUTE),
        };
        buckets.check(&ip.into(), limit, self.clock.now(), take)
    }

    /// Forgets the buckets in memory that are full again (a walk of every bucket).
    pub fn evict_full(&self) {
        let now = self.clock.now();
        for b in [&self.anon_verify, &self.anon_other, &self.key_lookups] {
            b.evict_full(now);
        }
        if let OrgBuckets::Local(b) = &self.orgs {
            b.iter().for_each(|b| b.evict_full(now));
        }
    }

    /// Gives back leased cells unused for a second (every one of them with `all`, as the
    /// instance stops). Nothing to do where the organizations' buckets are in memory.
    pub async fn give_back(&self, all: bool) {
        if let OrgBuckets::Shared(l) = &self.orgs {
            l.give_back(&self.clock, all).await;
        }
    }

    /// Buckets currently tracked.
    pub fn tracked(&self) -> usize {
        let orgs: usize = match &self.orgs {
            OrgBuckets::Local(b) => b.iter().map(|b| b.map.len()).sum(),
            OrgBuckets::Shared(l) => l.buckets.iter().map(DashMap::len).sum(),
        };
        self.anon_verify.map.len() + self.anon_other.map.len() + self.key_lookups.map.len() + orgs
    }
}

/// The name of an organization's bucket for a class in the shared store.
fn bucket_key(org_id: &str, class: Class) -> String {
    format!("{}/{org_id}", class.as_str())
}

/// Keeps the buckets for as long as it runs: gives back unused leased cells every second,
/// and forgets full buckets every 30 s (a walk of every one, which a flood of addresses
/// makes long).
pub async fn upkeep(limits: Arc<RateLimits>) {
    let mut ticks = tokio::time::interval(LEASE_IDLE);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    for tick in 0u64.. {
        ticks.tick().await;
        limits.give_back(false).await;
        if tick % 30 == 0 {
            limits.evict_full();
            metrics::gauge!("agentid_rate_limit_buckets").set(limits.tracked() as f64);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;

    /// A clock that moves only when the test moves it.
    #[derive(Clone, Default)]
    struct FakeClock(Arc<AtomicU64>);

    impl FakeClock {
        fn advance(&self, d: Duration) {
            self.0.fetch_add(nanos(d), Ordering::SeqCst);
        }
    }

    impl Clock for FakeClock {
        fn now(&self) -> Duration {
            Duration::from_nanos(self.0.load(Ordering::SeqCst))
        }
    }

    #[test]
    fn gcra_passes_a_burst_of_the_limit_then_one_cell_an_interval() {
        let g = Gcra { limit: 5 };
        let second = 1_000_000_000;
        let mut tat = 0;
        for left in (0..5).rev() {
            let (granted, after) = g.take(tat, 0, 1);
            assert_eq!(granted, 1);
            tat = after;
            assert_eq!(g.available(tat, 0), left);
        }
        assert_eq!(g.take(tat, 0, 1).0, 0);
        assert_eq!(g.wait(tat, 0), 12 * second, "one cell every 60/5 s");
        assert_eq!(g.take(tat, 12 * second - 1, 1).0, 0);
        assert_eq!(g.take(tat, 12 * second, 1).0, 1);
        // A lease takes what there is, up to what it asks for.
        assert_eq!(g.take(0, 0, 3), (3, 36 * second));
        assert_eq!(g.take(36 * second, 0, 3).0, 2);
        // A bucket left alone for longer than a minute is full, not fuller.
        assert_eq!(g.available(0, 600 * second), 5);
    }

    #[test]
    fn local_buckets_refuse_with_retry_after_and_come_back() {
        let b: LocalBuckets<String> = LocalBuckets::new();
        let clock = FakeClock::default();
        for i in 0..5 {
            let d = b.check("org_a", 5, clock.now(), true);
            assert!(d.allowed, "call {i}");
            assert_eq!(d.remaining, 4 - i);
            assert_eq!(d.limit, 5);
        }
        let refused = b.check("org_a", 5, clock.now(), true);
        assert!(!refused.allowed);
        assert_eq!(refused.remaining, 0);
        assert_eq!(refused.retry_after, Some(12));
        let peeked = b.check("org_a", 5, clock.now(), false);
        assert!(peeked.allowed && peeked.remaining == 0, "a look takes nothing");
        clock.advance(Duration::from_millis(11_999));
        assert!(!b.check("org_a", 5, clock.now(), true).allowed);
        clock.advance(Duration::from_millis(1));
        let back = b.check("org_a", 5, clock.now(), true);
        assert!(back.allowed);
        assert_eq!(back.remaining, 0);
        assert!(b.check("org_b", 5, clock.now(), true).allowed, "per key");
    }

    #[test]
    fn full_buckets_are_evicted() {
        let b: LocalBuckets<u32> = LocalBuckets::new();
        let clock = FakeClock::default();
        for i in 0..1000 {
            // At 6000/min a cell comes back every 10 ms.
            b.check(&i, 6000, clock.now(), true);
        }
        b.check(&5000, 60, clock.now(), true);
        clock.advance(Duration::from_millis(5));
        b.evict_full(clock.now());
        assert_eq!(b.map.len(), 1001);
        clock.advance(Duration::from_millis(45));
        b.evict_full(clock.now());
        assert_eq!(b.map.len(), 1, "only the slow bucket is still draining");
    }

    #[test]
    fn ipv6_addresses_share_a_bucket_per_64_and_mapped_ipv4_is_ipv4() {
        let key = |s: &str| AddressKey::from(s.parse::<IpAddr>().unwrap());
        assert_eq!(key("2001:db8:1:2:aaaa::1"), key("2001:db8:1:2:ffff:1:2:3"));
        assert_ne!(key("2001:db8:1:2::1"), key("2001:db8:1:3::1"));
        assert_eq!(key("::ffff:10.0.0.1"), key("10.0.0.1"));
        assert_ne!(key("10.0.0.1"), key("10.0.0.2"));
    }

    #[test]
    fn a_lease_hands_out_its_cells_then_asks_again() {
        let clock = FakeClock::default();
        let bucket = Leased {
            lease: Mutex::new(Lease {
                limit: 500,
                cells: 0,
                shared_left: 500,
                full_at: Duration::ZERO,
                refused_until: Duration::ZERO,
                used_at: Duration::ZERO,
            }),
            refill: tokio::sync::Mutex::new(()),
        };
        assert!(
            Leases::from_lease(&bucket, clock.now(), 500).is_none(),
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
            let d = Leases::from_lease(&bucket, clock.now(), 500).expect("a leased cell");
            assert!(d.allowed);
            assert_eq!(d.remaining, 480 + left);
        }
        assert!(Leases::from_lease(&bucket, clock.now(), 500).is_none());
        // An empty shared bucket is not asked again before its next cell.
        let empty = Taken {
            granted: 0,
            remaining: 0,
            full_in: Duration::from_secs(60),
            retry_in: Duration::from_millis(120),
        };
        apply(&mut bucket.lease.lock(), &empty, clock.now(), 500);
        let refused = Leases::from_lease(&bucket, clock.now(), 500).expect("known empty");
        assert!(!refused.allowed);
        assert_eq!(refused.retry_after, Some(1));
        clock.advance(Duration::from_millis(120));
        assert!(
            Leases::from_lease(&bucket, clock.now(), 500).is_none(),
            "ask again"
        );
    }

    #[test]
    fn lease_sizes_are_a_hundredth_of_the_limit_and_at_least_one() {
        assert_eq!(lease_size(60), 1);
        assert_eq!(lease_size(500), 5);
        assert_eq!(lease_size(50_000), 500);
    }
}

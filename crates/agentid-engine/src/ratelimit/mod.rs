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
//!   out was taken from the shared bucket, so the fleet never passes more than the limit;
//!   while the store cannot lease, each instance holds the organization to it alone.
//!
//! The buckets run on the clock they are given: monotonic in the service, one the tests move
//! by hand.

mod lease;
mod local;

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use agentid_store::SharedStore;

use lease::Leases;
use local::{AddressKey, LocalBuckets};

/// Unauthenticated calls: the spec's lowest tier.
pub(crate) const ANON_VERIFY_PER_MINUTE: u32 = 100;
pub(crate) const ANON_OTHER_PER_MINUTE: u32 = 20;
/// Database look-ups of API keys the cache has not seen, per client address: bounds what a
/// flood of random keys costs the store. Refreshing a key the cache held is not charged.
pub(crate) const KEY_LOOKUPS_PER_MINUTE: u32 = 60;
/// Database look-ups of unknown API keys, all addresses together: addresses are cheap (a
/// routed IPv6 /48 holds 65,536 /64s), and the store's pool is not.
pub(crate) const KEY_LOOKUPS_PER_MINUTE_ALL: u32 = 3000;
/// Token requests whose client failed to authenticate, per client address.
pub const FAILED_CLIENTS_PER_MINUTE: u32 = 20;
/// A leased cell that goes unused this long goes back to the shared bucket.
pub(crate) const LEASE_IDLE: Duration = Duration::from_secs(1);

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
pub(crate) fn publishable_share(verify_limit: u32) -> u32 {
    (verify_limit / 2).max(1)
}

/// See [`RateLimits::hold_failed_client`].
pub struct HeldCell<'a, C: Clock> {
    limits: &'a RateLimits<C>,
    ip: IpAddr,
    held: bool,
    decision: Decision,
}

impl<C: Clock> HeldCell<'_, C> {
    pub fn decision(&self) -> Decision {
        self.decision
    }

    /// The client failed to authenticate: the cell stays taken.
    pub fn failed(mut self) -> Decision {
        self.held = false;
        self.decision
    }
}

impl<C: Clock> Drop for HeldCell<'_, C> {
    fn drop(&mut self) {
        if self.held {
            let now = self.limits.clock.now();
            self.limits
                .failed_clients
                .give_back(&AddressKey::from(self.ip), FAILED_CLIENTS_PER_MINUTE, now);
        }
    }
}

/// Whose bucket a call is taken from.
#[derive(Debug, Clone, Copy)]
pub enum RateSubject<'a> {
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

pub(crate) fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// What the headers say of a bucket with `remaining` cells that is full again in
/// `full_in`; refused when `wait` is set.
pub(crate) fn decision(limit: u32, remaining: u32, full_in: Duration, wait: Option<Duration>) -> Decision {
    Decision {
        allowed: wait.is_none(),
        limit,
        remaining,
        reset: unix_after(full_in),
        retry_after: wait.map(|w| ceil_secs(w).max(1)),
    }
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
    all_key_lookups: LocalBuckets<()>,
    /// The token endpoint's failed client authentications: a bucket of their own, so that an
    /// address's other anonymous calls (a neighbour behind the same NAT asking for pages that
    /// do not exist) never shut the endpoint for the agents there.
    failed_clients: LocalBuckets<AddressKey>,
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
    pub(crate) fn with_clock(shared: Option<SharedStore>, clock: C) -> Self {
        let orgs = match shared {
            Some(store) => OrgBuckets::Shared(Leases::new(store)),
            None => OrgBuckets::Local([LocalBuckets::new(), LocalBuckets::new(), LocalBuckets::new()]),
        };
        RateLimits {
            clock,
            anon_verify: LocalBuckets::new(),
            anon_other: LocalBuckets::new(),
            key_lookups: LocalBuckets::new(),
            all_key_lookups: LocalBuckets::new(),
            failed_clients: LocalBuckets::new(),
            orgs,
        }
    }

    /// May this address have one more unknown key looked up in the store? Within its own
    /// budget, and the service's.
    pub(crate) fn check_key_lookup(&self, ip: IpAddr) -> Decision {
        let now = self.clock.now();
        let own = self
            .key_lookups
            .check(&ip.into(), KEY_LOOKUPS_PER_MINUTE, now, true);
        if !own.allowed {
            return own;
        }
        let all = self
            .all_key_lookups
            .check(&(), KEY_LOOKUPS_PER_MINUTE_ALL, now, true);
        if all.allowed {
            own
        } else {
            all
        }
    }

    /// A cell of the address's bucket of failed token requests, held while the request's
    /// client is checked (requests sent at once would all pass a look at the bucket): given
    /// back when the hold drops (the client authenticated, the store failed, the caller went
    /// away) unless [`HeldCell::failed`] keeps it. A bucket used up holds nothing:
    /// `decision().allowed` is false.
    pub fn hold_failed_client(&self, ip: IpAddr) -> HeldCell<'_, C> {
        let decision =
            self.failed_clients
                .check(&ip.into(), FAILED_CLIENTS_PER_MINUTE, self.clock.now(), true);
        HeldCell {
            limits: self,
            ip,
            held: decision.allowed,
            decision,
        }
    }

    /// Takes a cell of the caller's bucket for the class.
    pub async fn check(&self, caller: RateSubject<'_>, class: Class) -> Decision {
        match (caller, &self.orgs) {
            (RateSubject::Anonymous(ip), _) => self.anonymous(ip, class, true),
            (RateSubject::Org { org_id, per_minute }, OrgBuckets::Local(b)) => {
                b[class as usize].check(org_id, per_minute, self.clock.now(), true)
            }
            (RateSubject::Org { org_id, per_minute }, OrgBuckets::Shared(l)) => {
                l.check(&self.clock, class, org_id, per_minute).await
            }
        }
    }

    /// A verify call with a publishable key: a cell of the organization's publishable share,
    /// then one of its verify bucket. Returns the verify bucket's decision, with what the
    /// caller has left being the smaller of the two; or, when the share refused, the share's
    /// decision and `true`.
    pub async fn check_publishable_verify(&self, org_id: &str, verify_limit: u32) -> (Decision, bool) {
        let share = RateSubject::Org {
            org_id,
            per_minute: publishable_share(verify_limit),
        };
        let first = self.check(share, Class::Publishable).await;
        if !first.allowed {
            return (first, true);
        }
        let all = RateSubject::Org {
            org_id,
            per_minute: verify_limit,
        };
        let mut second = self.check(all, Class::Verify).await;
        second.remaining = second.remaining.min(first.remaining);
        (second, false)
    }

    /// What the caller's bucket for the class holds, taking nothing (for calls that never
    /// count, which still carry the headers).
    pub fn peek(&self, caller: RateSubject<'_>, class: Class) -> Decision {
        match (caller, &self.orgs) {
            (RateSubject::Anonymous(ip), _) => self.anonymous(ip, class, false),
            (RateSubject::Org { org_id, per_minute }, OrgBuckets::Local(b)) => {
                b[class as usize].check(org_id, per_minute, self.clock.now(), false)
            }
            (RateSubject::Org { org_id, per_minute }, OrgBuckets::Shared(l)) => {
                l.peek(&self.clock, class, org_id, per_minute)
            }
        }
    }

    /// Puts back the cell an organization's call in `class` took: a call that turned out not
    /// to count (a replayed client assertion, refused).
    pub fn return_cell(&self, caller: RateSubject<'_>, class: Class) {
        match (caller, &self.orgs) {
            (RateSubject::Anonymous(_), _) => {}
            (RateSubject::Org { org_id, per_minute }, OrgBuckets::Local(b)) => {
                b[class as usize].give_back(org_id, per_minute, self.clock.now())
            }
            (RateSubject::Org { org_id, .. }, OrgBuckets::Shared(l)) => l.return_cell(class, org_id),
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
    pub(crate) fn evict_full(&self) {
        let now = self.clock.now();
        for b in [
            &self.anon_verify,
            &self.anon_other,
            &self.key_lookups,
            &self.failed_clients,
        ] {
            b.evict_full(now);
        }
        self.all_key_lookups.evict_full(now);
        match &self.orgs {
            OrgBuckets::Local(b) => b.iter().for_each(|b| b.evict_full(now)),
            OrgBuckets::Shared(l) => l.evict_full(now),
        }
    }

    /// Gives back leased cells unused for a second (every one of them with `all`, as the
    /// instance stops). Nothing to do where the organizations' buckets are in memory.
    pub(crate) async fn give_back(&self, all: bool) {
        if let OrgBuckets::Shared(l) = &self.orgs {
            l.give_back(&self.clock, all).await;
        }
    }

    /// Buckets currently tracked.
    pub(crate) fn tracked(&self) -> usize {
        let orgs: usize = match &self.orgs {
            OrgBuckets::Local(b) => b.iter().map(|b| b.map.len()).sum(),
            OrgBuckets::Shared(l) => l.tracked(),
        };
        [
            &self.anon_verify,
            &self.anon_other,
            &self.key_lookups,
            &self.failed_clients,
        ]
        .iter()
        .map(|b| b.map.len())
        .sum::<usize>()
            + orgs
    }
}

/// The name of an organization's bucket for a class in the shared store.
pub(crate) fn bucket_key(org_id: &str, class: Class) -> String {
    format!("{}/{org_id}", class.as_str())
}

/// Keeps the buckets for as long as it runs: gives back unused leased cells every second,
/// and forgets full buckets every 30 s (a walk of every one, which a flood of addresses
/// makes long).
pub(crate) async fn upkeep(limits: Arc<RateLimits>) {
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

/// A clock that moves only when the test moves it.
#[cfg(test)]
#[derive(Clone, Default)]
pub(crate) struct FakeClock(Arc<std::sync::atomic::AtomicU64>);

#[cfg(test)]
impl FakeClock {
    pub(crate) fn advance(&self, d: Duration) {
        self.0.fetch_add(nanos(d), std::sync::atomic::Ordering::SeqCst);
    }
}

#[cfg(test)]
impl Clock for FakeClock {
    fn now(&self) -> Duration {
        Duration::from_nanos(self.0.load(std::sync::atomic::Ordering::SeqCst))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentid_core::domain::Gcra;

    /// Look-ups of unknown keys from distinct addresses (each within its own 60 a minute)
    /// share the service's budget: 3,000 at once, then 50 a second.
    #[test]
    fn unknown_key_lookups_from_every_address_share_one_budget() {
        let clock = FakeClock::default();
        let limits = RateLimits::with_clock(None, clock.clone());
        let address = |i: u32| IpAddr::from([0x2001, 0xdb8, (i >> 16) as u16, i as u16, 0, 0, 0, 1]);
        for i in 0..KEY_LOOKUPS_PER_MINUTE_ALL {
            assert!(limits.check_key_lookup(address(i)).allowed, "{i}");
        }
        let refused = limits.check_key_lookup(address(KEY_LOOKUPS_PER_MINUTE_ALL));
        assert!(!refused.allowed);
        assert_eq!(refused.retry_after, Some(1));
        clock.advance(Duration::from_secs(1));
        let passed = (0..60)
            .filter(|i| limits.check_key_lookup(address(100_000 + i)).allowed)
            .count();
        assert_eq!(passed, 50, "50 a second");
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
}

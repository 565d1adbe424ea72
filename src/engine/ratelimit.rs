//! Rate limits (the spec's table): per organization and endpoint class for keyed calls,
//! per client IP for anonymous ones. The buckets are `governor` GCRA limiters with a burst of
//! the per-minute limit: N calls pass at once, call N+1 waits for a cell to come back
//! (one every 60/N seconds). A background task evicts idle buckets.
//! The limiters run on the clock they are given: the monotonic default in the service, a
//! fake one that tests move by hand.

use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use dashmap::DashMap;
use governor::clock::{Clock, DefaultClock};
use governor::middleware::StateInformationMiddleware;
use governor::state::keyed::DashMapStateStore;
use governor::{Quota, RateLimiter};

/// Unauthenticated calls: the spec's lowest tier.
pub const ANON_VERIFY_PER_MINUTE: u32 = 100;
pub const ANON_OTHER_PER_MINUTE: u32 = 20;
/// Database look-ups of API keys the cache has not seen, per client address: bounds what a
/// flood of random keys costs the store. Refreshing a key the cache held is not charged.
pub const KEY_LOOKUPS_PER_MINUTE: u32 = 60;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Class {
    Verify,
    Other,
}

impl Class {
    pub fn as_str(self) -> &'static str {
        match self {
            Class::Verify => "verify",
            Class::Other => "other",
        }
    }
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

type Keyed<K, C> = RateLimiter<K, DashMapStateStore<K>, C, StateInformationMiddleware>;

fn limiter<K: std::hash::Hash + Eq + Clone, C: Clock + Clone>(per_minute: u32, clock: &C) -> Keyed<K, C> {
    let n = NonZeroU32::new(per_minute.max(1)).expect("positive");
    RateLimiter::dashmap_with_clock(Quota::per_minute(n), clock.clone())
        .with_middleware::<StateInformationMiddleware>()
}

pub struct RateLimits<C: Clock = DefaultClock> {
    clock: C,
    anon_verify: Keyed<IpAddr, C>,
    anon_other: Keyed<IpAddr, C>,
    key_lookups: Keyed<IpAddr, C>,
    /// One keyed limiter per (class, per-minute limit); organizations are its keys. An
    /// organization whose plan changes moves to the limiter of its new limit.
    orgs: DashMap<(Class, u32), Arc<Keyed<String, C>>>,
}

impl Default for RateLimits {
    fn default() -> Self {
        RateLimits::with_clock(DefaultClock::default())
    }
}

impl<C: Clock + Clone> RateLimits<C> {
    /// Limiters on `clock` (its clones share its time).
    pub fn with_clock(clock: C) -> Self {
        RateLimits {
            anon_verify: limiter(ANON_VERIFY_PER_MINUTE, &clock),
            anon_other: limiter(ANON_OTHER_PER_MINUTE, &clock),
            key_lookups: limiter(KEY_LOOKUPS_PER_MINUTE, &clock),
            orgs: DashMap::new(),
            clock,
        }
    }

    /// May this address have one more unknown key looked up in the store?
    pub fn check_key_lookup(&self, ip: IpAddr) -> Decision {
        self.decide(KEY_LOOKUPS_PER_MINUTE, self.key_lookups.check_key(&ip))
    }

    pub fn check(&self, caller: Caller<'_>, class: Class) -> Decision {
        let (limit, outcome) = match caller {
            Caller::Anonymous(ip) => {
                let (limit, lim) = match class {
                    Class::Verify => (ANON_VERIFY_PER_MINUTE, &self.anon_verify),
                    Class::Other => (ANON_OTHER_PER_MINUTE, &self.anon_other),
                };
                (limit, lim.check_key(&ip))
            }
            Caller::Org { org_id, per_minute } => {
                let lim = self
                    .orgs
                    .entry((class, per_minute))
                    .or_insert_with(|| Arc::new(limiter(per_minute, &self.clock)))
                    .clone();
                // The map's shard lock is released before the check.
                (per_minute, lim.check_key(&org_id.to_owned()))
            }
        };
        self.decide(limit, outcome)
    }

    fn decide(
        &self,
        limit: u32,
        outcome: Result<governor::middleware::StateSnapshot, governor::NotUntil<C::Instant>>,
    ) -> Decision {
        let now_unix = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        let per_cell = Duration::from_secs(60) / limit.max(1);
        match outcome {
            Ok(state) => {
                let remaining = state.remaining_burst_capacity();
                let used = limit.saturating_sub(remaining);
                Decision {
                    allowed: true,
                    limit,
                    remaining,
                    reset: ceil_secs(now_unix + per_cell * used),
                    retry_after: None,
                }
            }
            Err(not_until) => {
                let wait = not_until.wait_time_from(self.clock.now());
                Decision {
                    allowed: false,
                    limit,
                    remaining: 0,
                    reset: ceil_secs(now_unix + per_cell * limit),
                    retry_after: Some(ceil_secs(wait).max(1)),
                }
            }
        }
    }

    /// Forgets buckets that are full again (indistinguishable from new ones).
    pub fn evict_idle(&self) {
        for lim in [&self.anon_verify, &self.anon_other, &self.key_lookups] {
            lim.retain_recent();
            lim.shrink_to_fit();
        }
        for lim in self.orgs.iter() {
            lim.retain_recent();
        }
        self.orgs.retain(|_, lim| !lim.is_empty());
    }

    /// Buckets currently tracked.
    pub fn tracked(&self) -> usize {
        self.anon_verify.len()
            + self.anon_other.len()
            + self.key_lookups.len()
            + self.orgs.iter().map(|l| l.len()).sum::<usize>()
    }
}

fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// The limiters' upkeep, for as long as it runs: every `every` it evicts idle buckets, so
/// memory stays bounded however many client addresses call. Checks go straight to the
/// shared limiters (each a compare-and-swap on its bucket), so nothing else needs an owner.
pub async fn evict_idle(limits: Arc<RateLimits>, every: Duration) {
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        limits.evict_idle();
        metrics::gauge!("agentid_rate_limit_buckets").set(limits.tracked() as f64);
    }
}

#[cfg(test)]
mod tests {
    use governor::clock::FakeRelativeClock;

    use super::*;

    /// Limits on a clock that moves only when the test moves it.
    fn fake() -> (RateLimits<FakeRelativeClock>, FakeRelativeClock) {
        let clock = FakeRelativeClock::default();
        (RateLimits::with_clock(clock.clone()), clock)
    }

    #[test]
    fn exactly_n_pass_then_refusal_with_retry_after() {
        let (limits, clock) = fake();
        let org = Caller::Org {
            org_id: "org_a",
            per_minute: 5,
        };
        for i in 0..5 {
            let d = limits.check(org, Class::Other);
            assert!(d.allowed, "call {i}");
            assert_eq!(d.remaining, 4 - i);
            assert_eq!(d.limit, 5);
        }
        let refused = limits.check(org, Class::Other);
        assert!(!refused.allowed);
        assert_eq!(refused.remaining, 0);
        assert_eq!(refused.retry_after, Some(12), "one cell every 60/5 s");
        // A cell comes back 12 s after the first call, and only one.
        clock.advance(Duration::from_millis(11_999));
        assert!(!limits.check(org, Class::Other).allowed);
        clock.advance(Duration::from_millis(1));
        let back = limits.check(org, Class::Other);
        assert!(back.allowed);
        assert_eq!(back.remaining, 0);
        assert!(!limits.check(org, Class::Other).allowed);
        // Buckets are per organization and per class.
        assert!(limits.check(org, Class::Verify).allowed);
        assert!(
            limits
                .check(
                    Caller::Org {
                        org_id: "org_b",
                        per_minute: 5
                    },
                    Class::Other
                )
                .allowed
        );
    }

    #[test]
    fn anonymous_callers_are_limited_per_address() {
        let (limits, _clock) = fake();
        let a = Caller::Anonymous("10.0.0.1".parse().unwrap());
        let b = Caller::Anonymous("10.0.0.2".parse().unwrap());
        for _ in 0..ANON_OTHER_PER_MINUTE {
            assert!(limits.check(a, Class::Other).allowed);
        }
        assert!(!limits.check(a, Class::Other).allowed);
        assert!(limits.check(b, Class::Other).allowed);
        assert_eq!(limits.check(a, Class::Verify).limit, ANON_VERIFY_PER_MINUTE);
    }

    #[test]
    fn idle_buckets_are_evicted() {
        let (limits, clock) = fake();
        let ids: Vec<String> = (0..1000).map(|i| format!("org_{i}")).collect();
        for id in &ids {
            // At 6000/min a cell comes back every 10 ms: after one call the bucket is full
            // (indistinguishable from a new one) within 20 ms.
            limits.check(
                Caller::Org {
                    org_id: id,
                    per_minute: 6000,
                },
                Class::Verify,
            );
        }
        limits.check(Caller::Anonymous("10.0.0.9".parse().unwrap()), Class::Verify);
        assert_eq!(limits.tracked(), 1001);
        // 5 ms on, no organization's bucket is full yet.
        clock.advance(Duration::from_millis(5));
        limits.evict_idle();
        assert_eq!(limits.tracked(), 1001);
        clock.advance(Duration::from_millis(45));
        limits.evict_idle();
        assert_eq!(
            limits.tracked(),
            1,
            "only the anonymous bucket (0.6 s per cell) is still draining"
        );
    }
}

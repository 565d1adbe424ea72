//! Buckets kept in this process: anonymous addresses, the key look-up budget, and
//! organizations on a store that serves one instance.

use std::net::IpAddr;
use std::time::Duration;

use dashmap::DashMap;

use super::{decision, nanos, Decision};
use agentid_core::domain::Gcra;

/// Buckets kept in this process, by key; each entry is its limit and `tat`.
pub(crate) struct LocalBuckets<K> {
    pub(crate) map: DashMap<K, (u32, u64)>,
}

impl<K: std::hash::Hash + Eq> LocalBuckets<K> {
    pub(crate) fn new() -> Self {
        LocalBuckets { map: DashMap::new() }
    }

    /// Takes a cell (`take`) or only looks. A key is copied only for a bucket seen first.
    pub fn check<Q>(&self, key: &Q, limit: u32, now: Duration, take: bool) -> Decision
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

    /// Gives back one cell taken from `key`'s bucket (a call that turned out not to count).
    pub(crate) fn give_back<Q>(&self, key: &Q, limit: u32, now: Duration)
    where
        K: std::borrow::Borrow<Q>,
        Q: std::hash::Hash + Eq + ?Sized,
    {
        if let Some(mut entry) = self.map.get_mut(key) {
            let back = entry.1.saturating_sub(Gcra { limit }.interval());
            entry.1 = back.max(nanos(now));
        }
    }

    /// Forgets buckets that are full again (indistinguishable from new ones).
    pub(crate) fn evict_full(&self, now: Duration) {
        let now = nanos(now);
        self.map.retain(|_, (_, tat)| *tat > now);
        self.map.shrink_to_fit();
    }
}

/// The key of an anonymous caller's buckets: its IPv4 address, or the /64 of its IPv6 one
/// (a single host commonly holds a whole /64).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct AddressKey(IpAddr);

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ratelimit::{Clock, FakeClock};

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
}

//! GCRA, the arithmetic of every rate-limit bucket: in memory (`engine::ratelimit`) and in
//! the buckets a fleet shares in the database (`store`).

/// The GCRA arithmetic of a bucket of `limit` cells a minute (burst `limit`), on times in
/// nanoseconds. A bucket is its theoretical arrival time `tat`: taking a cell moves it one
/// emission interval on from `max(tat, now)`, and a cell can be taken while that stays
/// within a minute of `now`. The bucket is full when `tat <= now`.
#[derive(Debug, Clone, Copy)]
pub struct Gcra {
    pub limit: u32,
}

impl Gcra {
    /// Nanoseconds per cell.
    pub fn interval(self) -> u64 {
        60_000_000_000 / u64::from(self.limit.max(1))
    }

    /// How far `tat` may run ahead of now.
    fn window(self) -> u64 {
        self.interval() * u64::from(self.limit.max(1))
    }

    /// Cells a bucket at `tat` holds at `now`.
    pub fn available(self, tat: u64, now: u64) -> u32 {
        let used = tat.saturating_sub(now);
        ((self.window().saturating_sub(used)) / self.interval()).min(u64::from(self.limit)) as u32
    }

    /// Takes up to `want` cells: how many, and the bucket after.
    pub fn take(self, tat: u64, now: u64, want: u32) -> (u32, u64) {
        let granted = want.min(self.available(tat, now));
        (granted, tat.max(now) + u64::from(granted) * self.interval())
    }

    /// Nanoseconds until a bucket at `tat` holds a cell again (0 when it holds one).
    pub fn wait(self, tat: u64, now: u64) -> u64 {
        (tat + self.interval()).saturating_sub(now + self.window())
    }
}

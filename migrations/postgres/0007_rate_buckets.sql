-- Rate-limit buckets the instances of a fleet share (src/engine/ratelimit.rs): one row per
-- organization and endpoint class, its GCRA theoretical arrival time `tat` in nanoseconds on
-- the database's clock, with what the last lease took (`granted`, at `at`). Instances lease
-- cells from it instead of asking for every call. Unlogged: after a crash the buckets start
-- full again, which costs nothing worth a WAL record per lease.
CREATE UNLOGGED TABLE rate_buckets (
    bucket  TEXT PRIMARY KEY,
    tat     BIGINT NOT NULL,
    granted BIGINT NOT NULL,
    at      BIGINT NOT NULL
);

//! The rate-limit buckets every instance of a fleet shares.

use std::time::Duration;

use super::PgStore;
use crate::{SharedBuckets, StoreFuture, Taken};
use agentid_core::domain::Gcra;

/// Takes up to $3 cells from the bucket $1 of $2 cells a minute ($4 nanoseconds a cell), on
/// the database's clock, so that every instance runs on the same one. A bucket is created
/// full. All of `SET` reads the row as it was: `granted` is what `tat` moves by.
const TAKE_CELLS: &str = "
INSERT INTO rate_buckets AS b (bucket, tat, granted, at)
SELECT $1, n + LEAST($3, $2) * $4, LEAST($3, $2), n
FROM (SELECT (EXTRACT(EPOCH FROM clock_timestamp()) * 1000000000)::bigint AS n) c
ON CONFLICT (bucket) DO UPDATE SET
    granted = GREATEST(0, LEAST($3, (EXCLUDED.at + $2 * $4 - GREATEST(b.tat, EXCLUDED.at)) / $4)),
    tat = GREATEST(b.tat, EXCLUDED.at)
        + GREATEST(0, LEAST($3, (EXCLUDED.at + $2 * $4 - GREATEST(b.tat, EXCLUDED.at)) / $4)) * $4,
    at = EXCLUDED.at
RETURNING granted, tat, at";

row! {
    struct TakenRow {
        granted: i64, tat: i64, at: i64,
    }
}

impl SharedBuckets for PgStore {
    fn take_cells<'a>(&'a self, bucket: &'a str, limit: u32, want: u32) -> StoreFuture<'a, Taken> {
        Box::pin(async move {
            let g = Gcra { limit };
            let row: TakenRow = sqlx::query_as(TAKE_CELLS)
                .bind(bucket)
                .bind(i64::from(limit))
                .bind(i64::from(want))
                .bind(g.interval() as i64)
                .fetch_one(&self.pool)
                .await?;
            let (tat, at) = (row.tat.max(0) as u64, row.at.max(0) as u64);
            let granted = u32::try_from(row.granted).unwrap_or(0);
            Ok(Taken {
                granted,
                remaining: g.available(tat, at),
                full_in: Duration::from_nanos(tat.saturating_sub(at)),
                retry_in: Duration::from_nanos(if granted == 0 { g.wait(tat, at) } else { 0 }),
            })
        })
    }

    fn return_cells<'a>(&'a self, bucket: &'a str, limit: u32, cells: u32) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let back = i64::from(cells) * Gcra { limit }.interval() as i64;
            sqlx::query("UPDATE rate_buckets SET tat = tat - $2 WHERE bucket = $1")
                .bind(bucket)
                .bind(back)
                .execute(&self.pool)
                .await?;
            Ok(())
        })
    }
}

//! The SQL of `crate::sql` for one backend: `DB` is its database.

use crate::{PoolStats, SharedBuckets, Store, StoreError, StoreFuture};
use futures_util::future::BoxFuture;

use crate::sql::{Backend, SqlStore};

use super::DB;

impl SqlStore<DB> {
    /// A connection of the main pool. During an outage (no connection to be had: a
    /// failover's gap) it tries again until the outage's wait ends; nothing was sent yet, so this
    /// holds for writes as well as reads.
    pub(crate) async fn conn(&self) -> Result<sqlx::pool::PoolConnection<DB>, StoreError> {
        self.outage
            .ride_out(|| async { self.pool.acquire().await.map_err(|e| self.acquire_error(e)) })
            .await
    }

    /// Why no connection was had: a pool timeout while every connection the pool may open is
    /// open and in use is [`StoreError::Busy`] (callers waiting on each other, not an outage:
    /// no outage wait, and no retry that would add to the queue); anything else as it comes.
    pub(crate) fn acquire_error(&self, e: sqlx::Error) -> StoreError {
        let full = self.pool.size() >= self.pool.options().get_max_connections() && self.pool.num_idle() == 0;
        if matches!(e, sqlx::Error::PoolTimedOut) && full {
            metrics::counter!("agentid_store_busy_total").increment(1);
            StoreError::Busy
        } else {
            e.into()
        }
    }

    /// Opens a transaction on the main pool. During an outage (no connection, a node that
    /// is shutting down) it tries again until the outage's wait ends: nothing was sent yet.
    /// The writes run their whole transaction in `Outage::ride_out` too, ending it with
    /// [`commit`]: one that fails before its COMMIT wrote nothing and runs again; one whose
    /// COMMIT broke is `OutcomeUnknown`, and does not.
    pub(crate) async fn begin(&self) -> Result<sqlx::Transaction<'static, DB>, StoreError> {
        self.outage
            .ride_out(|| async { self.pool.begin().await.map_err(|e| self.acquire_error(e)) })
            .await
    }

    /// Opens a transaction that writes what it read, as [`SqlStore::begin`] does: SQLite's
    /// takes the write lock first (a deferred one that reads first cannot write once another
    /// writer committed meanwhile); PostgreSQL's is an ordinary one, without the exclusive lock.
    pub(crate) async fn writing(&self) -> Result<sqlx::Transaction<'static, DB>, StoreError> {
        self.outage
            .ride_out(|| async {
                self.pool
                    .begin_with(DB::EXCLUSIVE.begin)
                    .await
                    .map_err(|e| self.acquire_error(e))
            })
            .await
    }

    /// Opens an exclusive transaction (`Backend::EXCLUSIVE`), as [`SqlStore::begin`] does.
    pub(crate) async fn exclusive(&self) -> Result<sqlx::Transaction<'static, DB>, StoreError> {
        self.outage
            .ride_out(|| async {
                let mut tx = self
                    .pool
                    .begin_with(DB::EXCLUSIVE.begin)
                    .await
                    .map_err(|e| self.acquire_error(e))?;
                sqlx::query(DB::EXCLUSIVE.lock).execute(&mut *tx).await?;
                Ok(tx)
            })
            .await
    }
}

impl Store for SqlStore<DB> {
    fn backend(&self) -> &'static str {
        DB::BACKEND
    }

    fn pool_stats(&self) -> Vec<PoolStats> {
        DB::pools(self)
    }

    fn ping(&self) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            sqlx::query("SELECT 1").execute(&self.pool).await?;
            Ok(())
        })
    }

    fn close(&self) -> BoxFuture<'_, ()> {
        DB::close(self)
    }

    fn shared_buckets(&self) -> Option<&dyn SharedBuckets> {
        DB::shared_buckets(self)
    }
}

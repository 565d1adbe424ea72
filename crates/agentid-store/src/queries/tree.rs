//! The SQL of `crate::tree` for one backend: `DB` is its database.

use crate::block::{self, StoredBlock};
use crate::sql::{seq_i64, Backend, SqlStore};
use crate::{StoreError, StoreFuture, StoredCheckpoint};
use agentid_core::domain::Ledger;
use agentid_core::tlog::tree::{Hash, Subtree};

use crate::tree::{Added, CheckpointRow, TreeStore, CHECKPOINT_COLUMNS, NODES_PER_INSERT, RANGE_BLOCKS_SQL};

use super::DB;

impl TreeStore for SqlStore<DB> {
    fn record_hashes<'a>(&'a self, ledger: &'a Ledger, first: u64, last: u64) -> StoreFuture<'a, Vec<Hash>> {
        Box::pin(async move {
            let (first, last) = (seq_i64(first)?, seq_i64(last)?);
            // From the record before the first: each block read must follow the one before
            // it in the chain, that record's block included.
            let from = (first - 1).max(1);
            let blocks: Vec<StoredBlock> = sqlx::query_as(RANGE_BLOCKS_SQL)
                .bind(ledger.org_id.as_str())
                .bind(ledger.mode.as_str())
                .bind(from)
                .bind(last)
                .fetch_all(&mut *self.conn().await?)
                .await?;
            let mut out = Vec::with_capacity(usize::try_from(last - first + 1).unwrap_or(0).min(1 << 20));
            let (mut next, mut chain) = (from, None);
            for b in blocks.iter().filter(|b| b.last_seq >= from) {
                if b.first_seq > next {
                    return Err(StoreError::Corrupt(format!(
                        "ledger {ledger}: no block holds seq {next} (the next starts at {})",
                        b.first_seq
                    )));
                }
                block::chained_hashes(b, first..=last, &mut out, &mut chain).map_err(|e| match e {
                    StoreError::Corrupt(why) => StoreError::Corrupt(format!("ledger {ledger}: {why}")),
                    e => e,
                })?;
                next = b.last_seq + 1;
            }
            Ok(out)
        })
    }

    fn tree_nodes<'a>(
        &'a self,
        ledger: &'a Ledger,
        height: u32,
        indices: std::ops::Range<u64>,
    ) -> StoreFuture<'a, Vec<(u64, Vec<u8>)>> {
        Box::pin(async move {
            let rows: Vec<(i64, Vec<u8>)> = sqlx::query_as(
                "SELECT idx, hash FROM audit_tree_nodes WHERE org_id = $1 AND mode = $2 AND height = $3 \
                 AND idx >= $4 AND idx < $5 ORDER BY idx",
            )
            .bind(ledger.org_id.as_str())
            .bind(ledger.mode.as_str())
            .bind(i64::from(height))
            .bind(seq_i64(indices.start)?)
            .bind(seq_i64(indices.end)?)
            .fetch_all(&mut *self.conn().await?)
            .await?;
            Ok(rows.into_iter().map(|(i, h)| (i as u64, h)).collect())
        })
    }

    fn latest_checkpoints<'a>(
        &'a self,
        ledger: &'a Ledger,
        at_most: u64,
        limit: u32,
    ) -> StoreFuture<'a, Vec<StoredCheckpoint>> {
        Box::pin(async move {
            let rows: Vec<CheckpointRow> = sqlx::query_as(&format!(
                "SELECT {CHECKPOINT_COLUMNS} FROM audit_checkpoints WHERE org_id = $1 AND mode = $2 \
                 AND tree_size <= $3 AND {} ORDER BY tree_size DESC LIMIT $4",
                DB::READABLE_CHECKPOINT
            ))
            .bind(ledger.org_id.as_str())
            .bind(ledger.mode.as_str())
            .bind(i64::try_from(at_most).unwrap_or(i64::MAX))
            .bind(i64::from(limit))
            .fetch_all(&mut *self.conn().await?)
            .await?;
            rows.into_iter().map(CheckpointRow::into_record).collect()
        })
    }

    fn checkpoints<'a>(&'a self, ledger: &'a Ledger) -> StoreFuture<'a, Vec<StoredCheckpoint>> {
        Box::pin(async move {
            let rows: Vec<CheckpointRow> = sqlx::query_as(&format!(
                "SELECT {CHECKPOINT_COLUMNS} FROM audit_checkpoints WHERE org_id = $1 AND mode = $2 \
                 AND {} ORDER BY tree_size",
                DB::READABLE_CHECKPOINT
            ))
            .bind(ledger.org_id.as_str())
            .bind(ledger.mode.as_str())
            .fetch_all(&mut *self.conn().await?)
            .await?;
            rows.into_iter().map(CheckpointRow::into_record).collect()
        })
    }

    fn add_checkpoint<'a>(
        &'a self,
        cp: &'a StoredCheckpoint,
        after: u64,
        nodes: &'a [(Subtree, Hash)],
        ours: &'a (dyn Fn(&StoredCheckpoint) -> bool + Send + Sync),
    ) -> StoreFuture<'a, Added> {
        Box::pin(async move {
            let (org, mode) = (cp.ledger.org_id.as_str(), cp.ledger.mode.as_str());
            let mut tx = self
                .pool
                .begin_with(DB::EXCLUSIVE.begin)
                .await
                .map_err(|e| self.acquire_error(e))?;
            if let Some(lock) = DB::CHECKPOINT_LOCK {
                sqlx::query(lock).bind(org).bind(mode).execute(&mut *tx).await?;
            }
            let past: Vec<CheckpointRow> = sqlx::query_as(&format!(
                "SELECT {CHECKPOINT_COLUMNS} FROM audit_checkpoints WHERE org_id = $1 AND mode = $2 \
                 AND tree_size > $3 AND {} ORDER BY tree_size",
                DB::READABLE_CHECKPOINT
            ))
            .bind(org)
            .bind(mode)
            .bind(seq_i64(after)?)
            .fetch_all(&mut *tx)
            .await?;
            for row in past {
                if row.into_record().is_ok_and(|c| ours(&c)) {
                    return Ok(Added::Raced);
                }
            }
            // Any row at the size takes it, one that does not decode too (counted, not read).
            let (taken,): (i64,) = sqlx::query_as(
                "SELECT COUNT(*) FROM audit_checkpoints WHERE org_id = $1 AND mode = $2 AND tree_size = $3",
            )
            .bind(org)
            .bind(mode)
            .bind(seq_i64(cp.size)?)
            .fetch_one(&mut *tx)
            .await?;
            if taken > 0 {
                return Ok(Added::SizeTaken);
            }
            // What is stored already where this tree's subtrees go: only junk can be (rows are
            // written with their checkpoint, and this tree's checkpoint is not stored yet).
            let mut held = std::collections::HashMap::new();
            let mut heights: Vec<u32> = nodes.iter().map(|(s, _)| s.height).collect();
            heights.sort_unstable();
            heights.dedup();
            for height in heights {
                let at = nodes
                    .iter()
                    .filter(|(s, _)| s.height == height)
                    .map(|(s, _)| s.index);
                let (lo, hi) = (at.clone().min().unwrap_or(0), at.max().unwrap_or(0));
                let rows: Vec<(i64, Vec<u8>)> = sqlx::query_as(
                    "SELECT idx, hash FROM audit_tree_nodes WHERE org_id = $1 AND mode = $2 \
                     AND height = $3 AND idx >= $4 AND idx <= $5",
                )
                .bind(org)
                .bind(mode)
                .bind(i64::from(height))
                .bind(seq_i64(lo)?)
                .bind(seq_i64(hi)?)
                .fetch_all(&mut *tx)
                .await?;
                for (idx, hash) in rows {
                    held.insert((height, idx as u64), hash);
                }
            }
            let mut foreign = Vec::new();
            let fresh: Vec<&(Subtree, Hash)> = nodes
                .iter()
                .filter(|(s, h)| match held.get(&(s.height, s.index)) {
                    None => true,
                    Some(stored) => {
                        if stored[..] != h[..] {
                            foreign.push(*s);
                        }
                        false
                    }
                })
                .collect();
            for chunk in fresh.chunks(NODES_PER_INSERT) {
                let mut sql =
                    String::from("INSERT INTO audit_tree_nodes (org_id, mode, height, idx, hash) VALUES ");
                for i in 0..chunk.len() {
                    use std::fmt::Write as _;
                    let p = 3 + 3 * i;
                    let sep = if i == 0 { "" } else { ", " };
                    let _ = write!(sql, "{sep}($1, $2, ${p}, ${}, ${})", p + 1, p + 2);
                }
                let mut q = sqlx::query(&sql).bind(org).bind(mode);
                for (s, h) in chunk {
                    q = q.bind(i64::from(s.height)).bind(seq_i64(s.index)?).bind(&h[..]);
                }
                q.execute(&mut *tx).await?;
            }
            sqlx::query(&format!(
                "INSERT INTO audit_checkpoints ({CHECKPOINT_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6)"
            ))
            .bind(org)
            .bind(mode)
            .bind(seq_i64(cp.size)?)
            .bind(&cp.root[..])
            .bind(cp.note.as_str())
            .bind(cp.created_at.0)
            .execute(&mut *tx)
            .await?;
            tx.commit().await?;
            Ok(Added::Stored(foreign))
        })
    }
}

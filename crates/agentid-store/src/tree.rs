//! Each ledger's Merkle tree as stored: the leaves (record hashes, read from the blocks),
//! the subtree hashes checkpoints completed, and the signed checkpoints.

use sqlx::{ColumnIndex, Decode, Encode, Executor, IntoArguments, Type};

use super::block::{self, StoredBlock};
use super::sql::{hash32, parse_mode, seq_i64, Backend, SqlStore};
use super::{StoreError, StoreFuture, StoredCheckpoint};
use agentid_core::domain::{Ledger, Millis};
use agentid_core::tlog::tree::{Hash, Subtree};

/// The leaves, subtree hashes and checkpoints of each ledger's tree.
pub trait TreeStore {
    /// The record hashes of `seq` `first..=last` of a ledger, in order: the leaves of its
    /// Merkle tree. Fewer when the ledger ends before `last`; `Corrupt` at a gap.
    fn record_hashes<'a>(&'a self, ledger: &'a Ledger, first: u64, last: u64) -> StoreFuture<'a, Vec<Hash>>;
    /// Stored subtree hashes of one height with an index in `indices`, in order, as stored
    /// (a row the service did not write may hold anything: callers compare or check them).
    fn tree_nodes<'a>(
        &'a self,
        ledger: &'a Ledger,
        height: u32,
        indices: std::ops::Range<u64>,
    ) -> StoreFuture<'a, Vec<(u64, Vec<u8>)>>;
    /// The checkpoint of the largest tree of a ledger.
    /// Up to `limit` stored checkpoints of a ledger of at most `at_most` records, largest first.
    /// Rows are as stored: the caller tells the log key's from junk.
    fn latest_checkpoints<'a>(
        &'a self,
        ledger: &'a Ledger,
        at_most: u64,
        limit: u32,
    ) -> StoreFuture<'a, Vec<StoredCheckpoint>>;
    /// Every checkpoint of a ledger, smallest tree first.
    fn checkpoints<'a>(&'a self, ledger: &'a Ledger) -> StoreFuture<'a, Vec<StoredCheckpoint>>;
    /// Stores a checkpoint and the subtree hashes its tree completed since the tree of
    /// `after` leaves, in one transaction, unless a checkpoint of more than `after` records
    /// that `ours` accepts is stored already (another instance got there first). Rows `ours`
    /// refuses are junk: passed over, unless one holds this checkpoint's size. A subtree
    /// already stored is not written again (rows are never replaced): `Stored` lists those
    /// stored with another hash than the tree's, which the service did not write.
    fn add_checkpoint<'a>(
        &'a self,
        checkpoint: &'a StoredCheckpoint,
        after: u64,
        nodes: &'a [(Subtree, Hash)],
        ours: &'a (dyn Fn(&StoredCheckpoint) -> bool + Send + Sync),
    ) -> StoreFuture<'a, Added>;
}

/// What `add_checkpoint` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Added {
    /// Stored; with the subtrees found stored already with another hash.
    Stored(Vec<Subtree>),
    /// Nothing written: another instance stored a checkpoint past `after` first.
    Raced,
    /// Nothing written: a junk row holds this checkpoint's size.
    SizeTaken,
}

/// The blocks holding `seq` `$3..=$4` of a ledger, oldest first; binds org, mode, first, last.
const RANGE_BLOCKS_SQL: &str = "SELECT first_seq, last_seq, prev_hash, records FROM audit_blocks \
    WHERE org_id = $1 AND mode = $2 AND first_seq >= COALESCE((SELECT MAX(first_seq) FROM audit_blocks \
    WHERE org_id = $1 AND mode = $2 AND first_seq <= $3), 0) AND first_seq <= $4 ORDER BY first_seq";

const CHECKPOINT_COLUMNS: &str = "org_id, mode, tree_size, root, note, created_at";

row! {
    pub(crate) struct CheckpointRow {
        org_id: String,
        mode: String,
        tree_size: i64,
        root: Vec<u8>,
        note: String,
        created_at: i64,
    }
}

impl CheckpointRow {
    fn into_record(self) -> Result<StoredCheckpoint, StoreError> {
        Ok(StoredCheckpoint {
            ledger: Ledger {
                mode: parse_mode(&self.mode)?,
                org_id: self.org_id,
            },
            size: u64::try_from(self.tree_size)
                .map_err(|_| StoreError::Corrupt("checkpoint tree size".into()))?,
            root: hash32(self.root)?,
            note: self.note,
            created_at: Millis(self.created_at),
        })
    }
}

/// Stored subtree hashes go in statements of this many rows.
const NODES_PER_INSERT: usize = 200;

impl<DB: Backend> TreeStore for SqlStore<DB>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> &'q [u8]: Encode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
    for<'r> String: Decode<'r, DB> + Type<DB>,
    for<'r> Vec<u8>: Decode<'r, DB> + Type<DB>,
    for<'r> i64: Decode<'r, DB> + Type<DB>,
    for<'r> &'r str: ColumnIndex<DB::Row>,
    usize: ColumnIndex<DB::Row>,
{
    fn record_hashes<'a>(&'a self, ledger: &'a Ledger, first: u64, last: u64) -> StoreFuture<'a, Vec<Hash>> {
        Box::pin(async move {
            let (first, last) = (seq_i64(first)?, seq_i64(last)?);
            let blocks: Vec<StoredBlock> = sqlx::query_as(RANGE_BLOCKS_SQL)
                .bind(ledger.org_id.as_str())
                .bind(ledger.mode.as_str())
                .bind(first)
                .bind(last)
                .fetch_all(&mut *self.conn().await?)
                .await?;
            let mut out = Vec::with_capacity(usize::try_from(last - first + 1).unwrap_or(0).min(1 << 20));
            let mut next = first;
            for b in blocks.iter().filter(|b| b.last_seq >= first) {
                if b.first_seq > next {
                    return Err(StoreError::Corrupt(format!(
                        "ledger {ledger}: no block holds seq {next} (the next starts at {})",
                        b.first_seq
                    )));
                }
                block::record_hashes(b, next..=last, &mut out)?;
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
                 AND tree_size <= $3 ORDER BY tree_size DESC LIMIT $4"
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
                 ORDER BY tree_size"
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
                 AND tree_size > $3 ORDER BY tree_size"
            ))
            .bind(org)
            .bind(mode)
            .bind(seq_i64(after)?)
            .fetch_all(&mut *tx)
            .await?;
            let mut taken = false;
            for row in past {
                taken |= row.tree_size == seq_i64(cp.size)?;
                if row.into_record().is_ok_and(|c| ours(&c)) {
                    return Ok(Added::Raced);
                }
            }
            if taken {
                return Ok(Added::SizeTaken);
            }
            // What is stored already where this tree's subtrees go: only junk can be (rows are
            // written with their checkpoint, and this tree's checkpoint is not stored yet).
            let mut held = std::collections::HashMap::new();
            let mut heights: Vec<u32> = nodes.iter().map(|(s, _)| s.height).collect();
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

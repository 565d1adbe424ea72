//! Each ledger's Merkle tree as stored: the leaves (record hashes, read from the blocks),
//! the subtree hashes checkpoints completed, and the signed checkpoints.

use super::sql::{hash32, parse_mode};
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

/// Every block holding any `seq` of `$3..=$4` of a ledger, oldest first; binds org, mode,
/// first, last. A block holds at most `BLOCK_MAX` (128) records, so one holding `$3` starts
/// no earlier than 127 before it; a row that overlaps another is read too, and breaks the
/// chain its reader checks.
pub(crate) const RANGE_BLOCKS_SQL: &str = "SELECT first_seq, last_seq, prev_hash, records FROM audit_blocks \
    WHERE org_id = $1 AND mode = $2 AND first_seq > $3 - 128 AND first_seq <= $4 AND last_seq >= $3 \
    ORDER BY first_seq";

row! {
    pub(crate) struct CheckpointRow {
        org_id: String, mode: String, tree_size: i64, root: Vec<u8>, note: String, created_at: i64,
    }
}

pub(crate) const CHECKPOINT_COLUMNS: &str = CheckpointRow::COLUMNS;

impl CheckpointRow {
    pub(crate) fn into_record(self) -> Result<StoredCheckpoint, StoreError> {
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
pub(crate) const NODES_PER_INSERT: usize = 200;

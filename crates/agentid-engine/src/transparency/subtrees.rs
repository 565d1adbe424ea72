//! The hashes of a ledger's subtrees, read from the stored nodes (one per
//! `tree::STORED_EVERY` levels) and the records at a range's edges: what checkpoints store
//! and proofs are made of.

use std::ops::Range;

use agentid_core::domain::Ledger;
use agentid_core::tlog::tree::{self, Hash, Parts, Subtree};
use agentid_store::{SharedStore, StoreError};

/// The hash of a range a proof names, from the stored subtree hashes (and at most a few
/// records at its edges): one small read per subtree it splits into.
pub(super) async fn range_hash(
    store: &SharedStore,
    ledger: &Ledger,
    range: Range<u64>,
) -> Result<Hash, StoreError> {
    Ok(tree::fold(&subtree_hashes(store, ledger, range).await?))
}

/// The hashes of the subtrees a range splits into (`tree::subtrees`), in order.
pub(super) async fn subtree_hashes(
    store: &SharedStore,
    ledger: &Ledger,
    range: Range<u64>,
) -> Result<Vec<Hash>, StoreError> {
    let mut hashes = Vec::new();
    for s in tree::subtrees(range) {
        hashes.push(subtree_hash(store, ledger, s).await?);
    }
    Ok(hashes)
}

async fn subtree_hash(store: &SharedStore, ledger: &Ledger, s: Subtree) -> Result<Hash, StoreError> {
    let parts: Vec<Hash> = match s.parts() {
        Parts::Leaves(r) => {
            let records = store.record_hashes(ledger, r.start + 1, r.end).await?;
            records.iter().map(tree::leaf_hash).collect()
        }
        Parts::Nodes { height, indices } => {
            let rows = store.tree_nodes(ledger, height, indices.clone()).await?;
            rows.into_iter()
                .map(|(i, h)| {
                    h.try_into().map_err(|_| {
                        StoreError::Corrupt(format!(
                            "ledger {ledger}: the stored hash of subtree {height}@{i} is not 32 bytes"
                        ))
                    })
                })
                .collect::<Result<_, _>>()?
        }
    };
    let want = 1usize << (s.height % tree::STORED_EVERY);
    if parts.len() != want {
        return Err(StoreError::Corrupt(format!(
            "ledger {ledger}: the stored hashes of subtree {}@{} are incomplete",
            s.height, s.index
        )));
    }
    Ok(tree::perfect(&parts))
}

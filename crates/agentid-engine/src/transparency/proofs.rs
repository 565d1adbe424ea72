//! Inclusion and consistency proofs (RFC 9162 §2.1.3, §2.1.4), up to the latest checkpoint,
//! from stored subtree hashes: a proof is O(log n) small reads.

use std::ops::Range;

use agentid_core::domain::Ledger;
use agentid_core::tlog::tree::{self, Hash, Parts, Subtree};
use agentid_store::{SharedStore, StoreError};

use super::checkpointer::Transparency;

/// Why a proof was not given.
#[derive(Debug, thiserror::Error)]
pub enum ProofRefused {
    #[error("{0}")]
    OutOfRange(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl Transparency {
    /// The inclusion proof of record `seq` in the tree of `size` records, and its hash.
    pub async fn inclusion(
        &self,
        ledger: &Ledger,
        seq: u64,
        size: u64,
    ) -> Result<(Hash, Vec<Hash>), ProofRefused> {
        let latest = self.latest_size(ledger).await?;
        if !(1 <= seq && seq <= size && size <= latest) {
            return Err(ProofRefused::OutOfRange(format!(
                "need 1 ≤ seq ≤ tree_size ≤ {latest} (the latest checkpoint's size)"
            )));
        }
        let leaf = self.store.record_hashes(ledger, seq, seq).await?;
        let leaf = *leaf
            .first()
            .ok_or_else(|| StoreError::Corrupt(format!("record {seq} is missing")))?;
        let mut proof = Vec::new();
        for r in tree::inclusion_ranges(seq - 1, size) {
            proof.push(range_hash(&self.store, ledger, r).await?);
        }
        Ok((leaf, proof))
    }

    /// The consistency proof from the tree of `from` records to that of `to`.
    pub async fn consistency(&self, ledger: &Ledger, from: u64, to: u64) -> Result<Vec<Hash>, ProofRefused> {
        let latest = self.latest_size(ledger).await?;
        if !(1 <= from && from <= to && to <= latest) {
            return Err(ProofRefused::OutOfRange(format!(
                "need 1 ≤ from ≤ to ≤ {latest} (the latest checkpoint's size)"
            )));
        }
        let mut proof = Vec::new();
        for r in tree::consistency_ranges(from, to) {
            proof.push(range_hash(&self.store, ledger, r).await?);
        }
        Ok(proof)
    }

    async fn latest_size(&self, ledger: &Ledger) -> Result<u64, StoreError> {
        let size = self.store.ledger_size(ledger).await?;
        Ok(self
            .latest_signed(ledger, size, false)
            .await?
            .map_or(0, |c| c.size))
    }
}

/// The hash of a range a proof names, from the stored subtree hashes (and at most a few
/// records at its edges): one small read per subtree it splits into.
async fn range_hash(store: &SharedStore, ledger: &Ledger, range: Range<u64>) -> Result<Hash, StoreError> {
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

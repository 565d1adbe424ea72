//! Inclusion and consistency proofs (RFC 9162 §2.1.3, §2.1.4), up to the latest checkpoint,
//! from stored subtree hashes: a proof is O(log n) small reads.

use agentid_core::domain::Ledger;
use agentid_core::tlog::tree::{self, Hash};
use agentid_store::StoreError;

use super::checkpointer::Transparency;
use super::subtrees::range_hash;

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

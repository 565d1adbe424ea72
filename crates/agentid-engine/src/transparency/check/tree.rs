//! `audit verify` over a ledger's Merkle tree: its growth record by record, the stored
//! subtree hashes, and what each checkpoint commits to besides the records.

use super::*;

impl LedgerCheck<'_> {
    pub(super) fn grow_tree(
        &mut self,
        r: &AuditRecord,
        walk: &mut Walk,
        pending: &mut std::iter::Peekable<impl Iterator<Item = Claim>>,
    ) {
        let Some(tree) = walk.tree.as_mut() else { return };
        let nodes = &mut walk.nodes;
        tree.push(&r.hash, |s, h| nodes.push((s, h)));
        let size = tree.size();
        let root = pending
            .peek()
            .is_some_and(|c| c.size <= size)
            .then(|| tree.root());
        while let Some(claim) = pending.next_if(|c| c.size <= size) {
            if claim.size < size {
                // Passed while the tree was broken: reported at the end as not recomputable.
                self.fail(
                    None,
                    format!(
                        "{}: its root cannot be recomputed past a missing or unreadable record",
                        claim.source
                    ),
                );
            } else if root.as_ref() != Some(&claim.root) {
                self.fail(
                    Some(size),
                    format!(
                        "{}: the tree of the first {size} records has another root (records were rewritten)",
                        claim.source
                    ),
                );
            } else {
                self.summary.checkpoints += 1;
            }
        }
    }

    /// Whether the database still holds the revocations and key retirements each checkpoint
    /// commits to: one undone (an earlier row put back) is a failure.
    pub(super) async fn check_commitments(&mut self, claims: &[Claim]) -> Result<(), StoreError> {
        let lists = committed_lists(self.store, &self.ledger).await?;
        for claim in claims {
            let c = match Commitments::parse(&claim.extensions) {
                Ok(Some(c)) => c,
                Ok(None) => continue,
                Err(e) => {
                    self.fail(None, format!("{}: {e}", claim.source));
                    continue;
                }
            };
            if !commit::holds(List::Revocations, &lists.revocations, &c.revocations) {
                self.fail(
                    None,
                    format!(
                        "{}: it commits to {} revocations of this ledger, which the database no longer holds \
                         (it holds {}): a revocation was undone",
                        claim.source,
                        c.revocations.count,
                        lists.revocations.len()
                    ),
                );
            }
            if !commit::holds(List::Domains, &lists.domains, &c.domains) {
                self.fail(
                    None,
                    format!(
                        "{}: it commits to {} issuer-domain events, which the database no longer holds \
                         (it holds {}): who holds a name was rewritten",
                        claim.source,
                        c.domains.count,
                        lists.domains.len()
                    ),
                );
            }
            if !commit::holds(List::RetiredKeys, &lists.retired_keys, &c.retired_keys) {
                self.fail(
                    None,
                    format!(
                        "{}: it commits to {} retired signing keys, which the database no longer holds \
                         (it holds {}): a retirement was undone",
                        claim.source,
                        c.retired_keys.count,
                        lists.retired_keys.len()
                    ),
                );
            }
        }
        Ok(())
    }

    /// Compares computed subtree hashes with the stored ones (which exist up to the latest
    /// stored checkpoint).
    pub(super) async fn compare_nodes(
        &mut self,
        nodes: &mut Vec<(Subtree, Hash)>,
        until: u64,
    ) -> Result<(), StoreError> {
        let mut by_height: BTreeMap<u32, Vec<(u64, Hash)>> = BTreeMap::new();
        for (s, h) in nodes.drain(..) {
            if s.leaves().end <= until {
                by_height.entry(s.height).or_default().push((s.index, h));
            }
        }
        for (height, computed) in by_height {
            let (lo, hi) = (computed[0].0, computed[computed.len() - 1].0 + 1);
            let stored: HashMap<u64, Vec<u8>> = self
                .store
                .tree_nodes(&self.ledger, height, lo..hi)
                .await?
                .into_iter()
                .collect();
            for (index, hash) in computed {
                let s = Subtree { height, index };
                let seq = Some(s.leaves().start + 1);
                match stored.get(&index) {
                    None => self.fail(
                        seq,
                        format!("the stored hash of subtree {height}@{index} is missing"),
                    ),
                    Some(h) if h[..] != hash[..] => self.fail(
                        seq,
                        format!("the stored hash of subtree {height}@{index} is not the records'"),
                    ),
                    Some(_) => {}
                }
            }
        }
        Ok(())
    }
}

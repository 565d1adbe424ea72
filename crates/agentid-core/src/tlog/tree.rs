//! The Merkle tree of a ledger (RFC 9162 §2.1): leaf `i` is the record with `seq = i + 1`,
//! its hash `SHA-256(0x00 ‖ record hash)`, an interior node `SHA-256(0x01 ‖ left ‖ right)`.
//!
//! The store keeps the hash of every complete subtree whose height is a multiple of
//! [`STORED_EVERY`] (and above 0) that lies within the ledger's latest checkpoint, so that any
//! node of the tree is at most `2^(STORED_EVERY - 1)` stored hashes or records away: a proof
//! reads O(log n) small ranges, never a scan. This module is pure: it says which subtrees a
//! proof or a root needs and how their hashes combine; `engine::transparency` fetches them.

use std::ops::Range;

use sha2::{Digest, Sha256};

pub type Hash = [u8; 32];

/// Heights at which subtree hashes are stored: every fourth. A tree of n leaves keeps about
/// n / 15 of them, and any subtree's hash is computed from at most 8 stored hashes or leaves.
pub const STORED_EVERY: u32 = 4;

pub fn leaf_hash(record_hash: &Hash) -> Hash {
    let mut h = Sha256::new();
    h.update([0u8]);
    h.update(record_hash);
    h.finalize().into()
}

pub(crate) fn node_hash(left: &Hash, right: &Hash) -> Hash {
    let mut h = Sha256::new();
    h.update([1u8]);
    h.update(left);
    h.update(right);
    h.finalize().into()
}

/// The root of the empty tree: SHA-256 of nothing.
pub fn empty_root() -> Hash {
    Sha256::digest([]).into()
}

/// A complete subtree: the `2^height` leaves from `index << height`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Subtree {
    pub height: u32,
    pub index: u64,
}

/// What a subtree's hash is computed from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parts {
    /// The leaves of this range (0-based leaf indices): a subtree lower than the first stored
    /// height.
    Leaves(Range<u64>),
    /// Stored hashes of this height, at these indices (one when the subtree is stored itself).
    Nodes { height: u32, indices: Range<u64> },
}

impl Subtree {
    pub fn leaves(&self) -> Range<u64> {
        self.index << self.height..(self.index + 1) << self.height
    }

    /// Whether the store keeps this subtree's hash.
    pub(crate) fn is_stored(&self) -> bool {
        self.height > 0 && self.height.is_multiple_of(STORED_EVERY)
    }

    /// The stored hashes or leaves this subtree's hash folds from.
    pub fn parts(&self) -> Parts {
        let below = self.height - self.height % STORED_EVERY;
        if below == 0 {
            return Parts::Leaves(self.leaves());
        }
        let shift = self.height - below;
        Parts::Nodes {
            height: below,
            indices: self.index << shift..(self.index + 1) << shift,
        }
    }
}

/// The complete subtrees a range splits into, left to right, each as large as fits: the
/// ranges RFC 9162's recursion names start at a multiple of a power of two at least their
/// length, so these are its subtrees and their hashes fold into the range's (see [`fold`]).
pub fn subtrees(range: Range<u64>) -> Vec<Subtree> {
    let mut out = Vec::new();
    let mut at = range.start;
    while at < range.end {
        let left = range.end - at;
        // The largest power of two that fits in what is left and that `at` is aligned to.
        let mut height = 63 - left.leading_zeros();
        if at != 0 {
            height = height.min(at.trailing_zeros());
        }
        out.push(Subtree {
            height,
            index: at >> height,
        });
        at += 1 << height;
    }
    out
}

/// The hash of a range from the hashes of its [`subtrees`], in the same order: RFC 9162's
/// MTH splits a range at its largest power of two, so the subtrees combine right to left.
pub fn fold(hashes: &[Hash]) -> Hash {
    let mut it = hashes.iter().rev();
    let Some(last) = it.next() else {
        return empty_root();
    };
    it.fold(*last, |right, left| node_hash(left, &right))
}

/// The hash of a complete subtree from its `2^k` parts (leaf hashes or lower subtrees).
pub fn perfect(hashes: &[Hash]) -> Hash {
    debug_assert!(hashes.len().is_power_of_two());
    let mut level = hashes.to_vec();
    while level.len() > 1 {
        level = level.chunks(2).map(|p| node_hash(&p[0], &p[1])).collect();
    }
    level[0]
}

/// The largest power of two below `n` (n ≥ 2).
fn split(n: u64) -> u64 {
    1 << (63 - (n - 1).leading_zeros())
}

/// The ranges whose hashes make the inclusion proof of leaf `index` in a tree of `size`
/// leaves, in proof order (RFC 9162 §2.1.3.1, PATH).
pub fn inclusion_ranges(index: u64, size: u64) -> Vec<Range<u64>> {
    fn path(m: u64, r: Range<u64>, out: &mut Vec<Range<u64>>) {
        let n = r.end - r.start;
        if n <= 1 {
            return;
        }
        let k = split(n);
        if m < k {
            path(m, r.start..r.start + k, out);
            out.push(r.start + k..r.end);
        } else {
            path(m - k, r.start + k..r.end, out);
            out.push(r.start..r.start + k);
        }
    }
    let mut out = Vec::new();
    if index < size {
        path(index, 0..size, &mut out);
    }
    out
}

/// The ranges whose hashes make the consistency proof from `from` to `to` leaves
/// (0 < from ≤ to), in proof order (RFC 9162 §2.1.4.1, SUBPROOF).
pub fn consistency_ranges(from: u64, to: u64) -> Vec<Range<u64>> {
    fn subproof(m: u64, r: Range<u64>, whole: bool, out: &mut Vec<Range<u64>>) {
        let n = r.end - r.start;
        if m == n {
            if !whole {
                out.push(r);
            }
            return;
        }
        let k = split(n);
        if m <= k {
            subproof(m, r.start..r.start + k, whole, out);
            out.push(r.start + k..r.end);
        } else {
            subproof(m - k, r.start + k..r.end, false, out);
            out.push(r.start..r.start + k);
        }
    }
    let mut out = Vec::new();
    if 0 < from && from <= to {
        subproof(from, 0..to, true, &mut out);
    }
    out
}

/// The tree's right edge while leaves are appended: the hash of each subtree of
/// `subtrees(0..size)`. Appending reports every subtree it completes that the store keeps.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Frontier {
    size: u64,
    edge: Vec<(Subtree, Hash)>,
}

impl Frontier {
    /// A frontier at `size` from the hashes of `subtrees(0..size)`, in that order.
    pub fn at(size: u64, hashes: &[Hash]) -> Option<Frontier> {
        let parts = subtrees(0..size);
        (parts.len() == hashes.len()).then(|| Frontier {
            size,
            edge: parts.into_iter().zip(hashes.iter().copied()).collect(),
        })
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    /// Appends the leaf of a record hash; `stored` receives each completed subtree the store
    /// keeps, with its hash.
    pub fn push(&mut self, record_hash: &Hash, mut stored: impl FnMut(Subtree, Hash)) {
        let mut cur = (
            Subtree {
                height: 0,
                index: self.size,
            },
            leaf_hash(record_hash),
        );
        while let Some(&(left, lh)) = self.edge.last() {
            if left.height != cur.0.height {
                break;
            }
            self.edge.pop();
            cur = (
                Subtree {
                    height: left.height + 1,
                    index: left.index / 2,
                },
                node_hash(&lh, &cur.1),
            );
            if cur.0.is_stored() {
                stored(cur.0, cur.1);
            }
        }
        self.edge.push(cur);
        self.size += 1;
    }

    pub fn root(&self) -> Hash {
        let hashes: Vec<Hash> = self.edge.iter().map(|(_, h)| *h).collect();
        fold(&hashes)
    }
}

/// Why a proof does not hold.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProofError {
    #[error("the proof has the wrong number of hashes")]
    Length,
    #[error("the proof does not lead to the root")]
    Mismatch,
    #[error("sizes out of order: {0}")]
    Range(&'static str),
}

/// Checks an inclusion proof (RFC 9162 §2.1.3.2) of the leaf whose record hash is
/// `record_hash`, at 0-based `index`, in the tree of `size` leaves with `root`.
#[cfg(test)]
pub(crate) fn verify_inclusion(
    index: u64,
    size: u64,
    record_hash: &Hash,
    proof: &[Hash],
    root: &Hash,
) -> Result<(), ProofError> {
    if index >= size {
        return Err(ProofError::Range("the leaf is beyond the tree"));
    }
    let (mut f, mut s) = (index, size - 1);
    let mut r = leaf_hash(record_hash);
    for p in proof {
        if s == 0 {
            return Err(ProofError::Length);
        }
        if f & 1 == 1 || f == s {
            r = node_hash(p, &r);
            while f & 1 == 0 && f != 0 {
                f >>= 1;
                s >>= 1;
            }
        } else {
            r = node_hash(&r, p);
        }
        f >>= 1;
        s >>= 1;
    }
    if s != 0 {
        return Err(ProofError::Length);
    }
    if r != *root {
        return Err(ProofError::Mismatch);
    }
    Ok(())
}

/// Checks a consistency proof (RFC 9162 §2.1.4.2): the tree of `from` leaves with
/// `from_root` is a prefix of the tree of `to` leaves with `to_root`.
pub fn verify_consistency(
    from: u64,
    to: u64,
    from_root: &Hash,
    to_root: &Hash,
    proof: &[Hash],
) -> Result<(), ProofError> {
    if from == 0 || from > to {
        return Err(ProofError::Range("need 0 < from ≤ to"));
    }
    if from == to {
        if !proof.is_empty() {
            return Err(ProofError::Length);
        }
        return if from_root == to_root {
            Ok(())
        } else {
            Err(ProofError::Mismatch)
        };
    }
    let mut path: Vec<Hash> = Vec::with_capacity(proof.len() + 1);
    if from.is_power_of_two() {
        path.push(*from_root);
    }
    path.extend_from_slice(proof);
    let Some((first, rest)) = path.split_first() else {
        return Err(ProofError::Length);
    };
    let (mut f, mut s) = (from - 1, to - 1);
    while f & 1 == 1 {
        f >>= 1;
        s >>= 1;
    }
    let (mut fr, mut sr) = (*first, *first);
    for c in rest {
        if s == 0 {
            return Err(ProofError::Length);
        }
        if f & 1 == 1 || f == s {
            fr = node_hash(c, &fr);
            sr = node_hash(c, &sr);
            while f & 1 == 0 && f != 0 {
                f >>= 1;
                s >>= 1;
            }
        } else {
            sr = node_hash(&sr, c);
        }
        f >>= 1;
        s >>= 1;
    }
    if s != 0 {
        return Err(ProofError::Length);
    }
    if fr != *from_root || sr != *to_root {
        return Err(ProofError::Mismatch);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(i: u64) -> Hash {
        Sha256::digest(i.to_be_bytes()).into()
    }

    /// MTH straight from RFC 9162's definition.
    fn mth(leaves: &[Hash]) -> Hash {
        match leaves.len() {
            0 => empty_root(),
            1 => leaf_hash(&leaves[0]),
            n => {
                let k = split(n as u64) as usize;
                node_hash(&mth(&leaves[..k]), &mth(&leaves[k..]))
            }
        }
    }

    fn range_hash(leaves: &[Hash], r: Range<u64>) -> Hash {
        mth(&leaves[r.start as usize..r.end as usize])
    }

    #[test]
    fn frontier_roots_and_stored_subtrees_match_the_definition() {
        let leaves: Vec<Hash> = (0..300).map(record).collect();
        let mut f = Frontier::default();
        let mut stored = Vec::new();
        assert_eq!(f.root(), empty_root());
        for (i, l) in leaves.iter().enumerate() {
            f.push(l, |s, h| stored.push((s, h)));
            assert_eq!(f.root(), mth(&leaves[..=i]), "size {}", i + 1);
        }
        // Heights 4 and 8 below 300 leaves: 18 of 16 leaves, 1 of 256.
        assert_eq!(stored.len(), 19);
        for (s, h) in stored {
            assert!(s.is_stored());
            let r = s.leaves();
            assert_eq!(h, range_hash(&leaves, r));
        }
    }

    #[test]
    fn a_frontier_rebuilt_from_subtree_hashes_goes_on_alike() {
        let leaves: Vec<Hash> = (0..100).map(record).collect();
        for size in [0u64, 1, 2, 7, 16, 33, 64, 99] {
            let hashes: Vec<Hash> = subtrees(0..size)
                .iter()
                .map(|s| range_hash(&leaves, s.leaves()))
                .collect();
            let mut f = Frontier::at(size, &hashes).unwrap();
            for l in &leaves[size as usize..] {
                f.push(l, |_, _| {});
            }
            assert_eq!(f.root(), mth(&leaves));
        }
    }

    #[test]
    fn subtrees_fold_into_the_ranges_proofs_name() {
        let leaves: Vec<Hash> = (0..70).map(record).collect();
        for size in 1..=70u64 {
            let mut ranges = Vec::new();
            for i in 0..size {
                ranges.extend(inclusion_ranges(i, size));
            }
            for m in 1..=size {
                ranges.extend(consistency_ranges(m, size));
            }
            ranges.push(0..size);
            for r in ranges {
                let parts: Vec<Hash> = subtrees(r.clone())
                    .iter()
                    .map(|s| range_hash(&leaves, s.leaves()))
                    .collect();
                assert_eq!(fold(&parts), range_hash(&leaves, r.clone()), "{r:?}");
            }
        }
    }

    #[test]
    fn parts_of_a_subtree_are_stored_hashes_or_at_most_eight_leaves() {
        let s = Subtree { height: 3, index: 5 };
        assert_eq!(s.parts(), Parts::Leaves(40..48));
        let s = Subtree { height: 4, index: 5 };
        assert_eq!(
            s.parts(),
            Parts::Nodes {
                height: 4,
                indices: 5..6
            }
        );
        let s = Subtree { height: 7, index: 1 };
        assert_eq!(
            s.parts(),
            Parts::Nodes {
                height: 4,
                indices: 8..16
            }
        );
    }

    #[test]
    fn proofs_verify_and_tampered_ones_do_not() {
        let leaves: Vec<Hash> = (0..40).map(record).collect();
        for size in 1..=40u64 {
            let root = mth(&leaves[..size as usize]);
            for i in 0..size {
                let proof: Vec<Hash> = inclusion_ranges(i, size)
                    .into_iter()
                    .map(|r| range_hash(&leaves, r))
                    .collect();
                verify_inclusion(i, size, &leaves[i as usize], &proof, &root).unwrap();
                assert!(verify_inclusion(i, size, &record(999), &proof, &root).is_err());
                if let Some((_, short)) = proof.split_last() {
                    assert!(verify_inclusion(i, size, &leaves[i as usize], short, &root).is_err());
                }
            }
            for m in 1..=size {
                let old = mth(&leaves[..m as usize]);
                let proof: Vec<Hash> = consistency_ranges(m, size)
                    .into_iter()
                    .map(|r| range_hash(&leaves, r))
                    .collect();
                verify_consistency(m, size, &old, &root, &proof).unwrap();
                assert!(verify_consistency(m, size, &record(1), &root, &proof).is_err());
                if m < size {
                    let mut bad = proof.clone();
                    bad[0][0] ^= 1;
                    assert!(verify_consistency(m, size, &old, &root, &bad).is_err());
                }
            }
        }
        assert!(verify_consistency(0, 3, &empty_root(), &empty_root(), &[]).is_err());
        assert!(verify_consistency(4, 3, &empty_root(), &empty_root(), &[]).is_err());
    }

    mod props {
        use std::collections::HashMap;

        use proptest::prelude::*;

        use super::super::*;
        use super::record;

        /// A range's hash the way the service computes it: subtrees from the stored hashes
        /// (those a frontier reported) or from at most 8 leaves.
        fn from_store(r: Range<u64>, stored: &HashMap<Subtree, Hash>, leaves: &[Hash]) -> Hash {
            let parts: Vec<Hash> = subtrees(r)
                .into_iter()
                .map(|s| match s.parts() {
                    Parts::Leaves(l) => perfect(
                        &leaves[l.start as usize..l.end as usize]
                            .iter()
                            .map(leaf_hash)
                            .collect::<Vec<_>>(),
                    ),
                    Parts::Nodes { height, indices } => perfect(
                        &indices
                            .map(|index| stored[&Subtree { height, index }])
                            .collect::<Vec<_>>(),
                    ),
                })
                .collect();
            fold(&parts)
        }

        proptest! {
            // A fixed seed: CI runs the same cases every time.
            #![proptest_config(crate::testing::fixed_seed(9162, 48))]

            #[test]
            fn proofs_built_from_stored_subtrees_verify(size in 1u64..5000, a in any::<u64>(), b in any::<u64>()) {
                let leaves: Vec<Hash> = (0..size).map(record).collect();
                let mut tree = Frontier::default();
                let mut stored = HashMap::new();
                for l in &leaves {
                    tree.push(l, |s, h| { stored.insert(s, h); });
                }
                let root = tree.root();
                prop_assert_eq!(from_store(0..size, &stored, &leaves), root);
                let index = a % size;
                let proof: Vec<Hash> = inclusion_ranges(index, size)
                    .into_iter()
                    .map(|r| from_store(r, &stored, &leaves))
                    .collect();
                prop_assert!(verify_inclusion(index, size, &leaves[index as usize], &proof, &root).is_ok());
                let from = 1 + b % size;
                let proof: Vec<Hash> = consistency_ranges(from, size)
                    .into_iter()
                    .map(|r| from_store(r, &stored, &leaves))
                    .collect();
                let old = from_store(0..from, &stored, &leaves);
                prop_assert!(verify_consistency(from, size, &old, &root, &proof).is_ok());
            }
        }
    }
}

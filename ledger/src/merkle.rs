//! The RFC 6962 Merkle tree (SHA-256) over a ledger's entries, as C2SP tlog-tiles and
//! tlog-checkpoint require: leaf hash `SHA-256(0x00 ‖ entry)`, node hash
//! `SHA-256(0x01 ‖ left ‖ right)`, the tree of `n` leaves split at the largest power of two
//! below `n`. Leaf `i` is the exact stored bytes of the entry whose seq is `i`.
//!
//! * [`Frontier`]: the writer's (and the verifier's) O(log n) state: the roots of the
//!   perfect subtrees the leaves so far make, from which the root is computed.
//! * [`Nodes`]: where proofs read perfect-subtree hashes from (the tiles on disk, or a
//!   list in memory); [`inclusion_proof`] and [`consistency_proof`] are RFC 6962's
//!   `PATH` and `SUBPROOF` over it.
//! * [`verify_inclusion`] and [`verify_consistency`]: RFC 9162 sections 2.1.3.2 and
//!   2.1.4.2, strict about sizes and proof lengths (the transparency-dev probes).

use sha2::{Digest, Sha256};

/// A SHA-256 tree hash.
pub type TreeHash = [u8; 32];

/// `SHA-256("")`: the root of the empty tree.
pub fn empty_root() -> TreeHash {
    Sha256::digest([]).into()
}

/// The leaf hash of `data`: `SHA-256(0x00 ‖ data)`.
pub fn leaf_hash(data: &[u8]) -> TreeHash {
    let mut h = Sha256::new();
    h.update([0u8]);
    h.update(data);
    h.finalize().into()
}

/// The hash of an interior node: `SHA-256(0x01 ‖ left ‖ right)`.
pub fn node_hash(left: &TreeHash, right: &TreeHash) -> TreeHash {
    let mut h = Sha256::new();
    h.update([1u8]);
    h.update(left);
    h.update(right);
    h.finalize().into()
}

/// The largest power of two strictly below `n` (`n >= 2`).
fn split(n: u64) -> u64 {
    debug_assert!(n >= 2);
    1 << (63 - (n - 1).leading_zeros())
}

/// The right edge of a tree: the roots of its perfect subtrees, largest (leftmost) first.
/// Appending a leaf is amortised O(1) hashes, the root O(log n).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Frontier {
    size: u64,
    /// One hash per set bit of `size`, from the highest bit down.
    nodes: Vec<TreeHash>,
}

impl Frontier {
    /// The empty tree.
    pub fn new() -> Frontier {
        Frontier::default()
    }

    /// The frontier of a tree of `size` leaves whose perfect subtrees (one per set bit of
    /// `size`, largest first) have the hashes `nodes`; `None` if their number is wrong.
    pub fn from_nodes(size: u64, nodes: Vec<TreeHash>) -> Option<Frontier> {
        (nodes.len() == size.count_ones() as usize).then_some(Frontier { size, nodes })
    }

    /// The frontier of the first `size` leaves of the tree `nodes` holds.
    pub fn at<N: Nodes + ?Sized>(nodes: &N, size: u64) -> Result<Frontier, N::Error> {
        let mut out = Vec::with_capacity(size.count_ones() as usize);
        let mut start = 0u64;
        for level in (0..64u8).rev() {
            if size & (1 << level) != 0 {
                out.push(nodes.node(level, start >> level)?);
                start += 1 << level;
            }
        }
        Ok(Frontier { size, nodes: out })
    }

    /// Leaves so far.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The perfect subtrees' roots, largest first.
    pub fn nodes(&self) -> &[TreeHash] {
        &self.nodes
    }

    /// Append a leaf, given its leaf hash. Calls `full(level, index, hash)` for every
    /// perfect subtree the leaf completes (level 0 is the leaf itself), lowest first: what
    /// the tiles store.
    pub fn push_with(&mut self, leaf: TreeHash, mut full: impl FnMut(u8, u64, &TreeHash)) {
        let mut h = leaf;
        let mut level = 0u8;
        let mut index = self.size;
        full(0, index, &h);
        while index & 1 == 1 {
            // A popped node always exists: a set bit of `size` has its node.
            let left = self.nodes.pop().unwrap_or_default();
            h = node_hash(&left, &h);
            level += 1;
            index >>= 1;
            full(level, index, &h);
        }
        self.nodes.push(h);
        self.size += 1;
    }

    /// Append a leaf, given its leaf hash.
    pub fn push(&mut self, leaf: TreeHash) {
        self.push_with(leaf, |_, _, _| {});
    }

    /// The root of the tree so far (the empty tree's for size 0).
    pub fn root(&self) -> TreeHash {
        let mut it = self.nodes.iter().rev();
        let Some(last) = it.next() else {
            return empty_root();
        };
        it.fold(*last, |right, left| node_hash(left, &right))
    }
}

/// A source of perfect-subtree hashes: `node(level, index)` is the root of the subtree
/// of the `2^level` leaves from `index * 2^level`. Asked only for subtrees that are
/// complete in the tree being proven.
pub trait Nodes {
    /// Why a hash could not be read.
    type Error;
    /// The hash of the perfect subtree at `level`, `index`.
    fn node(&self, level: u8, index: u64) -> Result<TreeHash, Self::Error>;
}

/// Every leaf hash in memory (tests, small trees).
impl Nodes for [TreeHash] {
    type Error = std::convert::Infallible;
    fn node(&self, level: u8, index: u64) -> Result<TreeHash, Self::Error> {
        let lo = (index << level) as usize;
        Ok(range_root(&self[lo..lo + (1usize << level)]))
    }
}

/// The root of the leaves `leaves` (their hashes), computed directly.
pub fn range_root(leaves: &[TreeHash]) -> TreeHash {
    match leaves.len() {
        0 => empty_root(),
        1 => leaves[0],
        n => {
            let k = split(n as u64) as usize;
            node_hash(&range_root(&leaves[..k]), &range_root(&leaves[k..]))
        }
    }
}

/// `MTH(D[lo:hi])`, from perfect subtrees. `lo` is a multiple of the largest power of
/// two not above `hi - lo` whenever RFC 6962's recursion asks, so each piece is a node.
fn subtree<N: Nodes + ?Sized>(nodes: &N, lo: u64, hi: u64) -> Result<TreeHash, N::Error> {
    let n = hi - lo;
    if n == 0 {
        return Ok(empty_root());
    }
    if n.is_power_of_two() && lo.is_multiple_of(n) {
        return nodes.node(n.trailing_zeros() as u8, lo / n);
    }
    let k = split(n);
    Ok(node_hash(
        &subtree(nodes, lo, lo + k)?,
        &subtree(nodes, lo + k, hi)?,
    ))
}

/// The root of the first `size` leaves.
pub fn root<N: Nodes + ?Sized>(nodes: &N, size: u64) -> Result<TreeHash, N::Error> {
    subtree(nodes, 0, size)
}

/// The inclusion proof of leaf `index` in the tree of `size` leaves (RFC 6962 `PATH`),
/// from the leaf's sibling up. `index < size` is the caller's to check.
pub fn inclusion_proof<N: Nodes + ?Sized>(
    nodes: &N,
    index: u64,
    size: u64,
) -> Result<Vec<TreeHash>, N::Error> {
    let mut out = Vec::new();
    let (mut lo, mut hi) = (0u64, size);
    let mut steps = Vec::new();
    while hi - lo > 1 {
        let k = split(hi - lo);
        if index < lo + k {
            steps.push((lo + k, hi));
            hi = lo + k;
        } else {
            steps.push((lo, lo + k));
            lo += k;
        }
    }
    for &(a, b) in steps.iter().rev() {
        out.push(subtree(nodes, a, b)?);
    }
    Ok(out)
}

/// The consistency proof from the tree of `old` leaves to the tree of `new` leaves
/// (RFC 6962 `PROOF`/`SUBPROOF`); empty when `old` is 0 or equals `new`.
/// `old <= new` is the caller's to check.
pub fn consistency_proof<N: Nodes + ?Sized>(
    nodes: &N,
    old: u64,
    new: u64,
) -> Result<Vec<TreeHash>, N::Error> {
    let mut out = Vec::new();
    if old == 0 || old >= new {
        return Ok(out);
    }
    // SUBPROOF(m, D[lo:hi], b), iteratively: the hashes are appended innermost first.
    let (mut m, mut lo, mut hi, mut b) = (old, 0u64, new, true);
    let mut outer = Vec::new();
    loop {
        let n = hi - lo;
        if m == n {
            if !b {
                out.push(subtree(nodes, lo, hi)?);
            }
            break;
        }
        let k = split(n);
        if m <= k {
            outer.push((lo + k, hi));
            hi = lo + k;
        } else {
            outer.push((lo, lo + k));
            m -= k;
            lo += k;
            b = false;
        }
    }
    for &(a, z) in outer.iter().rev() {
        out.push(subtree(nodes, a, z)?);
    }
    Ok(out)
}

/// Why a proof does not verify.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProofError {
    /// The index is not below the tree size.
    #[error("index {index} is not below the tree size {size}")]
    IndexBeyondSize {
        /// The leaf index.
        index: u64,
        /// The tree size.
        size: u64,
    },
    /// The old size is larger than the new one.
    #[error("old size {old} is larger than new size {new}")]
    OldBeyondNew {
        /// The old size.
        old: u64,
        /// The new size.
        new: u64,
    },
    /// A consistency proof from the empty tree proves nothing.
    #[error("a consistency proof from the empty tree proves nothing")]
    FromEmpty,
    /// The proof has more or fewer hashes than the sizes call for.
    #[error("the proof has {found} hashes where the sizes call for {expected}")]
    WrongLength {
        /// Hashes in the proof.
        found: usize,
        /// Hashes the sizes call for.
        expected: usize,
    },
    /// The proof leads to another root.
    #[error("the proof leads to root {computed}, not {expected}")]
    RootMismatch {
        /// Root computed from the proof (hex).
        computed: String,
        /// Root expected (hex).
        expected: String,
    },
}

fn mismatch(computed: &TreeHash, expected: &TreeHash) -> ProofError {
    ProofError::RootMismatch {
        computed: hex::encode(computed),
        expected: hex::encode(expected),
    }
}

/// How many hashes an inclusion proof of `index` in a tree of `size` has: the inner
/// part (where the paths to `index` and to `size - 1` differ) and the border.
fn inclusion_len(index: u64, size: u64) -> (usize, usize) {
    let inner = 64 - (index ^ (size - 1)).leading_zeros();
    // `inner` is 64 when the paths part at the root's first bit (a size past 2^63): then
    // nothing is left of the index above it (a plain `>>` by 64 overflows).
    let border = index.checked_shr(inner).unwrap_or(0).count_ones() as usize;
    (inner as usize, border)
}

/// The root an inclusion proof of `leaf` at `index` leads to in a tree of `size`.
pub fn root_from_inclusion(
    index: u64,
    size: u64,
    leaf: &TreeHash,
    proof: &[TreeHash],
) -> Result<TreeHash, ProofError> {
    if index >= size {
        return Err(ProofError::IndexBeyondSize { index, size });
    }
    let (inner, border) = inclusion_len(index, size);
    if proof.len() != inner + border {
        return Err(ProofError::WrongLength {
            found: proof.len(),
            expected: inner + border,
        });
    }
    let mut r = *leaf;
    for (i, p) in proof[..inner].iter().enumerate() {
        r = if (index >> i) & 1 == 0 {
            node_hash(&r, p)
        } else {
            node_hash(p, &r)
        };
    }
    for p in &proof[inner..] {
        r = node_hash(p, &r);
    }
    Ok(r)
}

/// Check that `proof` shows the leaf hash `leaf` at `index` in the tree of `size` whose
/// root is `root` (RFC 9162 section 2.1.3.2).
pub fn verify_inclusion(
    index: u64,
    size: u64,
    leaf: &TreeHash,
    proof: &[TreeHash],
    root: &TreeHash,
) -> Result<(), ProofError> {
    let r = root_from_inclusion(index, size, leaf, proof)?;
    if &r != root {
        return Err(mismatch(&r, root));
    }
    Ok(())
}

/// Check that `proof` shows the tree of `old` leaves with root `old_root` to be a prefix
/// of the tree of `new` leaves with root `new_root` (RFC 9162 section 2.1.4.2). A proof
/// from size 0 is refused ([`ProofError::FromEmpty`]): the empty tree is a prefix of
/// every tree, and callers that accept it (tlog-witness) check that case themselves.
pub fn verify_consistency(
    old: u64,
    new: u64,
    old_root: &TreeHash,
    new_root: &TreeHash,
    proof: &[TreeHash],
) -> Result<(), ProofError> {
    if old > new {
        return Err(ProofError::OldBeyondNew { old, new });
    }
    if old == 0 {
        return Err(ProofError::FromEmpty);
    }
    if old == new {
        if !proof.is_empty() {
            return Err(ProofError::WrongLength {
                found: proof.len(),
                expected: 0,
            });
        }
        if old_root != new_root {
            return Err(mismatch(old_root, new_root));
        }
        return Ok(());
    }
    // The old tree's right edge, seen as a node of the new tree: its level is the number
    // of trailing ones of old - 1 that the proof does not need to carry.
    let shift = old.trailing_zeros();
    let (inner, border) = inclusion_len((old - 1) >> shift, ((new - 1) >> shift) + 1);
    let start_from_old = (old >> shift) == 1; // old is a power of two
    let expected = inner + border + usize::from(!start_from_old);
    if proof.len() != expected {
        return Err(ProofError::WrongLength {
            found: proof.len(),
            expected,
        });
    }
    let (seed, rest) = if start_from_old {
        (*old_root, proof)
    } else {
        (proof[0], &proof[1..])
    };
    let index = (old - 1) >> shift;
    let mask = index;
    // Both roots are rebuilt along the same path: the old one only from the hashes to
    // the left of it.
    let mut old_r = seed;
    let mut new_r = seed;
    for (i, p) in rest[..inner].iter().enumerate() {
        if (mask >> i) & 1 == 1 {
            old_r = node_hash(p, &old_r);
            new_r = node_hash(p, &new_r);
        } else {
            new_r = node_hash(&new_r, p);
        }
    }
    for p in &rest[inner..] {
        old_r = node_hash(p, &old_r);
        new_r = node_hash(p, &new_r);
    }
    if &old_r != old_root {
        return Err(mismatch(&old_r, old_root));
    }
    if &new_r != new_root {
        return Err(mismatch(&new_r, new_root));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaves(n: usize) -> Vec<TreeHash> {
        (0..n)
            .map(|i| leaf_hash(&(i as u64).to_be_bytes()))
            .collect()
    }

    #[test]
    fn every_proof_of_small_trees_verifies_and_none_at_the_wrong_place() {
        let all = leaves(70);
        for size in 1..=70u64 {
            let t = &all[..size as usize];
            let root = range_root(t);
            let mut f = Frontier::new();
            for l in t {
                f.push(*l);
            }
            assert_eq!(f.root(), root, "frontier root at {size}");
            assert_eq!(super::root(t, size).unwrap(), root);
            for index in 0..size {
                let p = inclusion_proof(t, index, size).unwrap();
                verify_inclusion(index, size, &t[index as usize], &p, &root).unwrap();
                if index + 1 < size {
                    assert!(
                        verify_inclusion(index + 1, size, &t[index as usize], &p, &root).is_err()
                    );
                }
            }
            for old in 1..=size {
                let p = consistency_proof(t, old, size).unwrap();
                let old_root = range_root(&t[..old as usize]);
                verify_consistency(old, size, &old_root, &root, &p)
                    .unwrap_or_else(|e| panic!("{old} -> {size}: {e}"));
                if old < size {
                    assert!(verify_consistency(old, size, &root, &root, &p).is_err());
                }
            }
        }
    }

    /// Sizes past 2^63 (a hostile checkpoint or proof bundle names any u64): the proof
    /// lengths are computed without overflow, and proofs that are not real are refused,
    /// never a panic. (Found by `cargo fuzz run consistency`: `old` 2, `new` moved past
    /// 2^63 panicked on a shift by 64 in a build with overflow checks.)
    #[test]
    fn sizes_past_two_to_the_63_are_refused_not_a_panic() {
        assert_eq!(inclusion_len(0, 1 << 63), (63, 0));
        assert_eq!(inclusion_len(0, (1 << 63) + 1), (64, 0));
        assert_eq!(inclusion_len(1, u64::MAX), (64, 0));
        assert_eq!(inclusion_len(u64::MAX - 1, u64::MAX), (0, 63));
        let all = leaves(4);
        let h = all[0];
        for size in [1u64 << 63, (1 << 63) + 1, u64::MAX - 1, u64::MAX] {
            for index in [0, 1, size / 2, size - 1] {
                for len in [0usize, 1, 63, 64, 65, 127, 128] {
                    let proof = vec![h; len];
                    assert!(verify_inclusion(index, size, &h, &proof, &all[1]).is_err());
                }
            }
            for old in [1u64, 2, 3, 1 << 62, size - 1] {
                for len in [0usize, 1, 63, 64, 65, 127, 128] {
                    let proof = vec![h; len];
                    assert!(verify_consistency(old, size, &all[0], &all[1], &proof).is_err());
                }
            }
        }
    }

    #[test]
    fn frontier_from_nodes_resumes() {
        let all = leaves(300);
        for size in [0u64, 1, 2, 3, 255, 256, 257, 299] {
            let f = Frontier::at(&all[..], size).unwrap();
            assert_eq!(f.root(), range_root(&all[..size as usize]));
            let mut g = f.clone();
            g.push(all[size as usize]);
            assert_eq!(g.root(), range_root(&all[..=size as usize]));
        }
    }
}

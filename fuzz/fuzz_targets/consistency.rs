//! RFC 9162 consistency proofs (`merkle::verify_consistency`: the witness's check of a
//! pushed checkpoint, `verify-proof --from`, `verify --anchor --no-walk`): a real proof
//! between two prefixes of a real tree always verifies, and a proof changed in any way
//! the input picks (a bit flipped, a hash removed, inserted or replaced, sizes moved,
//! roots swapped or replaced) never links a real root to a made-up one, and links two
//! real roots only in prefix order (the old one's prefix no longer than the new one's).
//! Two made-up roots may be consistent with each other (between equal sizes a proof is
//! empty and says only that the roots are equal): a proof is checked against a root the
//! verifier already trusts.
//!
//! The sizes are not the proof's to bind: RFC 9162's verifier takes only the shape of
//! the path from them, so a proof also verifies at another size whose path has the
//! same shape (from 1 to 256 leaves is also a proof from 1 to 172, with the 256-leaf
//! root). Every caller takes each size with its root from a signed checkpoint, which
//! binds the two; this target once asserted the claimed sizes too and stopped there.
#![no_main]
use tally_ledger::tlog::merkle::{
    consistency_proof, leaf_hash, range_root, verify_consistency, Frontier, TreeHash,
};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let [a, b, rest @ ..] = data else { return };
    let n = 1 + u64::from(*a) % 300;
    let m = 1 + u64::from(*b) % n;
    let leaves: Vec<TreeHash> = (0..n).map(|i| leaf_hash(&i.to_be_bytes())).collect();
    let truth = |s: u64| (s > 0 && s <= n).then(|| range_root(&leaves[..s as usize]));
    let mut proof = consistency_proof(&leaves[..], m, n).expect("in memory");
    let (mut old, mut new) = (m, n);
    let (mut old_root, mut new_root) = (truth(m).expect("m"), truth(n).expect("n"));
    verify_consistency(old, new, &old_root, &new_root, &proof).expect("a real proof verifies");
    for op in rest.chunks(3) {
        let (kind, x, y) = (op[0], *op.get(1).unwrap_or(&0), *op.get(2).unwrap_or(&0));
        let i = usize::from(x);
        match kind % 9 {
            0 if !proof.is_empty() => {
                let k = i % proof.len();
                proof[k][usize::from(y) % 32] ^= 1 << (y % 8);
            }
            1 if !proof.is_empty() => {
                proof.remove(i % proof.len());
            }
            2 => {
                let h = leaves[i % leaves.len()];
                proof.insert(i % (proof.len() + 1), h);
            }
            3 => std::mem::swap(&mut old_root, &mut new_root),
            4 => old = old.wrapping_add(u64::from(x)).wrapping_sub(u64::from(y)),
            5 => new = new.wrapping_add(u64::from(x)).wrapping_sub(u64::from(y)),
            6 => old_root[i % 32] ^= y | 1,
            7 => new_root = leaves[i % leaves.len()],
            8 if !proof.is_empty() => {
                let k = i % proof.len();
                proof[k] = truth(1 + u64::from(y) % n).expect("size");
            }
            _ => {}
        }
    }
    if verify_consistency(old, new, &old_root, &new_root, &proof).is_ok() {
        // The size of each real prefix whose root this is.
        let mut f = Frontier::new();
        let mut size_of = std::collections::HashMap::new();
        for (i, l) in leaves.iter().enumerate() {
            f.push(*l);
            size_of.insert(f.root(), i + 1);
        }
        match (size_of.get(&old_root), size_of.get(&new_root)) {
            (Some(o), Some(n)) => {
                assert!(
                    o <= n,
                    "a larger tree accepted as the prefix of a smaller one"
                )
            }
            // Two made-up roots consistent with each other (equal sizes and one root, or a
            // proof rebuilt from them): nothing about the real tree is claimed.
            (None, None) => {}
            _ => panic!("a real tree accepted as consistent with a made-up one"),
        }
    }
});

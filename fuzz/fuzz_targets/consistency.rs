//! RFC 9162 consistency proofs (`merkle::verify_consistency`: the witness's check of a
//! pushed checkpoint, `verify-proof --from`, `verify --anchor --no-walk`): a real proof
//! between two prefixes of a real tree always verifies, and a proof changed in any way
//! the input picks (a bit flipped, a hash removed, inserted or replaced, sizes moved,
//! roots swapped or replaced) verifies only if the sizes and roots it is checked with
//! still are a real prefix's and the real tree's.
#![no_main]
use tally_ledger::tlog::merkle::{
    consistency_proof, leaf_hash, range_root, verify_consistency, TreeHash,
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
        assert_eq!(truth(old), Some(old_root), "a wrong old tree accepted");
        assert_eq!(truth(new), Some(new_root), "a wrong new tree accepted");
    }
});

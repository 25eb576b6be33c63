//! The C2SP layer against independent implementations: the transparency-dev proof probes,
//! Cloudflare's `tlog_tiles` (a port of Go's sumdb tlog) for roots and proofs both ways,
//! and `signed_note` (a port of Go's sumdb note) for notes, vkeys and key ids.

use std::collections::BTreeSet;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use ed25519_dalek::SigningKey;
use serde_json::Value;
use tally_ledger::tlog::merkle::{
    consistency_proof, inclusion_proof, leaf_hash, range_root, verify_consistency,
    verify_inclusion, Frontier, TreeHash,
};
use tally_ledger::tlog::note::{cosign, sign_note, Note, TreeHead, Vkey, TYPE_COSIGNATURE};
use tally_ledger::tlog::proof::{ConsistencyProof, TlogProof};
use tally_ledger::tlog::witness::{Refusal, Witness};
use tally_ledger::tlog::LogKey;
use tally_ledger::LedgerId;

fn probes(kind: &str) -> Vec<Value> {
    let path = format!(
        "{}/tests/data/transparency-dev/{kind}.json",
        env!("CARGO_MANIFEST_DIR")
    );
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// A probe's base64 field as a hash. tally's verifiers take 32-byte hashes (the type
/// says so). A root or proof element of another length (garbage before or after it, a
/// root like `"don't care"`) is taken as a tagged SHA-256 of its bytes: equal values stay
/// equal, different ones different, and none equals a real hash, which is all such a
/// probe tests. A leaf hash of another length is not a leaf hash at all: refused.
fn hash(v: &Value) -> Option<TreeHash> {
    use sha2::Digest;
    let bytes = B64.decode(v.as_str()?).ok()?;
    Some(match <[u8; 32]>::try_from(bytes.as_slice()) {
        Ok(h) => h,
        Err(_) => sha2::Sha256::digest([b"not 32 bytes:".as_slice(), &bytes].concat()).into(),
    })
}

fn leaf(v: &Value) -> Option<TreeHash> {
    B64.decode(v.as_str()?).ok()?.try_into().ok()
}

fn hashes(v: &Value) -> Option<Vec<TreeHash>> {
    match v {
        Value::Null => Some(Vec::new()),
        Value::Array(a) => a.iter().map(hash).collect(),
        _ => None,
    }
}

#[test]
fn transparency_dev_inclusion_probes() {
    let all = probes("inclusion");
    assert_eq!(all.len(), 98);
    let mut wrong = Vec::new();
    for p in &all {
        let result = (|| {
            let (leaf, root, proof) = (
                leaf(&p["leafHash"])?,
                hash(&p["root"])?,
                hashes(&p["proof"])?,
            );
            Some(verify_inclusion(
                p["leafIdx"].as_u64()?,
                p["treeSize"].as_u64()?,
                &leaf,
                &proof,
                &root,
            ))
        })();
        let ok = matches!(result, Some(Ok(())));
        if ok == p["wantErr"].as_bool().unwrap() {
            wrong.push(p["file"].as_str().unwrap().to_owned());
        }
    }
    assert!(wrong.is_empty(), "probes judged wrongly: {wrong:#?}");
    // Every kind of probe the issue names is among them: index +-1, size x2 and /2,
    // wrong, empty and random roots and leaves, garbage before and after, a removed,
    // inserted or modified component (a bit flip in each element).
    let names: BTreeSet<&str> = all
        .iter()
        .map(|p| p["file"].as_str().unwrap().rsplit('/').next().unwrap())
        .collect();
    for want in [
        "happy-path.json",
        "leafIdx-plus-@1.json",
        "leafIdx-sub-@1.json",
        "leafIdx-XOR-@2.json",
        "treeSize-mul-@2.json",
        "treeSize-div-@2.json",
        "wrong-leaf.json",
        "random-root.json",
        "empty-root.json",
        "empty-leaf.json",
        "empty-root-and-leaf.json",
        "matching-root-and-leaf.json",
        "trailing-garbage.json",
        "preceding-garbage.json",
        "trailing-root.json",
        "preceding-root.json",
        "removed-component.json",
        "inserted-component.json",
        "modified-proof[0]-bit-@3.json",
        "modified-proof[1]-bit-@3.json",
        "modified-proof[2]-bit-@3.json",
    ] {
        assert!(names.contains(want), "{want}");
    }
    // Happy paths pass, so the rest fail for the reason they test.
    assert!(all.iter().any(|p| !p["wantErr"].as_bool().unwrap()));
}

#[test]
fn transparency_dev_consistency_probes() {
    let all = probes("consistency");
    assert_eq!(all.len(), 98);
    let mut wrong = Vec::new();
    for p in &all {
        let result = (|| {
            let (r1, r2, proof) = (hash(&p["root1"])?, hash(&p["root2"])?, hashes(&p["proof"])?);
            Some(verify_consistency(
                p["size1"].as_u64()?,
                p["size2"].as_u64()?,
                &r1,
                &r2,
                &proof,
            ))
        })();
        let ok = matches!(result, Some(Ok(())));
        if ok == p["wantErr"].as_bool().unwrap() {
            wrong.push(p["file"].as_str().unwrap().to_owned());
        }
    }
    assert!(wrong.is_empty(), "probes judged wrongly: {wrong:#?}");
    // Every kind of probe the issue names is among them.
    let names: BTreeSet<&str> = all
        .iter()
        .map(|p| p["file"].as_str().unwrap().rsplit('/').next().unwrap())
        .collect();
    for want in [
        "size1-plus-@1.json",
        "size2-mul-@2.json",
        "size2-div-@2.json",
        "wrong-root1.json",
        "swapped-roots.json",
        "trailing-garbage.json",
        "preceding-garbage.json",
        "truncated-proof.json",
        "empty-proof.json",
        "modified-proof@0-bit-@4.json",
        "sizes-are-equal-zero-but-roots-are-not.json",
        "sizes-are-equal-one-but-roots-are-not.json",
        "size1-sub-@1.json",
        "size1-XOR-@2.json",
        "wrong-root2.json",
        "trailing-root1.json",
        "preceding-root2.json",
        "preceding-proof-@0.json",
        "modified-proof@1-bit-@4.json",
        "modified-proof@2-bit-@4.json",
        "size1-is-zero-and-size2-is-not-zero.json",
        "size1-is-greater-than-size2.json",
        "sizes-are-equal-zero-and-proof-is-empty.json",
        "sizes-are-equal-one-and-proof-is-empty.json",
        "sizes-match-but-proof-is-not-empty-and-sizes-are-one.json",
        "consistency-check-on-empty-tree-size1-is-zero-is-useless.json",
    ] {
        assert!(names.contains(want), "{want}");
    }
}

/// `tlog_tiles` reads perfect-subtree hashes through its stored-hash indexes.
struct Reader(Vec<TreeHash>);

impl tlog_tiles::HashReader for Reader {
    fn read_hashes(&self, indexes: &[u64]) -> Result<Vec<tlog_tiles::Hash>, tlog_tiles::Error> {
        Ok(indexes
            .iter()
            .map(|&i| {
                let (level, n) = tlog_tiles::split_stored_hash_index(i);
                let lo = (n << level) as usize;
                tlog_tiles::Hash(range_root(&self.0[lo..lo + (1usize << level)]))
            })
            .collect())
    }
}

#[test]
fn roots_and_proofs_agree_with_tlog_tiles_both_ways() {
    let leaves: Vec<TreeHash> = (0..300u32)
        .map(|i| leaf_hash(format!("entry {i}").as_bytes()))
        .collect();
    for (i, l) in leaves.iter().enumerate() {
        assert_eq!(
            tlog_tiles::record_hash(format!("entry {i}").as_bytes()).0,
            *l
        );
    }
    let r = Reader(leaves.clone());
    let mut f = Frontier::new();
    for size in 1..=300u64 {
        f.push(leaves[size as usize - 1]);
        let t = &leaves[..size as usize];
        let root = f.root();
        assert_eq!(
            tlog_tiles::tree_hash(size, &r).unwrap().0,
            root,
            "root at {size}"
        );
        for index in [0, size / 3, size / 2, size - 1] {
            let mine = inclusion_proof(t, index, size).unwrap();
            let theirs: Vec<tlog_tiles::Hash> = mine.iter().map(|h| tlog_tiles::Hash(*h)).collect();
            tlog_tiles::check_record(
                &theirs,
                size,
                tlog_tiles::Hash(root),
                index,
                tlog_tiles::Hash(t[index as usize]),
            )
            .unwrap_or_else(|e| panic!("theirs refuses mine at {index}/{size}: {e}"));
            let theirs = tlog_tiles::prove_record(size, index, &r).unwrap();
            let as_mine: Vec<TreeHash> = theirs.iter().map(|h| h.0).collect();
            verify_inclusion(index, size, &t[index as usize], &as_mine, &root).unwrap();
        }
        for old in [1, size / 2, size.saturating_sub(1)] {
            if old == 0 || old > size {
                continue;
            }
            let old_root = range_root(&t[..old as usize]);
            let mine = consistency_proof(t, old, size).unwrap();
            let theirs: Vec<tlog_tiles::Hash> = mine.iter().map(|h| tlog_tiles::Hash(*h)).collect();
            tlog_tiles::check_tree(
                &theirs,
                size,
                tlog_tiles::Hash(root),
                old,
                tlog_tiles::Hash(old_root),
            )
            .unwrap_or_else(|e| panic!("theirs refuses my consistency {old}->{size}: {e}"));
            let theirs = tlog_tiles::prove_tree(size, old, &r).unwrap();
            let as_mine: Vec<TreeHash> = theirs.iter().map(|h| h.0).collect();
            verify_consistency(old, size, &old_root, &root, &as_mine).unwrap();
        }
    }
}

#[test]
fn notes_and_vkeys_agree_with_signed_note_both_ways() {
    let ledger = LedgerId([7; 16]);
    let key = LogKey::from_seed(ledger, [9; 32]);
    let note = key.sign(42, [3; 32]);
    let text = note.to_text();
    // Their parser and verifier accept my checkpoint and my vkey.
    let verifier = signed_note::StandardVerifier::new(&key.vkey().to_text()).unwrap();
    let theirs = signed_note::Note::from_bytes(text.as_bytes()).unwrap();
    let list = signed_note::VerifierList::new(vec![Box::new(verifier)]);
    let (ok, _) = theirs.verify(&list).unwrap();
    assert_eq!(ok.len(), 1);
    let cp = tlog_tiles::Checkpoint::from_bytes(theirs.text()).unwrap();
    assert_eq!(cp.origin(), key.origin());
    assert_eq!(cp.size(), 42);
    assert_eq!(cp.hash().0, [3; 32]);

    // Mine accepts theirs: a key they made, a note they signed.
    let (skey, vkey) = signed_note::generate_key(&mut rand_core::OsRng, "example.com/their-log");
    let signer = signed_note::StandardSigner::new(&skey).unwrap();
    let body = format!("example.com/their-log\n7\n{}\n", B64.encode([5u8; 32]));
    let mut n = signed_note::Note::new(body.as_bytes(), &[]).unwrap();
    n.add_sigs(&[&signer]).unwrap();
    let mine = Note::parse(&n.to_bytes()).unwrap();
    let v = Vkey::parse(&vkey).unwrap();
    v.verify(&mine).unwrap();
    let head = TreeHead::parse(&mine.text).unwrap();
    assert_eq!((head.size, head.root), (7, [5; 32]));
    // Key ids as the spec computes them: theirs over name, newline, type and key.
    assert_eq!(
        v.key_id(),
        signed_note::key_id("example.com/their-log", &[&[1u8][..], &v.public].concat())
    );
}

/// A cosignature/v1 verifier written from c2sp.org/tlog-cosignature for `signed_note`'s
/// note verification (key name and id matching, framing): the crate has none.
struct CosigVerifier {
    name: String,
    id: u32,
    key: ed25519_dalek::VerifyingKey,
}

impl signed_note::Verifier for CosigVerifier {
    fn name(&self) -> &str {
        &self.name
    }
    fn key_id(&self) -> u32 {
        self.id
    }
    fn verify(&self, msg: &[u8], sig: &[u8]) -> bool {
        if sig.len() != 72 {
            return false;
        }
        let t = u64::from_be_bytes(sig[..8].try_into().unwrap());
        let mut m = format!("cosignature/v1\ntime {t}\n").into_bytes();
        m.extend_from_slice(msg);
        let s = ed25519_dalek::Signature::from_bytes(sig[8..].try_into().unwrap());
        self.key.verify_strict(&m, &s).is_ok()
    }
}

#[test]
fn cosignatures_verify_under_signed_notes_framing() {
    let w = SigningKey::from_bytes(&[4; 32]);
    let text = TreeHead::new("example.com/log", 5, [1; 32]).to_text();
    let sig = cosign(&w, "example.com/w1", 1_700_000_000, &text);
    let note = Note {
        text: text.clone(),
        sigs: vec![
            sign_note(&SigningKey::from_bytes(&[5; 32]), "example.com/log", &text),
            sig,
        ],
    };
    let id = signed_note::key_id(
        "example.com/w1",
        &[&[TYPE_COSIGNATURE][..], w.verifying_key().as_bytes()].concat(),
    );
    let vkey = Vkey::new(
        "example.com/w1",
        TYPE_COSIGNATURE,
        w.verifying_key().to_bytes(),
    )
    .unwrap();
    assert_eq!(vkey.key_id(), id);
    let theirs = signed_note::Note::from_bytes(note.to_text().as_bytes()).unwrap();
    let list = signed_note::VerifierList::new(vec![Box::new(CosigVerifier {
        name: "example.com/w1".into(),
        id,
        key: w.verifying_key(),
    })]);
    let (ok, unknown) = theirs.verify(&list).unwrap();
    assert_eq!((ok.len(), unknown.len()), (1, 1));
    // And mine reads the timestamp back.
    assert_eq!(
        vkey.verify_cosignature(&text, &note.sigs[1]).unwrap(),
        1_700_000_000
    );
}

#[test]
fn tlog_proof_text_round_trips_and_is_strict() {
    let key = LogKey::from_seed(LedgerId([1; 16]), [2; 32]);
    let leaves: Vec<TreeHash> = (0..9u8).map(|i| leaf_hash(&[i])).collect();
    let root = range_root(&leaves);
    let p = TlogProof {
        extra: Some(vec![3]),
        index: 3,
        proof: inclusion_proof(&leaves[..], 3, 9).unwrap(),
        checkpoint: key.sign(9, root),
    };
    let text = p.to_text();
    assert_eq!(TlogProof::parse(&text).unwrap(), p);
    assert_eq!(
        TlogProof::parse_bundle(&format!("{text}{text}"))
            .unwrap()
            .len(),
        2
    );
    assert!(TlogProof::parse(&format!("{text}x\n")).is_err());
    assert!(TlogProof::parse(&format!("x{text}")).is_err());
    assert!(TlogProof::parse(&text.replace("index 3", "index 03")).is_err());
    assert!(TlogProof::parse(&text[..text.len() - 1]).is_err());
}

fn witness_at(dir: &std::path::Path, log: &LogKey) -> Witness {
    Witness::new(
        "example.com/w1",
        SigningKey::from_bytes(&[8; 32]),
        vec![log.vkey()],
        dir,
    )
    .unwrap()
}

#[test]
fn witness_add_checkpoint_semantics_and_persisted_state() {
    let dir = tempfile::tempdir().unwrap();
    let log = LogKey::from_seed(LedgerId([1; 16]), [2; 32]);
    let leaves: Vec<TreeHash> = (0..40u8).map(|i| leaf_hash(&[i])).collect();
    let at = |n: usize| range_root(&leaves[..n]);
    let body = |old: u64, new: u64, proof: Vec<TreeHash>| {
        ConsistencyProof {
            old,
            proof,
            checkpoint: log.sign(new, at(new as usize)),
        }
        .to_text()
    };
    let w = witness_at(dir.path(), &log);
    // First contact: 409 tells what it holds (0); from 0 an empty proof.
    assert_eq!(
        w.add_checkpoint(body(5, 10, vec![]).as_bytes(), 100),
        Err(Refusal::Conflict(0))
    );
    let line = w
        .add_checkpoint(body(0, 10, vec![]).as_bytes(), 100)
        .unwrap();
    assert!(line.starts_with("\u{2014} example.com/w1 "));
    // The cosignature verifies over the checkpoint's text.
    let sig = tally_ledger::tlog::note::NoteSig::from_line(line.trim_end()).unwrap();
    w.vkey()
        .verify_cosignature(&TreeHead::new(log.origin(), 10, at(10)).to_text(), &sig)
        .unwrap();
    // A good proof moves it on; a bad one, a fork at the same size, or a rollback do not.
    let p = consistency_proof(&leaves[..], 10, 20).unwrap();
    let mut bad = p.clone();
    bad[0][0] ^= 1;
    assert!(matches!(
        w.add_checkpoint(body(10, 20, bad).as_bytes(), 101),
        Err(Refusal::Unprocessable(_))
    ));
    w.add_checkpoint(body(10, 20, p).as_bytes(), 101).unwrap();
    let fork = ConsistencyProof {
        old: 20,
        proof: vec![],
        checkpoint: log.sign(20, [9; 32]),
    };
    assert_eq!(
        w.add_checkpoint(fork.to_text().as_bytes(), 102)
            .unwrap_err()
            .status(),
        422
    );
    assert_eq!(
        w.add_checkpoint(body(10, 15, vec![]).as_bytes(), 102),
        Err(Refusal::Conflict(20))
    );
    assert_eq!(
        w.add_checkpoint(body(20, 15, vec![]).as_bytes(), 102)
            .unwrap_err()
            .status(),
        400
    );
    // Another log's key, or no valid signature: 404 / 403.
    let other = LogKey::from_seed(LedgerId([2; 16]), [3; 32]);
    let foreign = ConsistencyProof {
        old: 0,
        proof: vec![],
        checkpoint: other.sign(1, at(1)),
    };
    assert_eq!(
        w.add_checkpoint(foreign.to_text().as_bytes(), 103)
            .unwrap_err()
            .status(),
        404
    );
    let mut forged = log.sign(30, at(30));
    forged.sigs[0].sig[0] ^= 1;
    let forged = ConsistencyProof {
        old: 20,
        proof: vec![],
        checkpoint: forged,
    };
    assert_eq!(
        w.add_checkpoint(forged.to_text().as_bytes(), 103)
            .unwrap_err()
            .status(),
        403
    );
    // The state survives a new witness process on the same directory.
    drop(w);
    let w = witness_at(dir.path(), &log);
    assert_eq!(w.held(log.origin()).unwrap().unwrap().head.size, 20);
    assert_eq!(
        w.add_checkpoint(body(10, 30, vec![]).as_bytes(), 104),
        Err(Refusal::Conflict(20))
    );
}

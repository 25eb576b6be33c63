//! Anchors checked without the walk (`tally verify DIR --anchor CP --no-walk`): each C2SP
//! checkpoint anchor is shown to be a prefix of the tree the ledger's log records by an
//! RFC 9162 consistency proof, built from the ledger's tree files and checked here
//! against both roots. O(log n) hashes instead of reading every entry.
//!
//! What that proves, and what it does not: the tree whose root the log's last group
//! records (its tree frame) extends the anchor, so that tree was neither cut below the
//! anchor nor forked from it. Nothing here reads an entry: that the entries are that
//! tree's leaves, their signatures, hash chain, epoch certificates and checkpoints,
//! decryption and replay are the walk's (`tally verify` without `--no-walk`). A writer
//! that rewrote the entries but kept the old tree frame and tree files is caught by the
//! walk alone; one that cut or forked the log and rebuilt its tree (what a writer's open
//! and `tally reindex` do) is caught here.

use serde::Serialize;
use tally_ledger::tlog::merkle::{self, Nodes, TreeHash};
use tally_ledger::tlog::note::{b64, TreeHead, Vkey};

use crate::tree::TreeAnchor;

/// The tree head a ledger's log records (read from its last sealed group, not walked).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordedHead {
    /// Entries the log's last checkpoint seals.
    pub size: u64,
    /// The Merkle root its group's tree frame records (`None`: a log written before
    /// tree frames).
    pub root: Option<TreeHash>,
}

/// What one anchor came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ProofStatus {
    /// A consistency proof shows the anchor to be a prefix of the recorded tree.
    Consistent,
    /// The proof does not lead to the anchor's root: the log forked from it.
    Fork,
    /// The anchor is larger than the log: it was truncated or rolled back.
    Truncated,
    /// The anchor is not a checkpoint of this ledger, or its signature does not verify
    /// under the log key.
    Invalid,
    /// No proof could be made: the tree files do not lead to the recorded root (or the
    /// log records none). Nothing is shown either way; the walk decides.
    Unproven,
}

/// One anchor's result.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct AnchorProof {
    /// Where the anchor came from (`anchor FILE`).
    pub source: String,
    /// Its size (0 when it does not parse).
    pub size: u64,
    /// Its root (base64; empty when it does not parse).
    pub root: String,
    /// What it came to.
    pub status: ProofStatus,
    /// Hashes in the consistency proof checked (consistent or fork).
    pub proof_hashes: usize,
    /// Why, in words.
    pub detail: String,
}

/// The verdict of a check without the walk.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum NoWalkVerdict {
    /// Every anchor is a prefix of the recorded tree (exit 0).
    Consistent,
    /// An anchor was forked from, cut below, or is not this ledger's (exit 1).
    Inconsistent,
    /// No forks or cuts found, but some anchor could not be proven (exit 3).
    Unproven,
}

/// What a check without the walk found.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct NoWalkReport {
    /// The verdict.
    pub verdict: NoWalkVerdict,
    /// The recorded tree head's size.
    pub size: u64,
    /// Its root (base64), if the log records one.
    pub root: Option<String>,
    /// Whether the tree files lead to that root (so proofs could be made from them).
    pub tree_files_match: bool,
    /// Each anchor's result, in the order given.
    pub anchors: Vec<AnchorProof>,
    /// What a check without the walk does not cover.
    pub not_checked: Vec<&'static str>,
}

/// What `--no-walk` leaves to the walk, in the report's words.
pub const NOT_CHECKED: [&str; 5] = [
    "that the entries are the leaves of the recorded tree",
    "the entries' signatures, hash chain and checkpoints",
    "epoch certificates (forward integrity)",
    "decryption and the consistency audit (auditor key)",
    "the replay of the gate's decisions",
];

/// Check one anchor of `size` with `root` against the head (`head_size`, `head_root`)
/// with the consistency `proof` (RFC 9162 section 2.1.4.2): the status, and why.
pub fn judge(
    size: u64,
    root: &TreeHash,
    head_size: u64,
    head_root: &TreeHash,
    proof: &[TreeHash],
) -> (ProofStatus, String) {
    if size > head_size {
        return (
            ProofStatus::Truncated,
            format!(
                "it holds size {size}, but the log has {head_size} entries: it was truncated or rolled back"
            ),
        );
    }
    if size == 0 {
        // The empty tree is a prefix of every tree; its root is fixed.
        return if *root == merkle::empty_root() && proof.is_empty() {
            (ProofStatus::Consistent, "the empty tree".into())
        } else {
            (
                ProofStatus::Invalid,
                "a checkpoint of size 0 whose root is not the empty tree's".into(),
            )
        };
    }
    match merkle::verify_consistency(size, head_size, root, head_root, proof) {
        Ok(()) => (
            ProofStatus::Consistent,
            format!(
                "a prefix of the recorded tree of size {head_size} (consistency proof of {} hashes)",
                proof.len()
            ),
        ),
        Err(e) => (
            ProofStatus::Fork,
            format!(
                "the consistency proof to the recorded tree of size {head_size} fails ({e}): the log forked from it"
            ),
        ),
    }
}

/// Check `anchors` (C2SP checkpoints of the ledger whose origin is `origin`; their
/// signatures under `log_key` when given) against the recorded `head`, with consistency
/// proofs built from `nodes` (the ledger's tree files).
pub fn check_anchors<N: Nodes + ?Sized>(
    nodes: &N,
    origin: &str,
    log_key: Option<&Vkey>,
    head: &RecordedHead,
    anchors: &[TreeAnchor],
) -> NoWalkReport
where
    N::Error: std::fmt::Display,
{
    let files = files_root(nodes, head);
    let out: Vec<AnchorProof> = anchors
        .iter()
        .map(|a| check_anchor(nodes, origin, log_key, head, &files, a))
        .collect();
    NoWalkReport {
        verdict: verdict(&out),
        size: head.size,
        root: head.root.map(|r| b64(&r)),
        tree_files_match: files.is_ok(),
        anchors: out,
        not_checked: NOT_CHECKED.to_vec(),
    }
}

/// The recorded root, if the tree files lead to it at the recorded size, or why not.
/// The tree files are derived and untrusted: a proof from them counts only if they do.
fn files_root<N: Nodes + ?Sized>(nodes: &N, head: &RecordedHead) -> Result<TreeHash, String>
where
    N::Error: std::fmt::Display,
{
    match head.root {
        None => Err("the log records no Merkle root (written by a build before trees): open it once with this build, or verify without --no-walk".to_owned()),
        Some(r) => match merkle::root(nodes, head.size) {
            Ok(ours) if ours == r => Ok(r),
            Ok(ours) => Err(format!(
                "the tree files lead to root {}, not to the recorded {}: run `tally reindex`, or verify without --no-walk",
                b64(&ours),
                b64(&r)
            )),
            Err(e) => Err(format!(
                "the tree files do not hold the tree of size {} ({e}): run `tally reindex`, or verify without --no-walk",
                head.size
            )),
        },
    }
}

/// One anchor: invalid unless it parses as a checkpoint of `origin` signed under
/// `log_key` (when given); then truncated if past the head, else proven from the tree
/// files (`files`: the root they lead to, or why they lead to none).
fn check_anchor<N: Nodes + ?Sized>(
    nodes: &N,
    origin: &str,
    log_key: Option<&Vkey>,
    head: &RecordedHead,
    files: &Result<TreeHash, String>,
    a: &TreeAnchor,
) -> AnchorProof
where
    N::Error: std::fmt::Display,
{
    let mut result = AnchorProof {
        source: a.source.clone(),
        size: 0,
        root: String::new(),
        status: ProofStatus::Invalid,
        proof_hashes: 0,
        detail: String::new(),
    };
    let h = match TreeHead::parse(&a.note.text) {
        Ok(h) => h,
        Err(e) => {
            result.detail = e.to_string();
            return result;
        }
    };
    result.size = h.size;
    result.root = b64(&h.root);
    if h.origin != origin {
        result.detail = format!("a checkpoint of {}, not of {origin}", h.origin);
        return result;
    }
    if let Some(k) = log_key {
        if let Err(e) = k.verify(&a.note) {
            result.detail = format!("not signed by the ledger's log key: {e}");
            return result;
        }
    }
    if h.size > head.size {
        (result.status, result.detail) = judge(h.size, &h.root, head.size, &[0; 32], &[]);
        return result;
    }
    prove(nodes, &h, head, files, &mut result);
    result
}

/// Prove the anchor's tree head `h` (no larger than the head) a prefix of the recorded
/// tree with a consistency proof from the tree files, into `result`: unproven when the
/// files lead to no root (`files`) or cannot make the proof.
fn prove<N: Nodes + ?Sized>(
    nodes: &N,
    h: &TreeHead,
    head: &RecordedHead,
    files: &Result<TreeHash, String>,
    result: &mut AnchorProof,
) where
    N::Error: std::fmt::Display,
{
    let head_root = match files {
        Ok(r) => *r,
        Err(why) => {
            result.status = ProofStatus::Unproven;
            result.detail = why.clone();
            return;
        }
    };
    let proof = if h.size == 0 {
        Ok(Vec::new())
    } else {
        merkle::consistency_proof(nodes, h.size, head.size)
    };
    match proof {
        Ok(p) => {
            (result.status, result.detail) = judge(h.size, &h.root, head.size, &head_root, &p);
            if h.size > 0 {
                result.proof_hashes = p.len();
            }
        }
        Err(e) => {
            result.status = ProofStatus::Unproven;
            result.detail = format!("the tree files cannot make the proof: {e}");
        }
    }
}

/// The verdict over every anchor's result: inconsistent if any is forked from, cut
/// below or invalid; else unproven if any is unproven or there are none.
fn verdict(out: &[AnchorProof]) -> NoWalkVerdict {
    let bad = out.iter().any(|a| {
        matches!(
            a.status,
            ProofStatus::Fork | ProofStatus::Truncated | ProofStatus::Invalid
        )
    });
    if bad {
        NoWalkVerdict::Inconsistent
    } else if out.iter().any(|a| a.status == ProofStatus::Unproven) || out.is_empty() {
        NoWalkVerdict::Unproven
    } else {
        NoWalkVerdict::Consistent
    }
}

impl NoWalkReport {
    /// The report for people.
    pub fn to_text(&self) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let n = self.anchors.len();
        let _ = match self.verdict {
            NoWalkVerdict::Consistent => writeln!(
                s,
                "CONSISTENT (no walk): {} a prefix of the tree the log records",
                if n == 1 {
                    "the anchor is"
                } else {
                    "every anchor is"
                }
            ),
            NoWalkVerdict::Inconsistent => writeln!(
                s,
                "NOT CONSISTENT (no walk): the log was cut below or forked from an anchor"
            ),
            NoWalkVerdict::Unproven => writeln!(
                s,
                "UNPROVEN (no walk): no cut or fork found, but not every anchor could be proven"
            ),
        };
        let _ = writeln!(
            s,
            "  tree head   size {} root {} (the log's last tree frame; tree files {})",
            self.size,
            self.root.as_deref().unwrap_or("none"),
            if self.tree_files_match {
                "match it"
            } else {
                "do NOT match it"
            }
        );
        for a in &self.anchors {
            let _ = writeln!(
                s,
                "  anchor      {} size {} root {}: {:?}: {}",
                a.source,
                a.size,
                if a.root.is_empty() { "-" } else { &a.root },
                a.status,
                a.detail
            );
        }
        let _ = writeln!(
            s,
            "  not checked without the walk: {}; `tally verify` without --no-walk checks them",
            self.not_checked.join("; ")
        );
        s
    }

    /// The exit code: 0 consistent, 1 a cut, fork or foreign anchor, 3 unproven.
    pub fn exit_code(&self) -> u8 {
        match self.verdict {
            NoWalkVerdict::Consistent => 0,
            NoWalkVerdict::Inconsistent => 1,
            NoWalkVerdict::Unproven => 3,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tally_ledger::tlog::merkle::{consistency_proof, leaf_hash, range_root};
    use tally_ledger::tlog::LogKey;
    use tally_ledger::LedgerId;

    const ID: LedgerId = LedgerId([3; 16]);

    fn leaves(n: usize, salt: u8) -> Vec<TreeHash> {
        (0..n).map(|i| leaf_hash(&[salt, i as u8])).collect()
    }

    fn anchor(key: &LogKey, t: &[TreeHash]) -> TreeAnchor {
        TreeAnchor {
            source: format!("anchor {}", t.len()),
            note: key.sign(t.len() as u64, range_root(t)),
        }
    }

    fn head(t: &[TreeHash]) -> RecordedHead {
        RecordedHead {
            size: t.len() as u64,
            root: Some(range_root(t)),
        }
    }

    fn run(t: &[TreeHash], key: &LogKey, h: &RecordedHead, a: &[TreeAnchor]) -> NoWalkReport {
        check_anchors(t, key.origin(), Some(&key.vkey()), h, a)
    }

    #[test]
    fn every_prefix_is_consistent_and_a_fork_or_cut_is_not() {
        let key = LogKey::from_seed(ID, [1; 32]);
        let t = leaves(37, 0);
        let anchors: Vec<TreeAnchor> = (1..=37).map(|n| anchor(&key, &t[..n])).collect();
        let r = run(&t, &key, &head(&t), &anchors);
        assert_eq!(r.verdict, NoWalkVerdict::Consistent, "{}", r.to_text());
        assert_eq!(r.exit_code(), 0);
        // A fork: the same first 20 leaves, then another history; anchors of the real
        // tree past 20 are forked from, those up to 20 are still prefixes.
        let mut forked = t[..20].to_vec();
        forked.extend(leaves(30, 9));
        let r = run(&forked, &key, &head(&forked), &anchors);
        for a in &r.anchors {
            let want = if a.size <= 20 {
                ProofStatus::Consistent
            } else {
                ProofStatus::Fork
            };
            assert_eq!(a.status, want, "{a:?}");
        }
        assert_eq!(r.exit_code(), 1);
        // Cut to 10 and re-sealed: larger anchors are past the end.
        let r = run(&t[..10], &key, &head(&t[..10]), &anchors[20..21]);
        assert_eq!(r.anchors[0].status, ProofStatus::Truncated);
        assert_eq!(r.exit_code(), 1);
    }

    #[test]
    fn a_wrong_proof_is_a_fork_never_consistent() {
        let t = leaves(21, 0);
        let root = range_root(&t);
        let old = range_root(&t[..6]);
        let good = consistency_proof(&t[..], 6, 21).unwrap();
        assert_eq!(judge(6, &old, 21, &root, &good).0, ProofStatus::Consistent);
        for i in 0..good.len() {
            for bit in [0u8, 7] {
                let mut p = good.clone();
                p[i][5] ^= 1 << bit;
                assert_eq!(judge(6, &old, 21, &root, &p).0, ProofStatus::Fork, "{i}");
            }
            let mut p = good.clone();
            p.remove(i);
            assert_eq!(judge(6, &old, 21, &root, &p).0, ProofStatus::Fork);
        }
        let mut longer = good.clone();
        longer.push(root);
        assert_eq!(judge(6, &old, 21, &root, &longer).0, ProofStatus::Fork);
        assert_eq!(judge(6, &old, 21, &root, &[]).0, ProofStatus::Fork);
        assert_eq!(judge(6, &root, 21, &old, &good).0, ProofStatus::Fork);
        assert_eq!(judge(22, &old, 21, &root, &good).0, ProofStatus::Truncated);
        assert_eq!(judge(0, &old, 21, &root, &[]).0, ProofStatus::Invalid);
        assert_eq!(
            judge(0, &merkle::empty_root(), 21, &root, &[]).0,
            ProofStatus::Consistent
        );
    }

    #[test]
    fn tree_files_that_do_not_lead_to_the_recorded_root_prove_nothing() {
        let key = LogKey::from_seed(ID, [1; 32]);
        let t = leaves(40, 0);
        let mut damaged = t.clone();
        damaged[3][0] ^= 1;
        let anchors = [anchor(&key, &t[..8]), anchor(&key, &t[..40])];
        let r = run(&damaged, &key, &head(&t), &anchors);
        assert!(!r.tree_files_match);
        assert!(r.anchors.iter().all(|a| a.status == ProofStatus::Unproven));
        assert_eq!(r.exit_code(), 3, "{}", r.to_text());
        // No root recorded (an old log): unproven too.
        let r = run(
            &t,
            &key,
            &RecordedHead {
                size: 40,
                root: None,
            },
            &anchors,
        );
        assert_eq!(r.exit_code(), 3);
    }

    #[test]
    fn an_anchor_of_another_log_or_key_is_invalid() {
        let key = LogKey::from_seed(ID, [1; 32]);
        let other = LogKey::from_seed(LedgerId([4; 16]), [1; 32]);
        let stranger = LogKey::from_seed(ID, [2; 32]);
        let t = leaves(12, 0);
        let r = run(
            &t,
            &key,
            &head(&t),
            &[anchor(&other, &t[..5]), anchor(&stranger, &t[..5])],
        );
        assert!(r.anchors.iter().all(|a| a.status == ProofStatus::Invalid));
        assert_eq!(r.exit_code(), 1);
    }
}

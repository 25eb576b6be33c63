//! The verifier's Merkle-tree checks on their own thread (`Options::tree_thread`) make
//! the report the inline checks make: the same findings in the same order, the same first
//! bad seq, the same sealed size, on tampered ledgers and exports alike, whether the tree
//! lags the chain by a whole ledger (small fixtures: one batch, sent at the end) or by a
//! few batches (large ones).

use tally_ledger::Frame;
use tally_tests::*;
use tally_verify::tree::TreeAnchor;
use tally_verify::{FindingKind, Options, Report, SourceError};

/// Verify `frames` with the tree inline and on its thread: the report, if both agree.
fn compare(
    frames: &[Result<Frame, SourceError>],
    opts: impl Fn() -> Options,
    max_findings: usize,
) -> Result<Report, String> {
    let run = |threaded: bool| {
        let mut o = opts();
        o.max_findings = max_findings;
        o.tree_thread = threaded;
        tally_verify::verify(frames.iter().cloned(), &o, |_| {}, |_| {})
    };
    let (inline, threaded) = (run(false), run(true));
    if threaded != inline {
        return Err(format!(
            "the tree on its thread and inline disagree (max_findings {max_findings}):\n{threaded:#?}\n{inline:#?}"
        ));
    }
    Ok(threaded)
}

#[track_caller]
fn both(
    frames: &[Result<Frame, SourceError>],
    opts: impl Fn() -> Options,
    max_findings: usize,
) -> Report {
    compare(frames, opts, max_findings).unwrap_or_else(|e| panic!("{e}"))
}

fn export_items(bytes: &[u8]) -> Option<Vec<Result<Frame, SourceError>>> {
    Some(tally_verify::walk::export_frames(bytes).ok()?.collect())
}

/// Five groups (one in a second epoch), with a fork's view at size 7 as an anchor.
fn forked() -> (Fixture, TreeAnchor) {
    let mut fx = Fixture::new(&[Step::Append(2), Step::Append(3)]);
    fx.apply(&[]);
    let (mut a, mut b) = fx.fork();
    a.apply(&[Step::Append(1), Step::Rotate, Step::Append(4)]);
    b.apply(&[Step::Append(2)]);
    let anchor = TreeAnchor {
        source: "witness fork".into(),
        note: b.ledger.signed_tree_head(),
    };
    (a, anchor)
}

#[test]
fn tree_thread_agrees_on_every_flip_of_an_export() {
    let (fx, anchor) = forked();
    let export = fx.export();
    let opts = || {
        let mut o = fx.options_with_log_key();
        o.tree_anchors = vec![anchor.clone()];
        o
    };
    let whole = both(&export_items(&export).expect("export"), opts, 1000);
    // The fork's view is a finding of the tree; what follows it is not sealed.
    assert!(whole.findings.iter().any(|f| f.kind == FindingKind::Fork));
    assert!(whole.sealed < whole.entries, "{}", whole.to_text());
    // An even sample of 512 bits, every part of every frame (each flip is verified eight
    // times: inline and threaded, at four limits).
    let bits: Vec<usize> = (0..export.len() * 8)
        .step_by((export.len() * 8 / 512).max(1) | 1)
        .collect();
    let failures = par_failures(&bits, |&bit| {
        let mut bytes = export.clone();
        flip(&mut bytes, bit);
        if claims_huge_epoch(&bytes) {
            return None;
        }
        let items = export_items(&bytes)?;
        [0, 1, 2, 1000]
            .into_iter()
            .find_map(|max| compare(&items, opts, max).err())
            .map(|e| format!("bit {bit}: {e}"))
    });
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The frames of `fx`'s log with the tree frame number `n` given another root.
fn with_bad_tree_frame(fx: &Fixture, n: usize) -> (Vec<Result<Frame, SourceError>>, u64) {
    let mut frames: Vec<_> = tally_verify::walk::ledger_frames(&fx.dir)
        .expect("log")
        .collect();
    let mut seen = 0;
    let mut at = None;
    for f in &mut frames {
        if let Err(SourceError::TreeFrame { size, root }) = f {
            if seen == n {
                root[0] ^= 1;
                at = Some(*size);
                break;
            }
            seen += 1;
        }
    }
    (frames, at.expect("tree frame n"))
}

#[test]
fn a_tree_frame_that_disagrees_unseals_what_follows_small() {
    let fx = Fixture::new(&[Step::Append(2), Step::Append(3), Step::Append(1)]);
    let (frames, at) = with_bad_tree_frame(&fx, 1);
    for max in [0, 1, 1000] {
        let r = both(&frames, || fx.options(), max);
        if max > 0 {
            assert_eq!(findings(&r)[0], (FindingKind::StoreError, at));
        }
        // The checkpoint right after the tree frame is not sealed, nor any later one.
        assert!(r.sealed < at, "sealed {} at {at}", r.sealed);
    }
}

#[test]
fn a_tree_frame_that_disagrees_unseals_what_follows_mid_stream() {
    // Enough entries that the tree thread gets batches while the walk goes on.
    let steps: Vec<Step> = (0..6).map(|_| Step::Append(700)).collect();
    let fx = Fixture::new(&steps);
    for n in [0, 3, 5] {
        let (frames, at) = with_bad_tree_frame(&fx, n);
        let r = both(&frames, || fx.options(), 1000);
        assert_eq!(findings(&r), vec![(FindingKind::StoreError, at)]);
        assert!(r.sealed < at, "sealed {} at {at}", r.sealed);
        // And one entry changed as well, before and after the tree frame.
        for seq in [at.saturating_sub(5), at + 5] {
            let mut frames = frames.clone();
            let mut i = 0;
            for f in &mut frames {
                if let Ok(Frame::Entry(b)) = f {
                    if i == seq {
                        let last = b.len() - 1;
                        b[last] ^= 1;
                    }
                    i += 1;
                }
            }
            both(&frames, || fx.options(), 1000);
            both(&frames, || fx.options(), 1);
        }
    }
    let untouched: Vec<_> = tally_verify::walk::ledger_frames(&fx.dir)
        .expect("log")
        .collect();
    assert_intact(&both(&untouched, || fx.options(), 1000));
}

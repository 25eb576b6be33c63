//! Checkpoints and anchors (SECURITY.md 5.2, 5.3): deleted seals, seals from another ledger or a
//! later epoch, forks, rollback, and sealing required.

use tally_ledger::format::Hash;
use tally_ledger::Frame;
use tally_tests::*;
use tally_verify::FindingKind::*;
use tally_verify::Verdict::{Incomplete, Tampered};
use tally_verify::{AnchorStatus, Tail};

#[test]
fn deleted_checkpoints_leave_an_unsealed_tail() {
    let fx = Fixture::standard();
    for keep in [4u64, 0] {
        let mut frames = fx.frames();
        frames.retain(|f| !matches!(f, Frame::Checkpoint(t) if checkpoint(t).size > keep));
        let report = verify_export(&write_export(&frames), &fx.options()).expect("export");
        assert_eq!(report.verdict(), Incomplete, "{}", report.to_text());
        assert_eq!(report.verdict(), Incomplete);
        assert!(report.findings.is_empty(), "{}", report.to_text());
        assert_eq!(report.sealed, keep);
        assert_eq!(
            report.tail,
            Tail::Unsealed {
                from: keep,
                count: 10 - keep
            }
        );
        let text = report.to_text();
        assert!(
            text.starts_with("INCOMPLETE") && !text.contains("INTACT"),
            "{text}"
        );
        assert!(
            text.contains(&format!("(seq {keep}..=9) are NOT sealed")),
            "{text}"
        );
    }
}

#[test]
fn checkpoint_from_another_ledger() {
    let fx = Fixture::standard();
    let other = fx.sibling(STANDARD);
    let theirs = other.frames();
    let mut frames = fx.frames();
    let i = checkpoint_at(&frames, 9);
    frames[i] = theirs[checkpoint_at(&theirs, 9)].clone();
    let report = verify_frames(&frames, &fx.options());
    assert_eq!(
        assert_first(&report, Tampered, CheckpointWrongLedger, 9).len(),
        1
    );
    // Added rather than replaced: the same.
    let mut frames = fx.frames();
    frames.insert(i, theirs[checkpoint_at(&theirs, 9)].clone());
    assert_eq!(
        findings(&verify_frames(&frames, &fx.options())),
        [(CheckpointWrongLedger, 9)]
    );
}

#[test]
fn anchor_from_another_ledger_is_invalid() {
    let fx = Fixture::standard();
    let other = fx.sibling(STANDARD);
    for size in [9u64, 12] {
        let mut other = other.sibling(&[]);
        other.apply(&[Step::Append(12)]);
        let anchor = checkpoints(&other.frames())
            .into_iter()
            .find(|c| c.size >= size)
            .expect("anchor");
        let mut opts = fx.options();
        opts.anchors.push(anchor.clone());
        let report = verify_frames(&fx.frames(), &opts);
        let all = findings(&report);
        assert_eq!(report.verdict(), Tampered);
        assert_eq!(all.len(), 1, "{all:?}");
        assert_eq!(all[0].0, AnchorInvalid);
        assert_eq!(report.anchors.len(), 1);
        assert_ne!(report.anchors[0].status, AnchorStatus::Matched);
        if anchor.size > 10 {
            // Beyond the ledger's end: reported where the ledger ends.
            assert_eq!(all[0].1, 10);
        }
    }
}

#[test]
fn anchor_findings_are_at_the_anchor_size_like_checkpoint_findings() {
    let fx = Fixture::standard();
    let other = fx.sibling(STANDARD);
    let mut opts = fx.options();
    opts.anchors.push(checkpoints(&other.frames())[7].clone());
    assert_eq!(opts.anchors[0].size, 9);
    assert_first(
        &verify_frames(&fx.frames(), &opts),
        Tampered,
        AnchorInvalid,
        9,
    );
    // A forged anchor of a fork, as for the same checkpoint stored in the ledger.
    let mut opts = fx.options();
    let key = fx.writer_key();
    opts.anchors.push(sign_checkpoint(
        &key,
        fx.id(),
        10,
        Hash([7; 32]),
        u64::MAX / 2,
    ));
    assert_eq!(
        findings(&verify_frames(&fx.frames(), &opts)),
        [(Fork, 10), (Fork, 10)]
    );
}

/// The writer host is taken at epoch 2; the attacker re-seals old records (size 2 and 4,
/// epochs 0 and 1) with the current key.
fn resealed(fx: &Fixture, size: u64, replace: bool) -> Vec<Frame> {
    let key = fx.writer_key();
    assert_eq!(key.epoch, 2);
    let mut frames = fx.frames();
    let i = checkpoint_at(&frames, size);
    let real = checkpoint(match &frames[i] {
        Frame::Checkpoint(t) => t,
        Frame::Entry(_) | Frame::Cosigned(_) => unreachable!(),
    });
    let forged = checkpoint_frame(&sign_checkpoint(
        &key,
        fx.id(),
        size,
        real.head,
        real.wall_ms,
    ));
    if replace {
        frames[i] = forged;
    } else {
        frames.insert(i + 1, forged);
    }
    frames
}

#[test]
fn reseal_with_a_later_epoch_key_is_caught() {
    let fx = Fixture::standard();
    for (size, replace) in [(2, true), (2, false), (4, true), (4, false)] {
        let report = verify_frames(&resealed(&fx, size, replace), &fx.options());
        let all = findings(&report);
        assert_eq!(report.verdict(), Tampered);
        assert_eq!(all.len(), 1, "{all:?}");
        assert_eq!(all[0].1, size);
        assert!(
            matches!(all[0].0, CheckpointWrongEpoch | CheckpointBadSignature),
            "{all:?}"
        );
    }
}

#[test]
fn reseal_with_a_later_epoch_key_is_wrong_epoch() {
    let fx = Fixture::standard();
    for (size, replace) in [(2, true), (2, false), (4, true), (4, false)] {
        let report = verify_frames(&resealed(&fx, size, replace), &fx.options());
        assert_eq!(
            findings(&report),
            [(CheckpointWrongEpoch, size)],
            "{}",
            report.to_text()
        );
    }
}

#[test]
fn fork_two_signed_checkpoints_of_one_size() {
    let fx = Fixture::standard();
    let key = fx.writer_key();
    let mut frames = fx.frames();
    let last = checkpoints(&frames).pop().expect("checkpoint");
    let forged = checkpoint_frame(&sign_checkpoint(
        &key,
        fx.id(),
        10,
        Hash([7; 32]),
        last.wall_ms,
    ));
    frames.push(forged.clone());
    let report = verify_frames(&frames, &fx.options());
    assert_eq!(findings(&report), [(Fork, 10)], "{}", report.to_text());
    assert_eq!(report.verdict(), Tampered);
    // The forged one first: its head is wrong, and the real one then forks from it.
    let mut frames = fx.frames();
    frames.insert(frames.len() - 1, forged);
    assert_eq!(
        findings(&verify_frames(&frames, &fx.options())),
        [(CheckpointHeadMismatch, 10), (Fork, 10)]
    );
    // As an anchor: the ledger's own checkpoint of that size forks from it.
    let mut opts = fx.options();
    opts.anchors.push(sign_checkpoint(
        &key,
        fx.id(),
        10,
        Hash([7; 32]),
        last.wall_ms,
    ));
    let report = verify_frames(&fx.frames(), &opts);
    let all = findings(&report);
    assert!(
        all.contains(&(Fork, 10)) && all.iter().all(|f| f.0 == Fork),
        "{all:?}"
    );
    assert_eq!(report.anchors[0].status, AnchorStatus::Mismatch);
}

#[test]
fn anchor_newer_than_the_ledger_is_a_rollback() {
    let fx = Fixture::standard();
    let frames = fx.frames();
    let newest = checkpoints(&frames).pop().expect("checkpoint");
    // Rolled back to size 7, a complete export with its end marker.
    let rolled = write_export(&frames[..=checkpoint_at(&frames, 7)]);
    let mut opts = fx.options();
    opts.anchors.push(newest);
    let report = verify_export(&rolled, &opts).expect("export");
    assert_eq!(assert_first(&report, Tampered, AnchorMissing, 7).len(), 1);
    assert_eq!(report.verdict(), Tampered);
    assert_eq!(report.anchors[0].status, AnchorStatus::Missing);
    assert!(report.to_text().starts_with("TAMPERED"));
    // The same anchor on the whole ledger matches.
    let report = verify_export(&fx.export(), &opts).expect("export");
    assert_intact(&report);
    assert_eq!(report.anchors[0].status, AnchorStatus::Matched);
}

#[test]
fn unsealed_ledger_where_sealing_is_required() {
    let fx = Fixture::standard();
    let export = fx.export();
    // --require-anchor without an anchor.
    let mut opts = fx.options();
    opts.require_anchor = true;
    let report = verify_export(&export, &opts).expect("export");
    assert_eq!(report.verdict(), Incomplete);
    assert_eq!(report.verdict(), Incomplete);
    assert!(report.findings.is_empty() && report.tail == Tail::Complete);
    let text = report.to_text();
    assert!(
        text.starts_with("INCOMPLETE") && text.contains("--require-anchor"),
        "{text}"
    );
    // With a matching anchor (an older checkpoint) it passes.
    opts.anchors.push(checkpoints(&fx.frames())[3].clone());
    let report = verify_export(&export, &opts).expect("export");
    assert_intact(&report);
    assert_eq!(report.anchors[0].status, AnchorStatus::Matched);
    // The anchor matches but the tail after the last checkpoint is not sealed.
    let mut frames = fx.frames();
    frames.pop();
    let report = verify_export(&write_export(&frames), &opts).expect("export");
    assert_eq!(report.verdict(), Incomplete, "{}", report.to_text());
    assert_eq!(report.tail, Tail::Unsealed { from: 9, count: 1 });
    assert!(!report.to_text().contains("INTACT"));
    // Without any option, an unsealed tail is never a pass either.
    let report = verify_export(&write_export(&frames), &fx.options()).expect("export");
    assert_eq!(report.verdict(), Incomplete);
    assert_eq!(report.sealed, 9);
}

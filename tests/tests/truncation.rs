//! Truncation and rollback (SECURITY.md 5.2): clean cuts, torn tails, checkpoints left behind,
//! and a truncated copy that keeps appending.

use tally_ledger::Frame;
use tally_tests::*;
use tally_verify::FindingKind::*;
use tally_verify::Verdict::{Incomplete, Intact, Tampered};
use tally_verify::{AnchorStatus, Tail};

/// Start offset of every frame in an export of `frames`, then of the end frame.
fn frame_offsets(frames: &[Frame]) -> Vec<usize> {
    let mut at = 16;
    let mut out = vec![at];
    for f in frames {
        at += 5 + match f {
            Frame::Entry(b) | Frame::Checkpoint(b) | Frame::Cosigned(b) => b.len(),
        };
        out.push(at);
    }
    out
}

fn small() -> Fixture {
    // G C1 E1 C2 E2(cert) C3 E3 E4 C5
    Fixture::new(&[Step::Append(1), Step::Rotate, Step::Append(2)])
}

#[test]
fn cut_at_every_frame_boundary_is_incomplete_never_intact() {
    let fx = small();
    let export = fx.export();
    let frames = parse_frames(&export);
    let offsets = frame_offsets(&frames);
    assert_eq!(*offsets.last().expect("end") + END_FRAME_LEN, export.len());
    for (i, &cut) in offsets.iter().enumerate() {
        let report = verify_export(&export[..cut], &fx.options()).expect("magic intact");
        let text = report.to_text();
        assert_eq!(report.verdict(), Incomplete, "cut after {i} frames\n{text}");
        assert_eq!(report.verdict(), Incomplete);
        assert!(report.findings.is_empty(), "{text}");
        assert_eq!(report.tail, Tail::CutClean { offset: cut as u64 });
        assert_eq!(report.entries, entry_count(&frames[..i]));
        assert!(
            text.starts_with("INCOMPLETE") && !text.contains("INTACT"),
            "{text}"
        );
    }
    assert_intact(&verify_export(&export, &fx.options()).expect("export"));
}

/// A copy cut inside a frame is incomplete evidence (exit 3), like one
/// cut between frames, and names the last sealed seq; it was a `torn_tail` finding.
#[test]
fn cut_mid_record_is_incomplete_evidence() {
    let fx = small();
    let export = fx.export();
    let frames = parse_frames(&export);
    let offsets = frame_offsets(&frames);
    let ends: Vec<usize> = offsets[1..].iter().copied().chain([export.len()]).collect();
    for (i, (&start, &end)) in offsets.iter().zip(&ends).enumerate() {
        let cuts: Vec<usize> = if exhaustive() {
            (start + 1..end).collect()
        } else {
            vec![start + 1, start + 4, start + 5, (start + end) / 2, end - 1]
        };
        let full = verify_export(&export[..start], &fx.options()).expect("magic intact");
        for cut in cuts {
            let report = verify_export(&export[..cut], &fx.options()).expect("magic intact");
            let text = report.to_text();
            assert_eq!(findings(&report), [], "cut at {cut} in frame {i}\n{text}");
            assert_eq!(report.verdict(), Incomplete, "{text}");
            assert_eq!(report.verdict(), Incomplete);
            assert_eq!(
                report.tail,
                Tail::Torn {
                    offset: start as u64,
                    // Cut inside the frame's 5-byte header: the header's missing bytes.
                    missing: (if cut < start + 5 { start + 5 } else { end } - cut) as u64
                }
            );
            // What is sealed is what the frames before the cut seal.
            assert_eq!(report.sealed, full.sealed, "{text}");
            let named = match report.sealed {
                0 => "nothing is sealed".to_owned(),
                s => format!("last sealed seq {}", s - 1),
            };
            assert!(
                text.starts_with("INCOMPLETE") && text.contains(&named),
                "{text}"
            );
        }
    }
}

/// Only bytes that contradict the chain are tampering. A frame whose
/// length was raised past the end of the file reads like a cut, but the export still
/// ends with its end marker, so it is not a cut copy.
#[test]
fn a_frame_length_past_the_end_marker_is_tampering() {
    let fx = small();
    let export = fx.export();
    let frames = parse_frames(&export);
    let offsets = frame_offsets(&frames);
    for &start in &offsets[..offsets.len() - 1] {
        let mut bytes = export.clone();
        // Claim a length that runs past the end of the file (but under the frame cap).
        bytes[start + 1..start + 5].copy_from_slice(&(export.len() as u32).to_be_bytes());
        let report = verify_export(&bytes, &fx.options()).expect("magic intact");
        assert_eq!(report.verdict(), Tampered, "{}", report.to_text());
        assert!(
            findings(&report).iter().any(|(k, _)| *k == ExportMalformed),
            "{}",
            report.to_text()
        );
    }
}

#[test]
fn entries_removed_but_later_checkpoints_kept() {
    let fx = Fixture::standard();
    let mut frames = fx.frames();
    frames.retain(|f| !matches!(f, Frame::Entry(b) if header(b).seq >= 5));
    let report = verify_export(&write_export(&frames), &fx.options()).expect("export");
    let all = assert_first(&report, Tampered, CheckpointMisplaced, 5);
    assert_eq!(
        all,
        vec![(CheckpointMisplaced, 5); 5],
        "checkpoints 6, 7, 8, 9, 10"
    );
    assert_eq!(report.sealed, 4);
}

/// The writer's directory is copied at size 4 (keys and all); the original goes on to
/// size 7 and hands out its checkpoint; the copy appends other records.
#[test]
fn truncate_and_keep_appending_is_caught_by_an_anchor() {
    let fx = Fixture::new(&[Step::Append(1), Step::Rotate, Step::Append(1)]);
    let (fx, mut longer) = fx.fork();
    let (mut original, mut shorter) = fx.fork();
    let common = original.ledger.checkpoint();
    assert_eq!(common.size, 4);
    original.apply(&[Step::Append(1), Step::Append(1), Step::Append(1)]);
    let anchor = original.ledger.checkpoint();
    assert_eq!(anchor.size, 7);
    for i in 0..4 {
        longer.append_batch(vec![decision(100 + i)]);
    }
    shorter.append_batch(vec![decision(200)]);
    let with = |anchor: &tally_ledger::Checkpoint| {
        let mut o = original.options();
        o.anchors.push(anchor.clone());
        o
    };
    // The copy holds a different size-7 history: a fork.
    let report = verify_export(&longer.export(), &with(&anchor)).expect("export");
    let all = findings(&report);
    assert_eq!(report.verdict(), Tampered);
    assert!(
        all.contains(&(Fork, 7)) && all.iter().all(|f| f.0 == Fork),
        "{}",
        report.to_text()
    );
    assert_eq!(report.anchors[0].status, AnchorStatus::Mismatch);
    // The copy is shorter than the anchor: rolled back.
    let report = verify_export(&shorter.export(), &with(&anchor)).expect("export");
    assert_eq!(
        findings(&report),
        [(AnchorMissing, 5)],
        "{}",
        report.to_text()
    );
    assert_eq!(report.anchors[0].status, AnchorStatus::Missing);
    // Both copies do contain the common checkpoint, and on their own look intact: only
    // an anchor held elsewhere tells them apart.
    for copy in [&longer, &shorter] {
        let report = verify_export(&copy.export(), &with(&common)).expect("export");
        assert_eq!(report.verdict(), Intact, "{}", report.to_text());
        assert_eq!(report.anchors[0].status, AnchorStatus::Matched);
    }
    assert_intact(&verify_export(&original.export(), &with(&anchor)).expect("export"));
}

/// The signed end of an export: a copy cut at any checkpoint and given a new end is never
/// complete evidence for a verifier holding the log key. A new plain end is incomplete
/// (`unsigned_end`, exit 3); the original signed end put back after the cut names other
/// counts and another root: `export_end_mismatch` (tampered). Without the log key the
/// plain-ended cut is indistinguishable from a shorter export, which is why `ledger.pub`
/// v2 names the log key.
#[test]
fn a_cut_export_given_a_new_end_never_verifies_complete_with_the_log_key() {
    let fx = small();
    let export = fx.export();
    let frames = parse_frames(&export);
    let offsets = frame_offsets(&frames);
    let signed_end = &export[export.len() - END_FRAME_LEN..];
    assert_intact(&verify_export(&export, &fx.options_with_log_key()).expect("export"));
    let mut cuts = 0;
    for (i, f) in frames.iter().enumerate() {
        if !matches!(f, Frame::Checkpoint(_)) || i + 1 == frames.len() {
            continue;
        }
        cuts += 1;
        let plain = write_export(&frames[..=i]);
        let report = verify_export(&plain, &fx.options_with_log_key()).expect("export");
        let text = report.to_text();
        assert_eq!(report.verdict(), Incomplete, "cut after frame {i}\n{text}");
        assert_eq!(report.tail, Tail::UnsignedEnd, "{text}");
        assert!(!text.contains("INTACT"), "{text}");
        // Without the log key nothing tells this copy from a shorter export.
        assert_eq!(
            verify_export(&plain, &fx.options())
                .expect("export")
                .verdict(),
            Intact
        );
        // The original signed end after the cut: its counts are not the file's.
        let mut resigned = export[..offsets[i + 1]].to_vec();
        resigned.extend_from_slice(signed_end);
        let report = verify_export(&resigned, &fx.options_with_log_key()).expect("export");
        let text = report.to_text();
        assert_eq!(report.verdict(), Tampered, "cut after frame {i}\n{text}");
        // ... and with the counts made the file's (tag, length, entries, checkpoints):
        // the log key's signature over them no longer verifies.
        let checkpoints = frames[..=i]
            .iter()
            .filter(|f| matches!(f, Frame::Checkpoint(_)))
            .count() as u64;
        let at = offsets[i + 1];
        resigned[at + 5..at + 13].copy_from_slice(&entry_count(&frames[..=i]).to_be_bytes());
        resigned[at + 13..at + 21].copy_from_slice(&checkpoints.to_be_bytes());
        let report = verify_export(&resigned, &fx.options_with_log_key()).expect("export");
        let text = report.to_text();
        assert_eq!(report.verdict(), Tampered, "cut after frame {i}\n{text}");
        assert!(
            report.findings.iter().any(|f| f.kind == ExportEndMismatch),
            "{text}"
        );
    }
    assert!(cuts >= 3, "the fixture has checkpoints to cut at");
}

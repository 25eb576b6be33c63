//! Single-bit flips (SECURITY.md 5.1): anywhere in an export, in any stored entry, and in the
//! store's file on disk. None may verify intact.
//!
//! Every bit is flipped when [`exhaustive`] holds (optimized crypto, or
//! `TALLY_EXHAUSTIVE=1`); otherwise an even sample, so that the debug suite stays fast.
//! Flips that make an entry claim an epoch of 2^20 or more are skipped here (they run
//! the verifier out of memory; see `crafted::huge_epoch_claim_is_bounded`).

use std::fs;

use tally_ledger::Frame;
use tally_tests::*;
use tally_verify::Verdict::{Intact, Tampered};
use tally_verify::{Report, SourceError};

/// 8 entries in 2 epochs: G C1 | E1 E2 C3 | E3(cert) C4 | E4 E5 E6 E7 C8.
fn small() -> Fixture {
    Fixture::new(&[Step::Append(2), Step::Rotate, Step::Append(4)])
}

fn first_line(report: &Report) -> String {
    report
        .to_text()
        .lines()
        .next()
        .unwrap_or_default()
        .to_string()
}

#[test]
fn every_bit_flip_in_an_export_is_tampered() {
    let fx = small();
    let export = fx.export();
    // With the log key: a flip in the signed end (root, signature) is caught too.
    let opts = fx.options_with_log_key();
    assert_intact(&verify_export(&export, &opts).expect("export"));
    let bits = bits_to_flip(export.len(), 128);
    let failures = par_failures(&bits, |&bit| {
        let mut bytes = export.clone();
        flip(&mut bytes, bit);
        if claims_huge_epoch(&bytes) {
            return None;
        }
        match verify_export(&bytes, &opts) {
            // Not an export at all: the magic.
            Err(_) if bit < 16 * 8 => None,
            Err(e) => Some(format!("bit {bit}: {e}")),
            Ok(r) if r.verdict() == Tampered => None,
            Ok(r) => Some(format!("bit {bit} (byte {}): {}", bit / 8, first_line(&r))),
        }
    });
    assert!(
        failures.is_empty(),
        "{} of {} flips not caught:\n{}",
        failures.len(),
        bits.len(),
        failures.join("\n")
    );
}

#[test]
fn every_bit_flip_in_a_stored_entry_is_tampered() {
    let fx = small();
    let frames = fx.frames();
    let opts = fx.options();
    // (frame index, byte in frame) for every byte of every entry.
    let bytes: Vec<(usize, usize)> = frames
        .iter()
        .enumerate()
        .flat_map(|(i, f)| match f {
            Frame::Entry(b) => (0..b.len()).map(|j| (i, j)).collect(),
            Frame::Checkpoint(_) | Frame::Cosigned(_) => Vec::new(),
        })
        .collect();
    let bits = bits_to_flip(bytes.len(), 72);
    let failures = par_failures(&bits, |&bit| {
        let (i, j) = bytes[bit / 8];
        let mut frames = frames.clone();
        if let Frame::Entry(b) = &mut frames[i] {
            flip(b, j * 8 + bit % 8);
        }
        if claims_huge_epoch(&write_export(&frames)) {
            return None;
        }
        let r = verify_frames(&frames, &opts);
        (r.verdict() != Tampered)
            .then(|| format!("frame {i} byte {j} bit {}: {}", bit % 8, first_line(&r)))
    });
    assert!(
        failures.is_empty(),
        "{} of {} flips not caught:\n{}",
        failures.len(),
        bits.len(),
        failures.join("\n")
    );
}

/// A flip in a decision's ciphertext (whose tag only the auditor key checks) is named at
/// that decision without the key: the chain records the hash of its bytes, in the next
/// entry's link and in the head the checkpoint after it signs.
#[test]
fn every_ciphertext_flip_is_named_at_its_entry_without_the_key() {
    let fx = small();
    let frames = fx.frames();
    let opts = fx.options();
    // (frame index, seq, byte in frame) for every body byte of every decision.
    let mut seq = 0u64;
    let mut bytes = Vec::new();
    for (i, f) in frames.iter().enumerate() {
        if let Frame::Entry(b) = f {
            let header = tally_ledger::format::Header::decode(b).expect("a header");
            if header.entry_type == tally_ledger::EntryType::Decision {
                // Its body, the ciphertext, follows the header.
                bytes.extend((tally_ledger::format::HEADER_LEN..b.len()).map(|j| (i, seq, j)));
            }
            seq += 1;
        }
    }
    let bits = bits_to_flip(bytes.len(), 72);
    let failures = par_failures(&bits, |&bit| {
        let (i, seq, j) = bytes[bit / 8];
        let mut frames = frames.clone();
        if let Frame::Entry(b) = &mut frames[i] {
            flip(b, j * 8 + bit % 8);
        }
        let r = verify_frames(&frames, &opts);
        let first = r.findings.first().map(|f| (f.seq, f.kind));
        (first != Some((seq, tally_verify::FindingKind::EntryAltered)))
            .then(|| format!("seq {seq} byte {j} bit {}: {}", bit % 8, first_line(&r)))
    });
    assert!(
        failures.is_empty(),
        "{} of {} flips not named at their entry:\n{}",
        failures.len(),
        bits.len(),
        failures.join("\n")
    );
}

/// What became of one flip in the segment file.
#[derive(Debug, Default)]
struct Outcomes {
    refused: usize,
    caught: usize,
}

/// Flip bits in the log segment of a closed ledger and verify the directory as `tally
/// verify DIR` does (`ledger_frames`, in place), with the ledger's last checkpoint held
/// as an anchor. Every byte of a segment is used (header, frame prefixes, entries,
/// checkpoints), so no flip may verify intact: the log may refuse to read (a header
/// flip), report an error, or end early (a torn write), and the verdict is never intact.
#[test]
fn bit_flips_in_the_segment_file_are_never_intact() {
    let fx = Fixture::new(&[Step::Append(1), Step::Append(2), Step::Append(1)]);
    let original = fx.frames();
    let anchor = checkpoints(&original).pop().expect("checkpoint");
    let Fixture {
        tmp,
        dir,
        ledger,
        public,
        ..
    } = fx;
    drop(ledger);
    let segment = dir
        .join(tally_ledger::segment::LOG_DIR)
        .join(tally_ledger::segment::segment_name(0));
    let seg = fs::read(&segment).expect("segment");
    // State frames (tags 3 and 4: the gate's derived state and the run links' last seqs)
    // are never hashed nor verified (docs/FORMAT.md): their payload bytes are left out.
    let derived = derived_payloads(&seg);
    let positions: Vec<usize> = if exhaustive() {
        (0..seg.len() * 8).collect()
    } else {
        sample_bits(seg.len(), 400)
    }
    .into_iter()
    .filter(|bit| !derived.iter().any(|r| r.contains(&(bit / 8))))
    .collect();
    let mut opts = tally_verify::Options::new(public);
    opts.anchors.push(anchor);
    let outcomes = std::sync::Mutex::new(Outcomes::default());
    let failures = par_failures(&positions, |&bit| {
        let scratch = tempfile::tempdir_in(tmp.path()).expect("scratch");
        // The verifier reads only the log: copy just that.
        let copy = scratch.path().join("ledger");
        fs::create_dir_all(copy.join("log")).expect("log dir");
        let mut bytes = seg.clone();
        flip(&mut bytes, bit);
        let name = segment.file_name().expect("name");
        fs::write(copy.join("log").join(name), &bytes).expect("write flipped segment");
        let Ok(frames) = tally_verify::walk::ledger_frames(&copy) else {
            outcomes.lock().expect("outcomes").refused += 1;
            return None;
        };
        let frames: Vec<Result<Frame, SourceError>> = frames.collect();
        let report = tally_verify::verify(frames.into_iter(), &opts, |_| {}, |_| {});
        let mut o = outcomes.lock().expect("outcomes");
        if report.verdict() == Intact {
            return Some(format!(
                "byte {} bit {}: {}",
                bit / 8,
                bit % 8,
                first_line(&report)
            ));
        }
        o.caught += 1;
        None
    });
    let outcomes = outcomes.into_inner().expect("outcomes");
    eprintln!("{} flips in the segment: {outcomes:?}", positions.len());
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(outcomes.caught > 0, "{outcomes:?}");
}

/// The byte ranges of the state frames' payloads in a segment.
fn derived_payloads(seg: &[u8]) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let mut pos = tally_ledger::segment::SEGMENT_HEADER_LEN;
    while pos + 5 <= seg.len() {
        let len = u32::from_be_bytes(seg[pos + 1..pos + 5].try_into().expect("len")) as usize;
        if matches!(seg[pos], 3 | 4) {
            out.push(pos + 5..pos + 5 + len);
        }
        pos += 5 + len;
    }
    out
}

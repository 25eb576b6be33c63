//! Modifying, inserting, deleting, reordering, duplicating and splicing records
//! (SECURITY.md 5.1): caught with the public key alone, at the first bad seq.

use tally_ledger::format::{entry_hash, HEADER_LEN};
use tally_ledger::Frame;
use tally_tests::*;
use tally_verify::FindingKind::*;
use tally_verify::Verdict::Tampered;

/// Flip one byte of a decision's ciphertext.
fn corrupt_body(frames: &mut [Frame], seq: u64) {
    let b = entry_mut(frames, seq);
    b[HEADER_LEN + 3] ^= 0x01;
}

#[test]
fn modified_ciphertext_is_named_by_the_seal_after_it() {
    let fx = Fixture::standard();
    // seq 2 is sealed by checkpoint 3 and followed by the epoch certificate at 3, which
    // links to the head the checkpoint signs: one changed entry, one finding, at 2.
    let mut frames = fx.frames();
    corrupt_body(&mut frames, 2);
    let all = assert_first(
        &verify_frames(&frames, &fx.options()),
        Tampered,
        EntryAltered,
        2,
    );
    assert_eq!(all, [(EntryAltered, 2)]);
    // The auditor key also finds that it does not decrypt.
    let report = verify_frames(&frames, &fx.auditor_options());
    let all = assert_first(&report, Tampered, EntryAltered, 2);
    assert_eq!(all[1..], [(Undecryptable, 2)]);
    assert_eq!(report.decrypted, Some(fx.appended.len() as u64 - 1));
}

#[test]
fn modified_ciphertext_inside_a_batch_and_at_the_head() {
    let fx = Fixture::standard();
    // seq 4 and 5 were one commit group: no checkpoint between them. Seq 5 still links
    // to seq 4's old hash, and checkpoint 6 vouches for seq 5: seq 4 was changed.
    let mut frames = fx.frames();
    corrupt_body(&mut frames, 4);
    assert_eq!(
        findings(&verify_frames(&frames, &fx.options())),
        [(EntryAltered, 4)]
    );
    let all = assert_first(
        &verify_frames(&frames, &fx.auditor_options()),
        Tampered,
        EntryAltered,
        4,
    );
    assert_eq!(all, [(EntryAltered, 4), (Undecryptable, 4)]);
    // The last record: only its checkpoint (size 10) can tell, and its signature stands.
    let mut frames = fx.frames();
    corrupt_body(&mut frames, 9);
    assert_eq!(
        findings(&verify_frames(&frames, &fx.options())),
        [(EntryAltered, 9)]
    );
    let all = assert_first(
        &verify_frames(&frames, &fx.auditor_options()),
        Tampered,
        EntryAltered,
        9,
    );
    assert_eq!(all, [(EntryAltered, 9), (Undecryptable, 9)]);
}

#[test]
fn modified_header_field_is_caught() {
    let fx = Fixture::standard();
    // wall_ms of seq 6 (bytes 30..38), sealed by checkpoint 7.
    let mut frames = fx.frames();
    entry_mut(&mut frames, 6)[37] ^= 0x01;
    // The flipped bit moves seq 6's time by a millisecond, up or down: when it shares a
    // millisecond with seq 5 or 7, that is also a correct time_regression (at 6 if it
    // went below seq 5's, at 7 if above seq 7's), so one is allowed there only. Seq 6
    // is named as changed, unless its own time regression already names it (then the
    // checkpoint after it is not taken as a witness against it).
    let all = findings(&verify_frames(&frames, &fx.options()));
    let structural: Vec<_> = all
        .iter()
        .filter(|(k, _)| *k != TimeRegression)
        .copied()
        .collect();
    if all.contains(&(TimeRegression, 6)) {
        assert_eq!(structural, [(CheckpointHeadMismatch, 7), (BrokenLink, 7)]);
    } else {
        assert_eq!(structural, [(EntryAltered, 6)]);
    }
    assert!(
        all.iter()
            .all(|(k, seq)| *k != TimeRegression || *seq == 6 || *seq == 7),
        "{all:?}"
    );
    // The header is the AEAD's associated data (a time_regression at 6 may come first,
    // as above).
    let report = verify_frames(&frames, &fx.auditor_options());
    assert_eq!(report.verdict(), Tampered);
    let all = findings(&report);
    assert_eq!(all.first().map(|f| f.1), Some(6), "{}", report.to_text());
    assert!(all.contains(&(Undecryptable, 6)), "{}", report.to_text());
}

#[test]
fn modify_and_rechain_without_keys_is_caught_by_every_later_seal() {
    let fx = Fixture::standard();
    let mut frames = fx.frames();
    corrupt_body(&mut frames, 2);
    rechain(&mut frames, 2);
    let all = assert_first(
        &verify_frames(&frames, &fx.options()),
        Tampered,
        EntryAltered,
        2,
    );
    // Both epoch certificates cover their previous hash; every later checkpoint's head
    // is now wrong: each is a mismatch, or names the entry before it as changed (every
    // entry from 2 on was rewritten), and the entry after it then links to the old
    // chain, not to the head it signs.
    assert!(all.contains(&(BadEpochCertificate, 3)), "{all:?}");
    assert!(all.contains(&(BadEpochCertificate, 7)), "{all:?}");
    for size in [3, 4, 6, 7, 8, 9, 10] {
        assert!(
            all.contains(&(CheckpointHeadMismatch, size))
                || all.contains(&(EntryAltered, size - 1)),
            "size {size}: {all:?}"
        );
    }
    assert_eq!(
        all,
        [
            (EntryAltered, 2),
            (BrokenLink, 3),
            (BadEpochCertificate, 3),
            (CheckpointHeadMismatch, 4),
            (EntryAltered, 5),
            (BrokenLink, 6),
            (CheckpointHeadMismatch, 7),
            (BadEpochCertificate, 7),
            (CheckpointHeadMismatch, 8),
            (EntryAltered, 8),
            (BrokenLink, 9),
            (CheckpointHeadMismatch, 10)
        ]
    );
}

/// The attacker took the writer host at epoch 2: modifies a record of an earlier epoch,
/// re-chains, drops the checkpoints it cannot re-sign and re-signs the final one with
/// the current key. The epoch certificates (signed by destroyed keys) still catch it.
#[test]
fn modify_rechain_and_reseal_with_the_current_key_is_caught_by_epoch_certificates() {
    let fx = Fixture::standard();
    let key = fx.writer_key();
    assert_eq!(key.epoch, 2);
    for (seq, certs) in [(2u64, vec![3u64, 7]), (5, vec![7])] {
        let mut frames = fx.frames();
        let last = checkpoints(&frames).pop().expect("a checkpoint");
        corrupt_body(&mut frames, seq);
        rechain(&mut frames, seq);
        frames.retain(|f| !matches!(f, Frame::Checkpoint(t) if checkpoint(t).size > seq));
        let head = entry_hash(entry_bytes(&frames, 9));
        frames.push(checkpoint_frame(&sign_checkpoint(
            &key,
            fx.id(),
            10,
            head,
            last.wall_ms,
        )));
        let report = verify_frames(&frames, &fx.options());
        let all = assert_first(&report, Tampered, BadEpochCertificate, certs[0]);
        let expected: Vec<_> = certs.iter().map(|&s| (BadEpochCertificate, s)).collect();
        assert_eq!(all, expected, "modified seq {seq}");
        assert!(
            report.sealed <= seq,
            "sealed {} past the modified record",
            report.sealed
        );
    }
}

#[test]
fn deleted_record_is_a_seq_break() {
    let fx = Fixture::standard();
    // Delete seq 8 with the checkpoint sealing it: the rest still links to nothing.
    let mut frames = fx.frames();
    frames.remove(checkpoint_at(&frames, 9));
    frames.remove(entry_at(&frames, 8));
    let all = assert_first(
        &verify_frames(&frames, &fx.options()),
        Tampered,
        SeqBreak,
        8,
    );
    assert!(all.iter().any(|f| f.0 == BrokenLink), "{all:?}");
    assert!(
        all.iter().all(|f| matches!(f.0, SeqBreak | BrokenLink)),
        "{all:?}"
    );
    // Delete seq 5 alone (mid-batch): its checkpoint now stands after seq 4.
    let mut frames = fx.frames();
    frames.remove(entry_at(&frames, 5));
    let all = assert_first(
        &verify_frames(&frames, &fx.options()),
        Tampered,
        CheckpointMisplaced,
        5,
    );
    assert!(all.contains(&(SeqBreak, 5)), "{all:?}");
    // Delete the first decision.
    let mut frames = fx.frames();
    frames.remove(checkpoint_at(&frames, 2));
    frames.remove(entry_at(&frames, 1));
    assert_first(
        &verify_frames(&frames, &fx.options()),
        Tampered,
        SeqBreak,
        1,
    );
}

#[test]
fn inserted_record_is_caught() {
    let fx = Fixture::standard();
    let mut frames = fx.frames();
    // A forged decision claiming seq 8, correctly linked to seq 7, inserted before the
    // real seq 8 (the attacker has no data key: the body is garbage).
    let mut forged = entry_bytes(&frames, 8).to_vec();
    set_prev_hash(&mut forged, entry_hash(entry_bytes(&frames, 7)));
    forged[HEADER_LEN..].fill(0x5a);
    let at = entry_at(&frames, 8);
    frames.insert(at, Frame::Entry(forged));
    // Findings name positions: the forged entry links correctly, so the chain is first
    // provably inconsistent at position 9, where the real seq 8 stands.
    let all = assert_first(
        &verify_frames(&frames, &fx.options()),
        Tampered,
        SeqBreak,
        9,
    );
    assert!(all.contains(&(BrokenLink, 9)), "{all:?}");
    // With the auditor key the forged entry itself is caught: it does not decrypt.
    let all = assert_first(
        &verify_frames(&frames, &fx.auditor_options()),
        Tampered,
        Undecryptable,
        8,
    );
    assert!(
        all.contains(&(SeqBreak, 9)) && all.contains(&(BrokenLink, 9)),
        "{all:?}"
    );
}

#[test]
fn reordered_records_are_a_seq_break() {
    let fx = Fixture::standard();
    // seq 4 and 5 share a commit group: swapping them moves no checkpoint.
    let mut frames = fx.frames();
    let (a, b) = (entry_at(&frames, 4), entry_at(&frames, 5));
    frames.swap(a, b);
    let all = assert_first(
        &verify_frames(&frames, &fx.options()),
        Tampered,
        SeqBreak,
        4,
    );
    assert!(
        all.contains(&(BrokenLink, 4)) && all.contains(&(BrokenLink, 5)),
        "{all:?}"
    );
    // Swap two sealed records together with their checkpoints.
    let mut frames = fx.frames();
    let (a, b) = (entry_at(&frames, 8), entry_at(&frames, 9));
    frames.swap(a, b);
    let (a, b) = (checkpoint_at(&frames, 9), checkpoint_at(&frames, 10));
    frames.swap(a, b);
    assert_first(
        &verify_frames(&frames, &fx.options()),
        Tampered,
        SeqBreak,
        8,
    );
}

/// The duplicate sits at position `at`; it is found there.
fn duplicates(fx: &Fixture) -> Vec<(Vec<Frame>, u64)> {
    // seq 8 again, right after its checkpoint (as if its commit were replayed).
    let mut replayed = fx.frames();
    let at = checkpoint_at(&replayed, 9) + 1;
    let dup = replayed[entry_at(&replayed, 8)].clone();
    let cp = replayed[at - 1].clone();
    replayed.splice(at..at, [dup, cp]);
    // seq 1 again, after the last checkpoint.
    let mut appended = fx.frames();
    appended.push(appended[entry_at(&appended, 1)].clone());
    vec![(replayed, 9), (appended, 10)]
}

#[test]
fn duplicated_record_is_a_seq_break_at_its_position() {
    let fx = Fixture::standard();
    for (frames, at) in duplicates(&fx) {
        let report = verify_frames(&frames, &fx.options());
        assert_eq!(report.verdict(), Tampered);
        assert!(
            findings(&report).contains(&(SeqBreak, at)),
            "{}",
            report.to_text()
        );
    }
}

#[test]
fn duplicated_record_is_first_reported_at_its_position() {
    let fx = Fixture::standard();
    for (frames, at) in duplicates(&fx) {
        let report = verify_frames(&frames, &fx.options());
        assert_first(&report, Tampered, SeqBreak, at);
        // `Report::sealed`: "with no finding before it".
        assert!(
            report.findings.iter().all(|f| f.seq >= report.sealed),
            "{}",
            report.to_text()
        );
    }
}

#[test]
fn spliced_record_from_another_ledger_with_the_same_keys() {
    let fx = Fixture::standard();
    let other = fx.sibling(STANDARD);
    let theirs = other.frames();
    // As is: another ledger id and another chain.
    let mut frames = fx.frames();
    *entry_mut(&mut frames, 8) = entry_bytes(&theirs, 8).to_vec();
    let all = assert_first(
        &verify_frames(&frames, &fx.options()),
        Tampered,
        WrongLedger,
        8,
    );
    assert!(
        all.contains(&(BrokenLink, 8)) && all.contains(&(CheckpointHeadMismatch, 9)),
        "{all:?}"
    );
    let all = findings(&verify_frames(&frames, &fx.auditor_options()));
    assert!(
        all.contains(&(WrongLedger, 8)) && all.contains(&(Undecryptable, 8)),
        "{all:?}"
    );
    // With its header rewritten to this ledger's id and chain, and the rest re-chained:
    // the seals catch it without a key, and it does not decrypt with the auditor key.
    let mut frames = fx.frames();
    let mut spliced = entry_bytes(&theirs, 8).to_vec();
    spliced[2..18].copy_from_slice(&fx.id().0);
    spliced[30..38].copy_from_slice(&entry_bytes(&frames, 8)[30..38]);
    *entry_mut(&mut frames, 8) = spliced;
    rechain(&mut frames, 7);
    // Checkpoint 9 signs what seq 8 was, and seq 9's re-written link is named too.
    assert_eq!(
        findings(&verify_frames(&frames, &fx.options())),
        [
            (EntryAltered, 8),
            (BrokenLink, 9),
            (CheckpointHeadMismatch, 10)
        ]
    );
    let all = assert_first(
        &verify_frames(&frames, &fx.auditor_options()),
        Tampered,
        EntryAltered,
        8,
    );
    assert!(all.contains(&(Undecryptable, 8)), "{all:?}");
}

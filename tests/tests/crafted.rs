//! Hostile field values: the verifier must answer with findings, never a panic or
//! unbounded memory.

use tally_tests::*;
use tally_verify::FindingKind::*;
use tally_verify::Verdict::Tampered;

#[test]
fn huge_epoch_claim_is_bounded() {
    let fx = Fixture::standard();
    let mut frames = fx.frames();
    // The epoch certificate at seq 3 claims epoch 2^20 + 1 (a single bit flip away from
    // 1); 2^31 + 1 would ask for 64 GiB.
    entry_mut(&mut frames, 3)[26..30].copy_from_slice(&((1u32 << 20) | 1).to_be_bytes());
    let report = verify_frames(&frames, &fx.options());
    assert_first(&report, Tampered, EpochBreak, 3);
    assert!(report.epochs <= 3, "{} epochs", report.epochs);
}

#[test]
fn entry_claiming_the_largest_seq_is_a_seq_break() {
    let fx = Fixture::standard();
    let mut frames = fx.frames();
    entry_mut(&mut frames, 9)[18..26].copy_from_slice(&u64::MAX.to_be_bytes());
    let report = verify_frames(&frames, &fx.options());
    assert_first(&report, Tampered, SeqBreak, 9);
}

#[test]
fn entry_claiming_the_largest_epoch_is_an_epoch_break() {
    let fx = Fixture::standard();
    let mut frames = fx.frames();
    // Decision 6 (epoch 1) claims the last epoch; the certificate of epoch 2 follows.
    entry_mut(&mut frames, 6)[26..30].copy_from_slice(&u32::MAX.to_be_bytes());
    let report = verify_frames(&frames, &fx.options());
    assert_first(&report, Tampered, EpochBreak, 6);
}

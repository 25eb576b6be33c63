//! Keys (SECURITY.md 5.3, 5.4): the wrong verification key, ledgers across many epoch
//! rotations, and the wrong auditor key.

use tally_ledger::keys::{AuditorKey, LedgerPublic};
use tally_ledger::Rotation;
use tally_tests::*;
use tally_verify::FindingKind::*;
use tally_verify::Verdict::{Intact, Tampered};

#[test]
fn verification_key_of_another_ledger() {
    let fx = Fixture::new(&[Step::Append(2)]);
    let other = fx.sibling(&[Step::Append(2)]);
    // The right ledger id with another key: the genesis does not match ledger.pub.
    let public = LedgerPublic {
        ledger_id: fx.id(),
        verifying_key: other.public.verifying_key,
        log_key: None,
    };
    let report = verify_export(&fx.export(), &tally_verify::Options::new(public)).expect("export");
    assert_eq!(findings(&report), [(BadGenesis, 0)], "{}", report.to_text());
    // Another ledger's ledger.pub altogether: never intact, nothing sealed.
    let report = verify_export(&fx.export(), &other.options()).expect("export");
    assert_eq!(report.verdict(), Tampered);
    assert!(report.key_mismatch.is_some(), "{}", report.to_text());
    assert_eq!(report.sealed, 0);
}

/// Another ledger's `ledger.pub` is told by the ledger ids, checked
/// first and named both (a user's mistake, which `tally` reports as exit 2), not a
/// `bad_genesis` finding.
#[test]
fn verification_key_of_another_ledger_is_a_key_mismatch_first() {
    let fx = Fixture::new(&[Step::Append(2)]);
    let other = fx.sibling(&[Step::Append(2)]);
    let report = verify_export(&fx.export(), &other.options()).expect("export");
    assert_eq!(
        report.key_mismatch,
        Some(tally_verify::report::KeyMismatch {
            key_ledger_id: other.id().to_string(),
            ledger_id: fx.id().to_string(),
        })
    );
    assert_eq!(findings(&report), [], "{}", report.to_text());
    let first = report
        .to_text()
        .lines()
        .next()
        .unwrap_or_default()
        .to_owned();
    assert!(
        first.starts_with("NOT VERIFIED")
            && first.contains(&other.id().to_string())
            && first.contains(&fx.id().to_string()),
        "{first}"
    );
}

const ROTATIONS: &[Step] = &[
    Step::Append(2),
    Step::Rotate,
    Step::Append(1),
    Step::Rotate,
    Step::Rotate,
    Step::Append(3),
    Step::Rotate,
    Step::Append(1),
    Step::Append(1),
];

fn assert_decrypts_all(fx: &Fixture, epochs: u32) {
    let export = fx.export();
    let report = verify_export(&export, &fx.options()).expect("export");
    assert_intact(&report);
    assert_eq!(report.epochs, epochs);
    assert_eq!(report.decrypted, None);
    let (report, events) = verify_export_events(&export, &fx.auditor_options()).expect("export");
    assert_intact(&report);
    assert_eq!(report.decrypted, Some(fx.appended.len() as u64));
    let got: Vec<_> = events.iter().map(|e| (*e.decision).clone()).collect();
    assert_eq!(got, fx.appended);
    assert!(events
        .windows(2)
        .all(|w| w[0].seq < w[1].seq && w[0].epoch <= w[1].epoch));
    assert_eq!(events.last().expect("events").epoch, epochs - 1);
}

#[test]
fn ledger_across_many_rotations_verifies_intact() {
    let fx = Fixture::new(ROTATIONS);
    assert_decrypts_all(&fx, 5);
    // The log itself, read in place (the ledger closed, as `tally verify DIR`).
    let appended = fx.appended.len() as u64;
    let Fixture {
        tmp,
        dir,
        ledger,
        public,
        ..
    } = fx;
    drop(ledger);
    let frames = log_frames(&dir);
    let mut opts = tally_verify::Options::new(public);
    opts.auditor = Some(AuditorKey::read(&tmp.path().join("auditor.key")).expect("auditor"));
    let report = verify_frames(&frames, &opts);
    assert_intact(&report);
    assert_eq!(report.decrypted, Some(appended));
}

#[test]
fn automatic_rotation_inside_commit_groups_verifies_intact() {
    // Rotation due every 3 entries: the certificate lands in the same group as decisions.
    let rotation = Rotation {
        records: 3,
        ms: u64::MAX,
    };
    let steps = [
        Step::Append(2),
        Step::Append(1),
        Step::Append(4),
        Step::Append(1),
        Step::Append(1),
        Step::Append(2),
    ];
    let fx = Fixture::build(&AuditorKey::generate(), rotation, &steps);
    let epochs = fx.ledger.epoch() + 1;
    assert!(epochs >= 4, "{epochs} epochs");
    assert_decrypts_all(&fx, epochs);
}

#[test]
fn wrong_auditor_key_decrypts_nothing() {
    let fx = Fixture::new(ROTATIONS);
    let mut opts = fx.options();
    opts.auditor = Some(AuditorKey::generate());
    let (report, events) = verify_export_events(&fx.export(), &opts).expect("export");
    assert!(report.auditor_key_mismatch);
    assert_eq!(report.decrypted, Some(0));
    assert!(events.is_empty());
    // The chain itself is intact; the report says nothing was decrypted.
    assert_eq!(report.verdict(), Intact);
    assert!(report.findings.is_empty());
    assert!(
        report.to_text().contains("decrypted   nothing"),
        "{}",
        report.to_text()
    );
    // The right key: no mismatch.
    let report = verify_export(&fx.export(), &fx.auditor_options()).expect("export");
    assert!(!report.auditor_key_mismatch);
}

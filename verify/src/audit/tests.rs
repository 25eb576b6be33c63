//! `Audit` on small ledgers written by `tally-ledger`: the report a library user gets is
//! the one `tally verify` prints.

use std::path::Path;

use serde_json::Value;
use tally_ledger::keys::{AuditorKey, LedgerPublic};
use tally_ledger::ledger::{Ledger as Log, Rotation};
use tally_ledger::Decision;

use super::{Audit, Ledger};
use crate::analysis::Config;
use crate::{Options, Verdict};

/// A ledger at `dir` holding `calls` allowed calls of run `run`, each settled `ok`.
fn write(dir: &Path, auditor: &AuditorKey, run: &str, calls: u64) -> LedgerPublic {
    let public = Log::init(dir, &auditor.public(), Rotation::default()).expect("init");
    let log = Log::open(dir).expect("open");
    for attempt in 1..=calls {
        let mut allow = Decision::from_json(&format!(
            r#"{{"run":"{run}","kind":"allow","worker":"w1","at_ms":{},"tool":"http.get","operation":"export.status:ea91","args":{{"n":{attempt}}},"effect":"read","channel":"http","attempt":{attempt},"reserve_cents":2}}"#,
            attempt * 10_000
        ))
        .expect("allow");
        allow.seal_args();
        let outcome = Decision::from_json(&format!(
            r#"{{"run":"{run}","kind":"outcome","worker":"w1","at_ms":{},"attempt":{attempt},"status":"ok","settled_cents":1,"remote_ref":"ea91","observed":"running"}}"#,
            attempt * 10_000 + 500
        ))
        .expect("outcome");
        log.append_batch(vec![allow, outcome]).expect("append");
    }
    public
}

/// The auditor's key (a fixed secret: each ledger's options hold a copy).
fn auditor() -> AuditorKey {
    AuditorKey::from_bytes([7; 32])
}

fn audited(ledgers: &[(&Path, LedgerPublic)]) -> Audit {
    Audit {
        ledgers: ledgers
            .iter()
            .map(|(path, public)| {
                let mut options = Options::new(public.clone());
                options.auditor = Some(auditor());
                Ledger::new(*path, options)
            })
            .collect(),
    }
}

#[test]
fn one_ledger_is_verified_and_analysed_as_tally_verify_reports_it() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (dir, auditor) = (tmp.path().join("l"), auditor());
    let public = write(&dir, &auditor, "r1", 3);
    let audit = audited(&[(&dir, public)]);
    let mut read = 0;
    let report = audit
        .run(Some(Config::default()), |n| read = n)
        .expect("audit");
    assert_eq!(report.verdict(), Verdict::Intact);
    assert!(!report.inconsistent());
    assert_eq!(read, report.verified.reports[0].1.entries);
    let analysis = report.analysis.as_ref().expect("analysed");
    assert!(analysis.findings.is_empty() && analysis.replay.findings.is_empty());
    // The text is the ledger's own report, then the analysis's sections.
    let text = report.to_text();
    let own = report.verified.reports[0].1.to_text();
    assert!(text.starts_with(&own) && text.len() > own.len(), "{text}");
    assert!(text.starts_with("INTACT"), "{text}");
    assert!(!text.contains("INCONSISTENT"), "{text}");
    let json = report.to_json();
    assert_eq!(json["decisions"], 6);
    assert_eq!(json["decrypted"], 6);
    assert_eq!(json["audit"]["findings"], Value::Array(Vec::new()));
    assert!(json["replay"].is_object());
    // Without the auditor's analysis the report is the verification alone.
    let keyless = audit.run(None, |_| {}).expect("audit");
    assert!(keyless.analysis.is_none());
    assert_eq!(keyless.to_text(), own);
}

#[test]
fn two_ledgers_are_read_as_one_and_each_is_numbered_with_its_path() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let auditor = auditor();
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    let (pa, pb) = (write(&a, &auditor, "ra", 2), write(&b, &auditor, "rb", 1));
    let audit = audited(&[(&a, pa), (&b, pb)]);
    let report = audit.run(Some(Config::default()), |_| {}).expect("audit");
    assert_eq!(report.verdict(), Verdict::Intact);
    let merge = report.verified.merge.as_ref().expect("merged");
    assert_eq!(merge.decisions, vec![4, 2]);
    let text = report.to_text();
    assert!(
        text.starts_with("INTACT: all 2 ledgers verified and sealed, read as one\n"),
        "{text}"
    );
    assert!(
        text.contains(&format!("ledger 2 ({}):\n", b.display())),
        "{text}"
    );
    assert!(text.contains("merged: 6 decisions of 2 ledgers in state version order\n"));
    let json = report.to_json();
    assert_eq!(json["verdict"], "intact");
    assert_eq!(json["ledgers"][1]["ledger"], 2);
    assert_eq!(json["ledgers"][0]["path"], a.display().to_string());
    assert_eq!(json["ledgers"][0]["decrypted"], 4);
    assert_eq!(
        report.verified.verification_json()["ledgers"][1]["entries"],
        json["ledgers"][1]["entries"]
    );
    assert!(report.verified.banner().is_none());
}

#[test]
fn a_missing_export_is_an_error_that_names_it() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let auditor = auditor();
    let public = write(&tmp.path().join("l"), &auditor, "r", 1);
    let missing = tmp.path().join("nothing.tally");
    let audit = audited(&[(&missing, public)]);
    let err = audit.run(None, |_| {}).expect_err("no such export");
    assert_eq!(err.to_string(), format!("opening {}", missing.display()));
    assert!(std::error::Error::source(&err).is_some());
}

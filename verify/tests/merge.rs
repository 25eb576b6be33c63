//! The merge of several ledgers' decisions into state version order.

use tally_ledger::{Decision, Kind};
use tally_verify::merge::{merge, MergeKind};
use tally_verify::{Event, Seq};

fn event(seq: u64, run: &str, version: Option<u64>) -> Event {
    Event {
        seq: Seq::single(seq),
        wall_ms: 0,
        epoch: 0,
        decision: Box::new(Decision {
            run: run.into(),
            // A record of no run stands for a ledger's policy record.
            kind: Some(if run.is_empty() {
                Kind::Policy
            } else {
                Kind::Allow
            }),
            state_version: version,
            ..Decision::default()
        }),
    }
}

fn stop(seq: u64, run: &str, version: u64) -> Event {
    let mut e = event(seq, run, Some(version));
    e.decision.kind = Some(Kind::Stop);
    e
}

fn merged(sources: Vec<Vec<Event>>) -> (Vec<(u16, u64, u64)>, tally_verify::merge::MergeReport) {
    let mut out = Vec::new();
    let ranked = sources
        .into_iter()
        .enumerate()
        .map(|(i, s)| (i, s.into_iter()));
    let report = merge(ranked.collect(), |e| {
        out.push((e.seq.ledger, e.seq.seq, e.seq.order))
    });
    (out, report)
}

#[test]
fn decisions_interleave_by_state_version_and_keep_each_ledgers_order() {
    let a = vec![
        event(0, "", None), // a policy record: before the decision it came with
        event(1, "r", Some(1)),
        stop(2, "child", 4),
        stop(3, "r", 4), // a kill's stops: one operation, one version
        event(4, "r", Some(9)),
    ];
    let b = vec![
        event(0, "", None),
        event(1, "r", Some(2)),
        event(2, "r", Some(7)),
    ];
    let (out, report) = merged(vec![a, b]);
    let got: Vec<(u16, u64)> = out.iter().map(|&(l, s, _)| (l, s)).collect();
    // Both policy records come before any decision (nothing versioned precedes them).
    assert_eq!(
        got,
        [
            (1, 0),
            (2, 0),
            (1, 1),
            (2, 1),
            (1, 2),
            (1, 3),
            (2, 2),
            (1, 4)
        ]
    );
    // Renumbered in merged order.
    let orders: Vec<u64> = out.iter().map(|&(_, _, o)| o).collect();
    assert_eq!(orders, (0..8).collect::<Vec<_>>());
    assert!(report.is_clean(), "{report:?}");
    assert_eq!(report.decisions, [5, 3]);
    assert_eq!(report.versioned, [4, 2]);
}

#[test]
fn a_version_that_goes_back_in_its_ledger_is_reported_and_not_reordered() {
    let a = vec![
        event(0, "r", Some(5)),
        event(1, "r", Some(3)),
        event(2, "r", Some(6)),
    ];
    let b = vec![event(0, "r", Some(4))];
    let (out, report) = merged(vec![a, b]);
    let got: Vec<(u16, u64)> = out.iter().map(|&(l, s, _)| (l, s)).collect();
    // Ledger 1's seq 1 stays after its seq 0, and goes with it.
    assert_eq!(got, [(2, 0), (1, 0), (1, 1), (1, 2)]);
    assert_eq!(report.findings.len(), 1, "{report:?}");
    assert_eq!(
        report.findings[0].kind,
        MergeKind::VersionBackwards {
            version: 3,
            before: 5
        }
    );
    assert_eq!(report.findings[0].seq.to_string(), "1:1");
}

#[test]
fn one_version_in_two_ledgers_is_reported() {
    let a = vec![event(0, "r", Some(1)), event(1, "r", Some(2))];
    let b = vec![event(0, "s", Some(2))];
    let (_, report) = merged(vec![a, b]);
    assert_eq!(report.findings.len(), 1, "{report:?}");
    match &report.findings[0].kind {
        MergeKind::VersionShared { version, other } => {
            assert_eq!(*version, 2);
            assert_eq!(other.to_string(), "1:1");
        }
        other => panic!("expected a shared version, got {other:?}"),
    }
    assert_eq!(report.findings[0].run, "s");
}

#[test]
fn a_seq_names_its_ledger_only_in_a_merged_audit() {
    assert_eq!(Seq::single(7).to_string(), "7");
    assert_eq!(serde_json::to_string(&Seq::single(7)).unwrap(), "7");
    let merged = Seq {
        order: 3,
        ledger: 2,
        seq: 7,
    };
    assert_eq!(merged.to_string(), "2:7");
    assert_eq!(serde_json::to_string(&merged).unwrap(), "\"2:7\"");
}

#[test]
fn a_run_with_unversioned_records_in_two_ledgers_is_unordered_whatever_the_order_given() {
    let a = || vec![event(0, "r", None), event(1, "r", None)];
    let b = || vec![event(0, "r", None)];
    let ranked = |first: Vec<Event>, second: Vec<Event>, ranks: [u8; 2]| {
        let mut out = Vec::new();
        let report = merge(
            vec![
                (ranks[0], first.into_iter()),
                (ranks[1], second.into_iter()),
            ],
            |e| out.push((e.seq.ledger, e.seq.seq)),
        );
        (out, report)
    };
    // The same two ledgers given in both orders (ranked by their ids, 7 and 9).
    let (ab, report) = ranked(a(), b(), [7, 9]);
    let (ba, _) = ranked(b(), a(), [9, 7]);
    let placed = |out: Vec<(u16, u64)>, a_is: u16| -> Vec<(bool, u64)> {
        out.into_iter().map(|(l, s)| (l == a_is, s)).collect()
    };
    assert_eq!(placed(ab, 1), placed(ba, 2), "one merged order either way");
    assert_eq!(report.findings.len(), 1, "{report:?}");
    assert_eq!(report.findings[0].kind, MergeKind::Unordered);
    assert_eq!(report.findings[0].run, "r");
}

#[test]
fn a_version_past_any_gates_is_reported() {
    let (_, report) = merged(vec![vec![event(0, "r", Some(u64::MAX))], vec![]]);
    assert_eq!(
        report.findings[0].kind,
        MergeKind::VersionOutOfRange { version: u64::MAX }
    );
}

/// One gate operation writes several records at one version only as a kill's stops (a
/// run and its descendants), never two calls: a ledger that repeats its last version on
/// a later call could put that call anywhere after its own previous record in the merged
/// order (before another host's stop of the run, say). Reported.
#[test]
fn a_call_repeating_its_ledgers_last_version_is_reported() {
    let mut first = event(0, "r", Some(4));
    first.decision.attempt = Some(1);
    let mut again = event(1, "r", Some(4));
    again.decision.attempt = Some(2);
    let mut stop = event(0, "r", Some(5));
    stop.decision.kind = Some(Kind::Stop);
    let (out, report) = merged(vec![vec![first, again], vec![stop]]);
    let got: Vec<(u16, u64)> = out.iter().map(|&(l, s, _)| (l, s)).collect();
    assert_eq!(got, [(1, 0), (1, 1), (2, 0)]);
    assert!(
        !report.is_clean(),
        "two calls at one version in one ledger: {report:?}"
    );
}

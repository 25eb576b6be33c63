//! One loop rule: what the gate refuses as `loop_repeated_call` is where `tally loops`
//! finds the loop, on the ledger the gate wrote.

use std::sync::Arc;

use tally_gate::{Caller, CheckRequest, Gate, StartRequest};
use tally_ledger::keys::AuditorKey;
use tally_ledger::{Ledger, Reason, Rotation};
use tally_policy::Recorded;
use tally_tests::read_export;
use tally_verify::analysis::{Analysis, Config, LoopEnd, Pattern, Report};
use tally_verify::{verify, Options};

/// Ask the gate for each path's read in turn (reporting `ok` for each allowed one) until
/// it refuses one; then analyse the ledger it wrote. The refusal's seq and the report.
fn gate_then_loops(paths: &[&str]) -> (Option<u64>, Report) {
    let dir = tempfile::tempdir().expect("tempdir");
    let auditor = AuditorKey::generate();
    let public = Ledger::init(
        &dir.path().join("l"),
        &auditor.public(),
        Rotation::default(),
    )
    .expect("init");
    let ledger = Arc::new(Ledger::open(&dir.path().join("l")).expect("open"));
    let policy = Recorded::new("[approvals]\nask_on = []\n").expect("policy");
    let gate = Gate::open(Arc::clone(&ledger), policy).expect("gate");
    let c = Caller::default();
    gate.start_blocking(
        c,
        StartRequest {
            run: "r".into(),
            ..StartRequest::default()
        },
    )
    .expect("start");
    let mut refused = None;
    for path in paths {
        let req: CheckRequest = serde_json::from_value(serde_json::json!({
            "run": "r", "tool": "fs.read", "effect": "read", "args": {"path": path}
        }))
        .expect("request");
        let a = gate.check_blocking(c, req).expect("answer");
        match a.reason {
            None => {
                let ok = serde_json::json!({"run": "r", "attempt": a.attempt, "status": "ok"});
                gate.outcome_blocking(c, serde_json::from_value(ok).expect("outcome"))
                    .expect("recorded");
            }
            Some(reason) => {
                assert_eq!(reason, Reason::LoopRepeatedCall, "{a:?}");
                refused = a.seq;
                break;
            }
        }
    }
    drop(gate);
    let out = dir.path().join("x.tally");
    ledger.export(&out).expect("export");
    let bytes = std::fs::read(&out).expect("read");
    let mut options = Options::new(public);
    options.auditor = Some(auditor);
    let mut analysis = Analysis::new(Config::default());
    let frames = read_export(&bytes).expect("export");
    verify(frames.into_iter(), &options, |e| analysis.push(&e), |_| {});
    (refused, analysis.finish())
}

#[test]
fn the_gates_loop_refusal_is_where_the_report_finds_the_loop() {
    for (paths, pattern) in [
        (vec!["a"; 10], Pattern::ExactRepetition),
        (
            ["a", "b"]
                .iter()
                .copied()
                .cycle()
                .take(10)
                .collect::<Vec<_>>(),
            Pattern::Alternation,
        ),
    ] {
        let (refused, report) = gate_then_loops(&paths);
        let seq = refused.expect("the gate refused the loop");
        assert_eq!(report.loops.len(), 1, "{pattern:?}: {:?}", report.loops);
        let l = &report.loops[0];
        assert_eq!(l.pattern, pattern);
        assert_eq!(
            l.ended_by,
            LoopEnd::Refused {
                reason: Reason::LoopRepeatedCall,
                seq: tally_verify::Seq::single(seq)
            }
        );
        assert_eq!(l.last_seq, seq);
    }
    // Calls the gate allows are no loop to the report either.
    let (refused, report) = gate_then_loops(&["a", "a", "a", "b", "c", "a"]);
    assert_eq!(refused, None);
    assert_eq!(report.loops, vec![]);
}

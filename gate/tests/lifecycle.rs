//! The gate on a clock the test moves (no sleeping): runs past their deadline are stopped
//! and stop counting toward the uid's open runs; pauses are records, and a pause an older
//! build kept outside the log still holds, and is kept in step.

use std::sync::Arc;

use tally_gate::{Caller, CheckRequest, Clock, Gate, GateError, ManualClock, StartRequest};
use tally_ledger::decision::Budget;
use tally_ledger::keys::AuditorKey;
use tally_ledger::{Ledger, Reason, Rotation};
use tally_policy::{Recorded, Verdict};

const T0: u64 = 1_700_000_000_000;

const ALICE: Caller = Caller {
    uid: Some(1000),
    operator: false,
    proxied: false,
};
const BOB: Caller = Caller {
    uid: Some(2000),
    operator: false,
    proxied: false,
};
const OPERATOR: Caller = Caller {
    uid: None,
    operator: true,
    proxied: false,
};

struct Fixture {
    _dir: tempfile::TempDir,
    ledger: Arc<Ledger>,
    clock: Arc<ManualClock>,
    policy: Recorded,
}

impl Fixture {
    fn new(policy: &str) -> Fixture {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("l");
        Ledger::init(&path, &AuditorKey::generate().public(), Rotation::default()).expect("init");
        Fixture {
            ledger: Arc::new(Ledger::open(&path).expect("open")),
            _dir: dir,
            clock: Arc::new(ManualClock::new(T0)),
            policy: Recorded::new(policy).expect("policy"),
        }
    }

    fn gate(&self) -> Gate {
        Gate::open(Arc::clone(&self.ledger), self.policy.clone())
            .expect("gate")
            .with_clock(Arc::clone(&self.clock) as Arc<dyn Clock>)
    }

    fn at(&self, ms: u64) {
        self.clock.set(T0 + ms);
    }
}

fn start(gate: &Gate, who: Caller, run: &str, deadline_ms: Option<u64>) -> Result<u64, GateError> {
    gate.start_blocking(
        who,
        StartRequest {
            run: run.into(),
            budget: Some(Budget {
                deadline_ms,
                ..Budget::default()
            }),
            ..StartRequest::default()
        },
    )
    .map(|s| s.seq)
}

fn check(gate: &Gate, who: Caller, run: &str) -> Result<tally_gate::CheckAnswer, GateError> {
    let req: CheckRequest = serde_json::from_value(serde_json::json!({
        "run": run, "tool": "search", "effect": "read",
        "args": {"n": gate.ledger().checkpoint().size},
    }))
    .expect("request");
    gate.check_blocking(who, req)
}

fn state(gate: &Gate, run: &str) -> (&'static str, Option<Reason>) {
    let s = gate.run(OPERATOR, run).expect("run");
    (s.state.as_str(), s.stop_reason)
}

#[test]
fn a_start_stops_the_callers_runs_past_their_deadline_first() {
    let f = Fixture::new("max_open_runs_per_uid = 2\n");
    let gate = f.gate();
    start(&gate, ALICE, "a", Some(1000)).expect("a");
    start(&gate, ALICE, "b", Some(5000)).expect("b");
    start(&gate, BOB, "bobs", Some(1000)).expect("bob's");
    f.at(999);
    assert!(matches!(
        start(&gate, ALICE, "c", None),
        Err(GateError::TooManyRuns { max: 2, .. })
    ));
    f.at(1000);
    let before = f.ledger.checkpoint().size;
    let seq = start(&gate, ALICE, "c", None).expect("a's place is free at its deadline");
    // One commit: a's stop, then c's start.
    assert_eq!(seq, before + 1);
    assert_eq!(
        state(&gate, "a"),
        ("stopped", Some(Reason::RunDeadlineExhausted))
    );
    assert_eq!(state(&gate, "b"), ("running", None));
    assert_eq!(
        state(&gate, "bobs"),
        ("running", None),
        "only the caller's runs"
    );
    // A stopped run answers without recording anything.
    assert!(matches!(
        check(&gate, ALICE, "a"),
        Err(GateError::Stopped(_))
    ));
}

#[test]
fn a_check_past_the_deadline_is_refused_and_stops_the_run() {
    let f = Fixture::new("max_open_runs_per_uid = 1\n");
    let gate = f.gate();
    start(&gate, ALICE, "a", Some(1000)).expect("a");
    f.at(999);
    assert_eq!(
        check(&gate, ALICE, "a").expect("check").decision,
        Verdict::Allow
    );
    f.at(1000);
    let before = f.ledger.checkpoint().size;
    let answer = check(&gate, ALICE, "a").expect("check");
    assert_eq!(
        (answer.decision, answer.reason),
        (Verdict::Deny, Some(Reason::RunDeadlineExhausted))
    );
    // The answer is the refusal's (the stop follows it in the same commit).
    assert_eq!(answer.seq, Some(before));
    assert_eq!(f.ledger.checkpoint().size, before + 2);
    assert_eq!(
        state(&gate, "a"),
        ("stopped", Some(Reason::RunDeadlineExhausted))
    );
    match check(&gate, ALICE, "a") {
        Err(GateError::Stopped(a)) => assert_eq!(a.seq, None),
        other => panic!("{other:?}"),
    }
    // It no longer counts: alice may start another run under max_open_runs_per_uid = 1.
    start(&gate, ALICE, "b", None).expect("b");
}

#[test]
fn a_start_refused_after_stopping_expired_runs_still_records_the_stops() {
    let f = Fixture::new("");
    let gate = f.gate();
    start(&gate, ALICE, "a", Some(10)).expect("a");
    f.at(10);
    let before = f.ledger.checkpoint().size;
    let refused = gate.start_blocking(
        ALICE,
        StartRequest {
            run: "child".into(),
            parent: Some("nobody".into()),
            ..StartRequest::default()
        },
    );
    assert!(
        matches!(refused, Err(GateError::RunNotFound(_))),
        "{refused:?}"
    );
    assert_eq!(f.ledger.checkpoint().size, before + 1, "a's stop, alone");
    assert_eq!(
        state(&gate, "a"),
        ("stopped", Some(Reason::RunDeadlineExhausted))
    );
    // After a restart the state says the same (it was written with the stop).
    drop(gate);
    assert_eq!(
        state(&f.gate(), "a"),
        ("stopped", Some(Reason::RunDeadlineExhausted))
    );
}

/// Builds before `pause` records kept a pause in the index alone (`p/` + run): it still
/// holds, and a resume through records keeps it in step, so the run does not come back
/// paused after a restart.
#[test]
fn a_pause_kept_outside_the_log_by_an_older_build_holds_and_is_kept_in_step() {
    let f = Fixture::new("");
    let gate = f.gate();
    start(&gate, ALICE, "r", None).expect("r");
    drop(gate);
    f.ledger
        .put_state_durable(&[(b"p/r".to_vec(), vec![1])])
        .expect("an older build's pause");
    let gate = f.gate();
    assert_eq!(
        check(&gate, ALICE, "r").expect("check").reason,
        Some(Reason::RunPaused)
    );
    gate.pause_blocking(OPERATOR, "r", false).expect("resume");
    assert_eq!(
        check(&gate, ALICE, "r").expect("check").decision,
        Verdict::Allow
    );
    drop(gate);
    let gate = f.gate();
    assert_eq!(state(&gate, "r"), ("running", None));
    assert_eq!(
        check(&gate, ALICE, "r").expect("check").decision,
        Verdict::Allow
    );
    // Paused again through a record: paused after a restart too.
    gate.pause_blocking(OPERATOR, "r", true).expect("pause");
    drop(gate);
    assert_eq!(state(&f.gate(), "r"), ("paused", None));
}

/// Pausing a run whose state does not change records nothing; only the operator pauses.
#[test]
fn pause_and_resume_record_only_what_changes() {
    let f = Fixture::new("");
    let gate = f.gate();
    start(&gate, ALICE, "p", None).expect("p");
    gate.start_blocking(
        ALICE,
        StartRequest {
            run: "c".into(),
            parent: Some("p".into()),
            budget: Some(Budget {
                attempts: Some(3),
                ..Budget::default()
            }),
            ..StartRequest::default()
        },
    )
    .expect("c");
    assert!(matches!(
        gate.pause_blocking(ALICE, "p", true),
        Err(GateError::NotAuthorized(_))
    ));
    // The child paused on its own first; pausing the parent then records the parent's.
    let before = f.ledger.checkpoint().size;
    gate.pause_blocking(OPERATOR, "c", true).expect("pause c");
    assert_eq!(f.ledger.checkpoint().size, before + 1);
    gate.pause_blocking(OPERATOR, "p", true).expect("pause p");
    assert_eq!(f.ledger.checkpoint().size, before + 2);
    gate.pause_blocking(OPERATOR, "p", true).expect("again");
    assert_eq!(f.ledger.checkpoint().size, before + 2, "nothing changed");
    gate.pause_blocking(OPERATOR, "p", false).expect("resume p");
    assert_eq!(f.ledger.checkpoint().size, before + 4, "p and c resumed");
    assert_eq!(state(&gate, "c"), ("running", None));
}

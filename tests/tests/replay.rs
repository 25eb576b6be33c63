//! SECURITY.md 5.8, attacked: a decision appended that the recorded policy would not have made
//! is reported by `verify` with its seq, offline, from the ledger alone.

use std::sync::Arc;

use tally_gate::{Caller, CheckRequest, Gate, StartRequest};
use tally_ledger::keys::AuditorKey;
use tally_ledger::{Decision, Effect, Ledger, Reason, Rotation};
use tally_policy::Inconsistency;
use tally_policy::Recorded;
use tally_tests::read_export;
use tally_verify::analysis::{Analysis, Config, Replay};
use tally_verify::replay::ReplayKind;
use tally_verify::{verify, Options};

const POLICY: &str = "[ceiling]\nattempts = 2\n[approvals]\nask_on = []\n";

fn check(gate: &Gate, op: &str) -> tally_gate::CheckAnswer {
    let req: CheckRequest = serde_json::from_value(serde_json::json!({
        "run": "r", "tool": "http", "operation": op, "effect": "read", "args": {"op": op}
    }))
    .expect("request");
    gate.check_blocking(Caller::default(), req).expect("check")
}

/// A gated run (two allows, then a refusal), plus whatever `forge` appends behind the
/// gate's back; the replay of the export.
fn replayed(forge: impl FnOnce(&Ledger, &str)) -> tally_verify::replay::ReplayReport {
    analysed(forge).replay
}

/// The same, with everything the one fold found: the audit's findings beside replay's.
fn analysed(forge: impl FnOnce(&Ledger, &str)) -> tally_verify::analysis::Report {
    let dir = tempfile::tempdir().expect("tempdir");
    let auditor = AuditorKey::generate();
    let public = Ledger::init(
        &dir.path().join("l"),
        &auditor.public(),
        Rotation::default(),
    )
    .expect("init");
    let ledger = Arc::new(Ledger::open(&dir.path().join("l")).expect("open"));
    let policy = Recorded::new(POLICY).expect("policy");
    let digest = policy.digest.clone();
    let gate = Gate::open(Arc::clone(&ledger), policy).expect("gate");
    gate.start_blocking(
        Caller::default(),
        StartRequest {
            run: "r".into(),
            ..StartRequest::default()
        },
    )
    .expect("start");
    assert_eq!(check(&gate, "a").reason, None);
    assert_eq!(check(&gate, "b").reason, None);
    assert_eq!(check(&gate, "c").reason, Some(Reason::AttemptsExhausted));
    drop(gate);
    forge(&ledger, &digest);
    let out = dir.path().join("x.tally");
    ledger.export(&out).expect("export");
    let bytes = std::fs::read(&out).expect("read");
    let mut options = Options::new(public);
    options.auditor = Some(auditor);
    let mut analysis = Analysis::new(Config::default());
    let frames = read_export(&bytes).expect("export");
    let report = verify(frames.into_iter(), &options, |e| analysis.push(&e), |_| {});
    assert_eq!(
        report.verdict(),
        tally_verify::Verdict::Intact,
        "{}",
        report.to_text()
    );
    analysis.finish()
}

fn forged_allow(policy: Option<&str>, attempt: u64) -> Decision {
    Decision {
        run: "r".into(),
        kind: Some(tally_ledger::Kind::Allow),
        // After the gate's own records: a forger keeps the clock going forward.
        at_ms: Some(100_000),
        tool: Some("http".into()),
        operation: Some("d".into()),
        effect: Some(Effect::Read),
        attempt: Some(attempt),
        policy: policy.map(str::to_owned),
        ..Decision::default()
    }
}

#[test]
fn an_honest_gate_replays_clean() {
    let report = replayed(|_, _| {});
    assert_eq!(report.replayed, 3);
    assert!(report.findings.is_empty(), "{}", report.to_text());
}

#[test]
fn an_allow_the_policy_would_refuse_is_reported_with_its_seq() {
    // Seqs: 0 genesis, 1 policy, 2 start, 3..=5 the gate's checks; the forgery is 6.
    let report = replayed(|ledger, digest| {
        ledger
            .append(forged_allow(Some(digest), 3))
            .expect("append behind the gate");
    });
    assert_eq!(report.findings.len(), 1, "{}", report.to_text());
    let f = &report.findings[0];
    assert_eq!(f.seq, 6);
    assert_eq!(
        f.kind,
        ReplayKind::AllowedAgainstPolicy {
            would: Reason::AttemptsExhausted
        }
    );
    assert!(report.to_text().contains("seq 6"), "{}", report.to_text());
}

#[test]
fn skipped_attempt_numbers_are_reported_and_excuse_nothing() {
    // Attempts 3..=6 skipped: issued by a state no ledger given records (a networked
    // gate killed before recording) or forged; either way counted as used, so the allow
    // is still beyond the budget.
    let report = analysed(|ledger, digest| {
        ledger
            .append(forged_allow(Some(digest), 7))
            .expect("append behind the gate");
    });
    let audit: Vec<&Inconsistency> = report.findings.iter().map(|f| &f.kind).collect();
    assert!(
        audit.contains(&&Inconsistency::AttemptsUnrecorded { from: 3, to: 6 }),
        "{audit:?}"
    );
    let kinds: Vec<&ReplayKind> = report.replay.findings.iter().map(|f| &f.kind).collect();
    assert_eq!(
        kinds,
        [&ReplayKind::AllowedAgainstPolicy {
            would: Reason::AttemptsExhausted
        }],
        "{}",
        report.replay.to_text()
    );
    let text = tally_verify::analysis::render_findings_text(&report);
    assert!(text.contains("attempts 3..=6 were issued"), "{text}");
}

#[test]
fn an_allow_without_the_gates_policy_is_not_from_the_gate() {
    let report = replayed(|ledger, _| {
        ledger.append(forged_allow(None, 3)).expect("append");
    });
    assert_eq!(report.findings.len(), 1, "{}", report.to_text());
    assert_eq!(report.findings[0].seq, 6);
    assert!(matches!(
        report.findings[0].kind,
        ReplayKind::NotFromGate { .. }
    ));
}

#[test]
fn a_refusal_the_policy_would_not_make_is_reported() {
    let report = replayed(|ledger, digest| {
        let mut d = forged_allow(Some(digest), 3);
        d.kind = Some(tally_ledger::Kind::Deny);
        d.attempt = None;
        // A new run with budget to spare, refused for a loop it never made.
        let start = Decision {
            run: "fresh".into(),
            kind: Some(tally_ledger::Kind::Start),
            at_ms: Some(0),
            budget: Some(Box::new(tally_policy::grant_budget(
                &tally_policy::Policy::from_toml(POLICY).expect("policy"),
                None,
                None,
                None,
            ))),
            policy: Some(digest.to_owned()),
            ..Decision::default()
        };
        ledger.append(start).expect("start");
        d.run = "fresh".into();
        d.reason = Some(Reason::LoopRepeatedCall);
        ledger.append(d).expect("deny");
    });
    assert_eq!(report.findings.len(), 1, "{}", report.to_text());
    assert_eq!(report.findings[0].seq, 7);
    assert_eq!(
        report.findings[0].kind,
        ReplayKind::RefusedAgainstPolicy {
            recorded: Reason::LoopRepeatedCall
        }
    );
}

/// A pause is a record: an allow recorded while the run's records say it is
/// paused is one the gate would not have made.
#[test]
fn an_allow_while_the_run_is_paused_is_reported() {
    let report = replayed(|ledger, digest| {
        let start = Decision {
            run: "held".into(),
            kind: Some(tally_ledger::Kind::Start),
            at_ms: Some(0),
            budget: Some(Box::new(tally_policy::grant_budget(
                &tally_policy::Policy::from_toml(POLICY).expect("policy"),
                None,
                None,
                None,
            ))),
            policy: Some(digest.to_owned()),
            ..Decision::default()
        };
        ledger.append(start).expect("start");
        for kind in [tally_ledger::Kind::Pause, tally_ledger::Kind::Allow] {
            let mut d = forged_allow(Some(digest), 1);
            d.run = "held".into();
            if kind == tally_ledger::Kind::Pause {
                d = Decision {
                    run: "held".into(),
                    kind: Some(kind),
                    at_ms: Some(50_000),
                    policy: Some(digest.to_owned()),
                    ..Decision::default()
                };
            }
            ledger.append(d).expect("append behind the gate");
        }
    });
    assert_eq!(report.findings.len(), 1, "{}", report.to_text());
    assert_eq!(report.findings[0].seq, 8);
    assert_eq!(
        report.findings[0].kind,
        ReplayKind::AllowedAgainstPolicy {
            would: Reason::RunPaused
        }
    );
}

/// A policy whose record would not fit a decision (12 KiB of newlines escape to 24 KiB)
/// is refused when the gate opens, not at its first decision.
#[test]
fn a_policy_too_large_to_record_is_refused_when_the_gate_opens() {
    let dir = tempfile::tempdir().expect("tempdir");
    let auditor = AuditorKey::generate();
    Ledger::init(
        &dir.path().join("l"),
        &auditor.public(),
        Rotation::default(),
    )
    .expect("init");
    let ledger = Arc::new(Ledger::open(&dir.path().join("l")).expect("open"));
    let policy = Recorded::new(&"\n".repeat(12_000)).expect("a valid, empty policy");
    let refused = Gate::open(ledger, policy);
    assert!(
        matches!(refused, Err(tally_gate::GateError::Invalid(_))),
        "{:?}",
        refused.err()
    );
}

/// Review finding: replay did not do what the gate does beside its records (carve a
/// child's budget, carry a continuation's unknown writes, keep a credential's spend), so
/// honest refusals were reported as ones the policy would not make.
#[test]
fn an_honest_gate_with_children_continuations_exempt_tools_and_backstops_replays_clean() {
    let dir = tempfile::tempdir().expect("tempdir");
    let auditor = AuditorKey::generate();
    let public = Ledger::init(
        &dir.path().join("l"),
        &auditor.public(),
        Rotation::default(),
    )
    .expect("init");
    let ledger = Arc::new(Ledger::open(&dir.path().join("l")).expect("open"));
    let text = "[approvals]\nask_on = []\n[scope]\nexempt = [\"search\"]\n[credentials.team]\nspend_cents_per_period = 100\n";
    let gate = Gate::open(Arc::clone(&ledger), Recorded::new(text).expect("policy")).expect("gate");
    let c = Caller::default();
    let start = |v: serde_json::Value| {
        gate.start_blocking(c, serde_json::from_value(v).expect("start"))
            .expect("started")
    };
    let ask = |v: serde_json::Value| {
        gate.check_blocking(c, serde_json::from_value(v).expect("check"))
            .expect("answer")
    };
    let done = |run: &str, attempt: Option<u64>, status: &str, cents: u64| {
        let req = serde_json::json!({"run": run, "attempt": attempt, "status": status, "settled_cents": cents});
        gate.outcome_blocking(c, serde_json::from_value(req).expect("outcome"))
            .expect("recorded");
    };
    // A parent whose child takes two of its three attempts: its third call is refused.
    start(serde_json::json!({"run": "p", "budget": {"attempts": 3}}));
    start(serde_json::json!({"run": "k", "parent": "p", "budget": {"attempts": 2}}));
    let a = ask(serde_json::json!({"run": "p", "tool": "t", "operation": "1", "effect": "read"}));
    assert_eq!(a.reason, None);
    let refused =
        ask(serde_json::json!({"run": "p", "tool": "t", "operation": "2", "effect": "read"}));
    assert_eq!(refused.reason, Some(Reason::AttemptsExhausted));
    // Exempt calls use no attempt.
    for i in 0..5 {
        let a = ask(
            serde_json::json!({"run": "k", "tool": "search", "operation": format!("q{i}"), "effect": "read"}),
        );
        assert_eq!(a.reason, None);
        done("k", a.attempt, "ok", 0);
    }
    // A continuation refuses the write the stopped run left unknown.
    start(serde_json::json!({"run": "old"}));
    let w = ask(
        serde_json::json!({"run": "old", "tool": "pay", "operation": "charge", "effect": "non_idempotent_write"}),
    );
    done("old", w.attempt, "timeout", 0);
    gate.stop_blocking(c, "old", tally_gate::StopRequest::default())
        .expect("stop");
    start(serde_json::json!({"run": "new", "continues": "old"}));
    let again = ask(
        serde_json::json!({"run": "new", "tool": "pay", "operation": "charge", "effect": "non_idempotent_write"}),
    );
    assert_eq!(again.reason, Some(Reason::OutcomeUnknownNonIdempotent));
    // A credential's backstop refuses another of its runs.
    start(serde_json::json!({"run": "a", "credential": "team"}));
    let x = ask(
        serde_json::json!({"run": "a", "tool": "llm", "operation": "x", "effect": "read", "reserve_cents": 80}),
    );
    done("a", x.attempt, "ok", 80);
    start(serde_json::json!({"run": "b", "credential": "team"}));
    let y = ask(
        serde_json::json!({"run": "b", "tool": "llm", "operation": "y", "effect": "read", "reserve_cents": 50}),
    );
    assert_eq!(y.reason, Some(Reason::BudgetExceeded));
    // The operator kills the parent: its child is stopped in the same commit.
    let operator = Caller {
        uid: None,
        operator: true,
        proxied: false,
    };
    gate.stop_blocking(operator, "p", tally_gate::StopRequest::default())
        .expect("kill");
    let req =
        serde_json::json!({"run": "k", "tool": "search", "operation": "q9", "effect": "read"});
    match gate.check_blocking(c, serde_json::from_value(req).expect("check")) {
        Err(tally_gate::GateError::Stopped(a)) => {
            assert_eq!(a.reason, Some(Reason::KilledByOperator))
        }
        other => panic!("the child goes on after its parent's kill: {other:?}"),
    }
    drop(gate);
    let out = dir.path().join("x.tally");
    ledger.export(&out).expect("export");
    let bytes = std::fs::read(&out).expect("read");
    let mut options = Options::new(public);
    options.auditor = Some(auditor);
    let mut replay = Replay::new();
    let frames = read_export(&bytes).expect("export");
    verify(frames.into_iter(), &options, |e| replay.push(&e), |_| {});
    let report = replay.finish();
    assert!(report.replayed >= 10, "{}", report.to_text());
    assert!(report.findings.is_empty(), "{}", report.to_text());
}

/// Review finding: replay accepted gate ledgers the policy never produces: a start
/// granting more than the ceiling, a refund (the gate writes none), a clock going back,
/// an allow under another uid, a timeout past the run's deadline.
#[test]
fn crafted_gate_records_are_reported() {
    let all = analysed(|ledger, digest| {
        let p = Some(digest.to_owned());
        let mut start = Decision {
            run: "rich".into(),
            kind: Some(tally_ledger::Kind::Start),
            at_ms: Some(0),
            budget: Some(Box::new(tally_ledger::decision::Budget {
                attempts: Some(1000),
                ..Default::default()
            })),
            policy: p.clone(),
            ..Decision::default()
        };
        ledger.append(start.clone()).expect("start"); // seq 6: beyond the ceiling of 2
        start.run = "r".into();
        let refund = Decision {
            run: "r".into(),
            kind: Some(tally_ledger::Kind::Refund),
            at_ms: Some(10),
            of: Some(1),
            policy: p.clone(),
            ..Decision::default()
        };
        ledger.append(refund).expect("refund"); // seq 7
        let mut back = forged_allow(Some(digest), 3);
        back.at_ms = Some(1); // seq 8: before the refund's 10 ms
        back.uid = Some(4242); // and under a uid that does not own the run
        ledger.append(back).expect("allow");
    });
    // Beyond the ceiling: the core's judgement of the start, an audit finding.
    assert!(
        all.findings.iter().any(|f| f.seq == 6
            && matches!(
                f.kind,
                Inconsistency::StartBeyondGrant {
                    dimension: tally_policy::Dimension::Attempts,
                    granted: 1000,
                    most: 2
                }
            )),
        "{:?}",
        all.findings
    );
    let report = all.replay;
    let kinds: Vec<(u64, &ReplayKind)> = report
        .findings
        .iter()
        .map(|f| (f.seq.seq, &f.kind))
        .collect();
    assert!(
        kinds.contains(&(
            7,
            &ReplayKind::GateNeverWrites {
                record: tally_ledger::Kind::Refund
            }
        )),
        "{}",
        report.to_text()
    );
    assert!(
        kinds
            .iter()
            .any(|(s, k)| *s == 8 && matches!(k, ReplayKind::ClockBackwards { .. })),
        "{}",
        report.to_text()
    );
    assert!(
        kinds
            .iter()
            .any(|(s, k)| *s == 8 && matches!(k, ReplayKind::NotOwner { .. })),
        "{}",
        report.to_text()
    );
}

// The embedded gate's state versions never go back, neither across a gate opened
// again over the same ledger nor across the ledger closed and opened again (the counter
// starts at the ledger's durable size).
#[test]
fn embedded_state_versions_increase_across_restarts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let auditor = AuditorKey::generate();
    let path = dir.path().join("l");
    let public = Ledger::init(&path, &auditor.public(), Rotation::default()).expect("init");
    let policy = || Recorded::new("[ceiling]\nattempts = 9\n[approvals]\nask_on = []\n").unwrap();
    {
        let ledger = Arc::new(Ledger::open(&path).expect("open"));
        let gate = Gate::open(Arc::clone(&ledger), policy()).expect("gate");
        gate.start_blocking(
            Caller::default(),
            StartRequest {
                run: "r".into(),
                ..StartRequest::default()
            },
        )
        .expect("start");
        check(&gate, "a");
        check(&gate, "b");
        drop(gate);
        let gate = Gate::open(Arc::clone(&ledger), policy()).expect("gate again");
        check(&gate, "c");
        // A raw append between: it takes a seq, no version.
        ledger.append(tally_tests::decision(1)).expect("raw append");
        check(&gate, "d");
    }
    {
        let ledger = Arc::new(Ledger::open(&path).expect("open again"));
        let gate = Gate::open(Arc::clone(&ledger), policy()).expect("gate reopened");
        check(&gate, "e");
        check(&gate, "f");
    }
    let ledger = Ledger::open(&path).expect("open to export");
    let out = dir.path().join("x.tally");
    ledger.export(&out).expect("export");
    let bytes = std::fs::read(&out).expect("read");
    let mut options = Options::new(public);
    options.auditor = Some(auditor);
    let mut versions = Vec::new();
    let frames = read_export(&bytes).expect("export");
    let report = verify(
        frames.into_iter(),
        &options,
        |e| {
            if let Some(v) = e.decision.state_version {
                versions.push(v);
            }
        },
        |_| {},
    );
    assert_eq!(report.verdict(), tally_verify::Verdict::Intact);
    assert_eq!(versions.len(), 7, "{versions:?}");
    assert!(
        versions.windows(2).all(|w| w[0] < w[1]),
        "versions go back or repeat: {versions:?}"
    );
}

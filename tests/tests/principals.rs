//! Principal budgets and proxied attempts under replay and the audit: the gate's
//! decisions verify clean (every allow and deny decided again on the uid's budget
//! folded across its runs), an allow forged past the uid's budget in a fresh run is
//! reported, and an outcome of a proxied attempt that the proxy did not report is a
//! finding.

use std::sync::Arc;

use tally_gate::{Caller, CheckRequest, Gate, OutcomeRequest, StartRequest};
use tally_ledger::keys::AuditorKey;
use tally_ledger::{Decision, Effect, Kind, Ledger, Reason, Rotation, Status};
use tally_policy::{Recorded, Verdict};
use tally_tests::read_export;
use tally_verify::analysis::{Analysis, Config, Report};
use tally_verify::replay::ReplayKind;
use tally_verify::{verify, Options};

const POLICY: &str = "[principals.default]\nattempts = 3\n[approvals]\nask_on = []\n";
const UID: u32 = 1000;

fn agent() -> Caller {
    Caller {
        uid: Some(UID),
        ..Caller::default()
    }
}

fn proxy() -> Caller {
    Caller {
        uid: Some(UID),
        proxied: true,
        ..Caller::default()
    }
}

fn check(gate: &Gate, who: Caller, run: &str, op: &str) -> tally_gate::CheckAnswer {
    let req: CheckRequest = serde_json::from_value(serde_json::json!({
        "run": run, "tool": "http", "operation": op, "effect": "read", "args": {"op": op}
    }))
    .expect("request");
    gate.check_blocking(who, req).expect("check")
}

fn start(gate: &Gate, run: &str) -> Result<(), tally_gate::GateError> {
    gate.start_blocking(
        agent(),
        StartRequest {
            run: run.into(),
            ..StartRequest::default()
        },
    )
    .map(drop)
}

/// Two runs of one uid through the gate (3 allows across them, one of them proxied and
/// reported by the proxy, then a refusal, then a refused start), plus what `forge`
/// appends behind the gate's back; the analysis of the export.
fn analysed(forge: impl FnOnce(&Ledger, &str)) -> Report {
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
    start(&gate, "a").expect("start");
    assert_eq!(check(&gate, agent(), "a", "x").decision, Verdict::Allow);
    let proxied = check(&gate, proxy(), "a", "y");
    assert_eq!(proxied.decision, Verdict::Allow);
    gate.outcome_blocking(
        proxy(),
        OutcomeRequest {
            run: "a".into(),
            attempt: proxied.attempt.expect("attempt"),
            // Still running: the attempt stays open, its final outcome to come.
            status: Status::Running,
            settled_cents: None,
            settled_nanos: None,
            remote_ref: None,
            observed: None,
            retry_after_ms: None,
            result_digest: None,
            worker: None,
            usage_refused: None,
            usage: None,
        },
    )
    .expect("the proxy's outcome");
    start(&gate, "b").expect("start");
    assert_eq!(check(&gate, agent(), "b", "z").decision, Verdict::Allow);
    assert_eq!(
        check(&gate, agent(), "b", "w").reason,
        Some(Reason::PrincipalBudgetExceeded)
    );
    assert!(start(&gate, "c").is_err());
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

#[test]
fn a_gate_with_principals_and_proxied_calls_verifies_clean() {
    let report = analysed(|_, _| {});
    assert_eq!(report.replay.replayed, 4);
    assert!(
        report.replay.findings.is_empty(),
        "{}",
        report.replay.to_text()
    );
    assert!(report.findings.is_empty(), "{:?}", report.findings);
}

#[test]
fn an_allow_past_the_uids_budget_in_a_fresh_run_is_reported() {
    let report = analysed(|ledger, digest| {
        // A start behind the gate's back (its runs are not limited here) and an allow in
        // it: the run's own budget has room, the uid's does not.
        for d in [
            Decision {
                run: "d".into(),
                kind: Some(Kind::Start),
                at_ms: Some(0),
                policy: Some(digest.to_owned()),
                uid: Some(UID),
                budget: Some(Default::default()),
                ..Decision::default()
            },
            Decision {
                run: "d".into(),
                kind: Some(Kind::Allow),
                at_ms: Some(1),
                tool: Some("http".into()),
                operation: Some("q".into()),
                effect: Some(Effect::Read),
                attempt: Some(1),
                timeout_ms: Some(60_000),
                policy: Some(digest.to_owned()),
                uid: Some(UID),
                ..Decision::default()
            },
        ] {
            ledger.append(d).expect("append behind the gate");
        }
    });
    let kinds: Vec<&ReplayKind> = report.replay.findings.iter().map(|f| &f.kind).collect();
    assert_eq!(
        kinds,
        vec![&ReplayKind::AllowedAgainstPolicy {
            would: Reason::PrincipalBudgetExceeded
        }],
        "{}",
        report.replay.to_text()
    );
}

#[test]
fn an_outcome_of_a_proxied_attempt_not_from_the_proxy_is_a_finding() {
    // Run a's attempt 2 was the proxy's, still running: its final outcome is the proxy's.
    let outcome = |digest: &str, proxied: Option<bool>| Decision {
        run: "a".into(),
        kind: Some(Kind::Outcome),
        at_ms: Some(10_000),
        attempt: Some(2),
        status: Some(Status::Ok),
        settled_cents: Some(0),
        policy: Some(digest.to_owned()),
        uid: Some(UID),
        proxied,
        ..Decision::default()
    };
    let report = analysed(|ledger, digest| {
        ledger.append(outcome(digest, None)).expect("append");
    });
    let kinds: Vec<&str> = report.findings.iter().map(|f| f.kind.as_str()).collect();
    assert_eq!(kinds, ["outcome_owned_by_proxy"], "{:?}", report.findings);
    // The proxy's own report of it is no finding.
    let report = analysed(|ledger, digest| {
        ledger.append(outcome(digest, Some(true))).expect("append");
    });
    assert!(report.findings.is_empty(), "{:?}", report.findings);
}

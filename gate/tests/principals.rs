//! Principal budgets (docs/GATE.md, "Principals") and proxied attempts, on a
//! [`ManualClock`] the test moves (never sleeping): a uid's runs, attempts and spend are
//! counted across all its runs per period, a new run is no new budget, the period rolls
//! over, a uid of its own replaces the default, and the state comes back from the log
//! when the index is lost. An attempt the proxy made has its outcome from the proxy only.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use tally_ledger::money::NANOS_PER_CENT;

use serde_json::json;
use tally_gate::{Caller, CheckAnswer, CheckRequest, Clock, Gate, GateError, ManualClock};
use tally_gate::{OutcomeRequest, StartRequest};
use tally_ledger::keys::AuditorKey;
use tally_ledger::{Ledger, Reason, Rotation};
use tally_policy::{Recorded, Verdict};

const T0: u64 = 1_700_000_000_000;

fn agent(uid: u32) -> Caller {
    Caller {
        uid: Some(uid),
        ..Caller::default()
    }
}

fn proxy(uid: u32) -> Caller {
    Caller {
        uid: Some(uid),
        proxied: true,
        ..Caller::default()
    }
}

struct Fixture {
    _dir: tempfile::TempDir,
    path: PathBuf,
    policy: String,
    clock: Arc<ManualClock>,
    gate: Gate,
}

fn open(path: &Path, policy: &str, clock: &Arc<ManualClock>) -> Gate {
    let ledger = Ledger::open_with_clock(path, Arc::clone(clock) as Arc<dyn Clock>).expect("open");
    Gate::open(Arc::new(ledger), Recorded::new(policy).expect("policy"))
        .expect("gate")
        .with_clock(Arc::clone(clock) as Arc<dyn Clock>)
}

impl Fixture {
    fn new(policy: &str) -> Fixture {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("l");
        let clock = Arc::new(ManualClock::new(T0));
        Ledger::init_with_clock(
            &path,
            &AuditorKey::generate().public(),
            Rotation::default(),
            clock.as_ref(),
        )
        .expect("init");
        let gate = open(&path, policy, &clock);
        Fixture {
            _dir: dir,
            path,
            policy: policy.to_owned(),
            clock,
            gate,
        }
    }

    /// Move the clock to `ms` after T0.
    fn at(&self, ms: u64) {
        self.clock.set(T0 + ms);
    }

    fn start(&self, who: Caller, run: &str) -> Result<(), GateError> {
        self.gate
            .start_blocking(
                who,
                StartRequest {
                    run: run.into(),
                    ..StartRequest::default()
                },
            )
            .map(drop)
    }

    fn check_as(&self, who: Caller, run: &str, reserve: u64) -> CheckAnswer {
        let req: CheckRequest = serde_json::from_value(json!({
            "run": run,
            "tool": "search",
            "effect": "read",
            "args": {"n": self.clock.now_ms()},
            "reserve_cents": reserve,
        }))
        .expect("request");
        self.clock.advance(1);
        self.gate.check_blocking(who, req).expect("an answer")
    }

    fn check(&self, uid: u32, run: &str, reserve: u64) -> (Verdict, Option<Reason>) {
        let a = self.check_as(agent(uid), run, reserve);
        (a.decision, a.reason)
    }

    fn outcome(&self, who: Caller, run: &str, attempt: u64, settled: u64) -> Result<(), GateError> {
        let req = OutcomeRequest {
            run: run.into(),
            attempt,
            status: tally_ledger::Status::Ok,
            settled_cents: Some(settled),
            settled_nanos: None,
            remote_ref: None,
            observed: None,
            retry_after_ms: None,
            result_digest: None,
            worker: None,
            usage_refused: None,
            usage: None,
        };
        self.gate.outcome_blocking(who, req).map(drop)
    }

    /// Close the gate, delete the ledger's index, and open it again: the state comes
    /// back from the log alone.
    fn restart_without_index(&mut self) {
        let placeholder = Fixture::new("");
        let old = std::mem::replace(&mut self.gate, placeholder.gate);
        drop(old);
        std::fs::remove_dir_all(self.path.join(tally_ledger::store::INDEX_DIR)).expect("rm index");
        self.gate = open(&self.path, &self.policy, &self.clock);
    }
}

const ALLOW: (Verdict, Option<Reason>) = (Verdict::Allow, None);
const PRINCIPAL: (Verdict, Option<Reason>) = (Verdict::Deny, Some(Reason::PrincipalBudgetExceeded));

fn refused_start(r: Result<(), GateError>) -> bool {
    matches!(r, Err(GateError::Refused(Reason::PrincipalBudgetExceeded)))
}

#[test]
fn runs_per_period_across_runs_and_the_period_rolls_over() {
    let f = Fixture::new("[principals.default]\nruns = 3\nperiod_ms = 10000\n");
    for i in 0..3 {
        f.start(agent(1000), &format!("r{i}"))
            .expect("within the runs");
        // Stopping a run gives nothing back: runs started are counted.
        f.gate
            .stop_blocking(agent(1000), &format!("r{i}"), Default::default())
            .expect("stop");
    }
    assert!(refused_start(f.start(agent(1000), "r3")), "a fourth run");
    assert_eq!(
        Reason::PrincipalBudgetExceeded.action(),
        tally_ledger::Action::Ask
    );
    // Another uid has a budget of its own; the in-process operator (no uid) has none.
    f.start(agent(2000), "other").expect("another uid");
    f.start(Caller::default(), "in-process").expect("no uid");
    // One ms before the period ends: still refused; at its end: a new period.
    f.at(9_999);
    assert!(refused_start(f.start(agent(1000), "r4")));
    f.at(10_000);
    f.start(agent(1000), "r5").expect("a new period");
}

#[test]
fn attempts_across_runs_deny_checks_then_refuse_starts() {
    let f = Fixture::new("[principals.default]\nattempts = 4\nperiod_ms = 60000\n");
    f.start(agent(1000), "a").expect("start");
    for _ in 0..3 {
        assert_eq!(f.check(1000, "a", 0), ALLOW);
    }
    f.start(agent(1000), "b").expect("start");
    assert_eq!(f.check(1000, "b", 0), ALLOW);
    // The run's own budget has room; the uid's does not, in either run.
    assert_eq!(f.check(1000, "b", 0), PRINCIPAL);
    assert_eq!(f.check(1000, "a", 0), PRINCIPAL);
    assert!(
        refused_start(f.start(agent(1000), "c")),
        "a new run is no way around it"
    );
    f.at(60_000);
    assert_eq!(f.check(1000, "a", 0), ALLOW, "a new period");
    f.start(agent(1000), "c").expect("a new period");
}

#[test]
fn spend_across_runs_counts_reservations_and_settles_like_the_runs() {
    let f = Fixture::new("[principals.default]\nspend_cents = 100\n");
    f.start(agent(1000), "a").expect("start");
    f.start(agent(1000), "b").expect("start");
    let first = f.check_as(agent(1000), "a", 60);
    assert_eq!(first.decision, Verdict::Allow);
    assert_eq!(f.check(1000, "b", 50), PRINCIPAL, "60 held + 50 > 100");
    assert_eq!(f.check(1000, "b", 40), ALLOW, "60 + 40 fits exactly");
    // Settled below its reservation: the difference is free again.
    f.outcome(agent(1000), "a", first.attempt.expect("attempt"), 10)
        .expect("outcome");
    assert_eq!(f.check(1000, "b", 50), ALLOW, "10 + 40 + 50 = 100");
    assert_eq!(f.check(1000, "a", 1), PRINCIPAL);
    // A call that reserves nothing still fits; a new run has nothing more to spend.
    assert_eq!(f.check(1000, "a", 0), ALLOW);
    assert!(refused_start(f.start(agent(1000), "c")));
}

#[test]
fn a_uid_of_its_own_replaces_the_default() {
    let f = Fixture::new(
        "[principals.default]\nruns = 1\n\n[principals.uid.1000]\nruns = 3\nattempts = 2\n",
    );
    for i in 0..3 {
        f.start(agent(1000), &format!("mine{i}"))
            .expect("its own allowance");
    }
    assert!(refused_start(f.start(agent(1000), "mine3")));
    f.start(agent(2000), "theirs0").expect("the default");
    assert!(refused_start(f.start(agent(2000), "theirs1")));
    // The uid's own entry replaces the default whole: its attempts are 2, and the
    // default gives uid 2000 no attempt limit.
    assert_eq!(f.check(1000, "mine0", 0), ALLOW);
    assert_eq!(f.check(1000, "mine1", 0), ALLOW);
    assert_eq!(f.check(1000, "mine2", 0), PRINCIPAL);
    for _ in 0..3 {
        assert_eq!(f.check(2000, "theirs0", 0), ALLOW);
    }
}

#[test]
fn a_bad_principals_table_is_refused_with_its_key() {
    for (policy, key) in [
        ("[principals.uid.alice]\nruns = 1\n", "principals.uid.alice"),
        ("[principals.uid.01000]\nruns = 1\n", "principals.uid.01000"),
        (
            "[principals.default]\nperiod_ms = 0\n",
            "principals.default.period_ms",
        ),
        ("[principals.default]\nrun = 1\n", "run"),
    ] {
        let err = Recorded::new(policy).expect_err(policy).to_string();
        assert!(err.contains(key), "{policy}: {err}");
    }
}

#[test]
fn the_principal_budget_comes_back_from_the_log_when_the_index_is_lost() {
    let mut f = Fixture::new("[principals.default]\nruns = 2\nattempts = 3\nspend_cents = 50\n");
    f.start(agent(1000), "a").expect("start");
    assert_eq!(f.check(1000, "a", 30), ALLOW);
    f.start(agent(1000), "b").expect("start");
    assert_eq!(f.check(1000, "b", 0), ALLOW);
    f.restart_without_index();
    assert!(refused_start(f.start(agent(1000), "c")), "runs survive");
    assert_eq!(
        f.check(1000, "b", 21),
        PRINCIPAL,
        "spend survives: 30 + 21 > 50"
    );
    assert_eq!(f.check(1000, "b", 20), ALLOW);
    f.restart_without_index();
    assert_eq!(f.check(1000, "a", 0), PRINCIPAL, "attempts survive");
}

#[test]
fn the_agent_cannot_report_the_outcome_of_a_proxied_attempt() {
    let mut f = Fixture::new("");
    f.start(agent(1000), "r").expect("start");
    let proxied = f.check_as(proxy(1000), "r", 5);
    assert_eq!(proxied.decision, Verdict::Allow);
    let own = f.check_as(agent(1000), "r", 0);
    let (p, o) = (proxied.attempt.expect("a"), own.attempt.expect("a"));
    let refused = f.outcome(agent(1000), "r", p, 0);
    assert!(
        matches!(refused, Err(GateError::OutcomeOwnedByProxy { attempt, .. }) if attempt == p),
        "{refused:?}"
    );
    // The agent still reports its own calls; and the refusal survives a lost index.
    f.outcome(agent(1000), "r", o, 0).expect("its own call");
    f.restart_without_index();
    assert!(matches!(
        f.outcome(agent(1000), "r", p, 0),
        Err(GateError::OutcomeOwnedByProxy { .. })
    ));
    // The operator is not the proxy either.
    assert!(matches!(
        f.outcome(
            Caller {
                operator: true,
                ..Caller::default()
            },
            "r",
            p,
            0
        ),
        Err(GateError::OutcomeOwnedByProxy { .. })
    ));
    f.outcome(proxy(1000), "r", p, 3)
        .expect("the proxy reports it");
    let standing = f.gate.run(agent(1000), "r").expect("run");
    assert_eq!(
        (standing.held_nanos, standing.settled_nanos),
        (0, 3 * NANOS_PER_CENT)
    );
}

#[test]
fn a_proxied_check_the_gate_refuses_is_recorded_as_the_proxys() {
    let f = Fixture::new("[principals.default]\nattempts = 1\n");
    f.start(agent(1000), "r").expect("start");
    assert_eq!(f.check_as(proxy(1000), "r", 0).decision, Verdict::Allow);
    let refused = f.check_as(proxy(1000), "r", 0);
    assert_eq!(
        (refused.decision, refused.reason),
        PRINCIPAL,
        "the proxy's calls draw from the owner's budget"
    );
    assert!(refused.seq.is_some(), "recorded");
    assert_eq!(
        f.check(1000, "r", 0),
        PRINCIPAL,
        "and so do the agent's own"
    );
}

/// `(used, limit)` of `dimension` in a snapshot.
fn dim(
    limits: &std::collections::BTreeMap<tally_wire::LimitKey, tally_ledger::decision::Limit>,
    dimension: &str,
) -> Option<(u64, u64)> {
    limits.get(dimension).map(|l| (l.used, l.limit))
}

#[test]
fn a_principals_usage_is_in_every_snapshot_and_standing() {
    let f = Fixture::new(
        "[principals.default]\nruns = 5\nattempts = 10\nspend_cents = 100\nperiod_ms = 60000\n\
         [principals.uid.3000]\nattempts = 2\n",
    );
    f.start(agent(1000), "a").expect("start");
    f.start(agent(1000), "b").expect("start");
    let first = f.check_as(agent(1000), "a", 30);
    // The snapshot is the state before the call, as every other dimension's.
    assert_eq!(dim(&first.limits, "principal_runs"), Some((2, 5)));
    assert_eq!(dim(&first.limits, "principal_attempts"), Some((0, 10)));
    assert_eq!(
        dim(&first.limits, "principal_spend_nanos"),
        Some((0, 100 * NANOS_PER_CENT))
    );
    // Across the uid's runs: b's check sees a's attempt and reservation.
    let second = f.check_as(agent(1000), "b", 20);
    assert_eq!(dim(&second.limits, "principal_attempts"), Some((1, 10)));
    assert_eq!(
        dim(&second.limits, "principal_spend_nanos"),
        Some((30 * NANOS_PER_CENT, 100 * NANOS_PER_CENT))
    );
    // The standings read it now (after both calls), for one run and in the list.
    let operator = Caller {
        operator: true,
        ..Caller::default()
    };
    let a = f.gate.run(operator, "a").expect("standing");
    assert_eq!(dim(&a.limits, "principal_attempts"), Some((2, 10)));
    assert_eq!(
        dim(&a.limits, "principal_spend_nanos"),
        Some((50 * NANOS_PER_CENT, 100 * NANOS_PER_CENT))
    );
    assert_eq!(dim(&a.limits, "principal_runs"), Some((2, 5)));
    // The run's own dimensions are its own.
    assert_eq!(a.limits["spend_nanos"].used, 30 * NANOS_PER_CENT);
    let runs = f.gate.runs(operator).expect("runs");
    assert_eq!(runs.len(), 2);
    for r in &runs {
        assert_eq!(dim(&r.limits, "principal_attempts"), Some((2, 10)), "{r:?}");
    }
    // A uid of its own has only the limits it sets; a run without an owner none.
    f.start(agent(3000), "c").expect("start");
    let c = f.gate.run(operator, "c").expect("standing");
    assert_eq!(dim(&c.limits, "principal_attempts"), Some((0, 2)));
    assert_eq!(dim(&c.limits, "principal_runs"), None);
    assert_eq!(dim(&c.limits, "principal_spend_nanos"), None);
    f.start(Caller::default(), "in-process").expect("no uid");
    let p = f.gate.run(operator, "in-process").expect("standing");
    assert!(
        p.limits
            .keys()
            .all(|k| !k.as_str().starts_with("principal_")),
        "{p:?}"
    );
    // A new period counts from nothing, in the standing too.
    f.at(60_000);
    let a = f.gate.run(operator, "a").expect("standing");
    assert_eq!(dim(&a.limits, "principal_attempts"), Some((0, 10)));
    assert_eq!(dim(&a.limits, "principal_runs"), Some((0, 5)));
}

fn operator() -> Caller {
    Caller {
        uid: Some(0),
        operator: true,
        ..Caller::default()
    }
}

/// The upstream's bill is the truth: an outcome settling above its reservation settles
/// whole, records the overrun on the outcome (the core's count), is charged to the run
/// and its principal, and the run's later spending is refused until a human grants it.
#[test]
fn an_overrun_settles_whole_is_recorded_and_stops_later_spending() {
    let f = Fixture::new("[principals.default]\nspend_cents = 1000\n");
    f.start(agent(1000), "r").expect("start");
    let a = f.check_as(proxy(1000), "r", 5);
    assert_eq!(a.decision, Verdict::Allow);
    // Billed 9 cents on a 5-cent reservation.
    f.outcome(proxy(1000), "r", a.attempt.expect("a"), 9)
        .expect("the proxy reports what the upstream billed");
    let s = f.gate.run(agent(1000), "r").expect("run");
    assert_eq!((s.held_nanos, s.settled_nanos), (0, 9 * NANOS_PER_CENT));
    let principal = s
        .limits
        .get(&tally_wire::LimitKey::PrincipalSpendNanos)
        .expect("principal");
    assert_eq!(
        principal.used,
        9 * NANOS_PER_CENT,
        "charged to the principal too"
    );
    // Even a call that reserves nothing: its outcome could settle any amount. A human
    // may grant more (`budget_exceeded` asks).
    let next = f.check_as(agent(1000), "r", 0);
    assert_eq!(
        (next.decision, next.cause),
        (Verdict::RequireApproval, Some(Reason::BudgetExceeded))
    );
}

/// The operator settles a held attempt (a cut stream's, a dead daemon's): only the
/// operator, only an attempt still held, once; the agent and the proxy cannot.
#[test]
fn the_operator_settles_a_held_attempt_once() {
    let f = Fixture::new("");
    f.start(agent(1000), "r").expect("start");
    let a = f.check_as(proxy(1000), "r", 5);
    let attempt = a.attempt.expect("a");
    let held = |f: &Fixture| {
        let s = f.gate.run(agent(1000), "r").expect("run");
        (s.held_nanos, s.settled_nanos)
    };
    assert_eq!(held(&f), (5 * NANOS_PER_CENT, 0));
    let settle = |who: Caller, nanos: u64| {
        f.gate.settle_blocking(
            who,
            "r",
            tally_gate::SettleRequest {
                attempt,
                settled_nanos: nanos,
            },
        )
    };
    for who in [agent(1000), proxy(1000)] {
        assert!(
            matches!(settle(who, 1), Err(GateError::NotAuthorized(_))),
            "{who:?}"
        );
    }
    assert!(matches!(
        f.gate.settle_blocking(
            operator(),
            "r",
            tally_gate::SettleRequest {
                attempt: 99,
                settled_nanos: 0
            }
        ),
        Err(GateError::NoSuchAttempt { .. })
    ));
    assert_eq!(held(&f), (5 * NANOS_PER_CENT, 0), "nothing changed");
    settle(operator(), 3 * NANOS_PER_CENT).expect("the operator settles");
    assert_eq!(held(&f), (0, 3 * NANOS_PER_CENT));
    assert!(matches!(
        settle(operator(), 0),
        Err(GateError::AttemptSettled { .. })
    ));
    // The proxy's late report is a second settlement: refused.
    assert!(matches!(
        f.outcome(proxy(1000), "r", attempt, 1),
        Err(GateError::AttemptSettled { .. })
    ));
}

//! The gate's conformance suite: the same cases against the embedded backend and against
//! PostgreSQL, with the same results. On PostgreSQL each case runs on several gates, each
//! with its own ledger, sharing one database (the fleet); the embedded backend has one
//! gate, shared by the same threads.

mod common;

use std::sync::Arc;
use std::thread;

use serde_json::json;
use tally_gate::backend::StateBackend;
use tally_gate::{
    Caller, CheckRequest, Clock, Gate, GateError, OutcomeRequest, StartRequest, StopRequest,
};
use tally_gate_postgres::Postgres;

use common::Cluster;

/// Gates that share one state.
trait Fleet {
    type B: StateBackend + 'static;
    /// `n` gates over one state (opened afresh: drop the previous ones first), reading
    /// the time from `clock`.
    fn gates_on(&self, n: usize, policy: &str, clock: Arc<dyn Clock>) -> Vec<Arc<Gate<Self::B>>>;
    /// `n` gates on the wall clock.
    fn gates(&self, n: usize, policy: &str) -> Vec<Arc<Gate<Self::B>>> {
        self.gates_on(n, policy, Arc::new(tally_gate::SystemClock))
    }
}

struct Embedded {
    dir: tempfile::TempDir,
}

impl Fleet for Embedded {
    type B = tally_gate::backend::Embedded;
    fn gates_on(&self, n: usize, policy: &str, clock: Arc<dyn Clock>) -> Vec<Arc<Gate<Self::B>>> {
        let gate =
            Arc::new(common::embedded_gate(self.dir.path(), &no_asking(policy)).with_clock(clock));
        (0..n).map(|_| Arc::clone(&gate)).collect()
    }
}

struct Fleetwide<'c> {
    cluster: &'c Cluster,
    db: String,
    hosts: Vec<tempfile::TempDir>,
}

impl Fleet for Fleetwide<'_> {
    type B = Postgres;
    fn gates_on(&self, n: usize, policy: &str, clock: Arc<dyn Clock>) -> Vec<Arc<Gate<Postgres>>> {
        assert!(n <= self.hosts.len());
        self.hosts[..n]
            .iter()
            .map(|h| {
                let ledger = common::ledger(h.path());
                let url = format!("{} dbname={}", self.cluster.url(), self.db);
                let backend = Postgres::open(
                    Arc::clone(&ledger),
                    &tally_gate_postgres::Options::new(&url),
                )
                .expect("postgres");
                let policy = tally_policy::Recorded::new(&no_asking(policy)).expect("policy");
                Arc::new(
                    Gate::with_backend(ledger, backend, policy)
                        .expect("gate")
                        .with_clock(Arc::clone(&clock)),
                )
            })
            .collect()
    }
}

/// The cases' policies: limits refuse rather than ask a human.
fn no_asking(policy: &str) -> String {
    format!("{policy}[approvals]\nask_on = []\n")
}

const OPERATOR: Caller = Caller {
    uid: None,
    operator: true,
    proxied: false,
};

fn start<B: StateBackend>(
    gate: &Gate<B>,
    caller: Caller,
    req: serde_json::Value,
) -> Result<tally_gate::Started, GateError> {
    let req: StartRequest = serde_json::from_value(req).expect("start request");
    gate.start_blocking(caller, req)
}

fn check<B: StateBackend>(
    gate: &Gate<B>,
    req: serde_json::Value,
) -> Result<tally_gate::CheckAnswer, GateError> {
    let req: CheckRequest = serde_json::from_value(req).expect("check request");
    gate.check_blocking(OPERATOR, req)
}

/// What a check came to, comparable across backends.
fn verdict(r: &Result<tally_gate::CheckAnswer, GateError>) -> String {
    match r {
        Ok(a) => match a.reason {
            None => format!("{:?}", a.decision),
            Some(reason) => format!("{:?} {reason:?}", a.decision),
        },
        Err(GateError::Stopped(a)) => format!("stopped {:?}", a.reason),
        Err(e) => format!("error {e}"),
    }
}

/// Run `n` calls of `f` at once, the i-th on gate `i % gates`; their results in order
/// of the sorted summaries.
fn race<B: StateBackend + 'static, T: Send + 'static>(
    gates: &[Arc<Gate<B>>],
    n: usize,
    f: impl Fn(&Gate<B>, usize) -> T + Send + Sync + Copy + 'static,
) -> Vec<T> {
    let barrier = Arc::new(std::sync::Barrier::new(n));
    let handles: Vec<_> = (0..n)
        .map(|i| {
            let gate = Arc::clone(&gates[i % gates.len()]);
            let barrier = Arc::clone(&barrier);
            thread::spawn(move || {
                barrier.wait();
                f(&gate, i)
            })
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().expect("thread"))
        .collect()
}

fn tally(mut v: Vec<String>) -> String {
    v.sort();
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < v.len() {
        let n = v[i..].iter().take_while(|x| **x == v[i]).count();
        out.push(format!("{n} x {}", v[i]));
        i += n;
    }
    out.join(", ")
}

const HOSTS: usize = 3;

/// 64 checks at once against attempts = 5: exactly 5 allows.
fn attempts_five<F: Fleet>(fleet: &F) -> String {
    let gates = fleet.gates(HOSTS, "");
    start(
        &gates[0],
        OPERATOR,
        json!({"run": "r", "budget": {"attempts": 5}}),
    )
    .expect("start");
    let results = race(&gates, 64, |g, i| {
        verdict(&check(
            g,
            json!({"run": "r", "tool": "t", "operation": format!("op{i}"), "effect": "read"}),
        ))
    });
    let summary = tally(results);
    assert_eq!(summary, "5 x Allow, 59 x Deny AttemptsExhausted");
    summary
}

/// 8 workers reserving 30 of the last 100 cents: 3 allows, 90 cents held, never more.
fn last_cents<F: Fleet>(fleet: &F) -> String {
    let gates = fleet.gates(HOSTS, "");
    start(
        &gates[0],
        OPERATOR,
        json!({"run": "r", "budget": {"spend_cents": 100}}),
    )
    .expect("start");
    let results = race(&gates, 8, |g, i| {
        verdict(&check(
            g,
            json!({"run": "r", "worker": format!("w{i}"), "tool": "llm", "operation": format!("gen{i}"), "effect": "read", "reserve_cents": 30}),
        ))
    });
    let held = gates[1].run(OPERATOR, "r").expect("standing").held_nanos;
    assert_eq!(held, 90 * 10_000_000, "held nanodollars (90 cents)");
    let summary = format!("{}; held {held}", tally(results));
    assert_eq!(
        summary,
        "3 x Allow, 5 x Deny ReservationInsufficient; held 900000000"
    );
    summary
}

/// A breaker opened through one gate refuses on the others.
fn breaker_shared<F: Fleet>(fleet: &F) -> String {
    let gates = fleet.gates(HOSTS, "[breaker]\nfailures = 2\nopen_ms = 60000\n");
    start(&gates[0], OPERATOR, json!({"run": "a"})).expect("start");
    start(&gates[1], OPERATOR, json!({"run": "b"})).expect("start");
    for i in 0..2 {
        let a = check(
            &gates[0],
            json!({"run": "a", "tool": "search", "operation": format!("q{i}"), "effect": "read"}),
        )
        .expect("check");
        assert_eq!(verdict(&Ok(a.clone())), "Allow");
        let req = OutcomeRequest {
            run: "a".into(),
            attempt: a.attempt.expect("attempt"),
            status: tally_ledger::Status::Error,
            settled_cents: None,
            settled_nanos: None,
            remote_ref: None,
            observed: None,
            retry_after_ms: None,
            result_digest: None,
            worker: None,
            usage_refused: None,
            usage: None,
        };
        gates[0].outcome_blocking(OPERATOR, req).expect("outcome");
    }
    let other: Vec<String> = gates[1..]
        .iter()
        .map(|g| {
            verdict(&check(
                g,
                json!({"run": "b", "tool": "search", "operation": "x", "effect": "read"}),
            ))
        })
        .collect();
    let healthy = verdict(&check(
        &gates[HOSTS - 1],
        json!({"run": "b", "tool": "fetch", "operation": "y", "effect": "read"}),
    ));
    let summary = format!("{}; other tool {healthy}", tally(other));
    assert_eq!(
        summary,
        format!("{} x Deny CircuitOpen; other tool Allow", HOSTS - 1)
    );
    summary
}

/// Reopened over the same state, the gate keeps its counters.
fn restart_keeps_counters<F: Fleet>(fleet: &F) -> String {
    {
        let gates = fleet.gates(HOSTS, "");
        start(
            &gates[0],
            OPERATOR,
            json!({"run": "r", "budget": {"attempts": 5}}),
        )
        .expect("start");
        for i in 0..3 {
            let v = verdict(&check(
                &gates[i % HOSTS],
                json!({"run": "r", "tool": "t", "operation": format!("o{i}"), "effect": "read"}),
            ));
            assert_eq!(v, "Allow");
        }
    }
    let gates = fleet.gates(HOSTS, "");
    let used = gates[2].run(OPERATOR, "r").expect("standing").calls_allowed;
    let after: Vec<String> = (0..3)
        .map(|i| {
            verdict(&check(
                &gates[i % HOSTS],
                json!({"run": "r", "tool": "t", "operation": format!("p{i}"), "effect": "read"}),
            ))
        })
        .collect();
    let summary = format!("allowed before {used}; after: {}", after.join(", "));
    assert_eq!(
        summary,
        "allowed before 3; after: Allow, Allow, Deny AttemptsExhausted"
    );
    summary
}

/// A kill through one gate stops the run and its children on every gate; a pause
/// through one holds the run on every gate until resumed.
fn kill_and_pause<F: Fleet>(fleet: &F) -> String {
    let gates = fleet.gates(HOSTS, "");
    start(&gates[0], OPERATOR, json!({"run": "p"})).expect("start");
    start(&gates[1], OPERATOR, json!({"run": "c", "parent": "p"})).expect("child");
    start(&gates[2], OPERATOR, json!({"run": "g", "parent": "c"})).expect("grandchild");
    start(&gates[0], OPERATOR, json!({"run": "q"})).expect("start");
    // A pause through one gate holds the runs below on the others; a resume lets them go.
    gates[1]
        .pause_blocking(OPERATOR, "p", true)
        .expect("pause p");
    let held = verdict(&check(
        &gates[2],
        json!({"run": "g", "tool": "t", "effect": "read"}),
    ));
    gates[0]
        .pause_blocking(OPERATOR, "p", false)
        .expect("resume p");
    let let_go = verdict(&check(
        &gates[2],
        json!({"run": "g", "tool": "t", "effect": "read"}),
    ));
    gates[0].pause_blocking(OPERATOR, "q", true).expect("pause");
    let paused = verdict(&check(
        &gates[1],
        json!({"run": "q", "tool": "t", "effect": "read"}),
    ));
    gates[2]
        .pause_blocking(OPERATOR, "q", false)
        .expect("resume");
    let resumed = verdict(&check(
        &gates[1],
        json!({"run": "q", "tool": "t", "effect": "read"}),
    ));
    gates[0]
        .stop_blocking(OPERATOR, "p", StopRequest::default())
        .expect("kill");
    let child = verdict(&check(
        &gates[1],
        json!({"run": "c", "tool": "t", "effect": "read"}),
    ));
    let grandchild = verdict(&check(
        &gates[2],
        json!({"run": "g", "tool": "t", "effect": "read"}),
    ));
    let summary = format!(
        "grandchild of a paused run: {held}, resumed: {let_go}; paused: {paused}; resumed: {resumed}; child: {child}; grandchild: {grandchild}"
    );
    assert_eq!(summary, "grandchild of a paused run: Deny RunPaused, resumed: Allow; paused: Deny RunPaused; resumed: Allow; child: stopped Some(KilledByOperator); grandchild: stopped Some(KilledByOperator)");
    summary
}

/// Runs past their deadline: a start by their uid on any gate stops them first, so they
/// no longer count toward its quota; a check past the deadline refuses and stops.
fn deadlines<F: Fleet>(fleet: &F) -> String {
    let clock = Arc::new(tally_gate::ManualClock::new(1_700_000_000_000));
    let at = |ms: u64| clock.set(1_700_000_000_000 + ms);
    let gates = fleet.gates_on(HOSTS, "max_open_runs_per_uid = 2\n", clock.clone());
    let agent = Caller {
        uid: Some(1000),
        operator: false,
        proxied: false,
    };
    let budget = |d: u64| json!({"deadline_ms": d});
    start(
        &gates[0],
        agent,
        json!({"run": "a", "budget": budget(1000)}),
    )
    .expect("a");
    start(
        &gates[1],
        agent,
        json!({"run": "b", "budget": budget(5000)}),
    )
    .expect("b");
    at(999);
    let early = match start(&gates[2], agent, json!({"run": "c"})) {
        Ok(_) => "started".to_owned(),
        Err(e) => format!("{e}"),
    };
    at(1000);
    let due = match start(&gates[2], agent, json!({"run": "c"})) {
        Ok(_) => "started".to_owned(),
        Err(e) => format!("{e}"),
    };
    let a = verdict(&check(
        &gates[1],
        json!({"run": "a", "tool": "t", "effect": "read"}),
    ));
    at(5000);
    let b = verdict(&check(
        &gates[0],
        json!({"run": "b", "tool": "t", "effect": "read"}),
    ));
    let b_after = verdict(&check(
        &gates[2],
        json!({"run": "b", "tool": "t", "effect": "read"}),
    ));
    let summary = format!("at 999: {early}; at 1000: {due}; a: {a}; b: {b}, then {b_after}");
    assert_eq!(summary, "at 999: uid 1000 already holds 2 open runs (the policy's max_open_runs_per_uid); stop finished runs first; at 1000: started; a: stopped Some(RunDeadlineExhausted); b: Deny RunDeadlineExhausted, then stopped Some(RunDeadlineExhausted)");
    summary
}

/// One run name, started on every gate at once: one start, the rest refused; a uid's
/// open-run quota holds across gates.
fn names_and_quota<F: Fleet>(fleet: &F) -> String {
    let gates = fleet.gates(HOSTS, "max_open_runs_per_uid = 3\n");
    let same = race(&gates, 8, |g, _| {
        match start(g, OPERATOR, json!({"run": "dup"})) {
            Ok(_) => "started".to_owned(),
            Err(GateError::RunExists(_)) => "exists".to_owned(),
            Err(e) => format!("error {e}"),
        }
    });
    let agent = Caller {
        uid: Some(1000),
        operator: false,
        proxied: false,
    };
    let quota = race(&gates, 8, move |g, i| {
        match start(g, agent, json!({"run": format!("u{i}")})) {
            Ok(_) => "started".to_owned(),
            Err(GateError::TooManyRuns { .. }) => "too many".to_owned(),
            Err(e) => format!("error {e}"),
        }
    });
    let summary = format!("same name: {}; quota: {}", tally(same), tally(quota));
    assert_eq!(
        summary,
        "same name: 7 x exists, 1 x started; quota: 3 x started, 5 x too many"
    );
    summary
}

/// One uid's principal budget, shared by the fleet: its starts and its checks race on
/// every gate at once, and the gates together give exactly its runs and attempts.
fn principal_shared<F: Fleet>(fleet: &F) -> String {
    let gates = fleet.gates(HOSTS, "[principals.default]\nruns = 4\nattempts = 10\n");
    let agent = Caller {
        uid: Some(1000),
        ..Caller::default()
    };
    let starts = race(&gates, 8, move |g, i| {
        match start(g, agent, json!({"run": format!("p{i}")})) {
            Ok(_) => "started".to_owned(),
            Err(GateError::Refused(r)) => format!("refused {r}"),
            Err(e) => format!("error {e}"),
        }
    });
    let open: Vec<String> = (0..8)
        .map(|i| format!("p{i}"))
        .filter(|r| gates[0].run(OPERATOR, r).is_ok())
        .collect();
    // The closure each thread runs is copied: the names it reads live for the test.
    let open: &'static [String] = Vec::leak(open);
    let checks = race(&gates, 16, move |g, i| {
        let run = &open[i % open.len()];
        verdict(&check(
            g,
            json!({"run": run, "tool": "t", "operation": format!("op{i}"), "effect": "read"}),
        ))
    });
    let summary = format!("starts: {}; checks: {}", tally(starts), tally(checks));
    assert_eq!(
        summary,
        "starts: 4 x refused principal_budget_exceeded, 4 x started; checks: 10 x Allow, 6 x Deny PrincipalBudgetExceeded"
    );
    summary
}

/// The runs named by a prefix (a key's runs of a day), open and stopped, read on any gate
/// and after the gates are opened again: what they hold and settled, none left out.
fn runs_named<F: Fleet>(fleet: &F) -> String {
    let gates = fleet.gates(HOSTS, "");
    for run in ["key-a-1", "key-a-2", "key-ab", "key-b-1"] {
        start(&gates[0], OPERATOR, json!({"run": run})).expect("start");
    }
    let allowed = check(
        &gates[1],
        json!({"run": "key-a-1", "tool": "llm", "effect": "read", "reserve_nanos": 300}),
    )
    .expect("check");
    check(
        &gates[2],
        json!({"run": "key-a-2", "tool": "llm", "effect": "read", "reserve_nanos": 500}),
    )
    .expect("check");
    let outcome: OutcomeRequest = serde_json::from_value(json!({
        "run": "key-a-2", "attempt": 1, "status": "ok", "settled_nanos": 450}))
    .expect("outcome");
    gates[2]
        .outcome_blocking(OPERATOR, outcome)
        .expect("outcome");
    gates[0]
        .stop_blocking(OPERATOR, "key-a-2", StopRequest::default())
        .expect("kill");
    assert!(allowed.attempt.is_some());
    let read = |g: &Gate<F::B>| -> String {
        let runs = g.runs_named("key-a-").expect("runs named");
        runs.iter()
            .map(|r| {
                format!(
                    "{} {:?} held {} settled {}",
                    r.run, r.state, r.held_nanos, r.settled_nanos
                )
            })
            .collect::<Vec<_>>()
            .join("; ")
    };
    let first = read(&gates[1]);
    drop(gates);
    let again = read(&fleet.gates(1, "")[0]);
    assert_eq!(first, again, "read again after the gates are opened afresh");
    assert_eq!(
        first,
        "key-a-1 Running held 300 settled 0; key-a-2 Stopped held 0 settled 450"
    );
    first
}

type Case<F> = (&'static str, fn(&F) -> String);

fn cases<F: Fleet>() -> Vec<Case<F>> {
    vec![
        ("attempts_five", attempts_five::<F>),
        ("last_cents", last_cents::<F>),
        ("breaker_shared", breaker_shared::<F>),
        ("restart_keeps_counters", restart_keeps_counters::<F>),
        ("kill_and_pause", kill_and_pause::<F>),
        ("names_and_quota", names_and_quota::<F>),
        ("deadlines", deadlines::<F>),
        ("principal_shared", principal_shared::<F>),
        ("runs_named", runs_named::<F>),
    ]
}

#[test]
fn the_same_cases_give_the_same_results_on_both_backends() {
    let embedded: Vec<(&str, String)> = cases::<Embedded>()
        .into_iter()
        .map(|(name, case)| {
            let fleet = Embedded {
                dir: tempfile::tempdir().expect("tempdir"),
            };
            (name, case(&fleet))
        })
        .collect();
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let postgres: Vec<(&str, String)> = cases::<Fleetwide>()
        .into_iter()
        .map(|(name, case)| {
            cluster.create_database(name);
            let fleet = Fleetwide {
                cluster: &cluster,
                db: name.to_owned(),
                hosts: (0..HOSTS)
                    .map(|_| tempfile::tempdir().expect("tempdir"))
                    .collect(),
            };
            (name, case(&fleet))
        })
        .collect();
    assert_eq!(embedded, postgres);
}

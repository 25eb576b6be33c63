//! The group commit of the leased mode on a real PostgreSQL (docs/FLEET.md, "Group
//! commit"): decisions at home of many runs in flight at once are committed several to
//! a transaction and each run still gets exactly its budget; decisions of one run from
//! many threads stay serialised; a group whose commit fails refuses every decision in
//! it and every one queued behind it, records nothing for them, and the runs are read
//! again from their rows (what they took counted nowhere); a run taken back while its
//! decision is in a group refuses only its own decisions, the others' are committed
//! (as one decision at a time would leave the rows); a decision on a copy that
//! held a refused one is refused too; a refused outcome gives back and counts in the
//! breaker once retried; a queued failure that trips a tool's breaker view stays in it
//! while a tick flushes and refreshes the row, and once committed; a row-lock wait ends as a certain rollback; a `COMMIT` ended
//! by a FATAL is an unknown outcome (its use stays counted). Lease time is on a manual
//! clock; nothing sleeps (a test waits for the group's queue to say what it holds).

mod common;

use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use common::lease::{at_noon, MARGIN, TTL};
use common::Cluster;
use serde_json::json;
use tally_gate::{Caller, CheckAnswer, Gate, GateError};
use tally_gate_postgres::{
    open_leased, LeaseClock, LeaseOptions, LeaseSetup, Leased, Options, Scope, ScopeKind,
    SliceOptions, ViewLimits,
};
use tally_policy::{Recorded, Verdict};

const OPERATOR: Caller = Caller {
    uid: None,
    operator: true,
    proxied: false,
};

/// No tool rate bucket, no limit on calls in flight: a tool's breaker is read from the
/// holder's view, so a decision at home sends nothing while it is made.
const VIEWED: &str = "[rate]\ntool_per_sec = 0\ntool_in_flight = 0\n[approvals]\nask_on = []\n";

/// [`VIEWED`], and three failures open a tool's breaker for 30 s.
const TRIPS: &str = "[rate]\ntool_per_sec = 0\ntool_in_flight = 0\n[breaker]\nfailures = 3\nopen_ms = 30000\nprobe_timeout_ms = 10000\n[approvals]\nask_on = []\n";

/// A leased gate `holder` over its own ledger in `dir` under `policy`, every round
/// trip bounded by `timeout`.
fn leased_under(
    cluster: &Cluster,
    dir: &std::path::Path,
    holder: &str,
    clock: &LeaseClock,
    timeout: Duration,
    policy: &str,
) -> Gate<Leased> {
    let ledger = common::ledger(dir);
    let setup = LeaseSetup {
        leases: LeaseOptions {
            ttl: TTL,
            margin: MARGIN,
            clock: clock.clone(),
        },
        slices: SliceOptions::default(),
        views: ViewLimits::default(),
        ..LeaseSetup::new(holder)
    };
    let options = Options {
        timeout,
        ..Options::new(&cluster.url())
    };
    let backend =
        open_leased(Arc::clone(&ledger), &options, &setup, |_| None, None).expect("backend");
    Gate::with_backend(ledger, backend, Recorded::new(policy).expect("policy")).expect("gate")
}

/// A cluster, the ledger's directory and a leased gate `host-a` on it at noon under
/// `policy`, every round trip bounded by `timeout` (none without a cluster: skipped).
fn home_under(
    policy: &str,
    timeout: Duration,
) -> Option<(Cluster, tempfile::TempDir, Arc<Gate<Leased>>)> {
    let cluster = Cluster::start()?;
    let dir = tempfile::tempdir().expect("dir");
    let gate = leased_under(&cluster, dir.path(), "host-a", &at_noon(), timeout, policy);
    Some((cluster, dir, Arc::new(gate)))
}

/// [`home_under`] the [`VIEWED`] policy, every round trip bounded by 30 s.
fn home() -> Option<(Cluster, tempfile::TempDir, Arc<Gate<Leased>>)> {
    home_under(VIEWED, Duration::from_secs(30))
}

/// `f` on the gate, on a thread of its own.
fn on_thread<T: Send + 'static>(
    gate: &Arc<Gate<Leased>>,
    f: impl FnOnce(&Gate<Leased>) -> T + Send + 'static,
) -> std::thread::JoinHandle<T> {
    let gate = Arc::clone(gate);
    std::thread::spawn(move || f(&gate))
}

fn start(gate: &Gate<Leased>, run: &str, attempts: u64) {
    let req = json!({"run": run, "budget": {"attempts": attempts}});
    gate.start_blocking(OPERATOR, serde_json::from_value(req).expect("start"))
        .expect("start");
}

/// `run` started with `attempts` and taken in: its first check allowed, the next
/// decisions on it made at home.
fn taken_in(gate: &Gate<Leased>, run: &str, attempts: u64) {
    start(gate, run, attempts);
    assert_eq!(
        check(gate, run).expect("first check").decision,
        Verdict::Allow
    );
}

fn check(gate: &Gate<Leased>, run: &str) -> Result<CheckAnswer, GateError> {
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let req = json!({"run": run, "tool": "llm", "operation": format!("q{n}"), "effect": "read"});
    gate.check_blocking(OPERATOR, serde_json::from_value(req).expect("check"))
}

fn outcome(gate: &Gate<Leased>, run: &str, attempt: u64) -> Result<(), GateError> {
    let req = json!({"run": run, "attempt": attempt, "status": "ok"});
    gate.outcome_blocking(OPERATOR, serde_json::from_value(req).expect("outcome"))
        .map(drop)
}

/// The group commit's count `name` (`group_commits`, `group_decisions`, `group_refused`,
/// `guard_taken_back`, `guard_stale_copy`).
fn count(gate: &Gate<Leased>, name: &str) -> u64 {
    use tally_gate::backend::StateBackend;
    gate.backend()
        .lease_counts()
        .and_then(|c| c.into_iter().find(|(n, _)| *n == name))
        .map_or(0, |(_, v)| v)
}

/// Checks and outcomes on `run` until a check is denied: the allows. Every answer is
/// an allow, a deny of the run's attempts, or (never here) a refusal: a failure.
fn spend(gate: &Gate<Leased>, run: &str) -> u64 {
    let mut allowed = 0;
    loop {
        let a = check(gate, run).unwrap_or_else(|e| panic!("check of {run}: {e}"));
        if a.decision != Verdict::Allow {
            return allowed;
        }
        allowed += 1;
        outcome(gate, run, a.attempt.expect("attempt"))
            .unwrap_or_else(|e| panic!("outcome of {run}: {e}"));
    }
}

/// `threads` threads, thread i spending run `runs[i % runs.len()]` until it is denied:
/// the allows per run.
fn spent(gate: &Arc<Gate<Leased>>, runs: &[String], threads: usize) -> Vec<u64> {
    let (tx, rx) = mpsc::channel();
    for i in 0..threads {
        let (gate, tx) = (Arc::clone(gate), tx.clone());
        let r = i % runs.len();
        let run = runs[r].clone();
        std::thread::spawn(move || {
            let _ = tx.send((r, spend(&gate, &run)));
        });
    }
    drop(tx);
    let mut allows = vec![0; runs.len()];
    for _ in 0..threads {
        let (r, n) = rx
            .recv_timeout(Duration::from_secs(120))
            .expect("a thread ended");
        allows[r] += n;
    }
    allows
}

#[test]
fn decisions_of_many_runs_in_flight_are_committed_together_and_each_run_gets_its_budget() {
    let Some((cluster, _dir, gate)) = home() else {
        return;
    };
    let runs: Vec<String> = (0..12).map(|i| format!("r{i}")).collect();
    for run in &runs {
        start(&gate, run, 15);
    }
    let allows = spent(&gate, &runs, runs.len());
    assert_eq!(allows, vec![15; runs.len()]);
    let (commits, decisions) = (
        count(&gate, "group_commits"),
        count(&gate, "group_decisions"),
    );
    // Each run's first check takes it in (central); the later decisions at home are
    // grouped: 12 runs x (15 allows + 15 outcomes + 1 deny), the 12 first checks less.
    assert!(
        decisions >= 12 * 29,
        "{decisions} decisions committed in groups"
    );
    assert!(
        commits < decisions,
        "{decisions} decisions in {commits} commits: never two in one"
    );
    assert_eq!(count(&gate, "group_refused"), 0);
    // Every run's row holds every attempt the gate answered.
    let rows = cluster.psql("SELECT count(*) FROM tally_runs WHERE home = 'host-a'");
    assert_eq!(rows.trim(), "12");
}

#[test]
fn decisions_of_one_run_from_many_threads_stay_serialised() {
    let Some((_cluster, _dir, gate)) = home() else {
        return;
    };
    start(&gate, "one", 40);
    let allows = spent(&gate, &["one".to_owned()], 8);
    // Two decisions made on one copy would allow past the run's 40 attempts.
    assert_eq!(allows, vec![40]);
    let grouped = count(&gate, "group_decisions");
    assert!(grouped >= 80, "{grouped} decisions committed in groups");
}

/// A session of the test's own, holding a run's row locked.
struct Locker {
    rt: tokio::runtime::Runtime,
    client: tokio_postgres::Client,
}

impl Locker {
    fn lock(cluster: &Cluster, run: &str) -> Locker {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let (client, conn) = rt
            .block_on(tokio_postgres::connect(
                &cluster.url(),
                tokio_postgres::NoTls,
            ))
            .expect("connect");
        rt.spawn(async move {
            let _ = conn.await;
        });
        let sql = format!("BEGIN; SELECT 1 FROM tally_runs WHERE name = '{run}' FOR UPDATE");
        rt.block_on(client.batch_execute(&sql)).expect("lock");
        Locker { rt, client }
    }

    fn run(&self, sql: &str) {
        self.rt
            .block_on(self.client.batch_execute(sql))
            .expect("statement");
    }
}

/// Wait (no sleep: the gate's own queue is read) until `holds` says yes, at most 60 s.
fn until(gate: &Gate<Leased>, what: &str, holds: impl Fn((usize, bool)) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !holds(gate.backend().group_pending()) {
        assert!(
            Instant::now() < deadline,
            "{what}: {:?}",
            gate.backend().group_pending()
        );
        std::thread::yield_now();
    }
}

#[test]
fn a_failed_group_commit_refuses_every_decision_in_it_and_behind_it_and_records_nothing() {
    let Some((cluster, _dir, gate)) = home() else {
        return;
    };
    for run in ["a", "b", "c"] {
        // Taken in: the next decisions on it are made at home.
        taken_in(&gate, run, 4);
    }
    let records = gate.ledger().snapshot().size();
    // Run a's row locked by another session: the group carrying a's decision waits.
    let locker = Locker::lock(&cluster, "a");
    let spawn = |run: &'static str| on_thread(&gate, move |g| check(g, run));
    let first = spawn("a");
    until(&gate, "a's group in flight", |(queued, flying)| {
        flying && queued == 0
    });
    let behind = [spawn("b"), spawn("c")];
    until(&gate, "b and c queued behind it", |(queued, _)| queued == 2);
    // The group's write of a, waiting on the row, is cancelled: the group rolls back.
    cancel_group(&cluster);
    locker.run("ROLLBACK");
    let answers: Vec<String> = std::iter::once(first)
        .chain(behind)
        .map(|t| match t.join().expect("thread") {
            Err(GateError::Unavailable(_)) => "unavailable".to_owned(),
            other => format!("{other:?}"),
        })
        .collect();
    assert_eq!(answers, ["unavailable"; 3]);
    assert_eq!(count(&gate, "group_refused"), 3);
    gate.ledger().flush().expect("flush");
    assert_eq!(
        gate.ledger().snapshot().size(),
        records,
        "nothing recorded for them"
    );
    // Read again from their rows: each run has exactly its 3 attempts left (nothing of
    // the refused decisions counted).
    for run in ["a", "b", "c"] {
        assert_eq!(
            left(&gate, run),
            3,
            "run {run}: attempts left after the failed group"
        );
    }
}

#[test]
fn a_run_taken_back_mid_group_refuses_only_its_own_decisions() {
    let Some((cluster, _dir, gate)) = home() else {
        return;
    };
    for (run, attempts) in [("z", 4), ("a", 4), ("b", 5)] {
        taken_in(&gate, run, attempts);
    }
    // z's group waits on z's row; b, a, b queue behind it: the next group holds them.
    let locker = Locker::lock(&cluster, "z");
    let z = on_thread(&gate, |g| check(g, "z"));
    until(&gate, "z's group in flight", |(queued, flying)| {
        flying && queued == 0
    });
    let mut queued = Vec::new();
    for (i, run) in ["b", "a", "b"].into_iter().enumerate() {
        queued.push(on_thread(&gate, move |g| check(g, run)));
        until(&gate, "queued behind z", |(q, _)| q == i + 1);
    }
    // Another session takes a's home back (a central write clears it) and commits.
    cluster.psql("UPDATE tally_runs SET version = version + 1 WHERE name = 'a'");
    locker.run("ROLLBACK");
    let z = z.join().expect("thread").expect("z's check");
    assert_eq!(z.decision, Verdict::Allow);
    let answers: Vec<Result<CheckAnswer, GateError>> = queued
        .into_iter()
        .map(|t| t.join().expect("thread"))
        .collect();
    // a's decision refused by its guard (retry: the next decision reads the row); b's
    // two committed and answered allow, attempts 2 and 3.
    match &answers[1] {
        Err(GateError::Unavailable(why)) => assert!(why.contains("taken back"), "{why}"),
        other => panic!("a: {other:?}"),
    }
    for (answer, attempt) in [(&answers[0], 2), (&answers[2], 3)] {
        let a = answer.as_ref().expect("b's check");
        assert_eq!((a.decision, a.attempt), (Verdict::Allow, Some(attempt)));
        assert!(a.seq.is_some(), "recorded: {a:?}");
    }
    assert_eq!(count(&gate, "group_refused"), 1);
    assert_eq!(count(&gate, "guard_taken_back"), 1);
    // As one decision at a time would leave them: a's refused decision counted nowhere
    // (its row read again: 3 of 4 left), b's two counted (2 of 5 left), z's (2 of 4).
    for (run, expected) in [("a", 3), ("b", 2), ("z", 2)] {
        assert_eq!(left(&gate, run), expected, "run {run}: attempts left");
    }
}

/// A run taken back whose refused decision changed a tool's breaker view (a third
/// failure that opens it) refuses, with it, a later decision of the group on another
/// run that decided the tool from that view: otherwise that decision would be recorded
/// `circuit_open` on a failure no ledger holds. Retried, it is decided on the view
/// without the refused failure: allowed.
#[test]
fn a_decision_on_a_breaker_view_a_taken_back_decision_changed_is_refused_with_it() {
    let Some((cluster, _dir, gate)) = home_under(TRIPS, Duration::from_secs(30)) else {
        return;
    };
    for (run, attempts) in [("z", 4), ("a", 6), ("c", 4)] {
        taken_in(&gate, run, attempts);
    }
    let failed = |gate: &Gate<Leased>, attempt: u64| {
        let req = json!({"run": "a", "attempt": attempt, "status": "error"});
        gate.outcome_blocking(OPERATOR, serde_json::from_value(req).expect("outcome"))
            .map(drop)
    };
    let allowed = |gate: &Gate<Leased>, run: &str| {
        let a = check(gate, run).expect("check");
        assert_eq!(a.decision, Verdict::Allow, "{a:?}");
        a.attempt.expect("attempt")
    };
    for _ in 0..2 {
        let attempt = allowed(&gate, "a");
        failed(&gate, attempt).expect("a failure");
    }
    let third = allowed(&gate, "a");
    // z's group waits on z's row; a's third failure, then c's check, queue behind it.
    let locker = Locker::lock(&cluster, "z");
    let z = on_thread(&gate, |g| check(g, "z"));
    until(&gate, "z's group in flight", |(queued, flying)| {
        flying && queued == 0
    });
    let a = on_thread(&gate, move |g| failed(g, third));
    until(&gate, "a's failure queued", |(q, _)| q == 1);
    let c = on_thread(&gate, |g| check(g, "c"));
    until(&gate, "c's check queued", |(q, _)| q == 2);
    cluster.psql("UPDATE tally_runs SET version = version + 1 WHERE name = 'a'");
    locker.run("ROLLBACK");
    z.join().expect("thread").expect("z's check");
    match a.join().expect("thread") {
        Err(GateError::Unavailable(why)) => assert!(why.contains("taken back"), "{why}"),
        other => panic!("a: {other:?}"),
    }
    match c.join().expect("thread") {
        Err(GateError::Unavailable(why)) => assert!(why.contains("taken back"), "{why}"),
        other => panic!("c, decided on a view counting a's refused failure: {other:?}"),
    }
    assert_eq!(count(&gate, "guard_taken_back"), 2);
    // Retried: two failures in the view, the breaker closed.
    allowed(&gate, "c");
}

/// Wait (no sleep: the server's activity is read) until one session is `group`, at
/// most 60 s; else `never` fails the test.
fn until_one(cluster: &Cluster, group: &str, never: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    let waiting = format!("SELECT count(*) FROM pg_stat_activity WHERE {group}");
    while cluster.psql(&waiting).trim() != "1" {
        assert!(Instant::now() < deadline, "{never}");
    }
}

/// Once the group commit's write waits on a locked row (not before: a cancel of an
/// idle session does nothing), its statement cancelled: the group rolls back for
/// certain, the rows as they were.
fn cancel_group(cluster: &Cluster) {
    let group = "application_name LIKE '%-group' AND wait_event_type = 'Lock'";
    until_one(cluster, group, "the group never waited on the row");
    let cancel = format!("SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE {group}");
    assert_eq!(cluster.psql(&cancel).trim(), "t");
}

fn check_tool(gate: &Gate<Leased>, run: &str, tool: &str) -> Result<CheckAnswer, GateError> {
    let req = json!({"run": run, "tool": tool, "operation": "q", "effect": "read"});
    gate.check_blocking(OPERATOR, serde_json::from_value(req).expect("check"))
}

/// Attempts `run` is still allowed (each check answered with its outcome).
fn left(gate: &Gate<Leased>, run: &str) -> u64 {
    let mut left = 0;
    loop {
        match check(gate, run) {
            Ok(a) if a.decision == Verdict::Allow => left += 1,
            Ok(_) => return left,
            Err(e) => panic!("{run}: {e}"),
        }
    }
}

#[test]
fn a_decision_on_a_copy_holding_a_queued_decision_whose_group_failed_is_refused() {
    let Some((cluster, _dir, gate)) = home() else {
        return;
    };
    taken_in(&gate, "a", 4);
    let locker = Locker::lock(&cluster, "a");
    // D1 at home, queued, its group waiting on a's row.
    let d1 = on_thread(&gate, |g| check(g, "a"));
    until(&gate, "D1's group in flight", |(queued, flying)| {
        flying && queued == 0
    });
    // D2 on the same run takes the kept copy (holding D1), then needs a tool this
    // holder has no view of: central, so it waits for the group first.
    let d2 = on_thread(&gate, |g| check_tool(g, "a", "fresh"));
    let deadline = Instant::now() + Duration::from_secs(60);
    while gate.backend().group_draining() == 0 {
        assert!(Instant::now() < deadline, "D2 never waited for the group");
        std::thread::yield_now();
    }
    // D1's group fails (its statement cancelled), a's home untouched.
    cancel_group(&cluster);
    until(&gate, "D1's group answered", |(_, flying)| !flying);
    locker.run("ROLLBACK");
    for (name, t) in [("D1", d1), ("D2", d2)] {
        match t.join().expect("thread") {
            Err(GateError::Unavailable(_)) => {}
            other => panic!("{name}: {other:?}"),
        }
    }
    // Neither D1 nor D2 is in the row: 3 attempts left of 4. D2, made on the copy the
    // failure let go, is counted as a stale copy's refusal.
    assert_eq!(count(&gate, "guard_stale_copy"), 1);
    assert_eq!(left(&gate, "a"), 3);
}

#[test]
fn an_outcome_whose_group_failed_gives_back_and_counts_in_the_breaker_once_retried() {
    let Some((cluster, _dir, gate)) = home() else {
        return;
    };
    let req = json!({"run": "o", "budget": {"spend_cents": 1000}});
    gate.start_blocking(OPERATOR, serde_json::from_value(req).expect("start"))
        .expect("start");
    let reserve = |cents: u64| {
        let req = json!({"run": "o", "tool": "llm", "operation": format!("r{cents}"), "effect": "read", "reserve_cents": cents});
        let a = gate.check_blocking(OPERATOR, serde_json::from_value(req).expect("check"));
        let a = a.expect("check");
        a.attempt.unwrap_or_else(|| panic!("no attempt: {a:?}"))
    };
    let settle = |gate: &Gate<Leased>, attempt: u64, cents: u64| {
        let req = json!({"run": "o", "attempt": attempt, "status": "ok", "settled_cents": cents});
        gate.outcome_blocking(OPERATOR, serde_json::from_value(req).expect("outcome"))
            .map(drop)
    };
    // Taken in, then an attempt at home reserving 30 cents on this holder's slice.
    let first = reserve(1);
    settle(&gate, first, 1).expect("first outcome");
    let attempt = reserve(30);
    let scope = Scope::new(ScopeKind::Run, "o");
    let used = || {
        gate.backend()
            .slices()
            .held(&scope)
            .expect("a slice")
            .1
            .nanos
    };
    let before = used();
    let unflushed = gate.backend().unflushed();
    // Its outcome (10 cents: 20 given back) queued, its group rolled back.
    let locker = Locker::lock(&cluster, "o");
    let refused = on_thread(&gate, move |g| settle(g, attempt, 10));
    cancel_group(&cluster);
    match refused.join().expect("thread") {
        Err(GateError::Unavailable(_)) => {}
        other => panic!("outcome: {other:?}"),
    }
    locker.run("ROLLBACK");
    assert_eq!(used(), before, "nothing given back for the refused outcome");
    assert_eq!(
        gate.backend().unflushed(),
        unflushed,
        "the refused outcome is not counted in the tool's breaker"
    );
    // Retried: the attempt is still open in the row, and what it gives back is credited
    // on the slice that took it.
    settle(&gate, attempt, 10).expect("outcome retried");
    assert_eq!(
        used(),
        before - 20 * 10_000_000,
        "20 cents given back on the slice"
    );
    assert_eq!(gate.backend().unflushed(), unflushed + 1, "counted once");
}

#[test]
fn a_queued_failure_that_trips_the_breaker_stays_in_the_view_through_a_tick() {
    let Some((cluster, _dir, gate)) = home_under(TRIPS, Duration::from_secs(30)) else {
        return;
    };
    start(&gate, "t", 10);
    let allowed = |gate: &Gate<Leased>| {
        let a = check(gate, "t").expect("check");
        assert_eq!(a.decision, Verdict::Allow, "{a:?}");
        a.attempt.expect("attempt")
    };
    let failed = |gate: &Gate<Leased>, attempt: u64| {
        let req = json!({"run": "t", "attempt": attempt, "status": "error"});
        gate.outcome_blocking(OPERATOR, serde_json::from_value(req).expect("outcome"))
            .map(drop)
    };
    // Taken in (the tool's row read: its view starts), then two failures at home.
    let first = allowed(&gate);
    outcome(&gate, "t", first).expect("first outcome");
    for _ in 0..2 {
        let attempt = allowed(&gate);
        failed(&gate, attempt).expect("a failure");
    }
    // The third failure trips the view; its group waits on t's locked row.
    let attempt = allowed(&gate);
    let locker = Locker::lock(&cluster, "t");
    let third = on_thread(&gate, move |g| failed(g, attempt));
    until(
        &gate,
        "the third failure's group in flight",
        |(queued, flying)| flying && queued == 0,
    );
    // The tick meanwhile: the first outcomes flushed into the row, the rows read again.
    let ticked = gate.backend().slices().tick(Instant::now());
    assert_eq!(ticked.breakers.flushed, 1, "{ticked:?}");
    assert!(!ticked.breakers.refresh_failed, "{ticked:?}");
    locker.run("ROLLBACK");
    third
        .join()
        .expect("thread")
        .expect("the third failure committed");
    // Its failure counts in the view: the next decision is refused from it.
    let a = check(&gate, "t").expect("decided");
    assert_eq!(
        (a.decision, a.reason),
        (Verdict::Deny, Some(tally_ledger::Reason::CircuitOpen)),
        "{a:?}"
    );
    assert_eq!(
        gate.backend().unflushed(),
        1,
        "the third failure, for the row"
    );
}

#[test]
fn a_group_waiting_on_a_locked_row_rolls_back_for_certain_before_the_bound() {
    let Some((cluster, _dir, gate)) = home_under(VIEWED, Duration::from_secs(1)) else {
        return;
    };
    taken_in(&gate, "w", 10);
    let scope = Scope::new(ScopeKind::Run, "w");
    let used = || gate.backend().slices().held(&scope).expect("a slice").1;
    let before = used();
    // The row held by another session past the server's lock_timeout (half the bound):
    // the group's write fails with an error, so what the decision took is given back.
    let locker = Locker::lock(&cluster, "w");
    match check(&gate, "w") {
        Err(GateError::Unavailable(_)) => {}
        other => panic!("check: {other:?}"),
    }
    locker.run("ROLLBACK");
    assert_eq!(
        used(),
        before,
        "what it took given back: a certain rollback"
    );
}

#[test]
fn a_group_whose_commit_is_ended_by_a_fatal_is_unsure() {
    let Some((cluster, _dir, gate)) = home() else {
        return;
    };
    taken_in(&gate, "u", 10);
    let scope = Scope::new(ScopeKind::Run, "u");
    let used = || gate.backend().slices().held(&scope).expect("a slice").1;
    let before = used();
    // A deferred trigger holds every COMMIT that wrote a run on a lock this test holds.
    cluster.psql(
        "CREATE FUNCTION test_hold() RETURNS trigger LANGUAGE plpgsql AS $$ \
         BEGIN PERFORM pg_advisory_xact_lock(4242); RETURN NULL; END $$; \
         CREATE CONSTRAINT TRIGGER test_hold AFTER UPDATE ON tally_runs \
         DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION test_hold()",
    );
    let locker = Locker::lock(&cluster, "none");
    locker.run("SELECT pg_advisory_xact_lock(4242)");
    let d = on_thread(&gate, |g| check(g, "u"));
    // The group's COMMIT waits on the lock: its session ended (a FATAL, 57P01).
    let group = "application_name LIKE '%-group' AND wait_event = 'advisory'";
    until_one(&cluster, group, "the group's COMMIT never waited");
    let end = format!("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE {group}");
    assert_eq!(cluster.psql(&end).trim(), "t");
    match d.join().expect("thread") {
        Err(GateError::Unavailable(_)) => {}
        other => panic!("check: {other:?}"),
    }
    locker.run("ROLLBACK");
    cluster.psql("DROP TRIGGER test_hold ON tally_runs");
    assert_eq!(count(&gate, "group_refused"), 1);
    // It may have committed: what it took stays counted in the slice.
    assert_eq!(
        used().attempts,
        before.attempts + 1,
        "an unknown outcome keeps its use counted"
    );
    // The next decision reads the row (here: rolled back) and goes on.
    assert_eq!(check(&gate, "u").expect("next").decision, Verdict::Allow);
}

//! PostgreSQL failing under the gate: slower than the bound, or down. Checks are refused
//! as unavailable (the daemon says `gate_unavailable`, action retry), never allowed, and
//! the same gate decides again once the database answers, without a restart.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use tally_gate::backend::{Keys, StateBackend, StateTxn};
use tally_gate::{Caller, CheckRequest, Gate, GateError, StartRequest};
use tally_gate_postgres::{Options, Postgres};

use common::Cluster;

const OPERATOR: Caller = Caller {
    uid: None,
    operator: true,
    proxied: false,
};
const POLICY: &str = "[approvals]\nask_on = []\n";
const BOUND: Duration = Duration::from_millis(500);

fn gate(cluster: &Cluster, dir: &std::path::Path) -> Gate<Postgres> {
    let ledger = common::ledger(dir);
    let options = Options {
        url: cluster.url(),
        timeout: BOUND,
    };
    let backend = Postgres::open(Arc::clone(&ledger), &options).expect("postgres");
    Gate::with_backend(
        ledger,
        backend,
        tally_policy::Recorded::new(POLICY).expect("policy"),
    )
    .expect("gate")
}

fn check(gate: &Gate<Postgres>, op: &str) -> Result<tally_gate::CheckAnswer, GateError> {
    let req: CheckRequest =
        serde_json::from_value(json!({"run": "r", "tool": "t", "operation": op, "effect": "read"}))
            .expect("request");
    gate.check_blocking(OPERATOR, req)
}

fn allowed(r: &Result<tally_gate::CheckAnswer, GateError>) -> bool {
    matches!(r, Ok(a) if a.decision == tally_policy::Verdict::Allow)
}

#[test]
fn a_row_held_past_the_bound_is_refused_as_unavailable_then_decided_once_free() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let dirs = [
        tempfile::tempdir().expect("dir"),
        tempfile::tempdir().expect("dir"),
    ];
    let gate = gate(&cluster, dirs[0].path());
    let req: StartRequest = serde_json::from_value(json!({"run": "r"})).expect("start");
    gate.start_blocking(OPERATOR, req).expect("start");
    assert!(allowed(&check(&gate, "a")));

    // Another daemon's transaction holds the run's row (a stalled decision).
    let other = Postgres::open(
        common::ledger(dirs[1].path()),
        &Options {
            url: cluster.url(),
            timeout: Duration::from_secs(10),
        },
    )
    .expect("second backend");
    let mut held = other.begin().expect("begin");
    held.load(&Keys::run("r")).expect("lock the run's row");

    let began = Instant::now();
    let refused = check(&gate, "b");
    let took = began.elapsed();
    match &refused {
        Err(GateError::Unavailable(why)) => assert!(why.contains("PostgreSQL"), "{why}"),
        other => panic!("expected unavailable, got {other:?}"),
    }
    assert!(
        took >= BOUND / 2 && took < BOUND * 4,
        "refused after {took:?}"
    );
    drop(held);
    assert!(
        allowed(&check(&gate, "c")),
        "decided again once the row is free"
    );
    assert_eq!(gate.failure(), None, "the gate itself never gave up");
    let standing = gate.run(OPERATOR, "r").expect("standing");
    assert_eq!(
        standing.calls_allowed, 2,
        "the refused check took no attempt"
    );
}

#[test]
fn postgres_down_refuses_checks_and_the_same_gate_recovers_when_it_returns() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let dir = tempfile::tempdir().expect("dir");
    let gate = gate(&cluster, dir.path());
    let req: StartRequest = serde_json::from_value(json!({"run": "r"})).expect("start");
    gate.start_blocking(OPERATOR, req).expect("start");
    assert!(allowed(&check(&gate, "a")));

    cluster.stop();
    for op in ["b", "c"] {
        let began = Instant::now();
        match check(&gate, op) {
            Err(GateError::Unavailable(why)) => assert!(why.contains("PostgreSQL"), "{why}"),
            other => panic!("expected unavailable while PostgreSQL is down, got {other:?}"),
        }
        assert!(began.elapsed() < BOUND * 4, "refused within the bound");
    }
    cluster.restart();
    assert!(allowed(&check(&gate, "d")), "the same gate decides again");
    assert_eq!(gate.failure(), None);
    let standing = gate.run(OPERATOR, "r").expect("standing");
    assert_eq!(
        standing.calls_allowed, 2,
        "nothing was lost, nothing taken while down"
    );
}

#[test]
fn a_gate_stalled_inside_a_transaction_has_its_rows_freed_by_the_server() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let dirs = [
        tempfile::tempdir().expect("dir"),
        tempfile::tempdir().expect("dir"),
    ];
    let gate = gate(&cluster, dirs[0].path());
    let req: StartRequest = serde_json::from_value(json!({"run": "r"})).expect("start");
    gate.start_blocking(OPERATOR, req).expect("start");
    // A gate with a short bound takes the run's row and then stalls.
    let stalled = Postgres::open(
        common::ledger(dirs[1].path()),
        &Options {
            url: cluster.url(),
            timeout: Duration::from_millis(100),
        },
    )
    .expect("second backend");
    let mut held = stalled.begin().expect("begin");
    held.load(&Keys::run("r")).expect("lock the run's row");
    // Past five times its bound the server ends its session and frees the row.
    std::thread::sleep(Duration::from_millis(800));
    assert!(allowed(&check(&gate, "a")), "the row was freed");
    drop(held);
}

/// Checks queued on one gate behind a slow database are each refused within the bound
/// too, not one bound after another.
#[test]
fn checks_queued_behind_a_slow_database_are_each_refused_within_the_bound() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let dirs = [
        tempfile::tempdir().expect("dir"),
        tempfile::tempdir().expect("dir"),
    ];
    let gate = Arc::new(gate(&cluster, dirs[0].path()));
    let req: StartRequest = serde_json::from_value(json!({"run": "r"})).expect("start");
    gate.start_blocking(OPERATOR, req).expect("start");
    let other = Postgres::open(
        common::ledger(dirs[1].path()),
        &Options {
            url: cluster.url(),
            timeout: Duration::from_secs(10),
        },
    )
    .expect("second backend");
    let mut held = other.begin().expect("begin");
    held.load(&Keys::run("r")).expect("lock the run's row");
    let workers: Vec<_> = (0..8)
        .map(|i| {
            let gate = Arc::clone(&gate);
            std::thread::spawn(move || {
                let began = Instant::now();
                let r = check(&gate, &format!("q{i}"));
                (r, began.elapsed())
            })
        })
        .collect();
    for w in workers {
        let (r, took) = w.join().expect("worker");
        assert!(
            matches!(r, Err(GateError::Unavailable(_))),
            "expected unavailable, got {r:?}"
        );
        assert!(took < BOUND * 3, "refused after {took:?}, bound {BOUND:?}");
    }
    drop(held);
    assert!(allowed(&check(&gate, "after")));
}

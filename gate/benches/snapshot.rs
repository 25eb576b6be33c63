//! What copying a decision's snapshot costs, beside what a decision costs: `cargo bench
//! -p tally-gate --bench snapshot` (docs/PERFORMANCE.md, "The snapshot").
//!
//! The embedded backend's load copies each scope a decision names out of its tables
//! (the run, its tool, where the policy gives them state its credential and principal),
//! and its commit moves the snapshot back. A run is grown first through the gate (check
//! and outcome pairs, some calls left open, so it holds what a busy run holds); then,
//! on the same ledger: (1) one copy and drop of that snapshot, (2) one keyed load of its
//! scopes under the backend's lock (begin, load, release), (3) for scale, one call (a
//! check and its outcome, each durable) through the gate. `TALLY_BENCH_CALLS` (default
//! 2000) calls for (3), 200000 rounds for (1) and (2).
#![allow(missing_docs)]

use std::sync::Arc;
use std::time::Instant;

use serde_json::json;
use tally_gate::backend::{Embedded, Keys, StateBackend, StateTxn};
use tally_gate::{Caller, CheckRequest, Gate, OutcomeRequest, StartRequest};
use tally_ledger::keys::AuditorKey;
use tally_ledger::{Ledger, Rotation};
use tally_policy::{Recorded, Verdict};

const AGENT: Caller = Caller {
    uid: Some(1000),
    operator: false,
    proxied: false,
};
const POLICY: &str = "[ceiling]\nattempts = 100000000\nspend_cents = 100000000\n\
side_effects = 100000000\n[loops]\ntool_calls = 100000000\n[rate]\nrun_per_sec = 0\n\
tool_per_sec = 0\ntool_in_flight = 0\n[approvals]\nask_on = []\n\
[principals.default]\nattempts = 100000000\n";
const TOOL: &str = "email.send";
const ROUNDS: u32 = 200_000;

fn check(gate: &Gate, i: u64) -> u64 {
    let req: CheckRequest = serde_json::from_value(json!({
        "run": "r", "tool": TOOL, "operation": format!("op{}", i % 16),
        "args": {"i": i}, "effect": "read", "reserve_cents": 1
    }))
    .expect("check");
    let a = gate.check_blocking(AGENT, req).expect("check");
    assert_eq!(a.decision, Verdict::Allow, "{a:?}");
    a.attempt.expect("attempt")
}

fn outcome(gate: &Gate, attempt: u64) {
    let req = OutcomeRequest {
        run: "r".to_owned(),
        attempt,
        status: tally_ledger::Status::Ok,
        settled_cents: Some(1),
        settled_nanos: None,
        remote_ref: None,
        observed: None,
        retry_after_ms: None,
        result_digest: None,
        worker: None,
        usage_refused: None,
        usage: None,
    };
    gate.outcome_blocking(AGENT, req).expect("outcome");
}

/// Nanoseconds per round of `f`, over `rounds`.
fn per_round(rounds: u32, mut f: impl FnMut()) -> f64 {
    let began = Instant::now();
    for _ in 0..rounds {
        f();
    }
    began.elapsed().as_nanos() as f64 / f64::from(rounds)
}

fn main() {
    let calls: u64 = std::env::var("TALLY_BENCH_CALLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("ledger");
    Ledger::init(&path, &AuditorKey::generate().public(), Rotation::default()).expect("init");
    let ledger = Arc::new(Ledger::open(&path).expect("open"));
    let policy = Recorded::new(POLICY).expect("policy");
    let gate = Gate::open(Arc::clone(&ledger), policy).expect("gate");
    let req: StartRequest =
        serde_json::from_value(json!({"run": "r", "goal": "a busy run"})).expect("start");
    gate.start_blocking(AGENT, req).expect("start");
    // Warm up and grow the run; four calls stay open.
    for i in 0..200 {
        let a = check(&gate, i);
        outcome(&gate, a);
    }
    for i in 0..4 {
        check(&gate, 1000 + i);
    }
    let began = Instant::now();
    for i in 0..calls {
        let a = check(&gate, 2000 + i);
        outcome(&gate, a);
    }
    let per_call = began.elapsed().as_nanos() as f64 / calls as f64;
    drop(gate);

    let backend = Embedded::open(Arc::clone(&ledger)).expect("backend");
    let principal = AGENT.uid.map(|u| u.to_string()).unwrap_or_default();
    let keys = Keys {
        runs: vec!["r"],
        tools: vec![TOOL],
        principals: vec![principal.as_str()],
        ..Keys::default()
    };
    let snapshot = {
        let mut t = backend.begin().expect("begin");
        t.load(&keys).expect("load")
    };
    let run = &snapshot.runs["r"];
    let tool = &snapshot.tools[TOOL];
    let copy = per_round(ROUNDS, || drop(std::hint::black_box(snapshot.clone())));
    let load = per_round(ROUNDS, || {
        let mut t = backend.begin().expect("begin");
        drop(std::hint::black_box(t.load(&keys).expect("load")));
    });
    println!(
        "snapshot: run `r` ({} attempts, {} open), tool `{TOOL}` ({} in flight), principal {principal}",
        run.last_attempt,
        run.open.len(),
        tool.in_flight.len()
    );
    println!("copy and drop of the snapshot: {copy:.0} ns");
    println!("begin, keyed load (the copy out of the tables), release: {load:.0} ns");
    println!(
        "one call through the gate (check and outcome, each durable): {:.1} us ({calls} calls)",
        per_call / 1000.0
    );
    println!(
        "a call loads a snapshot twice (check, outcome): {:.2} % of the call",
        200.0 * load / per_call
    );
}

//! Checks per second and p99 latency of the gate, embedded beside PostgreSQL with 1 and 3
//! gates (each with its own ledger) on one database, in one run; and the database round
//! trips per check and per outcome.
//!
//! Each worker loops: check (reserving 1 cent), then the outcome that settles it, on its
//! own run; the runs share four tools, whose rows every gate locks. The cluster runs
//! with fsync on, as the ledger does. `TALLY_BENCH_SECS`
//! (default 3) per line.
#![allow(missing_docs)]

#[path = "../tests/common/mod.rs"]
mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use tally_gate::backend::StateBackend;
use tally_gate::{Caller, CheckRequest, Gate, OutcomeRequest, StartRequest};
use tally_gate_postgres::{Options, Postgres};
use tally_policy::Verdict;

const OPERATOR: Caller = Caller {
    uid: None,
    operator: true,
};
const POLICY: &str = "[ceiling]\nattempts = 100000000\nspend_cents = 100000000\n\
[loops]\ntool_calls = 100000000\n[rate]\nrun_per_sec = 0\ntool_per_sec = 0\n\
[approvals]\nask_on = []\n";
const WORKERS: usize = 8;

fn start<B: StateBackend>(gate: &Gate<B>, run: &str) {
    let req: StartRequest = serde_json::from_value(
        json!({"run": run, "budget": {"attempts": 100_000_000, "spend_cents": 100_000_000}}),
    )
    .expect("start");
    gate.start_blocking(OPERATOR, req).expect("start");
}

fn one_call<B: StateBackend>(gate: &Gate<B>, run: &str, i: u64) -> Duration {
    let req: CheckRequest = serde_json::from_value(json!({
        "run": run, "tool": format!("tool{}", i % 4), "operation": format!("op{i}"),
        "args": {"i": i}, "effect": "read", "reserve_cents": 1
    }))
    .expect("check");
    let began = Instant::now();
    let a = gate.check_blocking(OPERATOR, req).expect("check");
    let took = began.elapsed();
    assert_eq!(a.decision, Verdict::Allow, "{a:?}");
    let req = OutcomeRequest {
        run: run.to_owned(),
        attempt: a.attempt.expect("attempt"),
        status: tally_ledger::Status::Ok,
        settled_cents: Some(1),
        remote_ref: None,
        observed: None,
        retry_after_ms: None,
        worker: None,
    };
    gate.outcome_blocking(OPERATOR, req).expect("outcome");
    took
}

/// `WORKERS` threads per gate for `secs`: checks/s and p99 check latency.
fn load<B: StateBackend + 'static>(label: &str, gates: &[Arc<Gate<B>>], secs: f64) {
    let stop = Arc::new(AtomicBool::new(false));
    let mut handles = Vec::new();
    for (g, gate) in gates.iter().enumerate() {
        for w in 0..WORKERS {
            let run = format!("{label}-g{g}-w{w}");
            start(gate, &run);
            let gate = Arc::clone(gate);
            let stop = Arc::clone(&stop);
            handles.push(std::thread::spawn(move || {
                let mut lat = Vec::new();
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    lat.push(one_call(&gate, &run, i));
                    i += 1;
                }
                lat
            }));
        }
    }
    let began = Instant::now();
    std::thread::sleep(Duration::from_secs_f64(secs));
    stop.store(true, Ordering::Relaxed);
    let mut lat: Vec<Duration> = handles
        .into_iter()
        .flat_map(|h| h.join().expect("worker"))
        .collect();
    let elapsed = began.elapsed().as_secs_f64();
    lat.sort();
    let p = |q: f64| lat[((lat.len() as f64 * q) as usize).min(lat.len() - 1)];
    println!(
        "{label:<28} {:>3} workers  {:>8.0} checks/s (each with its outcome)  p50 {:>7.2} ms  p99 {:>7.2} ms",
        gates.len() * WORKERS,
        lat.len() as f64 / elapsed,
        p(0.50).as_secs_f64() * 1e3,
        p(0.99).as_secs_f64() * 1e3,
    );
}

fn main() {
    let secs: f64 = std::env::var("TALLY_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3.0);
    let Some(cluster) = common::Cluster::start_with(true) else {
        return;
    };
    let dirs: Vec<tempfile::TempDir> = (0..4).map(|_| tempfile::tempdir().expect("dir")).collect();
    let policy = tally_policy::Recorded::new(POLICY).expect("policy");
    {
        let gate = Arc::new(
            Gate::open(common::ledger(dirs[3].path()), policy.clone()).expect("embedded gate"),
        );
        load("embedded, 1 gate", &[Arc::clone(&gate)], secs);
        load(
            "embedded, 1 gate (x3 workers)",
            &[Arc::clone(&gate), Arc::clone(&gate), gate],
            secs,
        );
    }
    let gates: Vec<Arc<Gate<Postgres>>> = dirs[..3]
        .iter()
        .map(|d| {
            let ledger = common::ledger(d.path());
            let backend =
                Postgres::open(Arc::clone(&ledger), &Options::new(&cluster.url())).expect("pg");
            Arc::new(Gate::with_backend(ledger, backend, policy.clone()).expect("gate"))
        })
        .collect();
    load("postgres, 1 gate", &gates[..1], secs);
    load("postgres, 3 gates", &gates, secs);

    // Round trips of one check and of one outcome, on a warm connection.
    let ledger = common::ledger(dirs[3].path().join("rt").as_path());
    let backend = Postgres::open(Arc::clone(&ledger), &Options::new(&cluster.url())).expect("pg");
    let trips = backend.round_trips();
    let gate = Gate::with_backend(ledger, backend, policy).expect("gate");
    start(&gate, "rt");
    one_call(&gate, "rt", 0);
    let before = trips.load(Ordering::Relaxed);
    let req: CheckRequest = serde_json::from_value(json!({
        "run": "rt", "tool": "tool1", "operation": "x", "effect": "read", "reserve_cents": 1
    }))
    .expect("check");
    let a = gate.check_blocking(OPERATOR, req).expect("check");
    let after_check = trips.load(Ordering::Relaxed);
    let req = OutcomeRequest {
        run: "rt".into(),
        attempt: a.attempt.expect("attempt"),
        status: tally_ledger::Status::Ok,
        settled_cents: Some(1),
        remote_ref: None,
        observed: None,
        retry_after_ms: None,
        worker: None,
    };
    gate.outcome_blocking(OPERATOR, req).expect("outcome");
    let after_outcome = trips.load(Ordering::Relaxed);
    println!(
        "round trips to PostgreSQL: {} per check, {} per outcome",
        after_check - before,
        after_outcome - after_check
    );
}

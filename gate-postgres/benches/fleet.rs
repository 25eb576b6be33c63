//! Checks per second and p99 latency of the gate, embedded beside PostgreSQL with 1 and 3
//! gates (each with its own ledger) on one database, in one run; then the same through
//! daemons (`tally_daemon::serve` in-process, each with its own ledger, HTTP on its own
//! Unix socket): 1 daemon embedded, 1 and 3 daemons on PostgreSQL; and the database round
//! trips per check and per outcome.
//!
//! Each worker loops: check (reserving 1 cent), then the outcome that settles it, on its
//! own run; the runs share four tools, whose rows every gate locks. The cluster runs
//! with fsync on, as the ledger does. `TALLY_BENCH_SECS`
//! (default 3) per line.
#![allow(missing_docs)]

#[path = "../tests/common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};
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
    proxied: false,
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
        settled_nanos: None,
        remote_ref: None,
        observed: None,
        retry_after_ms: None,
        result_digest: None,
        worker: None,
        usage_refused: None,
        usage: None,
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
    let lat: Vec<Duration> = handles
        .into_iter()
        .flat_map(|h| h.join().expect("worker"))
        .collect();
    let elapsed = began.elapsed().as_secs_f64();
    report(label, gates.len() * WORKERS, lat, elapsed);
}

fn report(label: &str, workers: usize, mut lat: Vec<Duration>, elapsed: f64) {
    lat.sort();
    let p = |q: f64| lat[((lat.len() as f64 * q) as usize).min(lat.len() - 1)];
    println!(
        "{label:<28} {workers:>3} workers  {:>8.0} checks/s (each with its outcome)  p50 {:>7.2} ms  p99 {:>7.2} ms",
        lat.len() as f64 / elapsed,
        p(0.50).as_secs_f64() * 1e3,
        p(0.99).as_secs_f64() * 1e3,
    );
}

async fn post(
    c: &mut tally_api::client::Client,
    path: &str,
    body: serde_json::Value,
) -> (u16, serde_json::Value) {
    let reply = c
        .request(
            tally_api::client::Method::POST,
            path,
            Some("application/json"),
            body.to_string(),
        )
        .await
        .expect("answer");
    let value = serde_json::from_slice(&reply.body).unwrap_or(serde_json::Value::Null);
    (reply.status.as_u16(), value)
}

/// `WORKERS` HTTP clients per daemon socket for `secs`, each on its own run and its own
/// connection: checks/s and p99 check latency (connection to answer, over the socket).
async fn daemon_load(label: &str, sockets: &[PathBuf], secs: f64) {
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for (d, socket) in sockets.iter().enumerate() {
        for w in 0..WORKERS {
            let run = format!("{label}-d{d}-w{w}");
            let mut c = tally_api::client::Client::unix(socket)
                .await
                .expect("connect");
            let (status, started) = post(
                &mut c,
                "/v1/runs",
                json!({"run": run, "budget": {"attempts": 100_000_000, "spend_cents": 100_000_000}}),
            )
            .await;
            assert_eq!(status, 201, "{started}");
            let stop = Arc::clone(&stop);
            tasks.push(tokio::spawn(async move {
                let mut lat = Vec::new();
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let began = Instant::now();
                    let (status, a) = post(
                        &mut c,
                        "/v1/check",
                        json!({
                            "run": run, "tool": format!("tool{}", i % 4),
                            "operation": format!("op{i}"), "args": {"i": i},
                            "effect": "read", "reserve_cents": 1
                        }),
                    )
                    .await;
                    lat.push(began.elapsed());
                    assert_eq!((status, a["decision"].as_str()), (200, Some("allow")), "{a}");
                    let (status, o) = post(
                        &mut c,
                        "/v1/outcome",
                        json!({"run": run, "attempt": a["attempt"], "status": "ok", "settled_cents": 1}),
                    )
                    .await;
                    assert_eq!(status, 200, "{o}");
                    i += 1;
                }
                lat
            }));
        }
    }
    let began = Instant::now();
    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
    stop.store(true, Ordering::Relaxed);
    let mut lat = Vec::new();
    for t in tasks {
        lat.extend(t.await.expect("worker"));
    }
    report(
        label,
        sockets.len() * WORKERS,
        lat,
        began.elapsed().as_secs_f64(),
    );
}

/// Daemons over `dirs` (each its own ledger and socket), the state in the database at
/// `state` or embedded in each ledger; measured with [`daemon_load`], then shut down.
async fn daemons(label: &str, dirs: &[&Path], state: Option<&str>, secs: f64) {
    let policy = tally_policy::Recorded::new(POLICY).expect("policy");
    let mut stops = Vec::new();
    let mut served = Vec::new();
    let mut sockets = Vec::new();
    for dir in dirs {
        let ledger = common::ledger(dir);
        let socket = dir.join("agent.sock");
        let mut options = tally_daemon::ServeOptions::new(dir.join("ledger"), &socket);
        options.policy = policy.clone();
        options.state = state.map(|url| {
            let pg = tally_gate_postgres::Options::new(url);
            tally_daemon::SharedState {
                timeout: pg.timeout,
                label: "gate state in PostgreSQL, shared".into(),
                open: std::sync::Arc::new(move |ledger, policy, clock| {
                    tally_gate_postgres::gatekeeper(ledger, &pg, policy, clock)
                }),
            }
        });
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        served.push(tokio::spawn(tally_daemon::serve(
            ledger,
            options,
            async move {
                let _ = stopped.await;
            },
        )));
        stops.push(stop);
        while tally_api::client::Client::unix(&socket).await.is_err() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        sockets.push(socket);
    }
    daemon_load(label, &sockets, secs).await;
    for stop in stops {
        let _ = stop.send(());
    }
    for s in served {
        s.await.expect("join").expect("daemon");
    }
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
    drop(gates);

    // The same through daemons: HTTP on Unix sockets, each daemon its own ledger.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let daemon_dirs: Vec<tempfile::TempDir> =
        (0..4).map(|_| tempfile::tempdir().expect("dir")).collect();
    let paths: Vec<&Path> = daemon_dirs.iter().map(|d| d.path()).collect();
    let url = cluster.url();
    runtime.block_on(async {
        daemons("embedded, 1 daemon", &paths[3..], None, secs).await;
        daemons("postgres, 1 daemon", &paths[..1], Some(&url), secs).await;
        daemons("postgres, 3 daemons", &paths[..3], Some(&url), secs).await;
    });

    // Round trips of one check and of one outcome, on a warm connection.
    let ledger = common::ledger(dirs[3].path().join("rt").as_path());
    let backend = Postgres::open(Arc::clone(&ledger), &Options::new(&cluster.url())).expect("pg");
    let gate = Gate::with_backend(ledger, backend, policy).expect("gate");
    let trips = || {
        gate.backend_round_trips()
            .expect("a networked backend counts")
    };
    start(&gate, "rt");
    one_call(&gate, "rt", 0);
    let before = trips();
    let req: CheckRequest = serde_json::from_value(json!({
        "run": "rt", "tool": "tool1", "operation": "x", "effect": "read", "reserve_cents": 1
    }))
    .expect("check");
    let a = gate.check_blocking(OPERATOR, req).expect("check");
    let after_check = trips();
    let req = OutcomeRequest {
        run: "rt".into(),
        attempt: a.attempt.expect("attempt"),
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
    gate.outcome_blocking(OPERATOR, req).expect("outcome");
    let after_outcome = trips();
    println!(
        "round trips to PostgreSQL: {} per check, {} per outcome",
        after_check - before,
        after_outcome - after_check
    );
}

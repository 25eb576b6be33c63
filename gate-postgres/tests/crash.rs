//! A gate killed with SIGKILL mid-load loses no acknowledged decision: every decision it
//! answered is in its ledger and in the shared state, and the other gates go on deciding
//! from that state. The gate under load is this test binary run again as a child process
//! (the `host` test below, which does nothing unless the parent sets its environment).

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;

use serde_json::json;
use tally_gate::{Caller, CheckRequest, Gate, StartRequest};
use tally_gate_postgres::{Options, Postgres};
use tally_policy::Verdict;

const OPERATOR: Caller = Caller {
    uid: None,
    operator: true,
    proxied: false,
};
const POLICY: &str = "[ceiling]\nattempts = 1000000\n[loops]\ntool_calls = 1000000\n\
[rate]\nrun_per_sec = 0\ntool_per_sec = 0\ntool_in_flight = 1000000\n[approvals]\nask_on = []\n";

fn gate(url: &str, dir: &std::path::Path) -> Gate<Postgres> {
    let ledger = common::ledger(dir);
    let backend = Postgres::open(Arc::clone(&ledger), &Options::new(url)).expect("postgres");
    Gate::with_backend(
        ledger,
        backend,
        tally_policy::Recorded::new(POLICY).expect("policy"),
    )
    .expect("gate")
}

fn check(gate: &Gate<Postgres>, i: u64) -> tally_gate::CheckAnswer {
    let req: CheckRequest = serde_json::from_value(json!({
        "run": "r", "tool": "t", "operation": format!("op{i}"), "args": {"i": i}, "effect": "read"
    }))
    .expect("request");
    gate.check_blocking(OPERATOR, req).expect("check")
}

/// The child: checks in a loop, printing each acknowledged allow's attempt and seq.
#[test]
fn host() {
    let (Some(url), Some(dir)) = (
        std::env::var_os("TALLY_TEST_PG_URL"),
        std::env::var_os("TALLY_TEST_LEDGER_DIR"),
    ) else {
        return;
    };
    let gate = gate(&url.to_string_lossy(), std::path::Path::new(&dir));
    for i in 0.. {
        let a = check(&gate, i);
        assert_eq!(a.decision, Verdict::Allow);
        println!(
            "ack {} {}",
            a.attempt.expect("attempt"),
            a.seq.expect("seq")
        );
    }
}

#[test]
fn a_gate_killed_mid_load_loses_no_acknowledged_decision() {
    let Some(cluster) = common::Cluster::start() else {
        return;
    };
    let dirs = [
        tempfile::tempdir().expect("dir"),
        tempfile::tempdir().expect("dir"),
    ];
    let survivor = gate(&cluster.url(), dirs[1].path());
    let req: StartRequest = serde_json::from_value(json!({"run": "r"})).expect("start");
    survivor.start_blocking(OPERATOR, req).expect("start");

    let mut child = Command::new(std::env::current_exe().expect("exe"))
        .args(["--exact", "host", "--nocapture", "--test-threads=1"])
        .env("TALLY_TEST_PG_URL", cluster.url())
        .env("TALLY_TEST_LEDGER_DIR", dirs[0].path())
        .stdout(Stdio::piped())
        .spawn()
        .expect("child gate");
    let mut acked: Vec<(u64, u64)> = Vec::new();
    let lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    for line in lines {
        let line = line.expect("line");
        let Some(rest) = line.strip_prefix("ack ") else {
            continue;
        };
        let (attempt, seq) = rest.split_once(' ').expect("ack line");
        acked.push((attempt.parse().expect("attempt"), seq.parse().expect("seq")));
        if acked.len() == 200 {
            child.kill().expect("SIGKILL");
            break;
        }
    }
    child.wait().expect("reaped");
    let (last_attempt, last_seq) = *acked.last().expect("acks");

    // The shared state holds at least every acknowledged attempt (it may be ahead).
    let standing = survivor.run(OPERATOR, "r").expect("standing");
    assert!(
        standing.calls_allowed >= last_attempt,
        "state behind an acknowledged decision: {} < {last_attempt}",
        standing.calls_allowed
    );
    // The killed gate's ledger holds every decision it acknowledged.
    let ledger = common::ledger(dirs[0].path());
    assert!(
        ledger.checkpoint().size > last_seq,
        "ledger lost an acknowledged decision: size {} <= seq {last_seq}",
        ledger.checkpoint().size
    );
    // The survivor goes on from the state the killed gate left: its next attempt is
    // numbered after every one the dead gate was given.
    let next = check(&survivor, 1_000_000);
    assert_eq!(next.decision, Verdict::Allow);
    assert!(next.attempt.expect("attempt") > last_attempt);
}

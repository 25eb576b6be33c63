//! The merged audit of a fleet: three gates with their own ledgers on one PostgreSQL,
//! one run's decisions spread over all three, read back by the real `tally` binary as
//! one. `tally` is another package's binary: `tally_testkit::Tally::workspace` has cargo
//! build it (or takes `TALLY_UNDER_TEST`).

#[path = "../common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::{json, Value};
use tally_gate::{Caller, CheckRequest, Gate, OutcomeRequest, StartRequest, StopRequest};
use tally_gate_postgres::{Options, Postgres};
use tally_ledger::keys::AuditorKey;
use tally_ledger::{Ledger, Rotation, Status};
use tally_policy::Recorded;
use tally_testkit::Tally;

const AGENT: Caller = Caller {
    uid: Some(1000),
    operator: false,
    proxied: false,
};

const POLICY: &str = "[ceiling]\nattempts = 6\n[approvals]\nask_on = []\n";

struct Host {
    dir: PathBuf,
    gate: Gate<Postgres>,
}

fn host(root: &Path, name: &str, auditor: &AuditorKey, url: &str) -> Host {
    let dir = root.join(name);
    std::fs::create_dir_all(&dir).expect("host dir");
    Ledger::init(&dir.join("ledger"), &auditor.public(), Rotation::default()).expect("init");
    let ledger = Arc::new(Ledger::open(&dir.join("ledger")).expect("open"));
    let backend = Postgres::open(Arc::clone(&ledger), &Options::new(url)).expect("postgres");
    let gate =
        Gate::with_backend(ledger, backend, Recorded::new(POLICY).expect("policy")).expect("gate");
    Host { dir, gate }
}

fn start(h: &Host, req: Value) {
    let req: StartRequest = serde_json::from_value(req).expect("start request");
    h.gate.start_blocking(AGENT, req).expect("start");
}

/// A check; its attempt if allowed.
fn check(h: &Host, req: Value) -> Option<u64> {
    let req: CheckRequest = serde_json::from_value(req).expect("check request");
    match h.gate.check_blocking(AGENT, req) {
        Ok(a) => a.attempt.filter(|_| a.reason.is_none()),
        Err(e) => panic!("check: {e}"),
    }
}

fn outcome(h: &Host, run: &str, attempt: u64, status: Status) {
    let req = OutcomeRequest {
        run: run.into(),
        attempt,
        status,
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
    h.gate.outcome_blocking(AGENT, req).expect("outcome");
}

fn tally(args: &[&std::ffi::OsStr]) -> (i32, Value) {
    let out = Tally::workspace()
        .command()
        .args(args)
        .output()
        .expect("tally runs");
    let json = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "tally printed no JSON ({e}): {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code().unwrap_or(-1), json)
}

/// The document must be what its published schema (docs/schemas/CMD.json) says.
fn conforms(cmd: &str, doc: &Value) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../docs/schemas")
        .join(format!("{cmd}.json"));
    let schema: Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("schema")).expect("JSON");
    let validator = jsonschema::draft202012::new(&schema).expect("a valid schema");
    let errors: Vec<String> = validator.iter_errors(doc).map(|e| e.to_string()).collect();
    assert!(errors.is_empty(), "{cmd}: {errors:#?}\n{doc:#}");
}

/// `tally CMD LEDGER... --key KEY... --auditor-key A --json`.
fn run(cmd: &str, hosts: &[&Path], auditor: &Path) -> (i32, Value) {
    let mut args: Vec<std::ffi::OsString> = vec![cmd.into()];
    for h in hosts {
        args.push(h.join("ledger").into());
    }
    for h in hosts {
        args.push("--key".into());
        args.push(h.join("ledger").join("ledger.pub").into());
    }
    args.extend(["--auditor-key".into(), auditor.into(), "--json".into()]);
    let refs: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_os_str()).collect();
    tally(&refs)
}

/// [`run`], its output checked against its schema.
fn audit(cmd: &str, hosts: &[&Path], auditor: &Path) -> (i32, Value) {
    let (code, doc) = run(cmd, hosts, auditor);
    conforms(cmd, &doc);
    (code, doc)
}

/// A test cluster, a directory for the hosts, and the auditor's key (written there).
struct Setup {
    cluster: common::Cluster,
    root: tempfile::TempDir,
    auditor: AuditorKey,
    auditor_path: PathBuf,
}

fn setup() -> Option<Setup> {
    let cluster = common::Cluster::start()?;
    let root = tempfile::tempdir().expect("tempdir");
    let auditor = AuditorKey::generate();
    let auditor_path = root.path().join("auditor.key");
    auditor.write(&auditor_path).expect("auditor key");
    Some(Setup {
        cluster,
        root,
        auditor,
        auditor_path,
    })
}

#[test]
fn three_ledgers_of_one_fleet_audit_as_one() {
    let Some(Setup {
        cluster,
        root,
        auditor,
        auditor_path,
    }) = setup()
    else {
        return;
    };
    let url = cluster.url();
    let hosts: Vec<Host> = ["a", "b", "c"]
        .iter()
        .map(|n| host(root.path(), n, &auditor, &url))
        .collect();

    // One run, its calls and outcomes spread over the three hosts: host i decides the
    // call of attempt i+1's turn, and another host reports its outcome.
    start(
        &hosts[0],
        json!({"run": "fleet-run", "goal": "sync the catalogue"}),
    );
    let mut allowed = 0;
    for i in 0..9usize {
        let h = &hosts[i % 3];
        let call = json!({"run": "fleet-run", "tool": "catalogue", "operation": format!("page{i}"), "effect": "read"});
        if let Some(attempt) = check(h, call) {
            allowed += 1;
            let status = if i % 2 == 0 {
                Status::Ok
            } else {
                Status::Error
            };
            outcome(&hosts[(i + 1) % 3], "fleet-run", attempt, status);
        }
    }
    assert_eq!(allowed, 6, "attempts = 6 across the fleet");
    // A second run loops on one host and another: the gate stops the repeated call.
    start(&hosts[2], json!({"run": "looping"}));
    for i in 0..6usize {
        let h = &hosts[i % 2 + 1];
        let call = json!({"run": "looping", "tool": "deploy", "operation": "push", "effect": "read", "args": {"env": "prod"}});
        if let Some(attempt) = check(h, call) {
            outcome(&hosts[i % 2], "looping", attempt, Status::Error);
        }
    }
    let stop: StopRequest = serde_json::from_value(json!({})).expect("stop");
    hosts[1]
        .gate
        .stop_blocking(AGENT, "fleet-run", stop)
        .expect("stop");
    let dirs: Vec<PathBuf> = hosts.iter().map(|h| h.dir.clone()).collect();
    drop(hosts);
    let all: Vec<&Path> = dirs.iter().map(PathBuf::as_path).collect();

    // Verified together: every chain intact, the merge clean, the audit and the replay
    // of every gate decision over the merged order find nothing.
    let (code, v) = audit("verify", &all, &auditor_path);
    assert_eq!(code, 0, "{v:#}");
    assert_eq!(v["verdict"], "intact", "{v:#}");
    assert_eq!(v["ledgers"].as_array().map(Vec::len), Some(3));
    assert_eq!(v["merge"]["findings"], json!([]), "{v:#}");
    assert_eq!(v["audit"]["findings"], json!([]), "{v:#}");
    assert_eq!(v["replay"]["findings"], json!([]), "{v:#}");
    let versioned: u64 = v["merge"]["versioned"]
        .as_array()
        .expect("versioned")
        .iter()
        .filter_map(Value::as_u64)
        .sum();
    assert!(
        versioned > 20,
        "every gate decision carries its state version: {v:#}"
    );

    // The text names each ledger, then the merge.
    let mut args: Vec<std::ffi::OsString> = vec!["verify".into()];
    args.extend(all.iter().map(|h| h.join("ledger").into_os_string()));
    for h in &all {
        args.extend([
            "--key".into(),
            h.join("ledger").join("ledger.pub").into_os_string(),
        ]);
    }
    args.extend([
        "--auditor-key".into(),
        auditor_path.clone().into_os_string(),
    ]);
    let out = Tally::workspace()
        .command()
        .args(&args)
        .output()
        .expect("tally runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.starts_with("INTACT: all 3 ledgers"), "{text}");
    for want in ["ledger 1 (", "ledger 2 (", "ledger 3 (", "merged: "] {
        assert!(text.contains(want), "{want:?} in:\n{text}");
    }

    // One handoff per run, whichever hosts wrote it.
    let (code, h) = audit("handoff", &all, &auditor_path);
    assert_eq!(code, 0, "{h:#}");
    let handoffs = h["handoffs"].as_array().expect("handoffs");
    let runs: Vec<&str> = handoffs.iter().filter_map(|x| x["run"].as_str()).collect();
    assert_eq!(runs, ["fleet-run", "looping"], "{h:#}");
    let fleet = &handoffs[0];
    assert_eq!(fleet["attempts"]["used"], 6, "{fleet:#}");
    assert_eq!(fleet["stop"]["reason"], "completed", "{fleet:#}");
    // Positions name their ledger: `L:SEQ`, the L-th ledger given.
    assert!(
        fleet["last_seq"]
            .as_str()
            .is_some_and(|s| s.starts_with("2:")),
        "the stop was recorded on the second host: {fleet:#}"
    );
    let looping = &handoffs[1];
    assert_eq!(looping["stop"]["status"], "refused", "{looping:#}");
    assert_eq!(
        looping["loops"], 1,
        "the loop across two hosts is one loop: {looping:#}"
    );

    // An auditor given only some of the fleet's ledgers is told the records do not add
    // up: outcomes of attempts whose allow is in a ledger not given.
    let (code, partial) = audit("verify", &all[..2], &auditor_path);
    assert_eq!(code, 1, "{partial:#}");
    assert_ne!(partial["audit"]["findings"], json!([]), "{partial:#}");
}

#[test]
fn a_ledger_of_another_state_is_told_apart() {
    let Some(cluster) = common::Cluster::start() else {
        return;
    };
    cluster.create_database("other");
    let root = tempfile::tempdir().expect("tempdir");
    let auditor = AuditorKey::generate();
    let auditor_path = root.path().join("auditor.key");
    auditor.write(&auditor_path).expect("auditor key");
    let here = host(root.path(), "here", &auditor, &cluster.url());
    let other_url = cluster.url().replace("dbname=gate", "dbname=other");
    let there = host(root.path(), "there", &auditor, &other_url);
    for (h, run) in [(&here, "mine"), (&there, "theirs")] {
        start(h, json!({"run": run}));
        check(
            h,
            json!({"run": run, "tool": "t", "operation": "x", "effect": "read"}),
        );
    }
    let dirs = [here.dir.clone(), there.dir.clone()];
    drop((here, there));
    // Each database numbers from 1: the two ledgers claim the same versions.
    let (code, v) = audit(
        "verify",
        &[dirs[0].as_path(), dirs[1].as_path()],
        &auditor_path,
    );
    assert_eq!(code, 1, "{v:#}");
    let findings = v["merge"]["findings"].as_array().expect("findings");
    assert!(
        findings.iter().any(|f| f["kind"] == "version_shared"),
        "{v:#}"
    );
}

/// Under a race the versions still order every run's decisions as they were made: the
/// replay over the merged order agrees with every allow and every refusal.
#[test]
fn racing_hosts_replay_clean_in_version_order() {
    let Some(Setup {
        cluster,
        root,
        auditor,
        auditor_path,
    }) = setup()
    else {
        return;
    };
    let url = cluster.url();
    let hosts: Vec<Arc<Host>> = ["a", "b", "c"]
        .iter()
        .map(|n| Arc::new(host(root.path(), n, &auditor, &url)))
        .collect();
    start(
        &hosts[0],
        json!({"run": "race", "budget": {"spend_cents": 200}}),
    );
    let workers: Vec<_> = (0..24usize)
        .map(|i| {
            let h = Arc::clone(&hosts[i % 3]);
            let settle = Arc::clone(&hosts[(i + 1) % 3]);
            std::thread::spawn(move || {
                let call = json!({"run": "race", "worker": format!("w{i}"), "tool": "llm",
                                  "operation": format!("gen{i}"), "effect": "read", "reserve_cents": 30});
                let req: CheckRequest = serde_json::from_value(call).expect("check");
                let answer = h.gate.check_blocking(AGENT, req).expect("check");
                if let (None, Some(attempt)) = (answer.reason, answer.attempt) {
                    let req = OutcomeRequest {
                        run: "race".into(),
                        attempt,
                        status: Status::Ok,
                        settled_cents: Some(20),
                        settled_nanos: None,
                        remote_ref: None,
                        observed: None,
                        retry_after_ms: None,
                        result_digest: None,
                        worker: None,
                        usage_refused: None,
                        usage: None,
                    };
                    settle.gate.outcome_blocking(AGENT, req).expect("outcome");
                    return 1;
                }
                0
            })
        })
        .collect();
    let allowed: u32 = workers.into_iter().map(|w| w.join().expect("worker")).sum();
    assert!(
        (6..=10).contains(&allowed),
        "{allowed} allows of 30 within 200 cents"
    );
    let dirs: Vec<PathBuf> = hosts.iter().map(|h| h.dir.clone()).collect();
    drop(hosts);
    let all: Vec<&Path> = dirs.iter().map(PathBuf::as_path).collect();
    let (code, v) = audit("verify", &all, &auditor_path);
    assert_eq!(code, 0, "{v:#}");
    assert_eq!(v["merge"]["findings"], json!([]), "{v:#}");
    assert_eq!(v["replay"]["findings"], json!([]), "{v:#}");
    assert_eq!(v["audit"]["findings"], json!([]), "{v:#}");
    let (_, s) = run("stats", &all, &auditor_path);
    assert_eq!(
        s["runs"][0]["spend"]["settled_nanos"],
        u64::from(allowed) * 20 * 10_000_000,
        "{s:#}"
    );
}

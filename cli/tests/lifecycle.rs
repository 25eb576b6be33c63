//! Pauses, cascades and run ends (the gate's half), on the real binary and daemon: a pause
//! survives the loss of the index (it is a record, and its state travels in the log);
//! pause and resume hold and let go a run's open descendants; a run past its deadline is
//! stopped and no longer counts toward the uid's open runs.
//!
//! `TALLY_UNDER_TEST` runs these against another build (they fail against one from
//! before these fixes).

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};
use tally_testkit::{Daemon, Tally};

fn tally() -> Tally {
    Tally::new(env!("CARGO_BIN_EXE_tally"))
}

fn ok(dir: &Path, args: &[&str]) -> String {
    tally().ok(dir, args, "")
}

/// What these tests ask of the gate.
trait Gate {
    fn started(&self, body: Value);
    /// The decision on one read by `run`, and its reason.
    fn check(&self, run: &str) -> (String, String);
}

impl Gate for Daemon {
    fn started(&self, body: Value) {
        let (status, v) = self.agent("POST", "/v1/runs", Some(body));
        assert_eq!(status, 201, "{v}");
    }

    fn check(&self, run: &str) -> (String, String) {
        self.check_read(run)
    }
}

/// A fresh ledger in `dir/ledger` and `policy` in `dir/policy.toml`.
fn ledger(dir: &Path, policy: &str) {
    tally().init(dir, policy);
}

/// `tally verify` with the auditor key: INTACT, and replay finds nothing.
fn verifies(dir: &Path) -> Value {
    tally().verifies(dir)
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for e in std::fs::read_dir(from).expect("read_dir") {
        let e = e.expect("entry");
        if e.file_type().expect("type").is_dir() {
            copy_dir(&e.path(), &to.join(e.file_name()));
        } else {
            std::fs::copy(e.path(), to.join(e.file_name())).expect("copy");
        }
    }
}

/// Item 2: pause a run, stop the daemon, lose the index (delete it, or put back a copy
/// from before the pause, or rebuild it with `tally reindex`), restart: the run is still
/// paused. And a resume survives the same.
#[test]
fn regression_issue_21_a_pause_survives_the_loss_of_the_index() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let d = tmp.path();
    ledger(d, "");
    let mut s = tally().serve(d, &[]);
    s.started(json!({"run": "r", "goal": "paused across restarts"}));
    assert_eq!(s.check("r").0, "allow");
    s.stop();
    copy_dir(&d.join("ledger/index"), &d.join("index-before-the-pause"));
    let mut s = tally().serve(d, &[]);
    let (status, v) = s.operator("POST", "/v1/runs/r/pause", None);
    assert_eq!((status, v["state"].as_str()), (200, Some("paused")), "{v}");
    assert_eq!(s.check("r"), ("deny".into(), "run_paused".into()));
    s.stop();

    type Loss = fn(&Path);
    let losses: [(&str, Loss); 3] = [
        ("the index deleted", |d| {
            std::fs::remove_dir_all(d.join("ledger/index")).expect("rm index")
        }),
        ("an older index put back", |d| {
            std::fs::remove_dir_all(d.join("ledger/index")).expect("rm index");
            copy_dir(&d.join("index-before-the-pause"), &d.join("ledger/index"));
        }),
        ("the index rebuilt by tally reindex", |d| {
            std::fs::remove_dir_all(d.join("ledger/index")).expect("rm index");
            ok(d, &["reindex", "--ledger", "ledger"]);
        }),
    ];
    for (what, lose) in losses {
        lose(d);
        let mut s = tally().serve(d, &[]);
        let (_, v) = s.operator("GET", "/v1/runs/r", None);
        assert_eq!(v["state"], "paused", "{what}: {v}");
        assert_eq!(
            s.check("r"),
            ("deny".into(), "run_paused".into()),
            "{what}: the paused run was allowed"
        );
        s.stop();
    }
    // Resumed, and the index lost again: it stays resumed.
    let mut s = tally().serve(d, &[]);
    let (status, v) = s.operator("POST", "/v1/runs/r/resume", None);
    assert_eq!((status, v["state"].as_str()), (200, Some("running")), "{v}");
    s.stop();
    std::fs::remove_dir_all(d.join("ledger/index")).expect("rm index");
    let mut s = tally().serve(d, &[]);
    assert_eq!(s.check("r").0, "allow");
    s.stop();
    let report = verifies(d);
    assert!(
        report["replay"]["replayed"].as_u64().unwrap_or(0) >= 2,
        "{report}"
    );
}

/// Item 3: pausing a parent holds its open descendants (children and theirs), and
/// resuming lets them go; a kill still stops them all.
#[test]
fn regression_issue_21_a_pause_holds_the_runs_below() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let d = tmp.path();
    ledger(d, "");
    let mut s = tally().serve(d, &[]);
    s.started(json!({"run": "p", "goal": "parent", "budget": {"attempts": 30}}));
    s.started(json!({"run": "c", "goal": "child", "parent": "p", "budget": {"attempts": 10}}));
    s.started(json!({"run": "g", "goal": "grandchild", "parent": "c", "budget": {"attempts": 4}}));
    s.started(json!({"run": "other", "goal": "not below p"}));
    for r in ["p", "c", "g", "other"] {
        assert_eq!(s.check(r).0, "allow", "{r}");
    }
    let (status, v) = s.operator("POST", "/v1/runs/p/pause", None);
    assert_eq!(status, 200, "{v}");
    for r in ["p", "c", "g"] {
        assert_eq!(
            s.check(r),
            ("deny".into(), "run_paused".into()),
            "{r} runs on while p is paused"
        );
        let (_, v) = s.operator("GET", &format!("/v1/runs/{r}"), None);
        assert_eq!(v["state"], "paused", "{r}: {v}");
    }
    assert_eq!(s.check("other").0, "allow");
    let (status, v) = s.operator("POST", "/v1/runs/p/resume", None);
    assert_eq!(status, 200, "{v}");
    for r in ["p", "c", "g"] {
        assert_eq!(s.check(r).0, "allow", "{r} is held after p resumed");
    }
    s.stop();
    verifies(d);
}

/// Item 5, the gate's half: runs past their deadline stop counting toward the uid's open
/// runs. With `max_open_runs_per_uid = 2`, two runs whose deadline passed no longer keep a
/// third from starting: they are stopped (`run_deadline_exhausted`, recorded) first. A
/// check past a run's deadline is refused and stops it. (The deadlines are 50 ms and the
/// test waits past them: a lower bound on the time elapsed, never a race. The refusal
/// before a deadline is `gate/tests/lifecycle.rs`'s, on a clock the test moves.)
#[test]
fn regression_issue_21_runs_past_their_deadline_stop_counting() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let d = tmp.path();
    ledger(d, "max_open_runs_per_uid = 2\n");
    let mut s = tally().serve(d, &[]);
    for r in ["session-1", "session-2"] {
        s.started(json!({"run": r, "goal": "a session", "budget": {"deadline_ms": 50}}));
    }
    std::thread::sleep(Duration::from_millis(60));
    let (status, v) = s.agent(
        "POST",
        "/v1/runs",
        Some(json!({"run": "session-3", "budget": {"deadline_ms": 50}})),
    );
    assert_eq!(
        status, 201,
        "a uid is refused too_many_runs by runs long over: {v}"
    );
    for r in ["session-1", "session-2"] {
        let (_, v) = s.agent("GET", &format!("/v1/runs/{r}"), None);
        assert_eq!(
            (&v["state"], &v["stop_reason"]),
            (&json!("stopped"), &json!("run_deadline_exhausted")),
            "{r}: {v}"
        );
    }
    // A check past the deadline: refused, and the run is stopped with it.
    std::thread::sleep(Duration::from_millis(60));
    assert_eq!(
        s.check("session-3"),
        ("deny".into(), "run_deadline_exhausted".into())
    );
    let (_, v) = s.agent("GET", "/v1/runs/session-3", None);
    assert_eq!(v["state"], "stopped", "{v}");
    let (status, v) = s.agent(
        "POST",
        "/v1/check",
        Some(json!({"run": "session-3", "tool": "search", "effect": "read"})),
    );
    assert_eq!(
        (status, &v["seq"]),
        (200, &Value::Null),
        "nothing more is recorded: {v}"
    );
    s.stop();
    let report = verifies(d);
    assert_eq!(report["verdict"], "intact", "{report}");
}

//! With the gate's state in PostgreSQL, the live view reads the runs on a connection of
//! its own, never on the decision thread's: a snapshot that waits on the database delays
//! no check.

use super::*;

/// SIGCONT to a stopped server process, whatever happens (a stopped process would also
/// hang the cluster's shutdown).
struct Stopped(String);

impl Stopped {
    fn stop(pid: &str) -> Stopped {
        let s = Command::new("kill")
            .args(["-STOP", pid])
            .status()
            .expect("kill");
        assert!(s.success(), "SIGSTOP {pid}");
        Stopped(pid.to_owned())
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        let _ = Command::new("kill").args(["-CONT", &self.0]).status();
    }
}

/// The PostgreSQL server process that serves the view's connection is stopped (as a
/// database stuck on a lock, a page fault storm or a stalled disk would leave it): a
/// snapshot asked for meanwhile waits on it, and every check is still answered, on the
/// decision thread's own connection. Once it runs again, the page answers with the runs.
#[test]
fn a_snapshot_stuck_in_postgresql_delays_no_check() {
    let Some(cluster) = tally_testkit::postgres::Cluster::start() else {
        return;
    };
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path();
    ledger(dir);
    std::fs::write(
        dir.join("policy.toml"),
        format!("{POLICY}\n[rate]\ntool_per_sec = 0\ntool_in_flight = 0\n"),
    )
    .expect("policy");
    let url = cluster.url();
    let served = tally().serve(dir, &["--state", &url]);
    served.start_run("r", 1000);
    served.call("r", "search", json!({"i": "first"}));
    // The first snapshot opens the view's connection.
    let (status, text) = served.operator_text("/v1/live");
    assert_eq!(status, 200, "{text}");
    // Its server process, by the application name the view's connection carries (the
    // gate's, `tally`, and `-view`: tally_gate_postgres::VIEW_SUFFIX).
    let pids =
        cluster.psql("SELECT pid FROM pg_stat_activity WHERE application_name = 'tally-view'");
    let pids: Vec<&str> = pids.lines().filter(|l| !l.is_empty()).collect();
    assert_eq!(pids.len(), 1, "one view connection: {pids:?}");
    let decisions =
        cluster.psql("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'tally'");
    assert_eq!(decisions.trim(), "1", "and one for the decisions");
    let stopped = Stopped::stop(pids[0]);

    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let snapshot = {
        let socket = served.operator_socket();
        let done = std::sync::Arc::clone(&done);
        std::thread::spawn(move || {
            let r = request(&socket, "GET", "/v1/live", None);
            done.store(true, std::sync::atomic::Ordering::SeqCst);
            r
        })
    };
    // Every check is answered while the snapshot waits on the stopped process.
    for i in 0..20 {
        let a = served.call("r", "search", json!({"i": i}));
        assert_eq!(a["decision"], "allow", "{a}");
    }
    let pending_after_checks = !done.load(std::sync::atomic::Ordering::SeqCst);
    drop(stopped);
    let (status, body) = snapshot.join().expect("snapshot thread");
    let body = String::from_utf8_lossy(&body).into_owned();
    // The snapshot could not finish while the process was stopped: either it was still
    // waiting when the checks were done, or it gave up at the bound (503, fail closed
    // for the view only).
    assert!(
        pending_after_checks || (status == 503 && body.contains("gate_unavailable")),
        "the snapshot did not wait on the stopped process: {status} {body}"
    );
    // The view answers again (on a new connection if the last one was given up), with
    // every check counted.
    let deadline = Instant::now() + Duration::from_secs(30);
    let snap: Value = loop {
        let (status, text) = served.operator_text("/v1/live");
        if status == 200 {
            break serde_json::from_str(&text).expect("snapshot");
        }
        assert!(Instant::now() < deadline, "{status} {text}");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(snap["runs"][0]["run"], "r", "{snap}");
    assert_eq!(
        snap["runs"][0]["closeness"]["each"]
            .as_array()
            .expect("each")
            .iter()
            .find(|h| h["dimension"] == "attempts")
            .expect("attempts")["used"],
        21,
        "{snap}"
    );
}

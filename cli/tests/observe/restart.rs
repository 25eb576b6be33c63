//! The live view's trajectories survive a daemon killed with SIGKILL and started again.

use super::*;

/// The `/v1/live` runs by name.
fn runs_of(snap: &Value) -> BTreeMap<String, Value> {
    snap["runs"]
        .as_array()
        .expect("runs")
        .iter()
        .map(|r| (r["run"].as_str().expect("run").to_owned(), r.clone()))
        .collect()
}

fn live(served: &Daemon) -> Value {
    let (status, text) = served.operator_text("/v1/live");
    assert_eq!(status, 200, "{text}");
    serde_json::from_str(&text).expect("snapshot")
}

/// The snapshot once run `run` has `n` attempts points (a restarted daemon reads its
/// trajectories back on a thread of its own, while it already serves).
fn live_with(served: &Daemon, run: &str, n: usize) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let snap = live(served);
        let have = runs_of(&snap)
            .get(run)
            .and_then(|r| r["spark"]["attempts"]["used"].as_array().map(Vec::len))
            .unwrap_or(0);
        if have >= n {
            return snap;
        }
        assert!(Instant::now() < deadline, "{have} of {n} points: {snap}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The first snapshot of the event stream on the operator socket.
fn first_event(served: &Daemon) -> Value {
    use std::io::Read;
    let mut s = std::os::unix::net::UnixStream::connect(served.operator_socket()).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    s.write_all(b"GET /v1/live/events HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .expect("write");
    let mut got = Vec::new();
    let mut buf = [0u8; 65536];
    loop {
        let text = String::from_utf8_lossy(&got).into_owned();
        if let Some(at) = text.find("event: snapshot\ndata: ") {
            let rest = &text[at + "event: snapshot\ndata: ".len()..];
            if let Some(end) = rest.find('\n') {
                return serde_json::from_str(&rest[..end]).expect("event data");
            }
        }
        let n = s.read(&mut buf).expect("read the stream");
        assert!(n > 0, "the stream ended: {text}");
        got.extend_from_slice(&buf[..n]);
    }
}

/// Wait until the trajectories' file holds `n` attempts points (its writer is a thread
/// of its own: a point is on disk a moment after the page shows it).
fn wait_for_points(dir: &Path, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (got, text) = points_in(dir);
        if got >= n {
            assert_eq!(got, n, "{text}");
            return;
        }
        assert!(Instant::now() < deadline, "{got} of {n} points: {text}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The attempts points the trajectories' file holds now, and its text.
fn points_in(dir: &Path) -> (usize, String) {
    let text = std::fs::read_to_string(dir.join("ledger/live.ndjson")).unwrap_or_default();
    let got = text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .map(|l| {
            l["points"]
                .as_array()
                .map_or(0, |p| p.iter().filter(|p| p[0] == 0).count())
        })
        .sum();
    (got, text)
}

fn spark(run: &Value, dim: &str) -> Vec<u64> {
    run["spark"][dim]["used"]
        .as_array()
        .unwrap_or_else(|| panic!("no {dim} trajectory: {run}"))
        .iter()
        .map(|v| v.as_u64().expect("used"))
        .collect()
}

/// Checks, then SIGKILL, then a new start: the page's JSON and its event stream have
/// every trajectory point from before (attempts and spend; a point per check and one per
/// outcome, which settles the call's spend), the next call adds to them;
/// a torn last line (a write cut by the kill) is skipped and said in the log; a clean
/// stop writes the last point before it exits.
#[test]
fn trajectories_survive_kill_9_and_restart() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path();
    ledger(dir);
    let mut served = tally().serve(dir, &[]);
    served.start_run("r", 50);
    served.start_run("s", 50);
    for i in 0..12 {
        served.call("r", "search", json!({"i": i}));
    }
    for i in 0..5 {
        served.call("s", "search", json!({"i": i}));
    }
    let before = runs_of(&live(&served));
    let r_attempts = spark(&before["r"], "attempts");
    assert_eq!(r_attempts.len(), 24, "{}", before["r"]);
    assert_eq!(spark(&before["s"], "attempts").len(), 10);

    wait_for_points(dir, 34);
    served.kill_9();
    served.restart();
    let after = runs_of(&live_with(&served, "r", 24));
    for run in ["r", "s"] {
        for dim in ["attempts", "spend_nanos"] {
            assert_eq!(
                spark(&after[run], dim),
                spark(&before[run], dim),
                "{run} {dim}: {}",
                after[run]
            );
        }
    }
    let event = runs_of(&first_event(&served));
    assert_eq!(spark(&event["r"], "attempts"), r_attempts);
    // The next call (a check and its outcome) adds two points to the same trajectory.
    served.call("r", "search", json!({"i": "after"}));
    let now = runs_of(&live(&served));
    let grown = spark(&now["r"], "attempts");
    assert_eq!(grown.len(), 26, "{}", now["r"]);
    assert_eq!(grown[..24], r_attempts[..]);

    // A write cut by a kill: a torn last line.
    wait_for_points(dir, 36);
    served.kill_9();
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(dir.join("ledger/live.ndjson"))
        .expect("the trajectories' file");
    f.write_all(b"{\"run\":\"r\",\"at_ms\":17").expect("torn");
    drop(f);
    served.restart();
    let again = runs_of(&live_with(&served, "r", 26));
    assert_eq!(spark(&again["r"], "attempts"), grown);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !served.log().contains("did not parse and were skipped") {
        assert!(Instant::now() < deadline, "{}", served.log());
        std::thread::sleep(Duration::from_millis(20));
    }

    // A clean stop right after checks: the file has their points too (the writer, which
    // writes at most every 50 ms, is flushed and joined), with no wait.
    wait_for_points(dir, 36);
    for i in 0..8 {
        served.check("s", "search", json!({"last": i}));
    }
    served.stop();
    let (got, text) = points_in(dir);
    assert_eq!(got, 44, "{text}");
}

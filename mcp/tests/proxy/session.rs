//! A session's end ends its run: the client closing stdin, a signal, or the server
//! exiting stops the run `tally mcp` started, so runs do not pile up toward the policy's
//! `max_open_runs_per_uid`; a later session under the same `--run` continues a run that
//! stopped `completed`, and does not continue one that stopped for anything else.

use super::*;
use tally_record::Reason;

/// The stop records of `run`: their reasons.
fn stops(ds: &[Decision]) -> Vec<Reason> {
    ds.iter()
        .filter(|d| d.kind == Some(Kind::Stop))
        .filter_map(|d| d.reason)
        .collect()
}

/// Wait for a child to exit (bounded); its status.
fn exited(child: &mut Child) -> std::process::ExitStatus {
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            return status;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "tally mcp did not exit"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The pids of `pid`'s children.
fn children(pid: u32) -> Vec<i32> {
    let mut out = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).expect("/proc") {
        let path = task.expect("task").path().join("children");
        for c in std::fs::read_to_string(path)
            .unwrap_or_default()
            .split_whitespace()
        {
            out.push(c.parse().expect("a pid"));
        }
    }
    out
}

fn signal(pid: i32, signal: rustix::process::Signal) {
    let pid = rustix::process::Pid::from_raw(pid).expect("a pid");
    rustix::process::kill_process(pid, signal).expect("kill");
}

/// A session: initialize, one allowed call, then the end `end` makes.
fn session(gate: &Gate, run: &str, end: impl FnOnce(&mut Raw)) -> String {
    let stderr = gate.path(&format!("{run}.stderr"));
    let file = std::fs::File::create(&stderr).expect("stderr file");
    let mut raw = Raw::start_logged(&gate.proxy(run, &[]), &[], file);
    initialize(&mut raw);
    let got = raw.exchange(&call(2, "lookup", json!({"key": run})), Some(&json!(2)));
    let answer = answer(&got, 2);
    assert_eq!(answer["result"]["isError"], false, "{run}: {answer}");
    end(&mut raw);
    std::fs::read_to_string(stderr).expect("stderr")
}

fn close(raw: &mut Raw) {
    drop(raw.child.stdin.take());
    exited(&mut raw.child);
}

#[test]
fn each_way_a_session_ends_stops_the_run_it_started() {
    if !sdk_available() {
        return;
    }
    let gate = Gate::start("");
    let log = session(&gate, "eof", close);
    assert!(
        log.contains("the client closed its stdin: run eof stopped (completed)"),
        "{log}"
    );
    for (run, sig) in [
        ("term", rustix::process::Signal::TERM),
        ("int", rustix::process::Signal::INT),
        ("hup", rustix::process::Signal::HUP),
    ] {
        let log = session(&gate, run, |raw| {
            signal(raw.child.id() as i32, sig);
            exited(&mut raw.child);
        });
        assert!(
            log.contains(&format!("run {run} stopped (completed)")),
            "{log}"
        );
    }
    // The server dies with nothing in flight: the session is over, nothing is uncertain.
    let log = session(&gate, "died", |raw| {
        for c in children(raw.child.id()) {
            signal(c, rustix::process::Signal::KILL);
        }
        let status = exited(&mut raw.child);
        assert_eq!(status.code(), Some(2), "a server that failed is exit 2");
    });
    assert!(
        log.contains("the server exited: run died stopped (completed)"),
        "{log}"
    );
    // The server dies in the middle of a non-idempotent write: its outcome is unknown,
    // and the run stops saying so (a human must check before the task goes on).
    let log = session(&gate, "crash", |raw| {
        raw.send(&call(3, "crash", json!({"code": 3})));
        exited(&mut raw.child);
    });
    assert!(
        log.contains("run crash stopped (outcome_unknown_non_idempotent)"),
        "{log}"
    );
    // A session started again under that name does not go on: every call is refused.
    let mut raw = Raw::start(&gate.proxy("crash", &[]), &[]);
    initialize(&mut raw);
    let got = raw.exchange(&call(2, "lookup", json!({"key": "again"})), Some(&json!(2)));
    let refused = answer(&got, 2);
    assert_eq!(refused["result"]["isError"], true, "{refused}");
    let t = text(&refused);
    assert!(
        t.contains("run crash has stopped (outcome_unknown_non_idempotent)")
            && t.contains("new --run"),
        "{t}"
    );
    raw.close();

    let expected = [
        ("eof", Reason::Completed),
        ("term", Reason::Completed),
        ("int", Reason::Completed),
        ("hup", Reason::Completed),
        ("died", Reason::Completed),
        ("crash", Reason::OutcomeUnknownNonIdempotent),
    ];
    let runs: Vec<&str> = expected.iter().map(|(r, _)| *r).collect();
    let all = gate.finish_all(&runs);
    for ((run, reason), ds) in expected.iter().zip(all) {
        assert_eq!(stops(&ds), vec![*reason], "{run}");
        // Its outcomes are recorded before the stop, and nothing after it.
        let last = ds.last().expect("decisions");
        assert_eq!(last.kind, Some(Kind::Stop), "{run}: {ds:?}");
    }
}

#[test]
fn sessions_do_not_pile_up_toward_the_open_run_limit() {
    if !sdk_available() {
        return;
    }
    // Two open runs at most for this uid: the third session was refused every call.
    let gate = Gate::start("max_open_runs_per_uid = 2\n");
    for run in ["s1", "s2", "s3", "s4"] {
        session(&gate, run, close);
    }
    // The same --run again: the run stopped completed, so this session continues it
    // under a name of its own, and again.
    let log = session(&gate, "s1", close);
    assert!(
        log.contains("run s1 has stopped (completed): this session continues it as run s1.2")
            && log.contains("run s1.2 stopped (completed)"),
        "{log}"
    );
    let log = session(&gate, "s1", close);
    assert!(log.contains("continues it as run s1.3"), "{log}");
    let ds = gate.finish("s1.3");
    let start = ds
        .iter()
        .find(|d| d.kind == Some(Kind::Start))
        .expect("start");
    assert_eq!(start.continues.as_deref(), Some("s1.2"));
    assert_eq!(allows(&ds).len(), 1);
    assert_eq!(stops(&ds), vec![Reason::Completed]);
}

/// The daemon closes a keep-alive connection after 10 s without a request: the next call
/// is still checked (on a new connection), not refused as if the gate were down.
#[test]
fn a_call_after_the_gate_closed_the_idle_connection_is_checked() {
    if !sdk_available() {
        return;
    }
    let gate = Gate::start("");
    let mut raw = Raw::start(&gate.proxy("idle", &[]), &[]);
    initialize(&mut raw);
    let first = raw.exchange(&call(2, "lookup", json!({"key": "a"})), Some(&json!(2)));
    assert_eq!(answer(&first, 2)["result"]["isError"], false);
    // Wait for the event, not a time: the proxy holds one socket less once the daemon
    // has closed its idle connection (its others are the runtime's signal pipe).
    let connected = sockets(raw.child.id());
    assert!(connected > 0);
    let started = Instant::now();
    while sockets(raw.child.id()) >= connected {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the daemon never closed the idle connection"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let second = raw.exchange(&call(3, "lookup", json!({"key": "b"})), Some(&json!(3)));
    let second = answer(&second, 3);
    assert_eq!(second["result"]["isError"], false, "{second}");
    raw.close();
    let ds = gate.finish("idle");
    assert_eq!(allows(&ds).len(), 2);
}

/// How many sockets a process holds open.
fn sockets(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|fds| {
            fds.filter_map(Result::ok)
                .filter_map(|fd| std::fs::read_link(fd.path()).ok())
                .filter(|l| l.to_string_lossy().starts_with("socket:"))
                .count()
        })
        .unwrap_or(0)
}

/// A session whose last call the gate refused says why it ended: a `stop` refusal is
/// the run's stop reason (not `completed`); after an `ask` refusal the run stays open for
/// the human's approval, and the next session under the same --run joins it.
#[test]
fn the_stop_says_why_the_gate_ended_the_session() {
    if !sdk_available() {
        return;
    }
    let looped = Gate::start("");
    let log = session(&looped, "loop", |raw| {
        for id in 3..=5 {
            raw.exchange(
                &call(id, "lookup", json!({"key": "loop"})),
                Some(&json!(id)),
            );
        }
        close(raw);
    });
    assert!(
        log.contains("run loop stopped (loop_repeated_call)"),
        "{log}"
    );
    let ds = looped.finish("loop");
    assert_eq!(stops(&ds), vec![Reason::LoopRepeatedCall]);

    let capped = Gate::start("[ceiling]\nattempts = 1\n");
    let log = session(&capped, "cap", |raw| {
        let got = raw.exchange(&call(3, "lookup", json!({"key": "more"})), Some(&json!(3)));
        let refused = answer(&got, 3);
        assert_eq!(
            refused["result"]["_meta"]["tally/gate"]["action"], "ask",
            "{refused}"
        );
        close(raw);
    });
    assert!(log.contains("the run is left open"), "{log}");
    let log = session_refused(&capped, "cap");
    assert!(!log.contains("continues it"), "{log}");
    let ds = capped.finish("cap");
    assert_eq!(stops(&ds), Vec::<Reason>::new(), "waiting for a human");
}

/// A session whose one call the gate refuses; its stderr.
fn session_refused(gate: &Gate, run: &str) -> String {
    let stderr = gate.path(&format!("{run}-refused.stderr"));
    let file = std::fs::File::create(&stderr).expect("stderr file");
    let mut raw = Raw::start_logged(&gate.proxy(run, &[]), &[], file);
    initialize(&mut raw);
    let got = raw.exchange(&call(2, "lookup", json!({"key": "x"})), Some(&json!(2)));
    assert_eq!(answer(&got, 2)["result"]["isError"], true);
    close(&mut raw);
    std::fs::read_to_string(stderr).expect("stderr")
}

//! When the gate is down, the server never answers or exits mid-call, or a retry is
//! refused: no call is made that the gate did not allow, and the ledger says what happened.

use super::*;

#[test]
fn with_the_gate_down_no_call_is_made() {
    if !sdk_available() {
        return;
    }
    let gate = Gate::start("");
    let calls_file = gate.path("calls.txt");
    let mut command = gate.proxy("down1", &[]);
    command[3] = gate.path("nobody-listens.sock");
    let mut raw = Raw::start(&command, &[("TALLY_MCP_TEST_CALLS", &calls_file)]);
    initialize(&mut raw);
    // Everything but tools/call still works.
    let list = raw.exchange(
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#,
        Some(&json!(2)),
    );
    assert!(answer(&list, 2)["result"]["tools"].is_array());
    let got = raw.exchange(&call(3, "lookup", json!({"key": "a"})), Some(&json!(3)));
    let refused = answer(&got, 3);
    assert_eq!(refused["result"]["isError"], true, "{refused}");
    let t = text(&refused);
    assert!(
        t.contains("not made (fail closed)")
            && t.contains("cannot reach the gate")
            && t.contains("nobody-listens.sock"),
        "{t}"
    );
    raw.close();
    assert!(
        std::fs::read_to_string(&calls_file)
            .unwrap_or_default()
            .is_empty(),
        "the call never reached the server"
    );
}

#[test]
fn a_call_the_server_never_answers_is_recorded_as_timeout() {
    if !sdk_available() {
        return;
    }
    let gate = Gate::start("[rate]\ncall_timeout_ms = 800\n");
    let mut raw = Raw::start(&gate.proxy("slow1", &[]), &[]);
    initialize(&mut raw);
    let started = Instant::now();
    let got = raw.exchange(&call(2, "slow", json!({"seconds": 5})), Some(&json!(2)));
    let elapsed = started.elapsed();
    let timed_out = answer(&got, 2);
    assert_eq!(timed_out["result"]["isError"], true, "{timed_out}");
    assert!(
        text(&timed_out).contains("did not answer within 800 ms"),
        "{timed_out}"
    );
    assert!(
        elapsed < Duration::from_secs(4),
        "answered at the gate's limit, not the server's: {elapsed:?}"
    );
    // The server was told to cancel; its late answer never reaches the client, which
    // already has one for that id.
    let later = raw.exchange(
        r#"{"jsonrpc":"2.0","id":3,"method":"ping"}"#,
        Some(&json!(3)),
    );
    let more = raw.read_until(None, Duration::ZERO);
    let late: Vec<&String> = later
        .iter()
        .chain(&more)
        .filter(|l| l.contains(r#""id":2"#))
        .collect();
    assert!(late.is_empty(), "a second answer to id 2: {late:?}");
    raw.close();
    let ds = gate.finish("slow1");
    let statuses: Vec<Status> = ds.iter().filter_map(|d| d.status).collect();
    assert_eq!(statuses, vec![Status::Timeout]);
}

#[test]
fn a_refusal_to_retry_says_when() {
    if !sdk_available() {
        return;
    }
    let gate = Gate::start("[rate]\nrun_per_sec = 1\nrun_burst = 1\n");
    let mut raw = Raw::start(&gate.proxy("rate1", &[]), &[]);
    initialize(&mut raw);
    let first = raw.exchange(&call(2, "lookup", json!({"key": "a"})), Some(&json!(2)));
    assert_eq!(answer(&first, 2)["result"]["isError"], false);
    let second = raw.exchange(&call(3, "lookup", json!({"key": "b"})), Some(&json!(3)));
    let refused = answer(&second, 3);
    let meta = &refused["result"]["_meta"]["tally/gate"];
    assert_eq!(meta["reason"], "rate_limit_exceeded", "{refused}");
    assert_eq!(meta["action"], "retry");
    let after = meta["retry_after_ms"].as_u64().expect("retry_after_ms");
    let t = text(&refused);
    assert!(
        t.contains("rate_limit_exceeded")
            && t.contains("Action: retry")
            && t.contains(&format!("Retry after {after} ms")),
        "{t}"
    );
    raw.close();
    let ds = gate.finish("rate1");
    let deny = ds
        .iter()
        .find(|d| d.kind == Some(Kind::Deny))
        .expect("the refusal is recorded");
    assert_eq!(deny.tool.as_deref(), Some("files/lookup"));
}

#[test]
fn a_server_that_exits_mid_call_leaves_an_unknown_outcome_and_its_exit_code() {
    if !sdk_available() {
        return;
    }
    let gate = Gate::start("");
    let mut raw = Raw::start(&gate.proxy("crash1", &[]), &[]);
    initialize(&mut raw);
    raw.send(&call(2, "crash", json!({"code": 3})));
    let started = Instant::now();
    let status = loop {
        if let Some(status) = raw.child.try_wait().expect("wait") {
            break status;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "tally mcp did not exit with its server"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(
        status.code(),
        Some(2),
        "a server that failed is tally's exit 2 (its own code is on stderr)"
    );
    let ds = gate.finish("crash1");
    let statuses: Vec<Status> = ds.iter().filter_map(|d| d.status).collect();
    // The write may or may not have happened: the ledger says unknown, not ok or error.
    assert_eq!(statuses, vec![Status::Unknown]);
}

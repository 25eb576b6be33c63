//! What fails behind the gateway, end to end: a gate that cannot answer at `initialize`
//! (its PostgreSQL server stopped) is a 503 that opens nothing, and a stdio server that
//! answers `initialize` but never its `tools/list` costs one bounded listing: its own
//! process killed and reaped, the other servers' left serving, the next listing served by
//! a new one.

use super::*;

const INIT: &[u8] = br#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}"#;

#[test]
fn an_initialize_the_gate_cannot_answer_is_503_and_opens_no_session() {
    if !sdk_available() {
        return;
    }
    let Some(cluster) = tally_testkit::postgres::Cluster::start() else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    tally().init(
        dir.path(),
        &format!(
            "[mcp.local]\ncommand = [\"python3\", \"{}\"]\n",
            server_py()
        ),
    );
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut serve = tally().serve(
        dir.path(),
        &["--state", &cluster.url(), "--mcp-listen", &listen],
    );
    wait_port(port);
    let addr: SocketAddr = listen.parse().expect("an address");
    let (status, v) = serve.agent(
        "POST",
        "/v1/runs",
        Some(json!({"run": "pg", "goal": "gateway test"})),
    );
    assert_eq!(status, 201, "{v}");
    let token = v["token"].as_str().expect("a token").to_owned();
    let bearer = format!("Bearer {token}");
    let opened = send(addr, "POST", &[("Authorization", &bearer)], INIT);
    assert_eq!(opened.status, 200, "{}", opened.body);

    // The gate's PostgreSQL server stops: the run's owner cannot be read.
    cluster.stop();
    let refused = send(addr, "POST", &[("Authorization", &bearer)], INIT);
    assert_eq!(refused.status, 503, "{}", refused.body);
    assert!(
        refused.body.contains("the gate cannot read the run pg"),
        "{}",
        refused.body
    );
    assert_eq!(refused.header("mcp-session-id"), None, "a session opened");

    // Once it is back, an initialize opens a session again.
    cluster.restart();
    let started = Instant::now();
    loop {
        let a = send(addr, "POST", &[("Authorization", &bearer)], INIT);
        if a.status == 200 {
            assert!(a.header("mcp-session-id").is_some(), "{:?}", a.headers);
            break;
        }
        assert_eq!(a.status, 503, "{}", a.body);
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "still refused: {}",
            a.body
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let status = serve.stop().expect("tally serve running");
    assert!(status.success(), "tally serve exited with {status}");
}

#[test]
fn a_stdio_server_hung_in_its_listing_is_killed_alone_and_started_again() {
    if !sdk_available() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let marker = p(dir.path(), "stuck-listed-once");
    let stuck_pids = p(dir.path(), "stuck-pid.txt");
    let gw = Gateway::start(&format!(
        "[mcp.stuck]\ncommand = [\"env\", \"TALLY_MCP_TEST_HANG_LIST={marker}\", \"TALLY_MCP_TEST_PID={stuck_pids}\", \"python3\", \"{}\"]\n",
        server_py()
    ));
    let token = gw.run("stuck");
    let s = RawSession::open(gw.addr, &token);
    let pids = |f: &str| -> Vec<u32> {
        std::fs::read_to_string(f)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    };
    // The first listing: `stuck` initializes, then never lists. The list is answered
    // with the other servers' tools at its bound; `stuck`'s process (that generation)
    // is killed and reaped, the local server's is not touched.
    let started = Instant::now();
    let list = s.post(br#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#);
    let took = started.elapsed();
    assert!(
        took >= Duration::from_secs(10) && took < Duration::from_secs(25),
        "{took:?}"
    );
    let tools = list.answer_to(2).expect("the list").to_string();
    assert!(tools.contains("local__lookup"), "{tools}");
    assert!(tools.contains("remote__lookup"), "{tools}");
    assert!(!tools.contains("stuck__"), "{tools}");
    let first = pids(&stuck_pids);
    assert_eq!(first.len(), 1, "{first:?}");
    assert!(
        gone(first[0]),
        "the hung server {} is still there",
        first[0]
    );
    let local = pids(&gw.gate.path("local-pid.txt"));
    assert_eq!(local.len(), 1, "{local:?}");
    assert!(!gone(local[0]), "the local server was killed with it");

    // The next listing starts a new generation, which lists; a call is served by it.
    let list = s.post(br#"{"jsonrpc":"2.0","id":3,"method":"tools/list"}"#);
    let tools = list.answer_to(3).expect("the list").to_string();
    assert!(tools.contains("stuck__lookup"), "{tools}");
    let a = s.post(call(4, "stuck__lookup", json!({"key": "k"})).as_bytes());
    assert_eq!(
        a.answer_to(4)
            .map(|m| m["result"]["content"][0]["text"].clone()),
        Some(json!("value of k")),
        "{}",
        a.body
    );
    let second = pids(&stuck_pids);
    assert_eq!(second.len(), 2, "one new server: {second:?}");
    assert!(!gone(second[1]), "the new server was killed");
    assert_eq!(pids(&gw.gate.path("local-pid.txt")), local);
    let Gateway { gate, _remote, .. } = gw;
    gate.finish("stuck");
    assert!(
        gone(second[1]),
        "the server {} outlived the gateway",
        second[1]
    );
}

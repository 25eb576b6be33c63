//! Start, drain, restart; the socket file and the ledger directory.

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use tally_daemon::{DaemonError, ServeOptions};
use tokio::io::AsyncWriteExt;

use crate::common::{
    allow, free_loopback_addr, new_ledger, open_ledger, post_json, read_until_closed, walk, Daemon,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_drains_the_request_in_flight_then_removes_the_socket() {
    let mut daemon = Daemon::start(|o| o.limits.read_timeout = Duration::from_secs(5)).await;
    let body = allow("drain", "w", 1);
    let (head, tail) = body.split_at(body.len() / 2);
    let mut stream = tokio::net::UnixStream::connect(&daemon.socket)
        .await
        .expect("connect");
    let request = format!(
        "POST /v1/decisions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{head}",
        body.len()
    );
    stream
        .write_all(request.as_bytes())
        .await
        .expect("write head");
    // An idle keep-alive connection must not hold the shutdown up.
    let idle = daemon.client().await;
    tokio::time::sleep(Duration::from_millis(100)).await;

    daemon.signal_shutdown();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !daemon.socket.exists(),
        "socket removed as soon as accepting stops"
    );
    assert!(
        tokio::net::UnixStream::connect(&daemon.socket)
            .await
            .is_err(),
        "no new connections"
    );

    // The request already in flight completes and is acknowledged.
    stream.write_all(tail.as_bytes()).await.expect("write tail");
    let (reply, _) = read_until_closed(&mut stream, Duration::from_secs(5)).await;
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    let json = reply.split("\r\n\r\n").nth(1).expect("body");
    let receipts: Vec<tally_ledger::Receipt> = serde_json::from_str(json).expect("receipts");
    daemon.wait().await.expect("clean exit after draining");
    drop(idle);

    let chain = walk(&daemon.ledger_dir, &daemon.auditor);
    chain.assert_holds(&receipts);
    assert_eq!(chain.entries.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_continues_the_chain() {
    let mut daemon = Daemon::start(|_| {}).await;
    let mut c = daemon.client().await;
    let mut acked = c
        .append_ndjson([allow("a", "w", 1), allow("b", "w", 2), allow("a", "w", 3)].join("\n"))
        .await
        .expect("first life");
    drop(c);
    daemon.shutdown().await.expect("clean shutdown");

    daemon.restart(|_| {}).await;
    let mut c = daemon.client().await;
    let more = c
        .append_ndjson([allow("a", "w", 4), allow("c", "w", 5)].join("\n"))
        .await
        .expect("second life");
    assert_eq!(more.iter().map(|r| r.seq).collect::<Vec<_>>(), vec![4, 5]);
    drop(c);
    daemon.shutdown().await.expect("clean shutdown");
    acked.extend(more);
    let chain = walk(&daemon.ledger_dir, &daemon.auditor);
    assert_eq!(chain.entries.len(), 6);
    chain.assert_holds(&acked);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_socket_path_is_guarded() {
    let mut daemon = Daemon::start(|_| {}).await;
    let mode =
        |p: &std::path::Path| std::fs::metadata(p).expect("socket").permissions().mode() & 0o777;
    assert_eq!(
        mode(&daemon.agent_socket),
        0o660,
        "default agent socket mode"
    );
    assert_eq!(
        mode(&daemon.socket),
        0o600,
        "the operator socket is the daemon user's"
    );

    // A second daemon (another ledger) on the same live socket is refused.
    let (_other_dir, other_ledger, _) = new_ledger(Default::default());
    let other = std::sync::Arc::new(open_ledger(&other_ledger));
    let result = tally_daemon::serve(
        other,
        ServeOptions::new(&other_ledger, &daemon.socket),
        async {},
    )
    .await;
    assert!(
        matches!(result, Err(DaemonError::SocketInUse { .. })),
        "{result:?}"
    );
    assert!(daemon.socket.exists(), "the live socket is left alone");

    // A file that is not a socket is never deleted.
    let file = daemon.dir.path().join("precious.txt");
    std::fs::write(&file, b"keep me").expect("write");
    let other = std::sync::Arc::new(open_ledger(&other_ledger));
    let result =
        tally_daemon::serve(other, ServeOptions::new(&other_ledger, &file), async {}).await;
    assert!(
        matches!(result, Err(DaemonError::SocketPathTaken { .. })),
        "{result:?}"
    );
    assert_eq!(std::fs::read(&file).expect("read"), b"keep me");

    // TCP only on loopback.
    let other = std::sync::Arc::new(open_ledger(&other_ledger));
    let mut options = ServeOptions::new(&other_ledger, daemon.dir.path().join("x.sock"));
    options.listen = Some("0.0.0.0:0".parse().expect("addr"));
    let result = tally_daemon::serve(other, options, async {}).await;
    assert!(
        matches!(result, Err(DaemonError::NotLoopback { .. })),
        "{result:?}"
    );
    daemon.shutdown().await.expect("clean shutdown");

    // A stale socket left by a dead daemon is replaced, with the configured mode.
    let stale = std::os::unix::net::UnixListener::bind(&daemon.socket).expect("bind stale");
    drop(stale);
    assert!(daemon.socket.exists());
    daemon.restart(|o| o.socket_mode = 0o600).await;
    let mode = std::fs::metadata(&daemon.socket)
        .expect("socket")
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600);
    let mut c = daemon.client().await;
    assert_eq!(
        c.append(&allow("r", "w", 1)).await.expect("append")[0].seq,
        1
    );
    drop(c);
    daemon.shutdown().await.expect("clean shutdown");
    assert!(!daemon.socket.exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_loopback_serves_the_same_api() {
    let addr = free_loopback_addr();
    let mut daemon = Daemon::start(|o| o.listen = Some(addr)).await;
    let mut tcp = tally_api::client::Client::tcp(addr)
        .await
        .expect("connect tcp");
    // TCP peers are agents: they reach the gate, not raw appends.
    let (status, started) = post_json(&mut tcp, "/v1/runs", r#"{"run":"t","goal":"g"}"#).await;
    assert_eq!(status, 201, "{started}");
    let (status, answer) = post_json(
        &mut tcp,
        "/v1/check",
        r#"{"run":"t","tool":"http","effect":"read","args":{"q":1}}"#,
    )
    .await;
    assert_eq!(
        (status, answer["decision"].as_str()),
        (200, Some("allow")),
        "{answer}"
    );
    let refused = tcp.append(&allow("t", "tcp", 1)).await;
    assert!(
        matches!(
            &refused,
            Err(tally_api::client::ClientError::Refused { status: 403, .. })
        ),
        "{refused:?}"
    );
    drop(tcp);
    daemon.shutdown().await.expect("clean shutdown");
    assert!(
        std::net::TcpStream::connect(addr).is_err(),
        "TCP listener closed"
    );
}

#[test]
fn run_refuses_a_ledger_directory_others_can_enter() {
    let (dir, ledger_dir, _) = new_ledger(Default::default());
    std::fs::set_permissions(&ledger_dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let result = tally_daemon::run(ServeOptions::new(&ledger_dir, dir.path().join("s.sock")));
    match result {
        Err(DaemonError::LedgerPermissions { mode, .. }) => assert_eq!(mode, 0o755),
        other => panic!("expected LedgerPermissions, got {other:?}"),
    }
    assert!(!dir.path().join("s.sock").exists());
}

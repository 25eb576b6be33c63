//! Regressions from the adversarial review of the daemon: each pins one attack that
//! worked before its fix.

use std::time::{Duration, Instant};

use tokio::io::AsyncWriteExt;
use tokio::net::{TcpStream, UnixStream};

use crate::common::{allow, checkpoint_text, free_loopback_addr, read_until_closed, walk, Daemon};

fn size_of(checkpoint: &str) -> u64 {
    checkpoint
        .lines()
        .find_map(|l| l.strip_prefix("size "))
        .and_then(|s| s.parse().ok())
        .expect("size line")
}

/// A client that sends a full decision and hangs up at once must still be counted: the
/// counters are what a gate enforces budgets from (they were updated by the request
/// handler, which dies with the connection).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decisions_whose_client_hung_up_are_committed_whole() {
    let mut daemon = Daemon::start(|_| {}).await;
    let body = allow("drift", "w", 1);
    let request = format!(
        "POST /v1/decisions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    for _ in 0..40 {
        let mut s = UnixStream::connect(&daemon.socket).await.expect("connect");
        s.write_all(request.as_bytes()).await.expect("write");
        drop(s);
    }
    let mut client = daemon.client().await;
    // Let every queued commit land.
    let mut size = 0;
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = size_of(&checkpoint_text(&mut client).await);
        if now == size {
            break;
        }
        size = now;
    }
    let committed = size - 1; // all but genesis
    assert!(committed > 0, "some hung-up requests were committed");
    drop(client);
    daemon.shutdown().await.expect("shutdown");
    let chain = walk(&daemon.ledger_dir, &daemon.auditor);
    let drift = chain
        .entries
        .iter()
        .filter_map(|e| e.decision.as_ref())
        .filter(|d| d.run == "drift")
        .count();
    assert_eq!(
        drift as u64, committed,
        "every committed decision is in the chain"
    );
}

/// Clients that send headers and stall in the body must not hold the in-flight slots
/// every append needs (they did: the slot was taken before the body was read).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_bodies_do_not_block_appends() {
    let mut daemon = Daemon::start(|o| {
        o.limits.max_in_flight = 4;
        o.limits.read_timeout = Duration::from_secs(8);
    })
    .await;
    let mut stalled = Vec::new();
    for _ in 0..12 {
        let mut s = UnixStream::connect(&daemon.socket).await.expect("connect");
        s.write_all(b"POST /v1/decisions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{")
            .await
            .expect("write");
        stalled.push(s);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut client = daemon.client().await;
    let start = Instant::now();
    client.append(&allow("ok", "w", 1)).await.expect("append");
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "an append waited {:?} behind stalled bodies",
        start.elapsed()
    );
    drop(stalled);
    daemon.shutdown().await.expect("shutdown");
}

async fn tcp_raw(addr: std::net::SocketAddr, request: String) -> String {
    use tokio::io::AsyncReadExt;
    let mut s = TcpStream::connect(addr).await.expect("connect tcp");
    s.write_all(request.as_bytes()).await.expect("write");
    // Read until the daemon closes (every request here says `Connection: close`).
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while let Ok(Ok(n)) = tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Over loopback TCP a web page in a local browser can reach the daemon: what a browser
/// sends (an Origin, a foreign Host, a POST without a JSON content type) is refused, and
/// nothing is written; a plain client is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_refuses_what_a_browser_sends() {
    let addr = free_loopback_addr();
    let port = addr.port();
    let mut daemon = Daemon::start(|o| o.listen = Some(addr)).await;
    let mut unix = daemon.client().await;
    let before = checkpoint_text(&mut unix).await;
    let body = allow("csrf", "w", 1);
    let post = |extra: &str, host: &str, typed: bool| {
        format!(
            "POST /v1/decisions HTTP/1.1\r\nHost: {host}\r\n{}{extra}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            if typed { "Content-Type: application/json\r\n" } else { "" },
            body.len()
        )
    };
    let origin = tcp_raw(
        addr,
        post("Origin: http://evil.example\r\n", "127.0.0.1", true),
    )
    .await;
    assert!(origin.starts_with("HTTP/1.1 403"), "{origin}");
    let rebound = tcp_raw(addr, post("", "evil.example", true)).await;
    assert!(rebound.starts_with("HTTP/1.1 403"), "{rebound}");
    let untyped = tcp_raw(addr, post("", "127.0.0.1", false)).await;
    assert!(untyped.starts_with("HTTP/1.1 415"), "{untyped}");
    let read = tcp_raw(
        addr,
        "GET /v1/export HTTP/1.1\r\nHost: evil.example\r\nConnection: close\r\n\r\n".into(),
    )
    .await;
    assert!(read.starts_with("HTTP/1.1 403"), "{read}");
    assert_eq!(
        checkpoint_text(&mut unix).await,
        before,
        "nothing was written"
    );
    // Past the guard, a TCP peer is an agent: it may not append decisions itself.
    let ok = tcp_raw(addr, post("", &format!("127.0.0.1:{port}"), true)).await;
    assert!(
        ok.starts_with("HTTP/1.1 403") && ok.contains("not_authorized"),
        "{ok}"
    );
    // The Unix socket is unaffected: no Host check, no content type needed.
    let (reply, _) = {
        let mut s = UnixStream::connect(&daemon.socket).await.expect("connect");
        let r = format!(
            "POST /v1/decisions HTTP/1.1\r\nHost: tally\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        s.write_all(r.as_bytes()).await.expect("write");
        read_until_closed(&mut s, Duration::from_secs(5)).await
    };
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    daemon.shutdown().await.expect("shutdown");
}

/// The socket is bound inside a private directory, so no other user can connect before
/// its mode is set; nothing of that directory is left beside the socket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socket_binding_leaves_only_the_socket() {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    let mut daemon = Daemon::start(|_| {}).await;
    let dir = daemon.socket.parent().expect("parent").to_path_buf();
    let names: Vec<String> = std::fs::read_dir(&dir)
        .expect("read dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        names.iter().all(|n| !n.starts_with('.')),
        "leftovers beside the socket: {names:?}"
    );
    let meta = std::fs::symlink_metadata(&daemon.agent_socket).expect("socket");
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.permissions().mode() & 0o777, 0o660);
    daemon.shutdown().await.expect("shutdown");
}

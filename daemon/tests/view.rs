//! The metrics listener (`serve --metrics-listen`) under attack by a local process: it
//! holds every connection and event stream it may, sends headers slowly, sends huge
//! headers and bodies. The daemon must refuse the excess with a typed answer, keep
//! deciding on the agent socket, and serve `/metrics` again once the attacker lets go.

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::common::{free_loopback_addr, get, post_json, Daemon};

/// Read from `s` until what arrived contains `needle` (true), the peer closes or `wait`
/// passes (false).
async fn read_until(s: &mut TcpStream, needle: &str, wait: Duration) -> (String, bool) {
    let mut out = Vec::new();
    let mut buf = [0u8; 8192];
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        if String::from_utf8_lossy(&out).contains(needle) {
            return (String::from_utf8_lossy(&out).into_owned(), true);
        }
        match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
            Err(_) | Ok(Ok(0)) | Ok(Err(_)) => {
                return (String::from_utf8_lossy(&out).into_owned(), false)
            }
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
        }
    }
}

/// Read until the peer closes (true) or `wait` passes (false).
async fn read_to_close(s: &mut TcpStream, wait: Duration) -> (String, bool) {
    let mut out = Vec::new();
    let mut buf = [0u8; 8192];
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
            Err(_) => return (String::from_utf8_lossy(&out).into_owned(), false),
            Ok(Ok(0)) | Ok(Err(_)) => return (String::from_utf8_lossy(&out).into_owned(), true),
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
        }
    }
}

async fn connect(addr: SocketAddr) -> TcpStream {
    TcpStream::connect(addr).await.expect("connect")
}

fn get_req(path: &str, close: bool) -> Vec<u8> {
    let c = if close { "Connection: close\r\n" } else { "" };
    format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{c}\r\n").into_bytes()
}

/// An event stream whose first snapshot arrived: it holds a connection and a stream.
async fn stream(addr: SocketAddr) -> TcpStream {
    let mut s = connect(addr).await;
    s.write_all(&get_req("/v1/live/events", false))
        .await
        .expect("write");
    let (got, ok) = read_until(&mut s, "event: snapshot", Duration::from_secs(20)).await;
    assert!(ok, "the stream sends its first snapshot: {got}");
    s
}

/// `GET /metrics` on a fresh connection: the whole answer (the daemon closes).
async fn metrics(addr: SocketAddr) -> String {
    let mut s = connect(addr).await;
    s.write_all(&get_req("/metrics", true))
        .await
        .expect("write");
    let (got, closed) = read_to_close(&mut s, Duration::from_secs(20)).await;
    assert!(closed, "answered and closed: {got}");
    got
}

/// `GET /metrics` answered 200 within 20 s: the listener's connections, all taken a
/// moment ago, serve again (a `503 too_many_connections` meanwhile is its typed refusal).
async fn served_again(addr: SocketAddr) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let got = metrics(addr).await;
        if got.starts_with("HTTP/1.1 200") {
            return;
        }
        assert!(
            got.is_empty() || got.contains("\"too_many_connections\""),
            "{got}"
        );
        assert!(tokio::time::Instant::now() < deadline, "{got}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Checks on the agent socket, each answered.
async fn decide(d: &Daemon, run: &str, n: u64) {
    for i in 0..n {
        let mut c = d.agent().await;
        let (status, answer) = post_json(
            &mut c,
            "/v1/check",
            &json!({"run": run, "tool": "search", "effect": "read", "args": {"q": i}}).to_string(),
        )
        .await;
        assert_eq!(status, 200, "{answer}");
        assert_eq!(answer["decision"], "allow", "{answer}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_on_the_metrics_listener_is_refused_typed_and_never_stops_decisions() {
    let addr = free_loopback_addr();
    let mut d = Daemon::start(|o| {
        o.observe.metrics_listen = Some(addr);
        o.observe.metrics_max_connections = 4;
        o.observe.max_live_streams = 2;
        // Long enough that the held connections below are not cut while the test runs.
        o.limits.read_timeout = Duration::from_secs(60);
    })
    .await;
    let mut c = d.agent().await;
    let (status, body) = post_json(
        &mut c,
        "/v1/runs",
        &json!({"run": "r", "budget": {"attempts": 1000}}).to_string(),
    )
    .await;
    assert_eq!(status, 201, "{body}");

    // Two event streams: every stream the daemon serves.
    let s1 = stream(addr).await;
    let _s2 = stream(addr).await;
    // A third is refused, typed, with Retry-After; its connection stays (keep-alive) and
    // holds the third connection.
    let mut third = connect(addr).await;
    third
        .write_all(&get_req("/v1/live/events", false))
        .await
        .expect("write");
    let (got, ok) = read_until(&mut third, "\"too_many_streams\"", Duration::from_secs(20)).await;
    assert!(ok && got.starts_with("HTTP/1.1 503"), "{got}");
    assert!(got.to_ascii_lowercase().contains("retry-after: 5"), "{got}");
    // The fourth: headers begun, never finished.
    let mut fourth = connect(addr).await;
    fourth
        .write_all(b"GET /metrics HTTP/1.1\r\n")
        .await
        .expect("write");
    // Every connection is taken: more are answered 503 with Retry-After and closed, many
    // times over.
    for _ in 0..40 {
        let got = metrics(addr).await;
        assert!(got.starts_with("HTTP/1.1 503"), "{got}");
        assert!(got.contains("\"too_many_connections\""), "{got}");
        assert!(got.to_ascii_lowercase().contains("retry-after: 1"), "{got}");
    }
    // A burst of connections left unread: the daemon holds none of them for long.
    let mut burst = Vec::new();
    for _ in 0..200 {
        burst.push(connect(addr).await);
    }

    // Decisions flow meanwhile, and the operator socket answers /metrics.
    decide(&d, "r", 20).await;
    let mut op = d.client().await;
    let reply = get(&mut op, "/metrics").await;
    assert_eq!(reply.status.as_u16(), 200);
    let text = String::from_utf8_lossy(&reply.body).into_owned();
    assert!(
        text.contains("tally_checks_total{decision=\"allow\""),
        "{text}"
    );
    drop(burst);

    // The attacker lets go of one stream: /metrics answers on the listener again (the
    // daemon sees the stream closed at its next write, within a couple of seconds).
    drop(s1);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let answered = loop {
        let got = metrics(addr).await;
        if got.starts_with("HTTP/1.1 200") {
            break got;
        }
        // Refused typed, or (while the burst's connections are still being refused)
        // closed at once.
        assert!(
            got.is_empty() || got.contains("\"too_many_connections\""),
            "{got}"
        );
        assert!(
            tokio::time::Instant::now() < deadline,
            "the listener serves again once a connection is let go"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(answered.contains("tally_checks_total"), "{answered}");
    // And the stream it let go is free for another page.
    drop(third);
    drop(fourth);
    let _s3 = stream(addr).await;
    d.shutdown().await.expect("clean shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_headers_huge_headers_and_bodies_on_the_metrics_listener_are_cut() {
    let addr = free_loopback_addr();
    let mut d = Daemon::start(|o| {
        o.observe.metrics_listen = Some(addr);
        // One connection in all: the slow client holds it until it is cut.
        o.observe.metrics_max_connections = 1;
        o.limits.read_timeout = Duration::from_millis(400);
    })
    .await;
    // Slowloris: the request line, then a header byte now and then, never the end.
    let mut slow = connect(addr).await;
    slow.write_all(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        .await
        .expect("write");
    let dripping = tokio::spawn(async move {
        for _ in 0..100 {
            if slow.write_all(b"X").await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        read_to_close(&mut slow, Duration::from_secs(10)).await
    });
    let (got, closed) = dripping.await.expect("dripping client");
    assert!(closed, "a client that drips its headers is cut: {got}");
    assert!(!got.contains("200 OK"), "{got}");
    // Its connection is free again.
    served_again(addr).await;

    // Headers past the limit: 431, closed.
    let mut big = connect(addr).await;
    let mut req = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n".to_vec();
    for i in 0..400 {
        req.extend_from_slice(format!("X-Pad-{i}: {}\r\n", "a".repeat(100)).as_bytes());
    }
    req.extend_from_slice(b"\r\n");
    let _ = big.write_all(&req).await;
    let (got, closed) = read_to_close(&mut big, Duration::from_secs(10)).await;
    assert!(closed, "{got}");
    assert!(got.is_empty() || got.starts_with("HTTP/1.1 431"), "{got}");
    assert!(!got.contains("tally_checks_total"), "{got}");
    // The one connection is let go once the daemon has closed its side, which can come
    // after the client read the close.
    served_again(addr).await;

    // A body: refused, typed, closed, unread.
    let mut body = connect(addr).await;
    body.write_all(
        b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100000000\r\n\r\nxxxx",
    )
    .await
    .expect("write");
    let (got, closed) = read_to_close(&mut body, Duration::from_secs(10)).await;
    assert!(closed, "{got}");
    assert!(got.starts_with("HTTP/1.1 413"), "{got}");
    assert!(got.contains("\"body_not_allowed\""), "{got}");

    served_again(addr).await;
    d.shutdown().await.expect("clean shutdown");
}

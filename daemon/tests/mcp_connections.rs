//! The bound on the MCP gateway's open connections (`--mcp-max-connections`), on the
//! real daemon over real TCP: connections that hold their places idle (one never sent
//! anything, others kept alive after a request) fill the bound; one more is answered
//! `503` with `Retry-After` at once and closed, and counted in `/metrics`
//! (`tally_mcp_refused_connections_total`); once one of them closes, a new connection is
//! served.

use std::net::SocketAddr;
use std::time::Duration;

use tally_mcp::gateway::GatewayLimits;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::common::{get, Daemon};
use crate::mcp_gateway::{bearer, gateway_with, send, IDLE, INIT};

const REFUSED: &str = "tally_mcp_refused_connections_total";

/// The value of the series `name` in the daemon's `/metrics` (`None` when absent).
pub(crate) async fn metric(d: &Daemon, name: &str) -> Option<u64> {
    let mut c = d.client().await;
    let text = String::from_utf8(get(&mut c, "/metrics").await.body.to_vec()).expect("utf8");
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(' ')))
        .and_then(|v| v.trim().parse().ok())
}

/// A `ping` with no session on a kept-alive HTTP/1.1 connection: answered (400, no
/// session) and the connection left open.
const PING: &str = r#"{"jsonrpc":"2.0","id":4,"method":"ping"}"#;

/// One request on `s`, kept alive: the answer's status, once its whole body is read.
async fn kept_alive(s: &mut TcpStream, auth: &str) -> u16 {
    let req = format!(
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: {auth}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: {}\r\n\r\n{PING}",
        PING.len()
    );
    s.write_all(req.as_bytes()).await.expect("write");
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = tokio::time::timeout(Duration::from_secs(30), s.read(&mut buf))
            .await
            .expect("an answer within 30 s")
            .expect("read");
        assert!(n > 0, "closed before a whole answer: {got:?}");
        got.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&got);
        let Some((head, body)) = text.split_once("\r\n\r\n") else {
            continue;
        };
        let length: usize = head
            .lines()
            .filter_map(|l| l.split_once(':'))
            .find(|(n, _)| n.eq_ignore_ascii_case("content-length"))
            .and_then(|(_, v)| v.trim().parse().ok())
            .expect("a Content-Length");
        if body.len() >= length {
            assert!(
                !head.to_ascii_lowercase().contains("connection: close"),
                "{head}"
            );
            return head
                .split(' ')
                .nth(1)
                .and_then(|c| c.parse().ok())
                .expect("a status");
        }
    }
}

/// A connection that sends nothing: what the gateway writes before closing it.
async fn refused(addr: SocketAddr) -> String {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), s.read_to_end(&mut out))
        .await
        .expect("answered and closed within 30 s")
        .expect("read");
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test]
async fn a_connection_over_the_bound_is_answered_503_at_once_and_a_freed_place_serves_again() {
    let gw = gateway_with(
        "",
        GatewayLimits::new(8, IDLE, 4096).with_max_connections(4),
    )
    .await;
    let token = gw.token("conns").await;
    let auth = bearer(&token);
    assert_eq!(metric(&gw.daemon, REFUSED).await, Some(0));
    // One connection sends nothing; three are kept alive after a request each.
    let silent = TcpStream::connect(gw.addr).await.expect("connect");
    let mut alive = Vec::new();
    for _ in 0..3 {
        let mut s = TcpStream::connect(gw.addr).await.expect("connect");
        assert_eq!(kept_alive(&mut s, &auth).await, 400);
        alive.push(s);
    }
    // The fifth, and a sixth, are refused without a request read.
    for _ in 0..2 {
        let answer = refused(gw.addr).await;
        let (head, body) = answer.split_once("\r\n\r\n").expect("a head");
        assert!(head.starts_with("HTTP/1.1 503 "), "{answer}");
        assert!(head.contains("\r\nRetry-After: 1"), "{answer}");
        assert!(head.contains("\r\nConnection: close"), "{answer}");
        assert!(body.contains("--mcp-max-connections"), "{answer}");
    }
    // Each refusal is counted (before its answer is written).
    assert_eq!(metric(&gw.daemon, REFUSED).await, Some(2));
    // The kept-alive connections still hold their places and are served.
    assert_eq!(kept_alive(&mut alive[0], &auth).await, 400);
    // The silent one closes: its place is given back once the gateway sees the close
    // (bounded polling: a refused initialize is tried again), and a real initialize on
    // a new connection is served.
    drop(silent);
    let h = [("Authorization", auth.as_str())];
    let mut statuses = Vec::new();
    for _ in 0..200 {
        let (status, session, answer) = send(gw.addr, "POST", &h, INIT).await;
        statuses.push(status);
        if status == 503 {
            assert!(answer.contains("--mcp-max-connections"), "{answer}");
            tokio::task::yield_now().await;
            continue;
        }
        assert_eq!(status, 200, "{answer}");
        assert!(session.is_some(), "{answer}");
        let refusals = statuses.iter().filter(|s| **s == 503).count() as u64;
        assert_eq!(metric(&gw.daemon, REFUSED).await, Some(2 + refusals));
        return;
    }
    panic!("no place given back after a connection closed: {statuses:?}");
}

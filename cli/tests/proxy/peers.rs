use super::*;

/// An HTTP/1.1 connection kept open (keep-alive) to send requests on.
struct Open {
    send: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
}

impl Open {
    async fn tcp(addr: SocketAddr) -> Open {
        let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
        Open::over(TokioIo::new(stream)).await
    }

    async fn unix(path: &Path) -> Open {
        let stream = tokio::net::UnixStream::connect(path)
            .await
            .expect("connect");
        Open::over(TokioIo::new(stream)).await
    }

    async fn over<I>(io: I) -> Open
    where
        I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    {
        let (send, conn) = hyper::client::conn::http1::handshake(io)
            .await
            .expect("handshake");
        tokio::spawn(conn);
        Open { send }
    }

    /// A chat completion with `token`: its status and body, or `None` if the connection
    /// is closed.
    async fn chat(&mut self, token: &str) -> Option<(u16, Value, hyper::HeaderMap)> {
        self.send.ready().await.ok()?;
        let req = hyper::Request::builder()
            .method("POST")
            .uri("/openai/v1/chat/completions")
            .header("host", "localhost")
            .header("authorization", bearer(token))
            .body(Full::new(Bytes::from(chat(
                "fake-ok",
                json!({"max_tokens": 5}),
            ))))
            .expect("request");
        let response = self.send.send_request(req).await.ok()?;
        let (parts, body) = response.into_parts();
        let body = body.collect().await.ok()?.to_bytes();
        Some((
            parts.status.as_u16(),
            serde_json::from_slice(&body).unwrap_or(Value::Null),
            parts.headers,
        ))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_over_its_connections_is_refused_while_others_proceed() {
    let upstream = FakeUpstream::start(FakeOptions::default());
    let dir = tempfile::tempdir().expect("dir");
    let mut served = Served::new_with(
        dir.path(),
        &policy(&upstream, 1000),
        &["--proxy-max-connections-per-peer", "2"],
    );
    let token = served.start_run("p").await;
    // Loopback TCP is one peer: two connections, each answered and kept open.
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut c = Open::tcp(served.proxy).await;
        let (status, v, _) = c.chat(&token).await.expect("an answer");
        assert_eq!(status, 200, "{v}");
        held.push(c);
    }
    // A third is over the peer's allowance: 429 in the dialect, retry, then closed.
    let mut third = Open::tcp(served.proxy).await;
    let (status, v, headers) = third.chat(&token).await.expect("an answer");
    assert_eq!(status, 429, "{v}");
    assert_eq!(v["error"]["code"], "too_many_connections", "{v}");
    assert_eq!(v["error"]["action"], "retry", "{v}");
    assert_eq!(headers["retry-after"], "1");
    assert_eq!(headers["x-should-retry"], "true");
    assert!(
        third.chat(&token).await.is_none(),
        "closed after its answer"
    );
    // Another peer (this uid on the proxy's Unix socket) proceeds meanwhile, and its
    // connections are its own: two of them while TCP holds its two.
    let sock = dir.path().join("proxy.sock");
    let mut mine = Vec::new();
    for _ in 0..2 {
        let mut c = Open::unix(&sock).await;
        let (status, v, _) = c.chat(&token).await.expect("an answer");
        assert_eq!(status, 200, "{v}");
        mine.push(c);
    }
    // The held ones still work; the refused one reached nothing upstream.
    for c in &mut held {
        assert_eq!(c.chat(&token).await.expect("an answer").0, 200);
    }
    assert_eq!(upstream.seen().len(), 6);
    // A connection closed gives its place back (the proxy sees the close a moment
    // later: bounded wait, never a fixed time).
    drop(held.pop());
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let mut c = Open::tcp(served.proxy).await;
        let (status, v, _) = c.chat(&token).await.expect("an answer");
        if status == 200 {
            break;
        }
        assert_eq!(status, 429, "{v}");
        assert!(
            Instant::now() < until,
            "the closed connection's place never came back"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let st = served.settled("p").await;
    assert_eq!(st["held_nanos"], 0, "{st}");
    served.verifies_the_bill(&upstream, &prices(), 0);
}

/// A connection that sent `head` (a request's headers, perhaps some of its body) and
/// nothing more.
async fn stalled(addr: SocketAddr, head: &str) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    stream.write_all(head.as_bytes()).await.expect("send");
    stream
}

/// A chat request's headers announcing a body of 400 bytes, and its first 10.
fn announcing_a_body(token: &str) -> String {
    format!(
        "POST /openai/v1/chat/completions HTTP/1.1\r\nhost: localhost\r\nauthorization: Bearer {token}\r\ncontent-type: application/json\r\ncontent-length: 400\r\n\r\n{{\"model\":"
    )
}

/// What the proxy sent on `stream` until it closed it, and when it did; `None` if it
/// was still open after `within`.
async fn until_closed(
    stream: &mut tokio::net::TcpStream,
    within: Duration,
) -> Option<(String, Instant)> {
    use tokio::io::AsyncReadExt;
    let mut got = Vec::new();
    let read = tokio::time::timeout(within, async {
        let mut buf = [0u8; 4096];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    read.ok()
        .map(|()| (String::from_utf8_lossy(&got).into_owned(), Instant::now()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_announce_a_body_and_stall_are_cut_at_the_read_timeout() {
    let upstream = FakeUpstream::start(FakeOptions::default());
    let dir = tempfile::tempdir().expect("dir");
    let mut served = Served::new_with(
        dir.path(),
        &policy(&upstream, 1000),
        &[
            "--proxy-max-connections-per-peer",
            "3",
            "--proxy-read-timeout-ms",
            "1500",
        ],
    );
    let token = served.start_run("p").await;
    // Every place loopback TCP has: two bodies that never come, headers that never end.
    let sent = Instant::now();
    let mut bodies = Vec::new();
    for _ in 0..2 {
        bodies.push(stalled(served.proxy, &announcing_a_body(&token)).await);
    }
    let mut head = stalled(
        served.proxy,
        "POST /openai/v1/chat/completions HTTP/1.1\r\nhost: localhost\r\n",
    )
    .await;
    // Meanwhile a well-behaved client has no place.
    let mut polite = Open::tcp(served.proxy).await;
    let (status, v, _) = polite.chat(&token).await.expect("an answer");
    assert_eq!(status, 429, "{v}");
    assert_eq!(v["error"]["code"], "too_many_connections", "{v}");
    // Each stalled body is answered 408 in the dialect, recorded, and closed at the read
    // timeout (never before it: the clock starts when the body is waited for).
    for stream in &mut bodies {
        let (reply, at) = until_closed(stream, Duration::from_secs(10))
            .await
            .expect("cut at the read timeout, not held");
        assert!(reply.starts_with("HTTP/1.1 408"), "{reply}");
        assert!(reply.contains("\"code\":\"request_refused\""), "{reply}");
        assert!(reply.contains("x-tally-seq: "), "recorded: {reply}");
        assert!(reply.contains("connection: close\r\n"), "{reply}");
        assert!(at - sent >= Duration::from_millis(1000), "{:?}", at - sent);
    }
    // Headers that never end: closed, nothing answered past a 408.
    let (reply, _) = until_closed(&mut head, Duration::from_secs(10))
        .await
        .expect("cut at the read timeout, not held");
    assert!(
        reply.is_empty() || reply.starts_with("HTTP/1.1 408"),
        "{reply}"
    );
    // Their places are back: the well-behaved client gets through (the proxy sees each
    // close a moment later: bounded wait, never a fixed time).
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let mut c = Open::tcp(served.proxy).await;
        let (status, v, _) = c.chat(&token).await.expect("an answer");
        if status == 200 {
            break;
        }
        assert_eq!(status, 429, "{v}");
        assert!(
            Instant::now() < until,
            "the stalled clients' places never came back"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A forged token is answered at once and closed: its body is never waited for.
    let mut forged = stalled(served.proxy, &announcing_a_body("tly_forged.00")).await;
    let (reply, _) = until_closed(&mut forged, Duration::from_secs(1))
        .await
        .expect("answered and closed before any read timeout");
    assert!(reply.starts_with("HTTP/1.1 401"), "{reply}");
    // Nothing of theirs reached the upstream, nothing is held.
    assert_eq!(upstream.seen().len(), 1, "{:?}", upstream.seen());
    let st = served.settled("p").await;
    assert_eq!(st["held_nanos"], 0, "{st}");
    let report = served.verifies();
    assert_eq!(report["replay"]["taken_as_recorded"], 0, "{report}");
    let refused: Vec<String> = served
        .decisions("p")
        .iter()
        .filter(|d| d["decision"]["kind"] == "deny")
        .map(|d| {
            d["decision"]["reason"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        })
        .collect();
    assert_eq!(refused, ["request_refused", "request_refused"]);
}

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
    served.verifies();
}

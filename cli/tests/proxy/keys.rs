use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_key_is_injected_the_token_never_leaves_and_usage_settles_over_http_and_https() {
    for tls in [false, true] {
        let upstream = FakeUpstream::start(FakeOptions {
            tls,
            ..Default::default()
        });
        let dir = tempfile::tempdir().expect("dir");
        let mut served = Served::new(dir.path(), &policy(&upstream, 1000));
        let token = served.start_run("r1").await;
        assert!(token.starts_with("tly_"), "{token}");

        let a = call(
            served.proxy,
            "/openai/v1/chat/completions",
            &[
                ("authorization", &bearer(&token)),
                ("x-api-key", &token),
                ("connection", "keep-alive, x-secret-hop"),
                ("x-secret-hop", "1"),
            ],
            chat("fake-ok", json!({"max_tokens": 50})),
        )
        .await;
        assert_eq!(a.status, 200, "{}", a.text());
        assert_eq!(a.json()["usage"]["completion_tokens"], 50);
        assert_eq!(a.headers["x-tally-run"], "r1");
        assert_eq!(a.headers["x-tally-attempt"], "1");
        assert!(a.headers.contains_key("x-tally-seq"));
        // Anthropic's dialect, its key header.
        let a = call(
            served.proxy,
            "/anthropic/v1/messages",
            &[("x-api-key", &token)],
            chat("fake-ok", json!({"max_tokens": 50})),
        )
        .await;
        assert_eq!(a.status, 200, "{}", a.text());
        let seen = upstream.seen();
        assert_eq!(seen.len(), 2);
        for s in &seen {
            assert!(s.real_key, "the upstream got the real key: {s:?}");
            assert!(!s.token_seen, "the run token reached the upstream: {s:?}");
            assert_eq!(s.max_tokens, Some(50));
            for h in ["connection", "x-secret-hop", "cookie"] {
                assert!(
                    !s.headers.iter().any(|n| n == h),
                    "{h} reached the upstream: {s:?}"
                );
            }
        }
        assert!(
            !seen[0].headers.iter().any(|n| n == "x-api-key"),
            "{:?}",
            seen[0]
        );
        assert!(
            !seen[1].headers.iter().any(|n| n == "authorization"),
            "{:?}",
            seen[1]
        );
        // $0.051 for each call (100 in at $10/M, 50 out at $1,000/M): what the upstream
        // billed. Nothing held.
        let st = served.settled("r1").await;
        assert_eq!(st["settled_nanos"], 102_000_000, "{st}");
        assert_eq!(st["held_nanos"], 0, "{st}");

        // Unknown, forged and missing tokens: 401 in the dialect, nothing forwarded.
        for auth in ["Bearer sk-real", "Bearer tly_cjE.00", "Bearer ", ""] {
            let headers: Vec<(&str, &str)> = if auth.is_empty() {
                vec![]
            } else {
                vec![("authorization", auth)]
            };
            let a = call(
                served.proxy,
                "/openai/v1/chat/completions",
                &headers,
                chat("fake-ok", json!({})),
            )
            .await;
            assert_eq!(a.status, 401, "{auth}: {}", a.text());
            assert_eq!(a.json()["error"]["code"], "invalid_token", "{}", a.text());
        }
        // A stopped run's token.
        let (status, v) = served
            .agent("POST", "/v1/runs/r1/stop", Some(json!({})))
            .await;
        assert_eq!(status, 200, "{v}");
        let a = call(
            served.proxy,
            "/anthropic/v1/messages",
            &[("x-api-key", &token)],
            br#"{"model":"fake-ok","max_tokens":5,"messages":[]}"#.to_vec(),
        )
        .await;
        // A real token of a run that has ended: the stop's reason and `stop`, not a bad
        // key; in Anthropic's dialect 402 `billing_error` (a 403 Claude Code retries),
        // and `x-should-retry: false`, which the SDKs obey.
        assert_eq!(a.status, 402, "{}", a.text());
        assert_eq!(a.json()["error"]["type"], "billing_error", "{}", a.text());
        assert_eq!(
            a.headers.get("x-should-retry").map(|v| v.as_bytes()),
            Some(&b"false"[..]),
            "{}",
            a.text()
        );
        assert_eq!(a.json()["tally"]["reason"], "completed", "{}", a.text());
        assert_eq!(a.json()["tally"]["action"], "stop", "{}", a.text());
        assert_eq!(upstream.seen().len(), 2, "nothing more was forwarded");
        served.verifies_the_bill(&upstream, &prices(), 0);
        let h = served.handoff("r1");
        assert_eq!(h["spend"]["settled_nanos"], 102_000_000, "{h}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_answers_on_its_unix_socket_too() {
    let upstream = FakeUpstream::start(FakeOptions::default());
    let dir = tempfile::tempdir().expect("dir");
    let mut served = Served::new(dir.path(), &policy(&upstream, 1000));
    let token = served.start_run("u").await;
    let sock = dir.path().join("proxy.sock");
    let stream = tokio::net::UnixStream::connect(&sock)
        .await
        .expect("connect to the proxy socket");
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    tokio::spawn(conn);
    let req = hyper::Request::builder()
        .method("POST")
        .uri("/openai/v1/chat/completions")
        .header("host", "localhost")
        .header("authorization", bearer(&token))
        .body(Full::new(Bytes::from(chat(
            "fake-ok",
            json!({"max_tokens": 50}),
        ))))
        .expect("request");
    let response = send.send_request(req).await.expect("response");
    assert_eq!(response.status(), 200);
    let body = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    assert!(String::from_utf8_lossy(&body).contains("fake upstream"));
    let mode = std::fs::metadata(&sock)
        .expect("socket")
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o660, "the agent socket's mode");
    assert_eq!(served.settled("u").await["settled_nanos"], 51_000_000);
    served.verifies_the_bill(&upstream, &prices(), 0);
    assert!(!sock.exists(), "removed when the daemon stops");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_is_accepted_only_as_minted_whatever_the_schemes_case() {
    let upstream = FakeUpstream::start(FakeOptions::default());
    let dir = tempfile::tempdir().expect("dir");
    let mut served = Served::new(dir.path(), &policy(&upstream, 1000));
    let token = served.start_run("r").await;
    let (head, mac) = token.split_once('.').expect("a dot");
    let mixed: String = mac
        .chars()
        .enumerate()
        .map(|(i, c)| {
            if i % 2 == 0 {
                c.to_ascii_uppercase()
            } else {
                c
            }
        })
        .collect();
    let upper_prefix = format!("TLY_{}", &token[4..]);
    let spellings = [
        (
            "authorization",
            format!("Bearer {head}.{}", mac.to_uppercase()),
        ),
        ("authorization", format!("Bearer {head}.{mixed}")),
        ("authorization", format!("Bearer {upper_prefix}")),
        ("authorization", format!("Bearer {token}0")),
        ("authorization", format!("Bearer {token} x")),
        ("authorization", format!("Bearer {head}. {mac}")),
        ("authorization", format!("Bearer\t{token}")),
        ("x-api-key", format!("{head}.{}", mac.to_uppercase())),
        ("x-api-key", format!("{token}.")),
    ];
    for (name, value) in &spellings {
        let a = call(
            served.proxy,
            "/openai/v1/chat/completions",
            &[(*name, value.as_str())],
            chat("fake-ok", json!({"max_tokens": 10})),
        )
        .await;
        assert_eq!(a.status, 401, "{name}: {value:?}: {}", a.text());
        assert_eq!(a.json()["error"]["code"], "invalid_token", "{}", a.text());
        assert!(!a.headers.contains_key("x-tally-seq"), "{value:?}");
    }
    assert!(upstream.seen().is_empty(), "{:?}", upstream.seen());
    // The scheme's word is case-insensitive (RFC 9110), and may be followed by more than
    // one space; the token as minted.
    let accepted = [
        format!("Bearer {token}"),
        format!("bearer {token}"),
        format!("BEARER {token}"),
        format!("Bearer   {token}"),
    ];
    for value in &accepted {
        let a = call(
            served.proxy,
            "/openai/v1/chat/completions",
            &[("authorization", value.as_str())],
            chat("fake-ok", json!({"max_tokens": 10})),
        )
        .await;
        assert_eq!(a.status, 200, "{value:?}: {}", a.text());
    }
    assert_eq!(upstream.seen().len(), accepted.len());
    served.settled("r").await;
    served.verifies();
    // Nothing was recorded for a token refused: the run holds the accepted calls only.
    let decisions = served.decisions("r");
    let kinds = |kind: &str| {
        decisions
            .iter()
            .filter(|d| d["decision"]["kind"] == kind)
            .count()
    };
    assert_eq!(kinds("allow"), accepted.len(), "{decisions:?}");
    assert_eq!(kinds("deny"), 0, "{decisions:?}");
}

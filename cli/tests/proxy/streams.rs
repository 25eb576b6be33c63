use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_pass_through_and_settle_and_a_client_that_did_not_ask_sees_no_usage_chunk() {
    let upstream = FakeUpstream::start(FakeOptions {
        tls: true,
        ..Default::default()
    });
    let dir = tempfile::tempdir().expect("dir");
    let mut served = Served::new(dir.path(), &policy(&upstream, 1000));
    let token = served.start_run("r").await;
    let auth = bearer(&token);
    let a = call(
        served.proxy,
        "/openai/v1/chat/completions",
        &[("authorization", &auth)],
        chat("fake-ok", json!({"stream": true, "max_tokens": 50})),
    )
    .await;
    assert_eq!(a.status, 200);
    let text = a.text();
    assert!(
        text.contains("w0 ") && text.ends_with("data: [DONE]\n\n"),
        "{text}"
    );
    assert!(
        !text.contains("\"usage\":{"),
        "the usage chunk reached a client that did not ask: {text}"
    );
    assert!(a.chunks.len() > 1, "passed through chunk by chunk");
    let seen = upstream.seen();
    assert_eq!(
        seen[0].stream_options.as_deref(),
        Some(r#"{"include_usage":true}"#)
    );
    // A client that asked sees it.
    let a = call(
        served.proxy,
        "/openai/v1/chat/completions",
        &[("authorization", &auth)],
        chat(
            "fake-ok",
            json!({"stream": true, "max_tokens": 50, "stream_options": {"include_usage": true}}),
        ),
    )
    .await;
    assert!(
        a.text().contains("\"completion_tokens\":50"),
        "{}",
        a.text()
    );
    // Anthropic's stream.
    let a = call(
        served.proxy,
        "/anthropic/v1/messages",
        &[("x-api-key", &token)],
        chat("fake-ok", json!({"max_tokens": 50, "stream": true})),
    )
    .await;
    assert!(a.text().contains("message_stop"), "{}", a.text());
    let st = served.settled("r").await;
    assert_eq!(st["settled_nanos"], 3 * 51_000_000, "{st}");
    assert_eq!(st["held_nanos"], 0, "{st}");
    served.verifies_the_bill(&upstream, &prices(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redirect_to_another_host_is_refused_and_recorded_and_a_cut_stream_stays_held() {
    let upstream = FakeUpstream::start(FakeOptions::default());
    let dir = tempfile::tempdir().expect("dir");
    let mut served = Served::new(dir.path(), &policy(&upstream, 1000));
    let token = served.start_run("r").await;
    let auth = bearer(&token);
    let h = [("authorization", auth.as_str())];
    let a = call(
        served.proxy,
        "/openai/v1/chat/completions",
        &h,
        chat("fake-redirect", json!({"max_tokens": 10})),
    )
    .await;
    assert_eq!(a.status, 403, "{}", a.text());
    assert_eq!(a.json()["error"]["code"], "scope_violation", "{}", a.text());
    assert!(a.headers.get("location").is_none());
    // To the upstream itself: passed back as it is.
    let a = call(
        served.proxy,
        "/openai/v1/chat/completions",
        &h,
        chat("fake-redirect-same", json!({"max_tokens": 10})),
    )
    .await;
    assert_eq!(a.status, 302, "{}", a.text());
    assert_eq!(a.headers["location"], "/v1/elsewhere");
    let st = served.settled("r").await;
    assert_eq!(
        (st["settled_nanos"].as_u64(), st["held_nanos"].as_u64()),
        (Some(0), Some(0)),
        "{st}"
    );
    // Cut mid-stream: no usage, so the reservation stays held (unknown).
    let a = call(
        served.proxy,
        "/openai/v1/chat/completions",
        &h,
        chat("fake-cut", json!({"stream": true, "max_tokens": 50})),
    )
    .await;
    assert!(a.cut, "the client sees the cut: {} {}", a.status, a.text());
    let st = served.standing("r").await;
    assert_eq!(st["settled_nanos"], 0, "{st}");
    assert!(st["held_nanos"].as_u64() >= Some(50_000_000), "{st}");
    // Status classes: 500 error, 429 rejected; nothing charged, nothing held by them.
    let held = st["held_nanos"].as_u64().expect("held");
    for model in ["fake-500", "fake-429"] {
        let a = call(
            served.proxy,
            "/openai/v1/chat/completions",
            &h,
            chat(model, json!({"max_tokens": 10})),
        )
        .await;
        assert!(a.status == 500 || a.status == 429, "{}", a.text());
    }
    // Their outcomes are recorded as their answers end: wait for them, then nothing more
    // is held than before.
    let st = served.held_back_to("r", held).await;
    assert_eq!(st["held_nanos"], held, "{st}");
    served.verifies_the_bill(&upstream, &prices(), 0);
    // The refused redirect is in the ledger: the attempt's outcome, rejected, says why.
    let h = served.handoff("r");
    assert!(h.to_string().contains("redirect_refused"), "{h}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_location_a_browser_reads_as_another_host_is_refused_and_recorded() {
    let upstream = FakeUpstream::start(FakeOptions::default());
    let dir = tempfile::tempdir().expect("dir");
    let mut served = Served::new(dir.path(), &policy(&upstream, 1000));
    let token = served.start_run("r").await;
    let auth = bearer(&token);
    let h = [("authorization", auth.as_str())];
    let here = upstream.addr().to_string();
    let redirected = |location: &[u8]| {
        upstream.redirect("fake-crafted-redirect", location);
        call(
            served.proxy,
            "/openai/v1/chat/completions",
            &h,
            chat("fake-crafted-redirect", json!({"max_tokens": 10})),
        )
    };
    // Each starts like a path on the upstream, or names it, and a browser (WHATWG URL)
    // or some client reads it as another host.
    let off: Vec<Vec<u8>> = vec![
        b"/\\evil.example/x".to_vec(),
        b"/\t/evil.example/x".to_vec(),
        b"\\\\evil.example/x".to_vec(),
        b"//evil.example/x".to_vec(),
        b"https:evil.example".to_vec(),
        format!("http://{here}@evil.example/").into_bytes(),
        format!("http://{here}\\@evil.example/").into_bytes(),
    ];
    for location in &off {
        let a = redirected(location).await;
        let shown = String::from_utf8_lossy(location);
        assert_eq!(a.status, 403, "{shown:?}: {}", a.text());
        assert_eq!(a.json()["error"]["code"], "scope_violation", "{shown:?}");
        assert!(a.headers.get("location").is_none(), "{shown:?}");
    }
    // On the upstream however it is spelt: passed back as it is.
    let on = [
        "/%5Cevil.example".to_owned(),
        "elsewhere".to_owned(),
        format!("http://{here}/v1/elsewhere"),
    ];
    for location in &on {
        let a = redirected(location.as_bytes()).await;
        assert_eq!(a.status, 302, "{location}: {}", a.text());
        assert_eq!(a.headers["location"], location.as_str());
    }
    assert_eq!(upstream.seen().len(), off.len() + on.len());
    let st = served.settled("r").await;
    assert_eq!(
        (st["settled_nanos"].as_u64(), st["held_nanos"].as_u64()),
        (Some(0), Some(0)),
        "{st}"
    );
    served.verifies();
    // Each refused redirect is its attempt's outcome, rejected, saying why.
    let refused = served
        .decisions("r")
        .iter()
        .filter(|d| d.to_string().contains("redirect_refused"))
        .count();
    assert_eq!(refused, off.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_mid_stream_keeps_the_reservation_held_after_restart() {
    let upstream = FakeUpstream::start(FakeOptions::default());
    let dir = tempfile::tempdir().expect("dir");
    let served = Served::new(dir.path(), &policy(&upstream, 1000));
    let token = served.start_run("r").await;
    let mut served = served.killed_mid_stream(&upstream, &token).await;
    let st = served.standing("r").await;
    assert_eq!(st["settled_nanos"], 0, "{st}");
    assert!(
        st["held_nanos"].as_u64() >= Some(50_000_000),
        "held, never lost: {st}"
    );
    served.verifies_the_bill(&upstream, &prices(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_run_deadline_cuts_a_stream_and_keeps_its_reservation_held() {
    let upstream = FakeUpstream::start(FakeOptions::default());
    let dir = tempfile::tempdir().expect("dir");
    let mut served = Served::new(dir.path(), &policy(&upstream, 1000));
    let (status, v) = served
        .agent(
            "POST",
            "/v1/runs",
            Some(json!({"run": "short", "budget": {"deadline_ms": 1500}})),
        )
        .await;
    assert_eq!(status, 201, "{v}");
    let token = v["token"].as_str().expect("token").to_owned();
    let started = Instant::now();
    // 50 chunks, one every 200 ms: 10 s, far past the run's 1.5 s.
    let a = call(
        served.proxy,
        "/openai/v1/chat/completions",
        &[("authorization", &bearer(&token))],
        chat("fake-slow", json!({"stream": true, "max_tokens": 50})),
    )
    .await;
    let took = started.elapsed();
    assert_eq!(a.status, 200);
    assert!(a.cut, "the stream is cut at the deadline: {}", a.text());
    assert!(
        !a.chunks.is_empty(),
        "what came before the deadline was passed on"
    );
    assert!(took < Duration::from_secs(5), "cut after {took:?}");
    let st = served.standing("short").await;
    assert_eq!(st["settled_nanos"], 0, "{st}");
    assert!(
        st["held_nanos"].as_u64() >= Some(50_000_000),
        "a timeout keeps it held: {st}"
    );
    // Past its deadline, the token no longer spends: 403 with the reason and `stop`, so
    // a client shows why and stops (a 401 reads as a bad key, which clients retry).
    let a = call(
        served.proxy,
        "/openai/v1/chat/completions",
        &[("authorization", &bearer(&token))],
        chat("fake-ok", json!({"max_tokens": 5})),
    )
    .await;
    assert_eq!(a.status, 403, "{}", a.text());
    assert_eq!(
        a.json()["error"]["code"],
        "run_deadline_exhausted",
        "{}",
        a.text()
    );
    assert_eq!(a.json()["error"]["action"], "stop", "{}", a.text());
    // And says so to the SDKs, which obey it over their own retry rules.
    assert_eq!(
        a.headers.get("x-should-retry").map(|v| v.as_bytes()),
        Some(&b"false"[..]),
        "{}",
        a.text()
    );
    served.verifies_the_bill(&upstream, &prices(), 0);
}

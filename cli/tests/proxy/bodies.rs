use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_bodies_are_refused_and_never_forwarded() {
    let upstream = FakeUpstream::start(FakeOptions::default());
    let dir = tempfile::tempdir().expect("dir");
    let mut served = Served::new(dir.path(), &policy(&upstream, 1000));
    let token = served.start_run("r").await;
    let auth = bearer(&token);
    let h = [("authorization", auth.as_str())];
    for (body, status) in [
        // Duplicate keys: tally and the upstream must never read two different values.
        (
            br#"{"model":"fake-ok","max_tokens":1,"max_tokens":100000,"messages":[]}"#.to_vec(),
            400,
        ),
        (
            br#"{"model":"fake-ok","model":"gpt-4o","messages":[]}"#.to_vec(),
            400,
        ),
        (
            br#"{"model":"fake-ok","messages":[{"role":"user","content":"a","content":"b"}]}"#
                .to_vec(),
            400,
        ),
        (b"not json".to_vec(), 400),
        // A model with no price.
        (chat("gpt-4o", json!({})), 403),
        // Over max_request_bytes (4096).
        (chat("fake-ok", json!({"pad": "x".repeat(5000)})), 413),
    ] {
        let a = call(served.proxy, "/openai/v1/chat/completions", &h, body).await;
        assert_eq!(a.status, status, "{}", a.text());
    }
    // A path or upstream outside the policy.
    let a = call(
        served.proxy,
        "/openai/v1/files",
        &h,
        chat("fake-ok", json!({})),
    )
    .await;
    assert_eq!(a.status, 403, "{}", a.text());
    assert_eq!(a.json()["error"]["code"], "scope_violation");
    let a = call(
        served.proxy,
        "/openai/v1/chat/completions/../../files",
        &h,
        chat("fake-ok", json!({})),
    )
    .await;
    assert_eq!(a.status, 403, "{}", a.text());
    let a = call(
        served.proxy,
        "/nope/v1/chat/completions",
        &h,
        chat("fake-ok", json!({})),
    )
    .await;
    assert_eq!(a.status, 404, "{}", a.text());
    assert!(upstream.seen().is_empty(), "{:?}", upstream.seen());
    served.verifies();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_without_max_tokens_gets_one_its_budget_can_pay() {
    let upstream = FakeUpstream::start(FakeOptions::default());
    let dir = tempfile::tempdir().expect("dir");
    // 5 cents: at $0.001 per output token, fewer than 50 tokens after the input.
    let mut served = Served::new(dir.path(), &policy(&upstream, 5));
    let token = served.start_run("r").await;
    let a = call(
        served.proxy,
        "/openai/v1/chat/completions",
        &[("authorization", &bearer(&token))],
        chat("fake-usage-10-5", json!({})),
    )
    .await;
    // fake-usage-* has no price of its own: priced under fake-ok's name it is refused.
    assert_eq!(a.status, 403, "{}", a.text());
    let a = call(
        served.proxy,
        "/openai/v1/chat/completions",
        &[("authorization", &bearer(&token))],
        chat("fake-ok", json!({})),
    )
    .await;
    // The fake reports 100 in / 50 out whatever it was asked; what matters is what it
    // was asked.
    let seen = upstream.seen();
    let asked = seen[0].max_tokens.expect("max_tokens injected");
    // 5 cents pays fewer than 50 tokens at $0.001 once the input bound ($0.00001 a
    // byte of the body) is paid.
    assert!((1..50).contains(&asked), "asked {asked}");
    let st = served.settled("r").await;
    assert!(a.status == 200, "{}", a.text());
    // The usage the fake reports (50 out) is above what was asked, so above the worst
    // case: not believed, it settles at the reservation, which is the whole budget; the
    // next call does not fit.
    assert_eq!(st["settled_nanos"], 50_000_000, "{st}");
    let a = call(
        served.proxy,
        "/openai/v1/chat/completions",
        &[("authorization", &bearer(&token))],
        chat("fake-ok", json!({"max_tokens": 1})),
    )
    .await;
    assert_eq!(a.status, 403, "{}", a.text());
    assert_eq!(upstream.seen().len(), 1);
    served.verifies();
}

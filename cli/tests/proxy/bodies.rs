use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_are_refused_recorded_and_never_forwarded() {
    let upstream = FakeUpstream::start(FakeOptions::default());
    let dir = tempfile::tempdir().expect("dir");
    let mut served = Served::new(dir.path(), &policy(&upstream, 1000));
    let token = served.start_run("r").await;
    let auth = bearer(&token);
    let h = [("authorization", auth.as_str())];
    let chat_path = "/openai/v1/chat/completions";
    let image = json!({"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]});
    let cases: Vec<(&str, Vec<u8>, u16, &str)> = vec![
        // Duplicate keys: tally and the upstream must never read two different values.
        (
            chat_path,
            br#"{"model":"fake-ok","max_tokens":1,"max_tokens":100000,"messages":[]}"#.to_vec(),
            400,
            "request_refused",
        ),
        (
            chat_path,
            br#"{"model":"fake-ok","model":"gpt-4o","messages":[]}"#.to_vec(),
            400,
            "request_refused",
        ),
        (
            chat_path,
            br#"{"model":"fake-ok","messages":[{"role":"user","content":"a","content":"b"}]}"#
                .to_vec(),
            400,
            "request_refused",
        ),
        (chat_path, b"not json".to_vec(), 400, "request_refused"),
        // An image on a model whose price has no image_tokens: its price does not
        // follow from its size, so it is not priced.
        (chat_path, chat("fake-ok", image), 403, "scope_violation"),
        // A model with no price.
        (chat_path, chat("gpt-4o", json!({})), 403, "scope_violation"),
        // Over max_request_bytes (4096).
        (
            chat_path,
            chat("fake-ok", json!({"pad": "x".repeat(5000)})),
            413,
            "request_refused",
        ),
        // A path or upstream outside the policy.
        (
            "/openai/v1/files",
            chat("fake-ok", json!({})),
            403,
            "scope_violation",
        ),
        (
            "/openai/v1/chat/completions/../../files",
            chat("fake-ok", json!({})),
            403,
            "scope_violation",
        ),
        (
            "/nope/v1/chat/completions",
            chat("fake-ok", json!({})),
            404,
            "scope_violation",
        ),
    ];
    let mut seqs = Vec::new();
    for (path, body, status, code) in cases {
        let a = call(served.proxy, path, &h, body).await;
        assert_eq!(a.status, status, "{path}: {}", a.text());
        assert_eq!(a.json()["error"]["code"], code, "{path}: {}", a.text());
        assert_eq!(a.json()["error"]["action"], "stop", "{}", a.text());
        assert_eq!(a.headers["x-tally-run"], "r", "{path}");
        // Recorded before it was answered: the answer names the decision.
        let seq: u64 = a.headers["x-tally-seq"]
            .to_str()
            .expect("seq")
            .parse()
            .expect("a seq");
        seqs.push((seq, code));
    }
    // An unknown upstream is no reason to skip the token: 401 whatever the path, and a
    // bad token records nothing.
    for path in ["/nope/v1/chat/completions", chat_path] {
        let a = call(
            served.proxy,
            path,
            &[("authorization", "Bearer sk-forged")],
            chat("fake-ok", json!({})),
        )
        .await;
        assert_eq!(a.status, 401, "{path}: {}", a.text());
        assert_eq!(a.json()["error"]["code"], "invalid_token", "{}", a.text());
        assert!(!a.headers.contains_key("x-tally-seq"));
    }
    assert!(upstream.seen().is_empty(), "{:?}", upstream.seen());
    let report = served.verifies_the_bill(&upstream, &prices(), 0);
    // Every refusal is a gate decision replay decided again, and agrees with.
    assert_eq!(report["replay"]["replayed"], seqs.len(), "{report}");
    assert_eq!(report["replay"]["taken_as_recorded"], 0, "{report}");
    let decisions = served.decisions("r");
    let denies: Vec<(u64, String)> = decisions
        .iter()
        .filter(|d| d["decision"]["kind"] == "deny")
        .map(|d| {
            assert_eq!(d["decision"]["proxied"], true, "{d}");
            (
                d["seq"].as_u64().expect("seq"),
                d["decision"]["reason"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            )
        })
        .collect();
    let want: Vec<(u64, String)> = seqs.iter().map(|(s, c)| (*s, c.to_string())).collect();
    assert_eq!(denies, want, "{decisions:?}");
    // Nothing was allowed: no attempt used, nothing held.
    assert!(
        decisions.iter().all(|d| d["decision"]["kind"] != "allow"),
        "{decisions:?}"
    );
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
    // The fake answers within what it was asked (as a real API does) and bills 100 in:
    // the call settles at that bill, within the budget, with nothing held.
    let bill = 100 * 10_000 + asked * 1_000_000;
    assert_eq!(st["settled_nanos"], bill, "{st}");
    assert_eq!(st["held_nanos"], 0, "{st}");
    assert!(bill <= 50_000_000);
    // What is left does not pay 10 more output tokens: refused, nothing forwarded.
    let a = call(
        served.proxy,
        "/openai/v1/chat/completions",
        &[("authorization", &bearer(&token))],
        chat("fake-ok", json!({"max_tokens": 10})),
    )
    .await;
    assert_eq!(a.status, 403, "{}", a.text());
    assert_eq!(upstream.seen().len(), 1);
    served.verifies_the_bill(&upstream, &prices(), 0);
}

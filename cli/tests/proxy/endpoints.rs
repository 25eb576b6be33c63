use super::*;

/// An Anthropic message to `model`.
fn message(model: &str, extra: Value) -> Vec<u8> {
    let mut m = json!({"model": model, "max_tokens": 5,
                       "messages": [{"role": "user", "content": "hello"}]});
    if let (Some(m), Some(e)) = (m.as_object_mut(), extra.as_object()) {
        m.extend(e.clone());
    }
    m.to_string().into_bytes()
}

// count_tokens is free: it must never hold a reservation (nine calls once held a whole
// budget) nor be sent a `max_tokens`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn count_tokens_a_hundred_times_holds_nothing_and_adds_no_max_tokens() {
    let upstream = FakeUpstream::start(FakeOptions::default());
    let dir = tempfile::tempdir().expect("dir");
    // A budget of 1 cent: far less than one held Messages reservation a call.
    let mut served = Served::new(dir.path(), &policy(&upstream, 1));
    let token = served.start_run("t").await;
    let h = [("x-api-key", token.as_str())];
    let body =
        json!({"model": "fake-ok", "messages": [{"role": "user", "content": "hi"}]}).to_string();
    for i in 0..100 {
        let path = if i % 2 == 0 {
            "/anthropic/v1/messages/count_tokens"
        } else {
            "/anthropic/v1/messages/count_tokens?beta=true"
        };
        let a = call(served.proxy, path, &h, body.clone()).await;
        assert_eq!(a.status, 200, "{i}: {}", a.text());
    }
    let st = served.settled("t").await;
    assert_eq!(st["held_nanos"], 0, "{st}");
    assert_eq!(st["settled_nanos"], 0, "{st}");
    let seen = upstream.seen();
    assert_eq!(seen.len(), 100);
    assert!(seen.iter().all(|s| s.max_tokens.is_none()), "{seen:?}");
    assert!(
        seen[1]
            .path
            .ends_with("/v1/messages/count_tokens?beta=true"),
        "{seen:?}"
    );
    served.verifies_the_bill(&upstream, &prices(), 0);
    let decisions = served.decisions("t");
    let allows: Vec<&Value> = decisions
        .iter()
        .filter(|d| d["decision"]["kind"] == "allow")
        .collect();
    assert_eq!(allows.len(), 100);
    assert!(allows
        .iter()
        .all(|d| d["decision"]["reserve_nanos"].as_u64().unwrap_or(0) == 0));
    let outcomes: Vec<&Value> = decisions
        .iter()
        .filter(|d| d["decision"]["kind"] == "outcome")
        .collect();
    assert_eq!(outcomes.len(), 100);
    assert!(
        outcomes.iter().all(|d| d["decision"]["status"] == "ok"),
        "{outcomes:?}"
    );
}

// Under the documented `/v1/messages` prefix, batches passed with a 1-token
// reservation: what the proxy does not meter it refuses, naming the path, and a path or
// query spelled any other way than the one the endpoint has is refused too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paths_the_proxy_does_not_meter_are_refused_by_name_and_never_forwarded() {
    let upstream = FakeUpstream::start(FakeOptions::default());
    let dir = tempfile::tempdir().expect("dir");
    let mut served = Served::new(dir.path(), &policy(&upstream, 1000));
    let token = served.start_run("p").await;
    let h = [("x-api-key", token.as_str())];
    let body = message("fake-ok", json!({}));
    for (path, names) in [
        ("/anthropic/v1/messages/batches", "/v1/messages/batches"),
        (
            "/anthropic/v1/messages/batches/b1/results",
            "/v1/messages/batches/b1/results",
        ),
        ("/anthropic/v1/messages/", "is not a path"),
        ("/anthropic/v1/messages//count_tokens", "is not a path"),
        ("/anthropic/v1//messages", "is not a path"),
        ("/anthropic/v1/messages\\count_tokens", "is not a path"),
        ("/anthropic/v1/messages?beta=false", "?beta=false"),
        ("/anthropic/v1/messages?beta=true&x=1", "?beta=true&x=1"),
        ("/openai/v1/chat/completions?x=1", "?x=1"),
    ] {
        let a = call(served.proxy, path, &h, body.clone()).await;
        // 402 in Anthropic's dialect (docs/PROXY.md), 403 in OpenAI's.
        let refused = if path.starts_with("/anthropic/") {
            402
        } else {
            403
        };
        assert_eq!(a.status, refused, "{path}: {}", a.text());
        let text = a.text();
        assert!(text.contains("scope_violation"), "{path}: {text}");
        assert!(text.contains(names), "{path}: {text}");
    }
    assert!(upstream.seen().is_empty(), "{:?}", upstream.seen());
    // The spelling Claude Code uses passes, with its query.
    let a = call(served.proxy, "/anthropic/v1/messages?beta=true", &h, body).await;
    assert_eq!(a.status, 200, "{}", a.text());
    assert_eq!(upstream.seen()[0].path, "/v1/messages?beta=true");
    served.settled("p").await;
    served.verifies_the_bill(&upstream, &prices(), 0);
}

// A request that can cost what the policy has no price for is refused with the field
// named, before anything is forwarded; a priced web search is reserved per use.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unpriced_costs_are_refused_with_the_field_named_and_priced_ones_reserved() {
    let upstream = FakeUpstream::start(FakeOptions::default());
    let dir = tempfile::tempdir().expect("dir");
    let mut text = policy(&upstream, 1000);
    text.push_str(
        "[prices.anthropic.\"fake-usage-10-5\"]\ninput_per_mtok = 10\noutput_per_mtok = \"1000\"\nmax_output_tokens = 100\ntool_prompt_tokens = 1000\nweb_search_per_use = \"0.01\"\n",
    );
    let mut served = Served::new(dir.path(), &text);
    let token = served.start_run("u").await;
    let h = [("x-api-key", token.as_str())];
    let search =
        json!({"tools": [{"type": "web_search_20250305", "name": "web_search", "max_uses": 2}]});
    for (body, field) in [
        (message("fake-ok", search.clone()), "`tools`"),
        (
            message(
                "fake-usage-10-5",
                json!({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}),
            ),
            "`tools[0].max_uses`",
        ),
        (
            message(
                "fake-usage-10-5",
                json!({"mcp_servers": [{"type": "url", "url": "https://mcp.example", "name": "x"}]}),
            ),
            "`mcp_servers`",
        ),
        (
            message(
                "fake-usage-10-5",
                json!({"tools": [{"type": "computer_20250124", "name": "computer", "display_width_px": 1, "display_height_px": 1}]}),
            ),
            "`tools[0].type`",
        ),
        (
            message("fake-usage-10-5", json!({"service_tier": "priority"})),
            "`service_tier`",
        ),
    ] {
        let a = call(served.proxy, "/anthropic/v1/messages", &h, body).await;
        assert_eq!(a.status, 402, "{field}: {}", a.text());
        let v = a.json();
        assert_eq!(v["tally"]["reason"], "scope_violation", "{v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains(field)),
            "{field}: {v}"
        );
    }
    assert!(upstream.seen().is_empty(), "{:?}", upstream.seen());
    // Priced: two searches at $0.01, the tool prompt's 1,000 tokens on top of the
    // body's bytes at $10/M, 5 output tokens at $1,000/M.
    let body = message("fake-usage-10-5", search);
    let a = call(served.proxy, "/anthropic/v1/messages", &h, body.clone()).await;
    assert_eq!(a.status, 200, "{}", a.text());
    served.settled("u").await;
    let p = [(
        "fake-usage-10-5",
        Price {
            per_web_search: 10_000_000,
            ..Price::usd(10, 1000)
        },
    )];
    served.verifies_the_bill(&upstream, &p, 0);
    let decisions = served.decisions("u");
    let reserved = decisions
        .iter()
        .find(|d| d["decision"]["kind"] == "allow")
        .and_then(|d| d["decision"]["reserve_nanos"].as_u64())
        .expect("an allow");
    // The forwarded body is canonical JSON: no longer than the one sent, plus the
    // 20 digits the bound measures its limit with.
    let most = (body.len() as u64 + 20 + 1000) * 10_000 + 2 * 10_000_000 + 5_000_000;
    let least = 1000 * 10_000 + 2 * 10_000_000 + 5_000_000;
    assert!(reserved <= most && reserved > least, "{reserved}");
}

// Claude Code's subagents ask for dated ids of the models they are priced as.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dated_id_is_priced_as_its_model() {
    let upstream = FakeUpstream::start(FakeOptions::default());
    let dir = tempfile::tempdir().expect("dir");
    let mut served = Served::new(dir.path(), &policy(&upstream, 1000));
    let token = served.start_run("d").await;
    let h = [("x-api-key", token.as_str())];
    let a = call(
        served.proxy,
        "/anthropic/v1/messages",
        &h,
        message("fake-ok-20251001", json!({})),
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.text());
    let a = call(
        served.proxy,
        "/anthropic/v1/messages",
        &h,
        message("fake-ok-2025-10-01", json!({})),
    )
    .await;
    assert_eq!(a.status, 402, "only -YYYYMMDD: {}", a.text());
    served.settled("d").await;
    served.verifies_the_bill(&upstream, &[("fake-ok-20251001", Price::usd(10, 1000))], 0);
}

// Only the headers a dialect needs reach the upstream: an agent's organization or
// project would choose whose account pays, a beta the operator did not allow can change
// what a call bills.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_allow_listed_headers_and_betas_reach_the_upstream() {
    let upstream = FakeUpstream::start(FakeOptions::default());
    let dir = tempfile::tempdir().expect("dir");
    let text = policy(&upstream, 1000).replacen(
        "paths = [\"/v1/messages\"]",
        "paths = [\"/v1/messages\"]\nanthropic_beta = [\"claude-code-20250219\"]",
        1,
    );
    let mut served = Served::new(dir.path(), &text);
    let token = served.start_run("h").await;
    let auth = bearer(&token);
    let extra = [
        ("openai-organization", "org-agent"),
        ("openai-project", "proj-agent"),
        ("openai-beta", "assistants=v2"),
        ("x-stainless-os", "Linux"),
        ("anthropic-dangerous-direct-browser-access", "true"),
        ("accept", "application/json"),
    ];
    let mut h: Vec<(&str, &str)> = vec![("authorization", auth.as_str())];
    h.extend(extra);
    let a = call(
        served.proxy,
        "/openai/v1/chat/completions",
        &h,
        chat("fake-ok", json!({})),
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.text());
    for betas in [
        "context-1m-2025-08-07",
        "context-1m-2025-08-07,claude-code-20250219",
    ] {
        let mut h: Vec<(&str, &str)> = vec![
            ("x-api-key", token.as_str()),
            ("anthropic-version", "2023-06-01"),
            ("anthropic-beta", betas),
        ];
        h.extend(extra);
        let a = call(
            served.proxy,
            "/anthropic/v1/messages",
            &h,
            message("fake-ok", json!({})),
        )
        .await;
        assert_eq!(a.status, 200, "{}", a.text());
    }
    let seen = upstream.seen();
    assert_eq!(seen.len(), 3);
    for s in &seen {
        for (name, _) in extra.iter().filter(|(n, _)| *n != "accept") {
            assert!(
                !s.headers.iter().any(|n| n == name),
                "{name} reached the upstream: {s:?}"
            );
        }
        assert!(s.headers.iter().any(|n| n == "accept"), "{s:?}");
    }
    assert!(
        seen[1].headers.iter().any(|n| n == "anthropic-version"),
        "{:?}",
        seen[1]
    );
    assert!(
        !seen[1].headers.iter().any(|n| n == "anthropic-beta"),
        "no allowed beta, no header: {:?}",
        seen[1]
    );
    assert!(
        seen[2].headers.iter().any(|n| n == "anthropic-beta"),
        "{:?}",
        seen[2]
    );
    served.settled("h").await;
    served.verifies_the_bill(&upstream, &prices(), 0);
}

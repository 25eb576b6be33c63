//! The upstream's bill is the truth: a call settles what the upstream reports, whatever
//! the gate reserved; an excess is an overrun recorded on the outcome and listed by
//! `tally verify`, and the run spends nothing more until a human grants it. A call
//! nobody saw end keeps its reservation held until the operator settles it (`tally
//! settle`), from the upstream's own figure.

use super::*;

/// The test policy with `fake-usage-1000-50` priced like the others: it bills 1,000
/// input tokens for a body of a few hundred bytes (as a provider adds a tool prompt the
/// body does not carry), past the input bound the gate reserved for.
fn billing_policy(upstream: &FakeUpstream) -> String {
    let mut p = policy(upstream, 1000);
    p.push_str(
        "[prices.openai.\"fake-usage-1000-50\"]\ninput_per_mtok = 10\noutput_per_mtok = \"1000\"\nmax_output_tokens = 100\n",
    );
    p
}

/// The prices [`billing_policy`] gives, for [`assert_bill`].
fn billing_prices() -> Vec<(&'static str, Price)> {
    let mut p = prices();
    p.push(("fake-usage-1000-50", Price::usd(10, 1000)));
    p
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_billing_past_the_reservation_settles_whole_as_an_overrun() {
    let upstream = FakeUpstream::start(FakeOptions::default());
    let dir = tempfile::tempdir().expect("dir");
    let mut served = Served::new(dir.path(), &billing_policy(&upstream));
    let token = served.start_run("r").await;
    let a = call(
        served.proxy,
        "/openai/v1/chat/completions",
        &[("authorization", &bearer(&token))],
        chat("fake-usage-1000-50", json!({"max_tokens": 50})),
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.text());
    // 1,000 in at $10/M and 50 out at $1,000/M: $0.06, the bill, whatever was reserved.
    let bill = tally_testkit::upstream::bill(&[&upstream], &billing_prices());
    assert_eq!(bill, 60_000_000);
    let st = served.settled("r").await;
    assert_eq!(st["settled_nanos"], bill, "{st}");
    // The next call, however small, is refused: after an overrun a human grants spend.
    let a = call(
        served.proxy,
        "/openai/v1/chat/completions",
        &[("authorization", &bearer(&token))],
        chat("fake-ok", json!({"max_tokens": 1})),
    )
    .await;
    assert_eq!(a.status, 403, "{}", a.text());
    assert!(a.text().contains("budget_exceeded"), "{}", a.text());
    assert_eq!(upstream.seen().len(), 1, "nothing more forwarded");
    // The operator sees it: counted, with its amount.
    let (status, body) = super::observed::operator(&served, "/metrics").await;
    assert_eq!(status, 200);
    let metrics = String::from_utf8_lossy(&body).into_owned();
    assert!(metrics.contains("\ntally_overruns_total 1\n"), "{metrics}");
    // The outcome records the excess; verify lists it with its seq, and is consistent;
    // the ledger settled the bill.
    let report = served.verifies_the_bill(&upstream, &billing_prices(), 0);
    let overruns = report["audit"]["overruns"].as_array().expect("overruns");
    assert_eq!(overruns.len(), 1, "{report}");
    let o = &overruns[0];
    let reserved = o["reserved_nanos"].as_u64().expect("reserved");
    assert!(reserved < bill, "{o}");
    assert_eq!(o["settled_nanos"], bill, "{o}");
    assert_eq!(o["overrun_nanos"], bill - reserved, "{o}");
    assert!(
        metrics.contains(&format!(
            "\ntally_overrun_nanos_total {}\n",
            bill - reserved
        )),
        "{metrics}"
    );
    let outcome = served
        .decisions("r")
        .into_iter()
        .find(|d| d["decision"]["kind"] == "outcome")
        .expect("the outcome");
    assert_eq!(outcome["seq"], o["seq"], "{outcome}");
    assert_eq!(
        outcome["decision"]["overrun_nanos"],
        bill - reserved,
        "{outcome}"
    );
    let h = served.handoff("r");
    assert_eq!(h["spend"]["overrun_nanos"], bill - reserved, "{h}");
    let text = tally().audit(served.dir(), "verify", &[]);
    let text = tally_testkit::tally::text(&text);
    assert!(text.contains("1 overrun"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_kill_9_mid_stream_the_operator_settles_what_the_call_held() {
    let upstream = FakeUpstream::start(FakeOptions::default());
    let dir = tempfile::tempdir().expect("dir");
    let served = Served::new(dir.path(), &policy(&upstream, 1000));
    let token = served.start_run("r").await;
    let mut served = served.killed_mid_stream(&upstream, &token).await;
    let st = served.standing("r").await;
    let held = st["held_nanos"].as_u64().expect("held");
    assert!(held >= 50_000_000, "held, never lost: {st}");
    // The agent cannot settle it, on either socket.
    let (status, v) = served
        .agent(
            "POST",
            "/v1/runs/r/settle",
            Some(json!({"attempt": 1, "settled_nanos": 0})),
        )
        .await;
    assert_eq!(status, 403, "{v}");
    let operator = served.daemon.operator_socket().display().to_string();
    let settle = |extra: &[&str]| {
        let mut args = vec!["settle", "--operator-socket", &operator, "--run", "r"];
        args.extend_from_slice(extra);
        tally().run(served.dir(), &args, "")
    };
    // Bad input changes nothing.
    for bad in [
        &["--attempt", "1", "--usd", "1e-3"][..],
        &["--attempt", "1"][..],
        &["--attempt", "1", "--usd", "0.01", "--release"][..],
        &["--attempt", "9", "--usd", "0.01"][..],
    ] {
        let out = settle(bad);
        assert!(!out.status.success(), "{bad:?}");
    }
    assert_eq!(served.standing("r").await["held_nanos"], held);
    // The provider's console says $0.0123.
    let out = settle(&["--attempt", "1", "--usd", "0.0123"]);
    assert!(out.status.success(), "{}", tally_testkit::tally::text(&out));
    let st = served.standing("r").await;
    assert_eq!(
        (st["held_nanos"].as_u64(), st["settled_nanos"].as_u64()),
        (Some(0), Some(12_300_000)),
        "{st}"
    );
    // Once: a second settlement is refused.
    let out = settle(&["--attempt", "1", "--release"]);
    assert!(!out.status.success());
    assert!(
        tally_testkit::tally::text(&out).contains("attempt_settled")
            || tally_testkit::tally::text(&out).contains("already settled"),
        "{}",
        tally_testkit::tally::text(&out)
    );
    // The upstream billed nothing for the stream nobody saw end: the ledger settled the
    // operator's figure and holds nothing.
    let report = served.verifies_the_bill(&upstream, &prices(), 12_300_000);
    assert_eq!(report["audit"]["findings"], json!([]), "{report}");
    let settled = served
        .decisions("r")
        .into_iter()
        .find(|d| d["decision"]["kind"] == "outcome")
        .expect("the operator's outcome");
    assert_eq!(settled["decision"]["operator"], true, "{settled}");
    assert_eq!(settled["decision"]["status"], "unknown", "{settled}");
}

/// An upstream that bills what the body does not carry: 500 tool-prompt tokens on top of
/// the 100 input whenever the request has `tools`. The call's bill is above its
/// reservation (the body is a few hundred bytes): the ledger settles the bill to the
/// nanodollar, the excess is an overrun, and the run's next call is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bill_above_the_reservation_is_settled_exactly_and_stops_later_spending() {
    let upstream = FakeUpstream::start(FakeOptions::default());
    let dir = tempfile::tempdir().expect("dir");
    let mut text = policy(&upstream, 1000);
    text.push_str(
        "[prices.anthropic.\"fake-bill-tools-500-0\"]\ninput_per_mtok = 10\noutput_per_mtok = \"1000\"\nmax_output_tokens = 100\n",
    );
    let mut served = Served::new(dir.path(), &text);
    let token = served.start_run("b").await;
    let body = json!({"model": "fake-bill-tools-500-0", "max_tokens": 50,
        "tools": [{"name": "get_weather", "description": "weather", "input_schema": {"type": "object"}}],
        "messages": [{"role": "user", "content": "weather?"}]});
    let a = call(
        served.proxy,
        "/anthropic/v1/messages",
        &[("x-api-key", &token)],
        body.to_string().into_bytes(),
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.text());
    served.settled("b").await;
    // 600 input and 50 output tokens: $0.006 + $0.05.
    assert_eq!(upstream.billed()[0].input, 600);
    let a = call(
        served.proxy,
        "/anthropic/v1/messages",
        &[("x-api-key", &token)],
        body.to_string().into_bytes(),
    )
    .await;
    // Anthropic's dialect answers a call the run may not make 402 (`billing_error`).
    assert_eq!(
        a.status,
        402,
        "after an overrun no call is allowed: {}",
        a.text()
    );
    assert_eq!(upstream.seen().len(), 1);
    let prices = [("fake-bill-tools-500-0", Price::usd(10, 1000))];
    served.verifies_the_bill(&upstream, &prices, 0);
}

/// An upstream event past the bound (16 MiB) is not buffered on: the stream is cut, and
/// the call is an `error` settled at its reservation (the most the gate allowed it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_event_past_the_bound_is_an_error_at_the_reservation() {
    let upstream = FakeUpstream::start(FakeOptions::default());
    let dir = tempfile::tempdir().expect("dir");
    let mut p = policy(&upstream, 1000);
    p.push_str(
        "[prices.openai.\"fake-huge-event\"]\ninput_per_mtok = 10\noutput_per_mtok = \"1000\"\nmax_output_tokens = 100\n",
    );
    let mut served = Served::new(dir.path(), &p);
    let token = served.start_run("h").await;
    let a = call(
        served.proxy,
        "/openai/v1/chat/completions",
        &[("authorization", &bearer(&token))],
        chat("fake-huge-event", json!({"stream": true, "max_tokens": 10})),
    )
    .await;
    assert!(a.cut, "the client's stream is cut");
    let st = served.settled("h").await;
    let outcome = {
        served.daemon.stop();
        served
            .decisions("h")
            .into_iter()
            .find(|d| d["decision"]["kind"] == "outcome")
            .expect("the outcome")
    };
    let allow = served
        .decisions("h")
        .into_iter()
        .find(|d| d["decision"]["kind"] == "allow")
        .expect("the allow");
    assert_eq!(outcome["decision"]["status"], "error", "{outcome}");
    assert_eq!(
        outcome["decision"]["settled_nanos"], allow["decision"]["reserve_nanos"],
        "{outcome} {allow}"
    );
    assert_eq!(st["held_nanos"], 0, "{st}");
    // The upstream billed nothing it could show (no usage): the ledger settled the
    // reservation without a bill.
    let mut p = prices();
    p.push(("fake-huge-event", Price::usd(10, 1000)));
    let reserved = allow["decision"]["reserve_nanos"]
        .as_u64()
        .expect("reserved");
    served.verifies_the_bill(&upstream, &p, reserved);
}

/// An upstream that bills a tool prompt and web searches: Anthropic Messages with a
/// client tool and a `web_search` server tool (`max_uses` 2), the fake billing 3,000
/// tool-prompt tokens (the policy counts 100) and 2 searches, as a plain answer and as a
/// stream. The ledger settles the bill to the nanodollar, searches included; the excess
/// over the reservation is an overrun `tally verify` lists with the outcome's seq; and
/// the run's next call is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_prompt_and_web_searches_billed_past_the_reservation_settle_to_the_unit() {
    const MODEL: &str = "fake-bill-tools-3000-2";
    let upstream = FakeUpstream::start(FakeOptions::default());
    let dir = tempfile::tempdir().expect("dir");
    let mut text = policy(&upstream, 1000);
    text.push_str(&format!(
        "[prices.anthropic.\"{MODEL}\"]\ninput_per_mtok = 10\noutput_per_mtok = \"1000\"\nmax_output_tokens = 100\ntool_prompt_tokens = 100\nweb_search_per_use = \"0.01\"\n"
    ));
    let mut served = Served::new(dir.path(), &text);
    let body = |stream: bool| {
        json!({"model": MODEL, "max_tokens": 50, "stream": stream,
            "tools": [{"name": "get_weather", "description": "weather", "input_schema": {"type": "object"}},
                      {"type": "web_search_20250305", "name": "web_search", "max_uses": 2}],
            "messages": [{"role": "user", "content": "What is the weather in Lyon today?"}]})
        .to_string()
        .into_bytes()
    };
    for stream in [false, true] {
        let run = format!("ws-{stream}");
        let token = served.start_run(&run).await;
        let a = call(
            served.proxy,
            "/anthropic/v1/messages",
            &[("x-api-key", &token)],
            body(stream),
        )
        .await;
        assert_eq!(a.status, 200, "{}", a.text());
        assert!(a.text().contains("web_search_requests"), "{}", a.text());
        served.settled(&run).await;
        let a = call(
            served.proxy,
            "/anthropic/v1/messages",
            &[("x-api-key", &token)],
            body(stream),
        )
        .await;
        // Anthropic's dialect: 402 (docs/PROXY.md).
        assert_eq!(a.status, 402, "after an overrun: {}", a.text());
        assert!(a.text().contains("budget_exceeded"), "{}", a.text());
    }
    assert_eq!(
        upstream.seen().len(),
        2,
        "nothing forwarded after an overrun"
    );
    // Each: 3,100 in at $10/M, 50 out at $1,000/M, 2 searches at $0.01: $0.101.
    let billed = upstream.billed();
    assert!(
        billed
            .iter()
            .all(|b| (b.input, b.output, b.web_searches) == (3100, 50, 2)),
        "{billed:?}"
    );
    let price = Price {
        per_web_search: 10_000_000,
        ..Price::usd(10, 1000)
    };
    let bill = 3100 * 10_000 + 50 * 1_000_000 + 2 * 10_000_000;
    assert_eq!(
        tally_testkit::upstream::bill(&[&upstream], &[(MODEL, price)]),
        2 * bill
    );
    let report = served.verifies_the_bill(&upstream, &[(MODEL, price)], 0);
    let overruns = report["audit"]["overruns"].as_array().expect("overruns");
    assert_eq!(overruns.len(), 2, "{report}");
    for (o, stream) in overruns.iter().zip([false, true]) {
        let run = format!("ws-{stream}");
        assert_eq!(o["run"], run.as_str(), "{o}");
        assert_eq!(o["settled_nanos"], bill, "{o}");
        let decisions = served.decisions(&run);
        let allow = decisions
            .iter()
            .find(|d| d["decision"]["kind"] == "allow")
            .expect("the allow");
        let reserved = allow["decision"]["reserve_nanos"]
            .as_u64()
            .expect("reserved");
        assert_eq!(o["reserved_nanos"], reserved, "{o}");
        assert_eq!(o["overrun_nanos"], bill - reserved, "{o}");
        let outcome = decisions
            .iter()
            .find(|d| d["decision"]["kind"] == "outcome")
            .expect("the outcome");
        assert_eq!(outcome["seq"], o["seq"], "{outcome}");
        assert_eq!(
            outcome["decision"]["overrun_nanos"],
            bill - reserved,
            "{outcome}"
        );
    }
    let text = tally().audit(served.dir(), "verify", &[]);
    let text = tally_testkit::tally::text(&text);
    assert!(text.contains("2 overruns"), "{text}");
}

/// Usage that cannot be true (more input than the model's context) is not believed: the
/// call is an `error` settled at its reservation (never at the number, never capped to a
/// believable one), the outcome says why (`usage_refused`) and records no usage, and
/// `tally verify` lists it with its seq for the operator to reconcile with the
/// provider's console. The upstream's bill is then, by design, not the ledger's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_past_the_models_context_is_an_error_at_the_reservation_and_listed() {
    let upstream = FakeUpstream::start(FakeOptions::default());
    let dir = tempfile::tempdir().expect("dir");
    let mut p = policy(&upstream, 1000);
    p.push_str(
        "[prices.openai.\"fake-usage-5000-20\"]\ninput_per_mtok = 10\noutput_per_mtok = \"1000\"\n\
         max_output_tokens = 100\ncontext_tokens = 1000\n",
    );
    let mut served = Served::new(dir.path(), &p);
    let token = served.start_run("r").await;
    let a = call(
        served.proxy,
        "/openai/v1/chat/completions",
        &[("authorization", &bearer(&token))],
        chat("fake-usage-5000-20", json!({"max_tokens": 50})),
    )
    .await;
    assert_eq!(
        a.status,
        200,
        "the agent has the upstream's answer: {}",
        a.text()
    );
    let st = served.settled("r").await;
    served.daemon.stop();
    let decisions = served.decisions("r");
    let allow = decisions
        .iter()
        .map(|d| &d["decision"])
        .find(|d| d["kind"] == "allow")
        .expect("the allow");
    let (seq, outcome) = decisions
        .iter()
        .find(|d| d["decision"]["kind"] == "outcome")
        .map(|d| (d["seq"].as_u64().expect("seq"), &d["decision"]))
        .expect("the outcome");
    assert_eq!(outcome["status"], "error", "{outcome}");
    assert_eq!(outcome["usage_refused"], "implausible", "{outcome}");
    assert_eq!(
        outcome["settled_nanos"], allow["reserve_nanos"],
        "{outcome}"
    );
    assert!(
        outcome.get("usage").is_none(),
        "nothing unbelievable recorded: {outcome}"
    );
    assert_eq!(st["settled_nanos"], allow["reserve_nanos"], "{st}");
    let report = served.verifies();
    let listed = report["audit"]["usage_refused"].as_array().expect("listed");
    assert_eq!(listed.len(), 1, "{report:#}");
    assert_eq!(listed[0]["seq"], seq, "{report:#}");
    assert_eq!(report["replay"]["findings"], json!([]), "{report:#}");
    let h = served.handoff("r");
    assert_eq!(h["model_calls"][0]["usage_refused"], "implausible", "{h:#}");
    assert_eq!(h["model_calls"][0]["usage"], Value::Null, "{h:#}");
}

//! What the upstream reported, kept: each proxied outcome records the usage its answer
//! reported (`usage`), `tally handoff` lists each model call with its model, tokens, cost
//! and how it ended, and every refused call, and `/metrics` counts the tokens per
//! upstream, model and price class. Before the outcome carried its usage, the handoff of
//! a proxied run said nothing of its model calls and no token was a series.

use std::collections::BTreeMap;

use super::observed::metrics_after;
use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_model_call_is_recorded_with_its_usage_listed_by_the_handoff_and_counted() {
    let upstream = FakeUpstream::start(FakeOptions::default());
    let dir = tempfile::tempdir().expect("dir");
    let mut text = policy(&upstream, 1000);
    // 60 in, 20 out on OpenAI's API: 30 of the 60 read from the cache.
    text.push_str(
        "[prices.openai.\"fake-usage-60-20-30-0\"]\ninput_per_mtok = 10\noutput_per_mtok = \"1000\"\n\
         cached_input_per_mtok = 1\nmax_output_tokens = 100\n",
    );
    let mut served = Served::new(dir.path(), &text);
    let token = served.start_run("r").await;
    let (chat_path, auth) = ("/openai/v1/chat/completions", bearer(&token));
    let h = [("authorization", auth.as_str())];
    for (model, extra, status) in [
        ("fake-ok", json!({"max_tokens": 50}), 200),
        (
            "fake-usage-60-20-30-0",
            json!({"max_tokens": 50, "stream": true}),
            200,
        ),
        ("fake-500", json!({"max_tokens": 50}), 500),
        ("gpt-4o", json!({"max_tokens": 50}), 403),
    ] {
        let r = call(served.proxy, chat_path, &h, chat(model, extra)).await;
        assert_eq!(r.status, status, "{model}: {}", r.text());
    }
    let body = json!({"model": "fake-ok", "max_tokens": 50,
                      "messages": [{"role": "user", "content": "hi"}]});
    let r = call(
        served.proxy,
        "/anthropic/v1/messages",
        &[("x-api-key", &token)],
        body.to_string(),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    served.held_back_to("r", 0).await;

    let metrics = metrics_after(&served, 4).await;
    let tokens = |upstream: &str, model: &str, class: &str| {
        let series = format!(
            "tally_upstream_tokens_total{{upstream=\"{upstream}\",model=\"{model}\",class=\"{class}\"}} "
        );
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(series.as_str()))
            .map_or(0, |v| v.parse::<u64>().expect("a count"))
    };

    // The ledger: each outcome of a call that reported usage carries it, as reported.
    served.daemon.stop();
    let outcomes: Vec<Value> = served
        .decisions("r")
        .into_iter()
        .map(|d| d["decision"].clone())
        .filter(|d| d["kind"] == "outcome")
        .collect();
    let usages: Vec<&Value> = outcomes.iter().map(|d| &d["usage"]).collect();
    assert_eq!(
        usages,
        [
            &json!({"input_tokens": 100, "output_tokens": 50}),
            &json!({"input_tokens": 30, "cached_tokens": 30, "output_tokens": 20}),
            &Value::Null,
            &json!({"input_tokens": 100, "output_tokens": 50}),
        ],
        "{outcomes:#?}"
    );
    // The metrics: every token the ledger holds, per upstream, model and class.
    let mut counted = BTreeMap::new();
    for (up, model) in [
        ("openai", "fake-ok"),
        ("openai", "fake-usage-60-20-30-0"),
        ("anthropic", "fake-ok"),
    ] {
        for class in ["input", "cached", "output"] {
            counted.insert((up, model, class), tokens(up, model, class));
        }
    }
    let expected: BTreeMap<_, _> = [
        (("openai", "fake-ok", "input"), 100),
        (("openai", "fake-ok", "cached"), 0),
        (("openai", "fake-ok", "output"), 50),
        (("openai", "fake-usage-60-20-30-0", "input"), 30),
        (("openai", "fake-usage-60-20-30-0", "cached"), 30),
        (("openai", "fake-usage-60-20-30-0", "output"), 20),
        (("anthropic", "fake-ok", "input"), 100),
        (("anthropic", "fake-ok", "cached"), 0),
        (("anthropic", "fake-ok", "output"), 50),
    ]
    .into_iter()
    .collect();
    assert_eq!(counted, expected, "{metrics}");
    assert!(!metrics.contains("gpt-4o"), "no agent-chosen label");

    // The handoff: each model call with its model, tokens, cost and end; the refusal.
    let h = served.handoff("r");
    let calls = h["model_calls"].as_array().expect("model_calls");
    let seen: Vec<(&str, &str, &str, &Value, u64)> = calls
        .iter()
        .map(|c| {
            (
                c["upstream"].as_str().expect("upstream"),
                c["model"].as_str().expect("model"),
                c["status"].as_str().expect("status"),
                &c["usage"],
                c["settled_nanos"].as_u64().expect("settled"),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            ("openai", "fake-ok", "ok", usages[0], 51_000_000),
            (
                "openai",
                "fake-usage-60-20-30-0",
                "ok",
                usages[1],
                20_330_000,
            ),
            ("openai", "fake-500", "error", &Value::Null, 0),
            ("anthropic", "fake-ok", "ok", usages[3], 51_000_000),
        ],
        "{h:#}"
    );
    assert_eq!(h["model_calls_total"], 4, "{h:#}");
    let refused = h["refused"].as_array().expect("refused");
    assert_eq!(refused.len(), 1, "{h:#}");
    assert_eq!(
        (
            &refused[0]["tool"],
            &refused[0]["reason"],
            &refused[0]["action"]
        ),
        (&json!("openai"), &json!("scope_violation"), &json!("stop")),
        "{h:#}"
    );
    assert_eq!(h["refused_total"], 1, "{h:#}");
    // The text a person reads says the same.
    let words = tally().ok(
        served.dir(),
        &[
            "handoff",
            "ledger",
            "--key",
            "ledger/ledger.pub",
            "--auditor-key",
            "auditor.key",
            "--run",
            "r",
        ],
        "",
    );
    assert!(
        words.contains("Model calls:")
            && words.contains("openai fake-usage-60-20-30-0: ok, 60 tokens in, 20 out")
            && words.contains("openai fake-500: error")
            && words.contains("Refused:")
            && words.contains("scope_violation, action stop"),
        "{words}"
    );
    let report = served.verifies_the_bill(&upstream, &prices_with_cached(), 0);
    assert_eq!(report["verdict"], "intact", "{report}");
}

/// [`prices`], and the cached model's.
fn prices_with_cached() -> Vec<(&'static str, Price)> {
    let mut p = prices();
    p.push((
        "fake-usage-60-20-30-0",
        Price {
            cached_input_per_mtok: 1_000_000_000,
            ..Price::usd(10, 1000)
        },
    ));
    p
}

/// A model's tool input may carry any key, serde_json's private marker among them
/// (`$serde_json::private::RawValue`, which serde_json's `Value` reader refuses where it
/// comes first in an object): the answer's usage is read all the same and the call
/// settles at it, plain and streamed, never held at its reservation as unknown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_marker_key_in_a_models_tool_input_leaves_the_call_settled_at_its_usage() {
    use tally_testkit::upstream::{Script, ToolCall};
    let upstream = FakeUpstream::start(FakeOptions::default());
    let marker = json!({"$serde_json::private::RawValue": 1});
    upstream.script(
        "fake-marker",
        Script {
            calls: vec![ToolCall {
                name: "f".to_owned(),
                input: marker,
            }],
            then: "done".to_owned(),
            usage: (100, 50),
        },
    );
    let dir = tempfile::tempdir().expect("dir");
    let mut text = policy(&upstream, 1000);
    text.push_str(
        "[prices.anthropic.\"fake-marker\"]\ninput_per_mtok = 10\noutput_per_mtok = \"1000\"\nmax_output_tokens = 100\n",
    );
    let mut served = Served::new(dir.path(), &text);
    let token = served.start_run("r").await;
    for stream in [false, true] {
        let body = json!({"model": "fake-marker", "max_tokens": 50, "stream": stream,
                          "tools": [{"name": "f", "input_schema": {"type": "object"}}],
                          "messages": [{"role": "user", "content": "go"}]});
        let r = call(
            served.proxy,
            "/anthropic/v1/messages",
            &[("x-api-key", &token)],
            body.to_string(),
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.text());
        // A stream sends the input as text (`input_json_delta`), the marker no key.
        assert!(
            stream || r.text().contains("serde_json::private::RawValue"),
            "{}",
            r.text()
        );
    }
    let st = served.settled("r").await;
    // 100 in at $10/M and 50 out at $1,000/M, twice: the upstream's usage.
    assert_eq!(st["settled_nanos"], 2 * 51_000_000, "{st}");
    let mut prices = prices();
    prices.push(("fake-marker", Price::usd(10, 1000)));
    served.verifies_the_bill(&upstream, &prices, 0);
}

//! OpenAI's Responses API (`/v1/responses`, the Agents SDK's default) end to end: a call
//! settles what the response's usage reports, plain or streamed (its last event:
//! `response.completed`, `response.incomplete`, `response.failed`); the limit the proxy
//! sets is `max_output_tokens`, never `max_tokens`; a stream that ends before its last
//! event, or a failed one without usage, stays held.

use super::*;

/// 300 input tokens, 120 of them read from the cache; 80 output tokens, 30 of them
/// reasoning (part of the output, as the Responses API counts them).
const CACHED: &str = "fake-usage-300-80-120-30";

/// [`policy`] with `/v1/responses` allowed on `openai`, and prices for [`CACHED`] (the
/// cached input at $1 per million) and for the failing models.
fn responses_policy(upstream: &FakeUpstream, spend_cents: u64) -> String {
    let mut text = policy(upstream, spend_cents).replacen(
        "paths = [\"/v1/chat/completions\"]",
        "paths = [\"/v1/chat/completions\", \"/v1/responses\"]",
        1,
    );
    text.push_str(&format!(
        "[prices.openai.\"{CACHED}\"]\ninput_per_mtok = 10\noutput_per_mtok = \"1000\"\n\
         cached_input_per_mtok = 1\nmax_output_tokens = 100\n"
    ));
    for model in ["fake-failed", "fake-failed-100-7"] {
        text.push_str(&format!(
            "[prices.openai.\"{model}\"]\ninput_per_mtok = 10\noutput_per_mtok = \"1000\"\nmax_output_tokens = 100\n"
        ));
    }
    text
}

/// [`prices`], and [`responses_policy`]'s.
fn responses_prices() -> Vec<(&'static str, Price)> {
    let mut p = prices();
    p.push((
        CACHED,
        Price {
            cached_input_per_mtok: 1_000_000_000,
            ..Price::usd(10, 1000)
        },
    ));
    p.push(("fake-failed", Price::usd(10, 1000)));
    p.push(("fake-failed-100-7", Price::usd(10, 1000)));
    p
}

/// A Responses request for `model` with `extra` members.
fn response(model: &str, extra: Value) -> Vec<u8> {
    let mut v = json!({"model": model, "input": PROMPT});
    if let (Some(o), Some(e)) = (v.as_object_mut(), extra.as_object()) {
        o.extend(e.clone());
    }
    v.to_string().into_bytes()
}

const PATH: &str = "/openai/v1/responses";

/// The run's outcomes, in order, as the ledger holds them (the daemon stopped).
fn outcomes(served: &Served, run: &str) -> Vec<Value> {
    served
        .decisions(run)
        .into_iter()
        .map(|d| d["decision"].clone())
        .filter(|d| d["kind"] == "outcome")
        .collect()
}

// Plain and streamed, a call settles what its usage reports: the input less its cached
// part at the input price, the cached part at the cached price, the output (reasoning
// included) at the output price; a call with no limit is sent `max_output_tokens`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_settles_its_usage_plain_and_streamed_and_is_sent_max_output_tokens() {
    let upstream = FakeUpstream::start(FakeOptions::default());
    let dir = tempfile::tempdir().expect("dir");
    let mut served = Served::new(dir.path(), &responses_policy(&upstream, 1000));
    let token = served.start_run("r").await;
    let auth = bearer(&token);
    let h = [("authorization", auth.as_str())];
    let a = call(
        served.proxy,
        PATH,
        &h,
        response(CACHED, json!({"max_output_tokens": 100})),
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.text());
    let v = a.json();
    assert_eq!(
        (
            &v["status"],
            &v["usage"]["input_tokens_details"]["cached_tokens"]
        ),
        (&json!("completed"), &json!(120)),
        "{v}"
    );
    let a = call(
        served.proxy,
        PATH,
        &h,
        response(CACHED, json!({"max_output_tokens": 100, "stream": true})),
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.text());
    let text = a.text();
    assert!(
        text.contains("event: response.completed") && text.contains("\"reasoning_tokens\":30"),
        "the stream passes through to its last event: {text}"
    );
    // No limit: the proxy sets one, in the Responses API's field only.
    for stream in [false, true] {
        let a = call(
            served.proxy,
            PATH,
            &h,
            response("fake-ok", json!({"stream": stream})),
        )
        .await;
        assert_eq!(a.status, 200, "{}", a.text());
    }
    let st = served.settled("r").await;
    // 180 input tokens at $10/M, 120 cached at $1/M, 80 output at $1,000/M; and fake-ok's
    // 100 in, 50 out, twice.
    let cached_call = 180 * 10_000 + 120 * 1_000 + 80 * 1_000_000;
    assert_eq!(
        st["settled_nanos"],
        2 * cached_call + 2 * 51_000_000,
        "{st}"
    );
    let seen = upstream.seen();
    assert_eq!(seen.len(), 4, "{seen:?}");
    for s in &seen[2..] {
        assert_eq!(s.limit_fields, ["max_output_tokens"], "{s:?}");
        // The model's own limit: the run's budget pays for more.
        assert_eq!(s.max_tokens, Some(100), "{s:?}");
        assert!(s.stream_options.is_none(), "{s:?}");
    }
    served.verifies_the_bill(&upstream, &responses_prices(), 0);
    let usages: Vec<Value> = outcomes(&served, "r")
        .iter()
        .map(|o| o["usage"].clone())
        .collect();
    let cached = json!({"input_tokens": 180, "cached_tokens": 120, "output_tokens": 80});
    let ok = json!({"input_tokens": 100, "output_tokens": 50});
    assert_eq!(usages, [cached.clone(), cached, ok.clone(), ok]);
}

// A response cut at its limit ends `incomplete` (a stream: `response.incomplete`) and
// settles the usage it reports; a stream cut before its last event, and one that ends
// `response.failed` without usage, settle nothing and stay held (`unknown`); a failed
// one that reports usage settles it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn incomplete_and_failed_responses_settle_their_usage_and_a_cut_stream_stays_held() {
    let upstream = FakeUpstream::start(FakeOptions::default());
    let dir = tempfile::tempdir().expect("dir");
    let mut served = Served::new(dir.path(), &responses_policy(&upstream, 1000));
    let token = served.start_run("r").await;
    let auth = bearer(&token);
    let h = [("authorization", auth.as_str())];
    // 20 of fake-ok's 50 output tokens: cut at the limit.
    let a = call(
        served.proxy,
        PATH,
        &h,
        response("fake-ok", json!({"max_output_tokens": 20})),
    )
    .await;
    let v = a.json();
    assert_eq!(
        (&v["status"], &v["incomplete_details"]["reason"]),
        (&json!("incomplete"), &json!("max_output_tokens")),
        "{v}"
    );
    let a = call(
        served.proxy,
        PATH,
        &h,
        response("fake-ok", json!({"max_output_tokens": 20, "stream": true})),
    )
    .await;
    let text = a.text();
    assert!(
        text.contains("event: response.incomplete") && !text.contains("response.completed"),
        "{text}"
    );
    let a = call(
        served.proxy,
        PATH,
        &h,
        response(
            "fake-failed-100-7",
            json!({"max_output_tokens": 20, "stream": true}),
        ),
    )
    .await;
    assert!(a.text().contains("event: response.failed"), "{}", a.text());
    // Two incomplete calls (100 in, 20 out) and the failed one's 100 in, 7 out.
    let st = served.settled("r").await;
    let settled = 2 * (100 * 10_000 + 20 * 1_000_000) + 100 * 10_000 + 7 * 1_000_000;
    assert_eq!(st["settled_nanos"], settled, "{st}");
    // Held: a failed response with no usage, a stream cut before its last event.
    for model in ["fake-failed", "fake-cut"] {
        let a = call(
            served.proxy,
            PATH,
            &h,
            response(model, json!({"max_output_tokens": 20, "stream": true})),
        )
        .await;
        assert_eq!(a.status, 200, "{model}: {}", a.text());
        if model == "fake-failed" {
            assert!(a.text().contains("event: response.failed"), "{}", a.text());
        } else {
            assert!(a.cut, "the client sees the cut: {}", a.text());
        }
    }
    let st = served.standing("r").await;
    assert_eq!(st["settled_nanos"], settled, "{st}");
    assert!(st["held_nanos"].as_u64() >= Some(2 * 20_000_000), "{st}");
    served.verifies_the_bill(&upstream, &responses_prices(), 0);
    let ends: Vec<(Value, Value)> = outcomes(&served, "r")
        .iter()
        .map(|o| (o["status"].clone(), o["settled_nanos"].clone()))
        .collect();
    assert_eq!(
        ends,
        [
            (json!("ok"), json!(21_000_000)),
            (json!("ok"), json!(21_000_000)),
            (json!("ok"), json!(8_000_000)),
            (json!("unknown"), Value::Null),
            (json!("unknown"), Value::Null),
        ]
    );
}

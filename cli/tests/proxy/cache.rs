use super::*;

/// Anthropic's cache writes at their own prices: $3 per million input, $3.75 written to
/// the 5-minute cache, $6 to the 1-hour cache, $15 output; and a model whose cache
/// writes have no price (with an alias that reports none).
fn cache_policy(upstream: &FakeUpstream) -> String {
    let mut text = policy(upstream, 1000);
    text.push_str(
        r#"
[prices.anthropic."fake-usage-10-5-1000-400"]
input_per_mtok = "3"
cache_write_per_mtok = "3.75"
cache_write_1h_per_mtok = "6"
output_per_mtok = "15"
max_output_tokens = 100

[prices.anthropic."fake-usage-10-5-1000-0"]
aliases = ["fake-usage-10-5-0-0"]
input_per_mtok = "3"
output_per_mtok = "15"
max_output_tokens = 100
"#,
    );
    text
}

/// A message long enough (over 2,000 bytes) that the usage reported fits its worst case;
/// its system prompt marked for the 1-hour cache when `cached`.
fn message(model: &str, stream: bool, cached: bool) -> Vec<u8> {
    let mut m = json!({"model": model, "max_tokens": 5, "stream": stream,
           "messages": [{"role": "user", "content": "cached context ".repeat(150)}]});
    if cached {
        m["system"] = json!([{"type": "text", "text": "you are",
                              "cache_control": {"type": "ephemeral", "ttl": "1h"}}]);
    }
    m.to_string().into_bytes()
}

// The cache writes this test's upstream reports are made possible by the body's
// `cache_control` markers: a marked request reserves its input at the 1-hour write
// rate, an unmarked one at the input rate, and a marker with no write price is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_writes_settle_at_their_own_price_and_unpriced_markers_are_refused() {
    let upstream = FakeUpstream::start(FakeOptions::default());
    let dir = tempfile::tempdir().expect("dir");
    let mut served = Served::new(dir.path(), &cache_policy(&upstream));
    let token = served.start_run("c").await;
    let h = [("x-api-key", token.as_str())];
    // 10 in, 600 written (5 min), 400 written (1 h), 5 out, to the nanodollar:
    // 10 x 3,000 + 600 x 3,750 + 400 x 6,000 + 5 x 15,000.
    let one = 30_000 + 2_250_000 + 2_400_000 + 75_000;
    for (i, stream) in [false, true].into_iter().enumerate() {
        let a = call(
            served.proxy,
            "/anthropic/v1/messages",
            &h,
            message("fake-usage-10-5-1000-400", stream, true),
        )
        .await;
        assert_eq!(a.status, 200, "{}", a.text());
        let st = served.settled("c").await;
        assert_eq!(
            st["settled_nanos"],
            one * (i as u64 + 1),
            "stream {stream}: {st}"
        );
    }
    // What the upstream billed for the two, to the nanodollar.
    let cached = Price {
        input_per_mtok: 3_000_000_000,
        cache_write_per_mtok: 3_750_000_000,
        cache_write_1h_per_mtok: 6_000_000_000,
        output_per_mtok: 15_000_000_000,
        ..Price::default()
    };
    // A cache marker on a model whose cache writes have no price: refused, named,
    // recorded, and nothing forwarded.
    let seen = upstream.seen().len();
    let a = call(
        served.proxy,
        "/anthropic/v1/messages",
        &h,
        message("fake-usage-10-5-1000-0", false, true),
    )
    .await;
    assert_eq!(a.status, 402, "{}", a.text());
    let v = a.json();
    assert_eq!(v["tally"]["reason"], "scope_violation", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("`cache_control`") && m.contains("cache_write_1h_per_mtok")),
        "{v}"
    );
    assert_eq!(upstream.seen().len(), seen, "never forwarded");
    // Unmarked, the same model is reserved at the input rate.
    let a = call(
        served.proxy,
        "/anthropic/v1/messages",
        &h,
        message("fake-usage-10-5-0-0", false, false),
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.text());
    let st = served.settled("c").await;
    assert_eq!(st["held_nanos"], 0, "{st}");
    let unmarked = Price {
        input_per_mtok: 3_000_000_000,
        output_per_mtok: 15_000_000_000,
        ..Price::default()
    };
    let p = [
        ("fake-usage-10-5-1000-400", cached),
        ("fake-usage-10-5-0-0", unmarked),
    ];
    // The two marked calls, and the unmarked one: 10 x 3,000 + 5 x 15,000.
    assert_eq!(
        tally_testkit::upstream::bill(&[&upstream], &p),
        2 * one + 105_000
    );
    served.verifies_the_bill(&upstream, &p, 0);
    let decisions = served.decisions("c");
    let reserved: Vec<u64> = decisions
        .iter()
        .filter(|d| d["decision"]["kind"] == "allow")
        .map(|d| d["decision"]["reserve_nanos"].as_u64().expect("reserved"))
        .collect();
    let settled: Vec<u64> = decisions
        .iter()
        .filter(|d| d["decision"]["kind"] == "outcome")
        .map(|d| d["decision"]["settled_nanos"].as_u64().expect("settled"))
        .collect();
    assert_eq!(
        settled,
        [one, one, 10 * 3_000 + 5 * 15_000],
        "{decisions:?}"
    );
    assert_eq!(reserved.len(), 3);
    // The marked reservations bound a prompt written to the 1-hour cache whole; the
    // unmarked one is its bytes at the input price and its output.
    let marked = message("x", false, true).len() as u64;
    assert!(reserved[0] >= marked * 6_000);
    let plain = message("fake-usage-10-5-0-0", false, false).len() as u64;
    assert!(
        reserved[2] < (plain + 40) * 3_000 + 5 * 15_000,
        "{reserved:?}"
    );
    assert!(reserved[2] >= plain * 3_000 + 5 * 15_000, "{reserved:?}");
}

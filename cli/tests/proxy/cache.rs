use super::*;

/// Anthropic's cache writes at their own prices: $3 per million input, $3.75 written to
/// the 5-minute cache, $6 to the 1-hour cache, $15 output; and a model whose cache
/// writes have no price.
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
input_per_mtok = "3"
output_per_mtok = "15"
max_output_tokens = 100
"#,
    );
    text
}

/// A message long enough (over 2,000 bytes) that the usage reported fits its worst case.
fn message(model: &str, stream: bool) -> Vec<u8> {
    json!({"model": model, "max_tokens": 5, "stream": stream,
           "messages": [{"role": "user", "content": "cached context ".repeat(150)}]})
    .to_string()
    .into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_writes_settle_at_their_own_price_and_unpriced_ones_at_the_reservation() {
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
            message("fake-usage-10-5-1000-400", stream),
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
    let price = Price {
        input_per_mtok: 3_000_000_000,
        cache_write_per_mtok: 3_750_000_000,
        cache_write_1h_per_mtok: 6_000_000_000,
        output_per_mtok: 15_000_000_000,
        ..Price::default()
    };
    assert_bill(&upstream, &[("fake-usage-10-5-1000-400", price)], 2 * one);
    // Cache writes with no price: not guessed; the call settles at what was reserved.
    let a = call(
        served.proxy,
        "/anthropic/v1/messages",
        &h,
        message("fake-usage-10-5-1000-0", false),
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.text());
    let st = served.settled("c").await;
    assert_eq!(st["held_nanos"], 0, "{st}");
    let third = st["settled_nanos"].as_u64().expect("settled") - 2 * one;
    served.verifies();
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
    assert_eq!(settled, [one, one, third], "{decisions:?}");
    assert_eq!(reserved.len(), 3);
    assert_eq!(
        third, reserved[2],
        "unpriced cache writes settle at the reservation"
    );
    // The plain input price would have settled 1,010 input tokens at $3: below the bill.
    assert!(third > 1_010 * 3_000 + 5 * 15_000);
    // The reservation bounds a prompt written to the 1-hour cache whole.
    assert!(reserved[0] >= (message("x", false).len() as u64) * 6_000);
}

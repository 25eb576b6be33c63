use super::*;

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
    let st = served.settled("b").await;
    let prices = [("fake-bill-tools-500-0", Price::usd(10, 1000))];
    // 600 input and 50 output tokens: $0.006 + $0.05.
    assert_eq!(upstream.billed()[0].input, 600);
    assert_bill(
        &upstream,
        &prices,
        st["settled_nanos"].as_u64().expect("settled"),
    );
    let a = call(
        served.proxy,
        "/anthropic/v1/messages",
        &[("x-api-key", &token)],
        body.to_string().into_bytes(),
    )
    .await;
    assert_eq!(
        a.status,
        403,
        "after an overrun no call is allowed: {}",
        a.text()
    );
    assert_eq!(upstream.seen().len(), 1);
    served.verifies();
}

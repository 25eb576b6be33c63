//! What images and billing tiers cost: reserved at their worst case, settled at what the
//! upstream bills, the bill and the ledger equal to the nanodollar.

use super::*;

/// $3 per million in, $15 out: `fake-images-1000` (1,000 tokens an image, bounded at
/// 1,600), and one with no image_tokens.
fn image_policy(upstream: &FakeUpstream) -> String {
    let mut text = policy(upstream, 1000);
    text.push_str(
        r#"
[prices.anthropic."fake-images-1000"]
input_per_mtok = "3"
output_per_mtok = "15"
max_output_tokens = 100
image_tokens = 1600

[prices.anthropic."fake-images-999"]
input_per_mtok = "3"
output_per_mtok = "15"
max_output_tokens = 100
"#,
    );
    text
}

/// Claude Code's turn after a `Read` of a PNG: an image in a message and one in a tool
/// result, each 40,000 bytes of base64.
fn with_images(model: &str, stream: bool) -> Vec<u8> {
    let image = json!({"type": "image", "source": {"type": "base64", "media_type": "image/png",
                       "data": "iVBORw0K".repeat(5000)}});
    json!({"model": model, "max_tokens": 100, "stream": stream, "messages": [
        {"role": "user", "content": [image.clone(), {"type": "text", "text": "and this file?"}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "Read", "input": {"file_path": "a.png"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [image]}]}]})
    .to_string()
    .into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn images_reserve_image_tokens_each_and_settle_what_the_upstream_bills() {
    let upstream = FakeUpstream::start(FakeOptions::default());
    let dir = tempfile::tempdir().expect("dir");
    let mut served = Served::new(dir.path(), &image_policy(&upstream));
    let token = served.start_run("i").await;
    let h = [("x-api-key", token.as_str())];
    // 100 + 2 x 1,000 in, 50 out.
    let one = 2_100 * 3_000 + 50 * 15_000;
    for (i, stream) in [false, true].into_iter().enumerate() {
        let a = call(
            served.proxy,
            "/anthropic/v1/messages",
            &h,
            with_images("fake-images-1000", stream),
        )
        .await;
        assert_eq!(a.status, 200, "{}", a.text());
        let st = served.settled("i").await;
        assert_eq!(st["settled_nanos"], one * (i as u64 + 1), "{st}");
    }
    // No image_tokens: refused, naming the image, never forwarded.
    let seen = upstream.seen().len();
    let a = call(
        served.proxy,
        "/anthropic/v1/messages",
        &h,
        with_images("fake-images-999", false),
    )
    .await;
    assert_eq!(a.status, 402, "{}", a.text());
    let v = a.json();
    assert_eq!(v["tally"]["reason"], "scope_violation", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("`messages[0].content[0]`") && m.contains("image_tokens")),
        "{v}"
    );
    assert_eq!(upstream.seen().len(), seen, "never forwarded");
    let p = [("fake-images-1000", Price::usd(3, 15))];
    served.verifies_the_bill(&upstream, &p, 0);
    // Reserved at the text's bytes and 1,600 an image, not at the images' 80,000 bytes.
    let reserved: Vec<u64> = served
        .decisions("i")
        .iter()
        .filter(|d| d["decision"]["kind"] == "allow")
        .map(|d| d["decision"]["reserve_nanos"].as_u64().expect("reserved"))
        .collect();
    let text = with_images("fake-images-1000", false).len() as u64 - 80_000;
    for r in &reserved {
        assert!(*r >= (text + 3_200) * 3_000 + 100 * 15_000, "{reserved:?}");
        assert!(*r < (text + 3_300) * 3_000 + 100 * 15_000, "{reserved:?}");
    }
    assert_eq!(reserved.len(), 2);
}

/// $1 in, $2 out at the default tier; flex at half, priority at double.
fn tier_policy(upstream: &FakeUpstream) -> String {
    let mut text = policy(upstream, 1000);
    text.push_str(
        r#"
[prices.openai."fake-tier-priority"]
input_per_mtok = "1"
output_per_mtok = "2"
max_output_tokens = 100

[prices.openai."fake-tier-priority".tiers.flex]
input_per_mtok = "0.5"
output_per_mtok = "1"

[prices.openai."fake-tier-priority".tiers.priority]
input_per_mtok = "2"
output_per_mtok = "4"
"#,
    );
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_tier_settles_at_the_rates_of_the_tier_that_served_it() {
    let upstream = FakeUpstream::start(FakeOptions::default());
    let dir = tempfile::tempdir().expect("dir");
    let mut served = Served::new(dir.path(), &tier_policy(&upstream));
    let token = served.start_run("t").await;
    let h = [("authorization", format!("Bearer {token}"))];
    let h: Vec<(&str, &str)> = h.iter().map(|(k, v)| (*k, v.as_str())).collect();
    // 100 in, 50 out at each tier: (tier asked, stream, what it settles at).
    let cases = [
        (None, false, 100 * 2_000 + 50 * 4_000),
        (None, true, 100 * 2_000 + 50 * 4_000),
        (Some("auto"), false, 100 * 2_000 + 50 * 4_000),
        (Some("flex"), false, 100 * 500 + 50 * 1_000),
        (Some("default"), true, 100 * 1_000 + 50 * 2_000),
    ];
    let mut total = 0;
    for (tier, stream, cost) in cases {
        let mut body = json!({"model": "fake-tier-priority", "max_tokens": 100, "stream": stream,
                              "messages": [{"role": "user", "content": "hi"}]});
        if let Some(t) = tier {
            body["service_tier"] = json!(t);
        }
        let a = call(
            served.proxy,
            "/openai/v1/chat/completions",
            &h,
            body.to_string().into_bytes(),
        )
        .await;
        assert_eq!(a.status, 200, "{tier:?}: {}", a.text());
        total += cost;
        let st = served.settled("t").await;
        assert_eq!(st["settled_nanos"], total, "{tier:?} stream {stream}: {st}");
    }
    // A tier the price has no rates for: refused before the upstream.
    let a = call(
        served.proxy,
        "/openai/v1/chat/completions",
        &h,
        json!({"model": "fake-tier-priority", "service_tier": "scale", "messages": []})
            .to_string()
            .into_bytes(),
    )
    .await;
    assert_eq!(a.status, 403, "{}", a.text());
    let v = a.json();
    assert_eq!(v["error"]["code"], "scope_violation", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("`service_tier`")),
        "{v}"
    );
    let usd = tally_record::money::NANOS_PER_DOLLAR;
    let p = [
        ("fake-tier-priority", Price::usd(1, 2)),
        (
            "fake-tier-priority@flex",
            Price {
                input_per_mtok: usd / 2,
                output_per_mtok: usd,
                ..Price::default()
            },
        ),
        ("fake-tier-priority@priority", Price::usd(2, 4)),
    ];
    served.verifies_the_bill(&upstream, &p, 0);
    // `auto` (or none) reserved at priority's rates, flex at its own.
    let reserved: Vec<u64> = served
        .decisions("t")
        .iter()
        .filter(|d| d["decision"]["kind"] == "allow")
        .map(|d| d["decision"]["reserve_nanos"].as_u64().expect("reserved"))
        .collect();
    assert_eq!(reserved.len(), 5);
    assert!(
        reserved[0] >= 100 * 4_000 && reserved[2] >= 100 * 4_000,
        "{reserved:?}"
    );
    assert!(
        reserved[3] < reserved[4] && reserved[4] < reserved[2],
        "{reserved:?}"
    );
}

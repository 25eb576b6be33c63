//! Bedrock Converse: the body read strictly, the output limit injected in
//! `inferenceConfig.maxTokens`, what no price covers refused, and the usage as AWS
//! bills it (a body's `usage`, a stream's `metadata` event).

use super::*;
use crate::usage::{from_body, Reported, StreamUsage, Usage};
use tally_policy::ModelPrice;
use tally_record::money::Nanos;

fn converse(body: &str) -> Result<ModelRequest, RequestError> {
    parse_named(
        Endpoint::Converse,
        Some("anthropic.claude-3-5-haiku-20241022-v1:0"),
        body.as_bytes(),
    )
}

fn price() -> ModelPrice {
    ModelPrice {
        max_output_tokens: 1000,
        cache_write_per_mtok: Some(Nanos(1_250_000_000)),
        image_tokens: Some(1600),
        ..ModelPrice::new(Nanos(1_000_000_000), Nanos(5_000_000_000))
    }
}

const HI: &str = r#"{"messages":[{"role":"user","content":[{"text":"hi"}]}]"#;

#[test]
fn the_limit_is_read_capped_and_injected_in_inference_config() {
    let r = converse(&format!(
        r#"{HI},"inferenceConfig":{{"maxTokens":50,"temperature":0.5}}}}"#
    ))
    .expect("reads");
    assert_eq!((r.max_tokens, r.choices, r.stream), (Some(50), 1, false));
    let p = r
        .price(&price(), Nanos(u64::MAX / 2), false)
        .expect("priced");
    let body: serde_json::Value = serde_json::from_slice(&p.body).expect("json");
    assert_eq!(body["inferenceConfig"]["maxTokens"], 50);
    assert_eq!(body["inferenceConfig"]["temperature"], 0.5);
    // None given: what the budget pays (here the model's limit), set in the request.
    let r = converse(&format!("{HI}}}")).expect("reads");
    let p = r
        .price(&price(), Nanos(u64::MAX / 2), false)
        .expect("priced");
    assert!(p.injected);
    let body: serde_json::Value = serde_json::from_slice(&p.body).expect("json");
    assert_eq!(body["inferenceConfig"]["maxTokens"], 1000);
    assert_eq!(p.worst.0, p.input_bound * 1000 + 1000 * 5000);
    // A stream reads the same.
    let s = parse_named(
        Endpoint::ConverseStream,
        Some("m"),
        format!("{HI}}}").as_bytes(),
    )
    .expect("reads");
    assert!(s.stream);
}

#[test]
fn images_and_cache_points_are_priced_and_what_no_price_covers_refused() {
    let img = r#"{"messages":[{"role":"user","content":[{"image":{"format":"png","source":{"bytes":"AAAAAAAAAAAAAAAA"}}},{"cachePoint":{"type":"default"}}]}],"system":[{"text":"s"},{"cachePoint":{"type":"default"}}],"toolConfig":{"tools":[{"toolSpec":{"name":"t","inputSchema":{"json":{}}}}]}}"#;
    let r = converse(img).expect("reads");
    assert_eq!((r.images.count, r.images.data_bytes), (1, 16));
    assert_eq!(r.cache, CacheMark::FiveMinutes);
    assert!(r.tools);
    for (body, field) in [
        (format!(r#"{HI},"guardrailConfig":{{}}}}"#), "guardrailConfig"),
        (
            format!(r#"{HI},"additionalModelRequestFields":{{"max_tokens":99999}}}}"#),
            "additionalModelRequestFields",
        ),
        (format!(r#"{HI},"promptVariables":{{}}}}"#), "promptVariables"),
        (format!(r#"{HI},"modelId":"x"}}"#), "modelId"),
        (format!(r#"{HI},"inferenceConfig":{{"max_tokens":5}}}}"#), "inferenceConfig.max_tokens"),
        (
            format!(r#"{HI},"performanceConfig":{{"latency":"optimized"}}}}"#),
            "performanceConfig",
        ),
        (
            r#"{"messages":[{"role":"user","content":[{"document":{"format":"pdf","name":"d","source":{"bytes":"AA"}}}]}]}"#.into(),
            "messages[0].content[0].document",
        ),
        (
            r#"{"messages":[{"role":"user","content":[{"video":{}}]}]}"#.into(),
            "messages[0].content[0].video",
        ),
        (
            r#"{"messages":[{"role":"user","content":[{"image":{"format":"png","source":{"s3Location":{"uri":"s3://b/k"}}}}]}]}"#.into(),
            "messages[0].content[0].image",
        ),
        (
            r#"{"messages":[{"role":"user","content":[{"guardContent":{"text":{"text":"x"}}}]}]}"#.into(),
            "messages[0].content[0].guardContent",
        ),
        (
            r#"{"messages":[{"role":"user","content":[{"text":"a","image":{}}]}]}"#.into(),
            "messages[0].content[0]",
        ),
        (
            r#"{"messages":[{"role":"user","content":[{"cachePoint":{"type":"default","ttl":"1h"}}]}]}"#.into(),
            "cachePoint",
        ),
        (
            r#"{"messages":[],"toolConfig":{"tools":[{"systemTool":{"name":"nova_grounding"}}]}}"#.into(),
            "systemTool",
        ),
        (
            r#"{"messages":[{"role":"user","content":[{"toolResult":{"toolUseId":"t","content":[{"document":{}}]}}]}]}"#.into(),
            "document",
        ),
    ] {
        let e = converse(&body).expect_err(&body);
        assert!(e.to_string().contains(field), "{field}: {e}");
    }
    for (body, field) in [
        (
            format!(r#"{HI},"inferenceConfig":{{"maxTokens":0}}}}"#),
            "maxTokens",
        ),
        (
            format!(r#"{HI},"inferenceConfig":{{"maxTokens":"5"}}}}"#),
            "maxTokens",
        ),
        (
            format!(r#"{HI},"inferenceConfig":{{"maxTokens":5,"maxTokens":9}}}}"#),
            "JSON",
        ),
    ] {
        let e = converse(&body).expect_err(&body);
        assert!(e.to_string().contains(field), "{field}: {e}");
    }
    // An image with no image_tokens in the price, a cache point with no write price.
    let r = converse(img).expect("reads");
    let no_images = ModelPrice {
        image_tokens: None,
        ..price()
    };
    assert!(r.price(&no_images, Nanos(u64::MAX / 2), false).is_err());
    let no_writes = ModelPrice {
        cache_write_per_mtok: None,
        ..price()
    };
    assert!(r.price(&no_writes, Nanos(u64::MAX / 2), false).is_err());
}

#[test]
fn usage_is_read_from_the_body_and_the_streams_metadata_event() {
    let b = br#"{"output":{"message":{"role":"assistant","content":[{"text":"hi"}]}},"stopReason":"end_turn",
        "usage":{"inputTokens":4,"outputTokens":32,"cacheReadInputTokens":10,"cacheWriteInputTokens":1222,"totalTokens":1268}}"#;
    let want = Usage {
        input: 4,
        cached: 10,
        written: 1222,
        output: 32,
        ..Usage::default()
    };
    assert_eq!(from_body(Endpoint::Converse, b), Reported::Usage(want));
    for bad in [
        r#"{"usage":{"inputTokens":4,"outputTokens":32,"totalTokens":37}}"#,
        r#"{"usage":{"inputTokens":-4,"outputTokens":32}}"#,
        r#"{"usage":{"outputTokens":32}}"#,
        r#"{"usage":{"inputTokens":4,"outputTokens":1.5}}"#,
    ] {
        assert!(
            matches!(
                from_body(Endpoint::Converse, bad.as_bytes()),
                Reported::Implausible(_)
            ),
            "{bad}"
        );
    }
    assert_eq!(from_body(Endpoint::Converse, b"{}"), Reported::Missing);
    let mut s = StreamUsage::new(Endpoint::ConverseStream);
    s.frame("messageStart", br#"{"role":"assistant"}"#);
    s.frame("messageStop", br#"{"stopReason":"end_turn"}"#);
    assert_eq!(s.reported(), Reported::Missing, "no metadata yet");
    s.frame(
        "metadata",
        br#"{"usage":{"inputTokens":4,"outputTokens":32,"cacheReadInputTokens":10,"cacheWriteInputTokens":1222,"totalTokens":1268},"metrics":{"latencyMs":9}}"#,
    );
    assert_eq!(s.reported(), Reported::Usage(want));
    let mut s = StreamUsage::new(Endpoint::ConverseStream);
    s.frame("metadata", b"not json");
    assert!(matches!(s.reported(), Reported::Implausible(_)));
}

#[test]
fn bedrock_ids_are_priced_by_their_version_and_geography_rules() {
    let policy = tally_policy::Policy::from_toml(
        r#"
[ceiling]
spend_cents = 100

[upstreams.bedrock]
url = "https://bedrock-runtime.us-east-1.amazonaws.com"
kind = "bedrock"
credential = "aws"
aws_region = "us-east-1"
paths = ["/model"]

[prices.bedrock."anthropic.claude-3-5-haiku"]
input_per_mtok = "0.8"
output_per_mtok = "4"

[prices.bedrock."us.anthropic.claude-3-5-sonnet-20241022-v2:0"]
input_per_mtok = "3.3"
output_per_mtok = "16.5"

[prices.bedrock."anthropic.claude-3-5-sonnet"]
input_per_mtok = "3"
output_per_mtok = "15"
aliases = ["arn:aws:bedrock:us-east-1:123456789012:application-inference-profile/abc123"]
"#,
    )
    .expect("policy");
    let input = |id: &str| {
        policy
            .prices
            .priced(tally_policy::UpstreamKind::Bedrock, "bedrock", id)
            .map(|p| p.input_per_mtok.0)
    };
    for id in [
        "anthropic.claude-3-5-haiku",
        "anthropic.claude-3-5-haiku-20241022",
        "anthropic.claude-3-5-haiku-20241022-v1:0",
        "us.anthropic.claude-3-5-haiku-20241022-v1:0",
        "global.anthropic.claude-3-5-haiku-20241022-v1:0",
        "arn:aws:bedrock:us-east-1::foundation-model/anthropic.claude-3-5-haiku-20241022-v1:0",
        "arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.anthropic.claude-3-5-haiku-20241022-v1:0",
    ] {
        assert_eq!(input(id), Some(800_000_000), "{id}");
    }
    // A profile priced by its own id wins over the base model's price.
    assert_eq!(
        input("us.anthropic.claude-3-5-sonnet-20241022-v2:0"),
        Some(3_300_000_000)
    );
    assert_eq!(
        input("eu.anthropic.claude-3-5-sonnet-20241022-v2:0"),
        Some(3_000_000_000)
    );
    assert_eq!(
        input("arn:aws:bedrock:us-east-1:123456789012:application-inference-profile/abc123"),
        Some(3_000_000_000)
    );
    for id in [
        "anthropic.claude-3-5-haiku-20241022-v1:0:200k",
        "xx.anthropic.claude-3-5-haiku-20241022-v1:0",
        "anthropic.claude-3-5-haiku-2024102-v1:0",
        "arn:aws:bedrock:us-east-1:123456789012:application-inference-profile/other",
        "amazon.nova-pro-v1:0",
    ] {
        assert_eq!(input(id), None, "{id}");
    }
}

//! Gemini and Azure OpenAI: the route read from the path (one spelling, crafted names
//! refused), the body read strictly, the worst case, and the usage as Google bills it.

use super::*;
use crate::endpoint::{api_version_allowed, Routed};
use crate::usage::{from_body, Reported, StreamUsage, Usage};
use tally_policy::{ModelPrice, UpstreamKind};
use tally_record::money::{per_million, Nanos};

const G: UpstreamKind = UpstreamKind::Gemini;
const AZ: UpstreamKind = UpstreamKind::AzureOpenai;

fn gemini(body: &str) -> Result<ModelRequest, RequestError> {
    parse_named(
        Endpoint::GenerateContent,
        Some("gemini-2.5-flash"),
        body.as_bytes(),
    )
}

#[test]
fn a_gemini_model_in_the_path_has_one_spelling() {
    let ok = Routed::of(G, "/v1beta/models/gemini-2.5-flash:generateContent").expect("routed");
    assert_eq!(ok.endpoint, Endpoint::GenerateContent);
    assert_eq!(ok.named.as_deref(), Some("gemini-2.5-flash"));
    let s = Routed::of(G, "/v1/models/gemini-2.0-flash-001:streamGenerateContent").expect("v1");
    assert_eq!(s.endpoint, Endpoint::StreamGenerateContent);
    for off in [
        "/v1beta/models/gemini-2.5-flash:generateContent:streamGenerateContent",
        "/v1beta/models/gemini-2.5-flash:streamGenerateContent:generateContent",
        "/v1beta/models/gemini-2.5-flash:countTokens",
        "/v1beta/models/gemini-2.5-flash:embedContent",
        "/v1beta/models/gemini-2.5-flash",
        "/v1beta/models/:generateContent",
        "/v1beta/models/Gemini-2.5-Flash:generateContent",
        "/v1beta/models/a/b:generateContent",
        "/v1beta/models/..:generateContent",
        "/v1beta/models/.x:generateContent",
        "/v1beta/models/x..y:generateContent",
        "/v1beta/models/x.:generateContent",
        "/v1beta/models/x%2Fy:generateContent",
        "/v1beta/models/x@y:generateContent",
        "/v1beta/models/x y:generateContent",
        "/v1beta/models/x;y:generateContent",
        "/v1beta/tunedModels/x:generateContent",
        "/v1beta/models/x:generateContent/",
        "/v2/models/x:generateContent",
    ] {
        assert_eq!(Routed::of(G, off), None, "{off}");
    }
    assert_eq!(
        Routed::of(
            G,
            &format!("/v1beta/models/{}:generateContent", "a".repeat(129))
        ),
        None
    );
    // The query: none, and Gemini's stream exactly `alt=sse`.
    assert!(Endpoint::GenerateContent.query_allowed(None));
    assert!(Endpoint::StreamGenerateContent.query_allowed(Some("alt=sse")));
    for q in [
        Some("key=AIza"),
        Some("alt=sse&key=x"),
        Some("key=x&alt=sse"),
        Some("alt=json"),
        None,
    ] {
        assert!(!Endpoint::StreamGenerateContent.query_allowed(q), "{q:?}");
    }
    assert!(!Endpoint::GenerateContent.query_allowed(Some("alt=sse")));
}

#[test]
fn an_azure_deployment_and_api_version_are_read_exactly() {
    let r = Routed::of(AZ, "/openai/deployments/prod-4o/chat/completions").expect("routed");
    assert_eq!(
        (r.endpoint, r.named.as_deref()),
        (Endpoint::ChatCompletions, Some("prod-4o"))
    );
    let r = Routed::of(AZ, "/openai/responses").expect("responses");
    assert_eq!((r.endpoint, r.named), (Endpoint::Responses, None));
    for off in [
        "/openai/deployments/a/b/chat/completions",
        "/openai/deployments//chat/completions",
        "/openai/deployments/.x/chat/completions",
        "/openai/deployments/x/completions",
        "/openai/deployments/x/embeddings",
        "/openai/deployments/x%20y/chat/completions",
        "/v1/chat/completions",
        "/openai/v1/chat/completions",
        "/v1/openai/responses",
        "/v1/openai/deployments/x/chat/completions",
        "/openai/v1/responses",
    ] {
        assert_eq!(Routed::of(AZ, off), None, "{off}");
    }
    let v = vec!["2024-10-21".to_owned()];
    assert!(api_version_allowed(Some("api-version=2024-10-21"), &v));
    for q in [
        None,
        Some("api-version=2024-10-22"),
        Some("api-version=2024-10-21&x=1"),
        Some("x=1&api-version=2024-10-21"),
        Some("api-version=2024%2D10%2D21"),
        Some("API-VERSION=2024-10-21"),
    ] {
        assert!(!api_version_allowed(q, &v), "{q:?}");
    }
    // The body may name the deployment again (or its model): kept for the plan.
    let r = parse_named(
        Endpoint::ChatCompletions,
        Some("prod-4o"),
        br#"{"model":"gpt-4o","messages":[]}"#,
    )
    .expect("reads");
    assert_eq!(
        (r.model.as_str(), r.body_model.as_deref()),
        ("prod-4o", Some("gpt-4o"))
    );
    // Azure's On Your Data searches a service tally has no price for.
    let e = parse_named(
        Endpoint::ChatCompletions,
        Some("prod-4o"),
        br#"{"messages":[],"data_sources":[{"type":"azure_search"}]}"#,
    )
    .expect_err("refused");
    assert!(e.to_string().contains("data_sources"), "{e}");
    // Their camelCase spellings, and the vision enhancements (OCR, grounding).
    for member in ["dataSources", "enhancements"] {
        let body = format!(r#"{{"messages":[],"{member}":[{{"type":"azure_search"}}]}}"#);
        let e = parse_named(Endpoint::ChatCompletions, Some("prod-4o"), body.as_bytes())
            .expect_err("refused");
        assert!(e.to_string().contains(member), "{e}");
    }
}

#[test]
fn a_gemini_body_is_read_strictly() {
    let r = gemini(r#"{"contents":[{"role":"user","parts":[{"text":"hi"}]}],"generationConfig":{"maxOutputTokens":100,"candidateCount":2}}"#)
        .expect("reads");
    assert_eq!(
        (r.model.as_str(), r.max_tokens, r.choices),
        ("gemini-2.5-flash", Some(100), 2)
    );
    assert!(!r.stream);
    for (body, names) in [
        (r#"{"model":"other","contents":[]}"#, "model"),
        (
            r#"{"contents":[],"generation_config":{"max_output_tokens":9}}"#,
            "generation_config",
        ),
        (
            r#"{"contents":[],"generationConfig":{"max_output_tokens":9}}"#,
            "max_output_tokens",
        ),
        (
            r#"{"contents":[],"generationConfig":{"maxOutputTokens":0}}"#,
            "maxOutputTokens",
        ),
        (
            r#"{"contents":[],"generationConfig":{"maxOutputTokens":1.5}}"#,
            "maxOutputTokens",
        ),
        (
            r#"{"contents":[],"generationConfig":{"maxOutputTokens":"9"}}"#,
            "maxOutputTokens",
        ),
        (
            r#"{"contents":[],"generationConfig":{"candidateCount":500}}"#,
            "candidateCount",
        ),
        (
            r#"{"contents":[],"generationConfig":{"responseModalities":["TEXT","IMAGE"]}}"#,
            "responseModalities",
        ),
        (
            r#"{"contents":[],"generationConfig":{"speechConfig":{}}}"#,
            "speechConfig",
        ),
        (
            r#"{"contents":[],"cachedContent":"cachedContents/x"}"#,
            "cachedContent",
        ),
        (
            r#"{"contents":[],"tools":[{"googleSearch":{}}]}"#,
            "googleSearch",
        ),
        (
            r#"{"contents":[],"tools":[{"functionDeclarations":[],"codeExecution":{}}]}"#,
            "codeExecution",
        ),
        (
            r#"{"contents":[{"parts":[{"inlineData":{"mimeType":"audio/mp3","data":"AAAA"}}]}]}"#,
            "audio/mp3",
        ),
        (
            r#"{"contents":[{"parts":[{"fileData":{"mimeType":"video/mp4","fileUri":"f"}}]}]}"#,
            "fileData",
        ),
        (
            r#"{"contents":[{"parts":[{"inline_data":{"mime_type":"image/png","data":"AAAA"}}]}]}"#,
            "inline_data",
        ),
        (
            r#"{"contents":[{"parts":[{"functionCall":{"args":{"inlineData":{"mimeType":"image/png","data":"A"}}}}]}]}"#,
            "inlineData",
        ),
        (
            r#"{"contents":[],"generationConfig":{"maxOutputTokens":1,"maxOutputTokens":2}}"#,
            "JSON",
        ),
    ] {
        let e = gemini(body).err().unwrap_or_else(|| panic!("read: {body}"));
        assert!(e.to_string().contains(names), "{body}: {e}");
    }
    // A body without the path's model.
    assert!(parse(Endpoint::GenerateContent, br#"{"contents":[]}"#).is_err());
    // Images: each at `image_tokens`, its base64 data out of the byte bound.
    let data = "A".repeat(4000);
    let body = format!(
        r#"{{"contents":[{{"parts":[{{"text":"what"}},{{"inlineData":{{"mimeType":"image/png","data":"{data}"}}}}]}}],"systemInstruction":{{"parts":[{{"inlineData":{{"mimeType":"image/jpeg","data":"AAAA"}}}}]}}}}"#
    );
    let r = gemini(&body).expect("reads");
    assert_eq!((r.images.count, r.images.data_bytes), (2, 4004));
    // A file the body does not carry, even one said to be an image.
    let e = gemini(r#"{"contents":[{"parts":[{"fileData":{"mimeType":"image/png","fileUri":"https://www.youtube.com/watch?v=x"}}]}]}"#)
        .expect_err("refused");
    assert!(e.to_string().contains("fileData"), "{e}");
}

fn price() -> ModelPrice {
    ModelPrice {
        max_output_tokens: 1000,
        image_tokens: Some(300),
        ..ModelPrice::new(Nanos(1_000_000_000), Nanos(2_000_000_000))
    }
}

#[test]
fn a_gemini_worst_case_sets_max_output_tokens_in_generation_config() {
    // Absent: set to what the budget pays, capped at the model's limit, the request's
    // other generationConfig members kept.
    let r = gemini(r#"{"contents":[],"generationConfig":{"temperature":0.5}}"#).expect("reads");
    let p = r
        .price(&price(), Nanos(1_000_000_000), false)
        .expect("priced");
    assert!(p.injected);
    assert_eq!(p.max_tokens, 1000);
    let sent: serde_json::Value = serde_json::from_slice(&p.body).expect("JSON");
    assert_eq!(sent["generationConfig"]["maxOutputTokens"], 1000);
    assert_eq!(sent["generationConfig"]["temperature"], 0.5);
    // The input bound is the forwarded body with a 20-digit limit in place.
    let input = p.body.len() as u64 - 4 + 20;
    assert_eq!(p.input_bound, input);
    assert_eq!(
        p.worst,
        Nanos(per_million(input, Nanos(1_000_000_000)).expect("fits").0 + 1000 * 2_000)
    );
    // Given: capped at the model's limit, times candidateCount (thoughts included).
    let r =
        gemini(r#"{"contents":[],"generationConfig":{"maxOutputTokens":5000,"candidateCount":3}}"#)
            .expect("reads");
    let p = r
        .price(&price(), Nanos(1_000_000_000), false)
        .expect("priced");
    assert_eq!(p.max_tokens, 1000);
    assert!(p.worst.0 >= 3 * 1000 * 2_000, "{:?}", p.worst);
    let sent: serde_json::Value = serde_json::from_slice(&p.body).expect("JSON");
    assert_eq!(sent["generationConfig"]["maxOutputTokens"], 1000);
}

#[test]
fn gemini_usage_is_read_as_google_bills_it() {
    let b = br#"{"candidates":[{"finishReason":"STOP"}],"usageMetadata":{"promptTokenCount":100,"cachedContentTokenCount":40,"candidatesTokenCount":30,"thoughtsTokenCount":20,"totalTokenCount":150}}"#;
    let want = Usage {
        input: 60,
        cached: 40,
        output: 50,
        ..Usage::default()
    };
    assert_eq!(
        from_body(Endpoint::GenerateContent, b),
        Reported::Usage(want)
    );
    // A tool-use prompt is input.
    let b = br#"{"usageMetadata":{"promptTokenCount":10,"toolUsePromptTokenCount":5,"candidatesTokenCount":1,"totalTokenCount":16}}"#;
    assert_eq!(
        from_body(Endpoint::GenerateContent, b)
            .usage()
            .map(|u| u.input),
        Some(15)
    );
    for bad in [
        r#"{"usageMetadata":{"candidatesTokenCount":1}}"#,
        r#"{"usageMetadata":{"promptTokenCount":-1}}"#,
        r#"{"usageMetadata":{"promptTokenCount":5,"cachedContentTokenCount":6}}"#,
        r#"{"usageMetadata":{"promptTokenCount":5,"candidatesTokenCount":1,"totalTokenCount":5}}"#,
        r#"{"usageMetadata":{"promptTokenCount":5,"thoughtsTokenCount":1.5}}"#,
        r#"{"usageMetadata":7}"#,
    ] {
        assert!(
            matches!(
                from_body(Endpoint::GenerateContent, bad.as_bytes()),
                Reported::Implausible(_)
            ),
            "{bad}"
        );
    }
    assert_eq!(
        from_body(Endpoint::GenerateContent, b"{}"),
        Reported::Missing
    );
    // A stream: the usage so far in each chunk, the call's once a chunk ends it.
    let mut s = StreamUsage::new(Endpoint::StreamGenerateContent);
    s.event(r#"{"candidates":[{"content":{"parts":[{"text":"a"}]}}],"usageMetadata":{"promptTokenCount":9,"totalTokenCount":9}}"#);
    assert_eq!(
        s.reported(),
        Reported::Missing,
        "not ended: a cut stream has no usage"
    );
    s.event(r#"{"candidates":[{"content":{"parts":[{"text":"b"}]},"finishReason":"MAX_TOKENS"}],"usageMetadata":{"promptTokenCount":9,"candidatesTokenCount":4,"thoughtsTokenCount":6,"totalTokenCount":19}}"#);
    assert_eq!(
        s.reported(),
        Reported::Usage(Usage {
            input: 9,
            output: 10,
            ..Usage::default()
        })
    );
    // A blocked prompt ends the answer too.
    let mut s = StreamUsage::new(Endpoint::StreamGenerateContent);
    s.event(r#"{"promptFeedback":{"blockReason":"SAFETY"},"usageMetadata":{"promptTokenCount":7,"totalTokenCount":7}}"#);
    assert_eq!(s.reported().usage().map(|u| u.input), Some(7));
}

#[test]
fn a_gemini_request_is_forwarded_for_text_only() {
    // No responseModalities (an image model would answer with images): TEXT written.
    for body in [
        r#"{"contents":[]}"#,
        r#"{"contents":[],"generationConfig":{"responseModalities":[]}}"#,
    ] {
        let p = gemini(body)
            .expect("reads")
            .price(&price(), Nanos(1_000_000_000), false)
            .expect("priced");
        let sent: serde_json::Value = serde_json::from_slice(&p.body).expect("JSON");
        assert_eq!(
            sent["generationConfig"]["responseModalities"],
            serde_json::json!(["TEXT"]),
            "{body}"
        );
    }
    // Usage with tokens of a modality no price covers is unpriced.
    let p = price();
    for (b, unpriced) in [
        (
            r#"{"usageMetadata":{"promptTokenCount":10,"candidatesTokenCount":5,"candidatesTokensDetails":[{"modality":"IMAGE","tokenCount":5}]}}"#,
            true,
        ),
        (
            r#"{"usageMetadata":{"promptTokenCount":10,"candidatesTokenCount":5,"promptTokensDetails":[{"modality":"AUDIO","tokenCount":10}]}}"#,
            true,
        ),
        (
            r#"{"usageMetadata":{"promptTokenCount":10,"candidatesTokenCount":5,"promptTokensDetails":[{"modality":"TEXT","tokenCount":4},{"modality":"IMAGE","tokenCount":6}],"candidatesTokensDetails":[{"modality":"TEXT","tokenCount":5}]}}"#,
            false,
        ),
    ] {
        let u = from_body(Endpoint::GenerateContent, b.as_bytes())
            .usage()
            .unwrap_or_else(|| panic!("read: {b}"));
        assert_eq!(u.unpriced(&p), unpriced, "{b}");
    }
    assert!(matches!(
        from_body(
            Endpoint::GenerateContent,
            br#"{"usageMetadata":{"promptTokenCount":1,"candidatesTokensDetails":[{"tokenCount":1}]}}"#
        ),
        Reported::Implausible(_)
    ));
}

#[test]
fn gemini_thinking_is_bounded_by_the_output_limit() {
    let r = gemini(r#"{"contents":[],"generationConfig":{"maxOutputTokens":500,"thinkingConfig":{"thinkingBudget":8000,"includeThoughts":true}}}"#)
        .expect("reads");
    let p = r
        .price(&price(), Nanos(1_000_000_000), false)
        .expect("priced");
    let sent: serde_json::Value = serde_json::from_slice(&p.body).expect("JSON");
    assert_eq!(
        sent["generationConfig"]["thinkingConfig"]["thinkingBudget"],
        500
    );
    assert_eq!(
        sent["generationConfig"]["thinkingConfig"]["includeThoughts"],
        true
    );
    // A budget under the limit is kept.
    let r = gemini(r#"{"contents":[],"generationConfig":{"thinkingConfig":{"thinkingBudget":0}}}"#)
        .expect("reads");
    let p = r
        .price(&price(), Nanos(1_000_000_000), false)
        .expect("priced");
    let sent: serde_json::Value = serde_json::from_slice(&p.body).expect("JSON");
    assert_eq!(
        sent["generationConfig"]["thinkingConfig"]["thinkingBudget"],
        0
    );
    for (body, names) in [
        (
            r#"{"contents":[],"generationConfig":{"thinkingConfig":{"thinkingBudget":-1}}}"#,
            "thinkingBudget",
        ),
        (
            r#"{"contents":[],"generationConfig":{"thinkingConfig":{"thinking_budget":9}}}"#,
            "thinking_budget",
        ),
        (
            r#"{"contents":[],"generationConfig":{"thinkingConfig":{"include_thoughts":true}}}"#,
            "include_thoughts",
        ),
        (
            r#"{"contents":[],"generationConfig":{"thinkingConfig":{"thinkingLevel":"high"}}}"#,
            "thinkingLevel",
        ),
        (
            r#"{"contents":[],"generationConfig":{"thinkingConfig":7}}"#,
            "thinkingConfig",
        ),
    ] {
        let e = gemini(body).err().unwrap_or_else(|| panic!("read: {body}"));
        assert!(e.to_string().contains(names), "{body}: {e}");
    }
}

#[test]
fn gemini_inline_data_has_one_spelling() {
    assert!(gemini(r#"{"contents":[{"parts":[{"inlineData":{"mimeType":"image/png","data":"AAAA","displayName":"x"}}]}]}"#).is_ok());
    for (body, names) in [
        (
            r#"{"contents":[{"parts":[{"inlineData":{"mimeType":"image/png","mime_type":"audio/mp3","data":"AAAA"}}]}]}"#,
            "mime_type",
        ),
        (
            r#"{"contents":[{"parts":[{"inlineData":{"mimeType":"image/png","data":"AAAA","uri":"x"}}]}]}"#,
            "uri",
        ),
    ] {
        let e = gemini(body).err().unwrap_or_else(|| panic!("read: {body}"));
        assert!(e.to_string().contains(names), "{body}: {e}");
    }
}

#[test]
fn a_body_of_many_images_reads_the_same_walked_once() {
    // 20,000 inline images in parts: each counted; one more where no part is (the last
    // member walked) refused by its exact path.
    let n = 20_000;
    let part = r#"{"inlineData":{"mimeType":"image/png","data":"AAAA"}}"#;
    let parts = vec![part; n].join(",");
    let body = format!(r#"{{"contents":[{{"parts":[{parts}]}}]}}"#);
    let r = gemini(&body).expect("reads");
    assert_eq!(
        (
            r.images.count,
            r.images.data_bytes,
            r.images.first.as_deref()
        ),
        (
            n as u64,
            4 * n as u64,
            Some("contents[0].parts[0].inlineData")
        )
    );
    let stray = format!(
        r#"{{"contents":[{{"parts":[{parts}]}},{{"parts":[{{"functionCall":{{"name":"f","args":{{"z":{part}}}}}}}]}}]}}"#
    );
    let e = gemini(&stray).expect_err("refused");
    assert!(
        e.to_string()
            .contains("contents[1].parts[0].functionCall.args.z.inlineData"),
        "{e}"
    );
}

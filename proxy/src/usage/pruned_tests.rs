//! The pruned reading ([`crate::pruned`]) against a whole `Value`'s, through the
//! usage readers of every dialect.

use serde_json::Value;

use super::{of_body, shape, StreamUsage};
use crate::endpoint::Endpoint;
use crate::pruned::{read, read_str};

const ENDPOINTS: &[Endpoint] = &[
    Endpoint::ChatCompletions,
    Endpoint::Responses,
    Endpoint::Messages,
    Endpoint::CountTokens,
    Endpoint::GenerateContent,
    Endpoint::StreamGenerateContent,
    Endpoint::Converse,
    Endpoint::ConverseStream,
    Endpoint::Route,
];

/// Answers and events of every dialect, and what a hostile or broken upstream
/// could send: members twice, of the wrong kind, null, nested, serde_json's private
/// markers, numbers out of range, bad escapes, trailing bytes, not JSON.
const BODIES: &[&str] = &[
    r#"{"id":"x","choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":100,"completion_tokens":50,"prompt_tokens_details":{"cached_tokens":40}},"service_tier":"flex"}"#,
    r#"{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}}"#,
    r#"{"choices":[{"delta":{"content":"a"}}],"usage":{"prompt_tokens":3,"completion_tokens":2}}"#,
    r#"{"choices":"none","usage":{"prompt_tokens":3,"completion_tokens":2},"service_tier":7}"#,
    r#"{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2},"usage":null}"#,
    r#"{"usage":null,"usage":{"prompt_tokens":3,"completion_tokens":2},"service_tier":"auto"}"#,
    r#"{"usage":"lots","service_tier":null}"#,
    r#"{"usage":{"prompt_tokens":-1,"completion_tokens":2.5}}"#,
    r#"{"usage":{"prompt_tokens":1e400,"completion_tokens":2}}"#,
    r#"{"note":1e400,"usage":{"prompt_tokens":1,"completion_tokens":2}}"#,
    r#"{"note":"\ud800","usage":{"prompt_tokens":1,"completion_tokens":2}}"#,
    r#"{"note":"\u00e9\n","usage":{"prompt_tokens":1,"completion_tokens":2}}"#,
    r#"{"usage":{"prompt_tokens":1,"completion_tokens":2}} x"#,
    r#"{"usage":{"prompt_tokens":1,"completion_tokens":2}"#,
    r#"{"a":{"\u0024serde_json::private::RawValue":"{\"usage\":{\"input_tokens\":1,\"output_tokens\":2}}"},"usage":{"input_tokens":1,"output_tokens":2}}"#,
    r#"[{"usage":{"prompt_tokens":1,"completion_tokens":2}}]"#,
    r#""usage""#,
    r#"null"#,
    r#"{"output":[{"type":"web_search_call"},{"type":"message","content":[{"text":"x"}]},{"type":"web_search_call","type":"x"},"s",null],"usage":{"input_tokens":10,"output_tokens":5,"input_tokens_details":{"cached_tokens":4}},"service_tier":"priority"}"#,
    r#"{"output":{"type":"web_search_call"},"usage":{"input_tokens":10,"output_tokens":5}}"#,
    r#"{"type":"response.completed","response":{"output":[{"type":"web_search_call"}],"usage":{"input_tokens":10,"output_tokens":5},"service_tier":"flex"}}"#,
    r#"{"type":"response.completed","response":"gone"}"#,
    r#"{"type":"response.failed","response":null}"#,
    r#"{"type":"response.created","response":{"service_tier":"auto"}}"#,
    r#"{"type":"response.incomplete","response":{"usage":{"input_tokens":1,"output_tokens":1}},"response":{"usage":{"input_tokens":2,"output_tokens":2}}}"#,
    r#"{"type":"message_start","message":{"usage":{"input_tokens":10,"output_tokens":1,"cache_creation_input_tokens":5,"cache_creation":{"ephemeral_1h_input_tokens":2},"service_tier":"standard"}}}"#,
    r#"{"type":"message_start","message":[1,2]}"#,
    r#"{"type":"message_delta","usage":{"output_tokens":7,"server_tool_use":{"web_search_requests":2}}}"#,
    r#"{"type":"message_delta","usage":{"output_tokens":7,"input_tokens":3}}"#,
    r#"{"type":"message_delta","usage":{"output_tokens":"7"}}"#,
    r#"{"type":"message_stop"}"#,
    r#"{"type":7}"#,
    r#"{"id":"m","content":[{"type":"text","text":"hi"}],"usage":{"input_tokens":10,"output_tokens":5,"cache_read_input_tokens":7,"server_tool_use":{"web_search_requests":1}}}"#,
    r#"{"candidates":[{"content":{"parts":[{"text":"x"}]}}],"usageMetadata":{"promptTokenCount":5,"candidatesTokenCount":3,"totalTokenCount":8}}"#,
    r#"{"candidates":[{"finishReason":"STOP"}],"usageMetadata":{"promptTokenCount":5,"candidatesTokenCount":3,"totalTokenCount":8,"thoughtsTokenCount":1}}"#,
    r#"{"candidates":[{"finishReason":null},"x"],"usageMetadata":{"promptTokenCount":5}}"#,
    r#"{"candidates":{"finishReason":"STOP"},"promptFeedback":{"blockReason":null}}"#,
    r#"{"promptFeedback":[{"blockReason":"SAFETY"}],"usageMetadata":null}"#,
    r#"{"output":{"message":{}},"usage":{"inputTokens":3,"outputTokens":2,"totalTokens":5},"stopReason":"end_turn"}"#,
    r#"{"usage":{"inputTokens":3,"outputTokens":2,"totalTokens":9}}"#,
    "not json",
    "",
];

#[test]
fn an_answer_reads_as_its_whole_value_reads() {
    for &endpoint in ENDPOINTS {
        for body in BODIES {
            let whole = serde_json::from_slice::<Value>(body.as_bytes());
            let pruned = read(shape(endpoint), body.as_bytes());
            assert_eq!(whole.is_ok(), pruned.is_ok(), "{endpoint:?} {body}");
            let (Ok(whole), Ok(pruned)) = (whole, pruned) else {
                continue;
            };
            assert_eq!(
                of_body(endpoint, &pruned),
                of_body(endpoint, &whole),
                "{endpoint:?} {body}"
            );
            assert_eq!(
                crate::tier::said(endpoint, &pruned),
                crate::tier::said(endpoint, &whole),
                "{endpoint:?} {body}"
            );
        }
    }
}

#[test]
fn a_stream_reads_as_its_whole_events_read() {
    for &endpoint in ENDPOINTS {
        // Each event alone, and all of them in order (what comes before matters).
        let mut all = (StreamUsage::new(endpoint), StreamUsage::new(endpoint));
        for body in BODIES {
            let mut one = (StreamUsage::new(endpoint), StreamUsage::new(endpoint));
            for (p, w) in [(&mut one.0, &mut one.1), (&mut all.0, &mut all.1)] {
                let kept = p.event(body);
                let whole = match serde_json::from_str::<Value>(body) {
                    Ok(v) => w.event_value(&v),
                    Err(_) => crate::usage::Keep::Pass,
                };
                assert_eq!(kept, whole, "{endpoint:?} {body}");
                assert_eq!(p.reported(), w.reported(), "{endpoint:?} {body}");
                assert_eq!(p.tier(), w.tier(), "{endpoint:?} {body}");
            }
        }
    }
}

#[test]
fn only_what_the_readers_look_at_is_kept() {
    let body = br#"{"id":"x","choices":[{"message":{"content":"a long answer"}}],"usage":{"prompt_tokens":1,"completion_tokens":2},"service_tier":"flex"}"#;
    let v = read(shape(Endpoint::ChatCompletions), body).expect("read");
    assert_eq!(
        v,
        serde_json::json!({"choices": [null], "usage": {"prompt_tokens": 1, "completion_tokens": 2}, "service_tier": "flex"})
    );
    let body = br#"{"type":"response.completed","response":{"output":[{"type":"message","content":[{"text":"x"}]}],"usage":{"input_tokens":1,"output_tokens":1}}}"#;
    let v = read(shape(Endpoint::Responses), body).expect("read");
    assert_eq!(
        v,
        serde_json::json!({"type": "response.completed", "response": {"output": [{"type": "message"}], "usage": {"input_tokens": 1, "output_tokens": 1}}})
    );
}

/// Whether `body` reads, pruned by every dialect's shape (as an answer and as an
/// event), exactly where a `Value`'s reader reads it.
fn reads_as_a_value(body: &[u8]) -> bool {
    let whole = serde_json::from_slice::<Value>(body).is_ok();
    for &endpoint in ENDPOINTS {
        let at = shape(endpoint);
        assert_eq!(read(at, body).is_ok(), whole, "{endpoint:?}");
        if let Ok(text) = std::str::from_utf8(body) {
            assert_eq!(read_str(at, text).is_ok(), whole, "{endpoint:?}");
        }
    }
    whole
}

#[test]
fn nesting_is_refused_at_the_depth_a_value_is() {
    let arrays = |n: usize| format!("{}1{}", "[".repeat(n), "]".repeat(n));
    let objects = |n: usize| format!("{}1{}", r#"{"a":"#.repeat(n), "}".repeat(n));
    for nest in [arrays, objects] {
        // 126 to 129 arrays or objects deep in all, the deepest in a member not kept
        // and in the usage (kept whole): read to 127 levels as serde_json reads them
        // (its limit of 128), refused past.
        for levels in 126..=129 {
            let body = format!(
                r#"{{"note":{},"usage":{{"prompt_tokens":1,"completion_tokens":2}}}}"#,
                nest(levels - 1)
            );
            assert_eq!(reads_as_a_value(body.as_bytes()), levels <= 127, "{levels}");
            let body = format!(
                r#"{{"usage":{{"prompt_tokens":1,"completion_tokens":2,"x":{}}}}}"#,
                nest(levels - 2)
            );
            assert_eq!(reads_as_a_value(body.as_bytes()), levels <= 127, "{levels}");
        }
    }
}

#[test]
fn bytes_that_are_not_utf8_are_refused_wherever_they_are() {
    for body in [
        &b"{\"note\":\"\xff\",\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2}}"[..],
        b"{\"n\xc3\":1,\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2}}",
        b"{\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2,\"x\":\"\xed\xa0\x80\"}}",
        b"{\"choices\":[\"\xc0\xaf\"],\"usage\":null}",
    ] {
        assert!(!reads_as_a_value(body), "{body:?}");
    }
}

#[test]
fn a_marker_key_is_ordinary_where_nothing_is_kept_and_read_whole_where_it_is() {
    let marker = "$serde_json::private::RawValue";
    let usage = r#""usage":{"prompt_tokens":1,"completion_tokens":2}"#;
    // Not kept, first or not first in its object: skipped, the usage read.
    for note in [
        format!(r#"{{"{marker}":1}}"#),
        format!(r#"{{"a":1,"{marker}":1}}"#),
        format!(r#"[{{"{marker}":{{"{marker}":[]}}}}]"#),
    ] {
        let body = format!(r#"{{"note":{note},{usage}}}"#);
        let v = read(shape(Endpoint::ChatCompletions), body.as_bytes()).expect("read");
        assert_eq!(v["usage"]["prompt_tokens"], 1, "{body}");
        // The same key at the top is one more member not kept.
        let body = format!(r#"{{"{marker}":1,{usage}}}"#);
        assert!(read(shape(Endpoint::ChatCompletions), body.as_bytes()).is_ok());
    }
    // In the usage, kept whole: as a `Value` reads it (first, refused; the string
    // it names read in its place; not first, an ordinary key).
    let body = format!(r#"{{"usage":{{"{marker}":1}}}}"#);
    assert!(read(shape(Endpoint::ChatCompletions), body.as_bytes()).is_err());
    let body = format!(r#"{{"usage":{{"{marker}":"{{\"prompt_tokens\":5}}"}}}}"#);
    let v = read(shape(Endpoint::ChatCompletions), body.as_bytes()).expect("read");
    assert_eq!(v["usage"], serde_json::json!({"prompt_tokens": 5}));
    let body = format!(r#"{{"usage":{{"prompt_tokens":5,"{marker}":1}}}}"#);
    let v = read(shape(Endpoint::ChatCompletions), body.as_bytes()).expect("read");
    assert_eq!(v["usage"]["prompt_tokens"], 5);
}

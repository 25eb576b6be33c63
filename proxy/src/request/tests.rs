//! The request parser's and the worst case's unit tests.

use super::*;
use tally_policy::{ModelPrice, UpstreamKind};
use tally_record::money::{per_million, Nanos};

fn price() -> ModelPrice {
    ModelPrice {
        cached_input_per_mtok: Nanos(500_000_000),
        max_output_tokens: 1000,
        ..ModelPrice::new(Nanos(1_000_000_000), Nanos(2_000_000_000))
    }
}

fn chat(body: &[u8]) -> ModelRequest {
    parse(Endpoint::ChatCompletions, body).expect("reads")
}

#[test]
fn duplicate_keys_at_any_depth_are_refused() {
    for body in [
        r#"{"model":"a","model":"b"}"#,
        r#"{"model":"a","max_tokens":1,"max_tokens":100000}"#,
        r#"{"model":"a","messages":[{"role":"user","content":"x","content":"y"}]}"#,
        r#"{"model":"a"} x"#,
        r#"[{"model":"a"}]"#,
        r#"{"model":"a","max_tokens":1.5}"#,
        r#"{"model":"a","max_tokens":-1}"#,
        r#"{"model":"a","max_tokens":"9"}"#,
        r#"{"model":"a","stream":"yes"}"#,
        r#"{"model":"a","messages":[{"role":"user","content":[{"type":"input_audio","input_audio":{"data":"x"}}]}]}"#,
        r#"{"model":"a","max_tokens":1,"max_completion_tokens":2}"#,
    ] {
        assert!(
            parse(Endpoint::ChatCompletions, body.as_bytes()).is_err(),
            "{body}"
        );
    }
}

#[test]
fn the_endpoint_is_the_exact_path() {
    use Endpoint::*;
    let o = UpstreamKind::Openai;
    let a = UpstreamKind::Anthropic;
    assert_eq!(
        Endpoint::of(o, "/v1/chat/completions"),
        Some(ChatCompletions)
    );
    assert_eq!(Endpoint::of(o, "/chat/completions"), Some(ChatCompletions));
    assert_eq!(Endpoint::of(o, "/v1/responses"), Some(Responses));
    assert_eq!(Endpoint::of(a, "/v1/messages"), Some(Messages));
    assert_eq!(
        Endpoint::of(a, "/v1/messages/count_tokens"),
        Some(CountTokens)
    );
    for (kind, path) in [
        (a, "/v1/messages/batches"),
        (a, "/v1/messages/batches/b1/results"),
        (a, "/v1/messages/"),
        (a, "/v1/complete"),
        (o, "/v1/batches"),
        (o, "/v1/chat/completions/x"),
        (o, "/v1/responses/resp_1"),
        (o, "/v1/responses/input_tokens"),
        (o, "/v1/files"),
        (o, "/v1/v1/responses"),
        (o, "/v1/messages"),
        (a, "/v1/chat/completions"),
    ] {
        assert_eq!(Endpoint::of(kind, path), None, "{path}");
    }
    assert!(Messages.query_allowed(Some("beta=true")));
    assert!(CountTokens.query_allowed(None));
    for q in ["beta=false", "beta=true&x=1", "x=1"] {
        assert!(!Messages.query_allowed(Some(q)), "{q}");
    }
    assert!(!ChatCompletions.query_allowed(Some("beta=true")));
    assert!(!Responses.query_allowed(Some("x=1")));
}

#[test]
fn numbers_keep_their_digits_and_the_worst_case_bounds_the_call() {
    let body = br#"{"model":"m","temperature":0.10000000000000000001,"max_tokens":1e2,"messages":[{"role":"user","content":"hi"}]}"#;
    let r = chat(body);
    assert_eq!(r.max_tokens, Some(100));
    let p = r.price(&price(), Nanos(0), false).expect("priced");
    let text = String::from_utf8(p.body.clone()).expect("utf8");
    assert!(
        text.contains("\"temperature\":0.10000000000000000001"),
        "{text}"
    );
    assert!(text.contains("\"max_tokens\":100"), "{text}");
    assert!(!p.injected);
    assert!(p.input_bound >= p.body.len() as u64);
    // 100 output tokens at $2/M + the body's bytes at $1/M, rounded up.
    let want = per_million(p.input_bound, Nanos(1_000_000_000))
        .and_then(|i| i.checked_add(Nanos(200_000)))
        .expect("fits");
    assert_eq!(p.worst, want);
    // Cache-write prices do not raise a body that marks nothing for the cache.
    let dear = ModelPrice {
        cache_write_per_mtok: Some(Nanos(1_250_000_000)),
        cache_write_1h_per_mtok: Some(Nanos(2_000_000_000)),
        ..price()
    };
    assert_eq!(r.price(&dear, Nanos(0), false).expect("priced").worst, want);
}

fn messages(body: &serde_json::Value) -> ModelRequest {
    parse(Endpoint::Messages, body.to_string().as_bytes()).expect("reads")
}

#[test]
fn cache_writes_are_reserved_only_where_the_body_marks_them() {
    let dear = ModelPrice {
        cache_write_per_mtok: Some(Nanos(1_250_000_000)),
        cache_write_1h_per_mtok: Some(Nanos(2_000_000_000)),
        ..price()
    };
    let body = |cc: serde_json::Value| {
        serde_json::json!({"model": "m", "max_tokens": 10, "system": [
            {"type": "text", "text": "you are", "cache_control": cc}],
            "messages": [{"role": "user", "content": "hi"}]})
    };
    let rate = |r: &ModelRequest, p: &ModelPrice| {
        let q = r.price(p, Nanos(0), false).expect("priced");
        let input = q.worst.0 - 20_000; // 10 out at $2/M
        (input, q.input_bound)
    };
    let five = messages(&body(serde_json::json!({"type": "ephemeral"})));
    assert_eq!(five.cache, CacheMark::FiveMinutes);
    let (cost, bound) = rate(&five, &dear);
    assert_eq!(Some(Nanos(cost)), per_million(bound, Nanos(1_250_000_000)));
    let hour = messages(&body(serde_json::json!({"type": "ephemeral", "ttl": "1h"})));
    assert_eq!(hour.cache, CacheMark::OneHour);
    let (cost, bound) = rate(&hour, &dear);
    assert_eq!(Some(Nanos(cost)), per_million(bound, Nanos(2_000_000_000)));
    let none = messages(&body(serde_json::Value::Null));
    assert_eq!(none.cache, CacheMark::None);
    let (cost, bound) = rate(&none, &dear);
    assert_eq!(Some(Nanos(cost)), per_million(bound, Nanos(1_000_000_000)));
    // A marker whose write has no price is refused, naming the field.
    for (r, p) in [
        (&five, price()),
        (
            &hour,
            ModelPrice {
                cache_write_per_mtok: Some(Nanos(1_250_000_000)),
                ..price()
            },
        ),
    ] {
        match r.price(&p, Nanos(0), false) {
            Err(RequestError::Unpriced { field, .. }) => assert_eq!(field, "cache_control"),
            other => panic!("{other:?}"),
        }
    }
    assert!(parse(
        Endpoint::Messages,
        body(serde_json::json!({"type": "ephemeral", "ttl": "2h"}))
            .to_string()
            .as_bytes()
    )
    .is_err());
}

/// Claude Code 2.1.332's first turn of `claude -p hello`, as it sent it (paths and
/// ids scrubbed): 12 tools, a system prompt with three `cache_control` markers (no
/// ttl), `max_tokens: 128000`, streaming.
const CLAUDE_CODE: &[u8] = include_bytes!("../../testdata/claude-code-2.1.332-messages.json");

#[test]
fn a_claude_code_turn_reserves_its_input_at_the_base_rate_plus_overheads_and_its_output() {
    // Claude Opus's prices: $5 in, $6.25 written (5 min), $10 (1 h), $25 out.
    let opus = ModelPrice {
        cached_input_per_mtok: Nanos(500_000_000),
        cache_write_per_mtok: Some(Nanos(6_250_000_000)),
        cache_write_1h_per_mtok: Some(Nanos(10_000_000_000)),
        max_output_tokens: 128_000,
        tool_prompt_tokens: 500,
        ..ModelPrice::new(Nanos(5_000_000_000), Nanos(25_000_000_000))
    };
    let turn: Value = serde_json::from_slice(CLAUDE_CODE).expect("json");
    let r = parse(Endpoint::Messages, CLAUDE_CODE).expect("Claude Code's turn reads");
    assert_eq!(r.max_tokens, Some(128_000));
    assert!(r.tools && r.stream);
    assert_eq!(r.cache, CacheMark::FiveMinutes);
    // Its markers removed: input at the base rate.
    let mut plain = turn.clone();
    strip(&mut plain, "cache_control");
    let bare = parse(Endpoint::Messages, plain.to_string().as_bytes()).expect("reads");
    assert_eq!(bare.cache, CacheMark::None);
    let p = bare.price(&opus, Nanos(u64::MAX), false).expect("priced");
    assert_eq!(p.max_tokens, 128_000);
    // The body forwarded, its limit at 20 digits, plus the tool prompt.
    let body_bound = p.body.len() as u64 - 6 + 20;
    assert_eq!(p.input_bound, body_bound + 500);
    let most = per_million(body_bound + 500, Nanos(5_000_000_000))
        .and_then(|i| i.checked_add(per_million(128_000, Nanos(25_000_000_000))?))
        .expect("fits");
    assert_eq!(p.worst, most);
    assert!(p.worst <= most, "no more than input + overheads + output");
    // About $3.45: $3.20 of it the output Claude Code asks for, $0.25 the input.
    assert!(p.worst.0 < 3_500_000_000, "{:?}", p.worst);
    // The markers present: the whole input at the 5-minute write rate, no dearer.
    let q = r.price(&opus, Nanos(u64::MAX), false).expect("priced");
    let marked = per_million(q.input_bound, Nanos(6_250_000_000))
        .and_then(|i| i.checked_add(per_million(128_000, Nanos(25_000_000_000))?))
        .expect("fits");
    assert_eq!(q.worst, marked);
    // A run with $1 left, clamping: the limit is what the dollar pays.
    let c = r.price(&opus, Nanos(1_000_000_000), true).expect("priced");
    assert!(c.clamped && c.max_tokens < 128_000 && c.worst <= Nanos(1_000_000_000));
    let c = r.price(&opus, Nanos(1_000_000_000), false).expect("priced");
    assert!(!c.clamped && c.max_tokens == 128_000, "off by default");
}

fn strip(v: &mut Value, key: &str) {
    match v {
        Value::Object(o) => {
            o.remove(key);
            o.values_mut().for_each(|x| strip(x, key));
        }
        Value::Array(a) => a.iter_mut().for_each(|x| strip(x, key)),
        _ => {}
    }
}

#[test]
fn server_tools_are_priced_per_use_or_refused() {
    let search = ModelPrice {
        web_search_per_use: Some(Nanos(10_000_000)),
        web_search_tokens_per_use: 1000,
        tool_prompt_tokens: 300,
        ..price()
    };
    let r = messages(&serde_json::json!({"model": "m", "max_tokens": 10,
        "tools": [{"type": "web_search_20250305", "name": "web_search", "max_uses": 3}],
        "messages": [{"role": "user", "content": "hi"}]}));
    assert_eq!(r.web_searches, 3);
    let p = r.price(&search, Nanos(0), false).expect("priced");
    assert_eq!(p.input_bound, p.body.len() as u64 - 2 + 20 + 300 + 3 * 1000);
    let want = per_million(p.input_bound, Nanos(1_000_000_000))
        .and_then(|i| i.checked_add(Nanos(3 * 10_000_000 + 20_000)))
        .expect("fits");
    assert_eq!(p.worst, want);
    match r.price(&price(), Nanos(0), false) {
        Err(RequestError::Unpriced { field, .. }) => assert_eq!(field, "tools"),
        other => panic!("{other:?}"),
    }
    let refused = |endpoint: Endpoint, body: serde_json::Value| -> String {
        match parse(endpoint, body.to_string().as_bytes()) {
            Err(RequestError::Unpriced { field, .. }) => field,
            other => panic!("{body}: {other:?}"),
        }
    };
    let m = |extra: serde_json::Value| {
        let mut b = serde_json::json!({"model": "m", "max_tokens": 10, "messages": []});
        b.as_object_mut()
            .expect("object")
            .extend(extra.as_object().expect("object").clone());
        b
    };
    use serde_json::json;
    let e = Endpoint::Messages;
    assert_eq!(
        refused(
            e,
            m(json!({"tools": [{"type": "web_search_20250305", "name": "s"}]}))
        ),
        "tools[0].max_uses"
    );
    assert_eq!(
        refused(
            e,
            m(
                json!({"tools": [{"name": "a", "input_schema": {}}, {"type": "computer_20250124", "name": "c"}]})
            )
        ),
        "tools[1].type"
    );
    assert_eq!(
        refused(
            e,
            m(json!({"tools": [{"type": "code_execution_20250825", "name": "c"}]}))
        ),
        "tools[0].type"
    );
    assert_eq!(
        refused(
            e,
            m(json!({"mcp_servers": [{"type": "url", "url": "https://x"}]}))
        ),
        "mcp_servers"
    );
    let e = Endpoint::ChatCompletions;
    assert_eq!(
        refused(e, m(json!({"web_search_options": {}}))),
        "web_search_options"
    );
    assert_eq!(
        refused(
            e,
            m(
                json!({"tools": [{"type": "function", "function": {"name": "f"}}, {"type": "file_search"}]})
            )
        ),
        "tools[1].type"
    );
    let r = |extra: serde_json::Value| {
        let mut b = serde_json::json!({"model": "m", "input": "hi"});
        b.as_object_mut()
            .expect("object")
            .extend(extra.as_object().expect("object").clone());
        b
    };
    let e = Endpoint::Responses;
    assert_eq!(
        refused(e, r(json!({"tools": [{"type": "web_search"}]}))),
        "max_tool_calls"
    );
    assert_eq!(
        refused(e, r(json!({"previous_response_id": "resp_1"}))),
        "previous_response_id"
    );
    assert_eq!(refused(e, r(json!({"background": true}))), "background");
    assert_eq!(
        refused(e, r(json!({"tools": [{"type": "mcp", "server_url": "x"}]}))),
        "tools[0].type"
    );
    let ok = parse(
        e,
        r(json!({"tools": [{"type": "web_search"}], "max_tool_calls": 2}))
            .to_string()
            .as_bytes(),
    )
    .expect("reads");
    assert_eq!(ok.web_searches, 2);
}

#[test]
fn billing_tiers_are_reserved_at_their_rates_or_refused() {
    let r = |tier: &str| {
        chat(format!(r#"{{"model":"m","max_tokens":10,"service_tier":"{tier}"}}"#).as_bytes())
    };
    let worst = |tier: &str, p: &ModelPrice| r(tier).price(p, Nanos(0), false).map(|q| q.worst);
    let base = worst("default", &price()).expect("priced");
    // At `input` per million input and `output` per million output (10 tokens).
    let at = |tier: &str, p: &ModelPrice, input: u64, output: u64| {
        let q = r(tier).price(p, Nanos(0), false).expect("priced");
        let want = per_million(q.input_bound, Nanos(input))
            .and_then(|i| i.checked_add(per_million(10, Nanos(output))?));
        assert_eq!(Some(q.worst), want, "{tier}");
    };
    at("auto", &price(), 1_000_000_000, 2_000_000_000);
    for tier in ["priority", "flex", "scale"] {
        match worst(tier, &price()) {
            Err(RequestError::Unpriced { field, .. }) => assert_eq!(field, "service_tier"),
            other => panic!("{tier}: {other:?}"),
        }
    }
    let tier = |i: u64, o: u64| tally_policy::TierPrice {
        input_per_mtok: Nanos(i),
        cached_input_per_mtok: Nanos(i),
        cache_write_per_mtok: None,
        cache_write_1h_per_mtok: None,
        output_per_mtok: Nanos(o),
    };
    let listed = ModelPrice {
        tiers: [
            ("flex".to_owned(), tier(500_000_000, 1_000_000_000)),
            ("priority".to_owned(), tier(2_000_000_000, 4_000_000_000)),
        ]
        .into(),
        ..price()
    };
    let flex = worst("flex", &listed).expect("priced");
    let priority = worst("priority", &listed).expect("priced");
    assert!(
        flex < base && base < priority,
        "{flex:?} {base:?} {priority:?}"
    );
    at("priority", &listed, 2_000_000_000, 4_000_000_000);
    at("flex", &listed, 500_000_000, 1_000_000_000);
    assert_eq!(worst("default", &listed), Ok(base));
    // `auto` (or none) is the dearest it can land on.
    at("auto", &listed, 2_000_000_000, 4_000_000_000);
    let none = chat(br#"{"model":"m","max_tokens":10}"#);
    let q = none.price(&listed, Nanos(0), false).expect("priced");
    assert_eq!(
        Some(q.worst),
        per_million(q.input_bound, Nanos(2_000_000_000)).and_then(|i| i.checked_add(Nanos(40_000)))
    );
}

#[test]
fn responses_and_reasoning_models_get_the_limit_they_accept() {
    let r = parse(
        Endpoint::Responses,
        br#"{"model":"m","input":"hi","stream":true}"#,
    )
    .expect("reads");
    let p = r.price(&price(), Nanos(u64::MAX), false).expect("priced");
    let text = String::from_utf8(p.body).expect("utf8");
    assert!(text.contains("\"max_output_tokens\":1000"), "{text}");
    assert!(!text.contains("max_tokens\""), "{text}");
    assert!(!text.contains("stream_options"), "{text}");
    assert!(parse(Endpoint::Responses, br#"{"model":"m","max_tokens":5}"#).is_err());
    let reasoning = ModelPrice {
        max_tokens_field: tally_policy::MaxTokensField::MaxCompletionTokens,
        ..price()
    };
    let p = chat(br#"{"model":"o","messages":[]}"#)
        .price(&reasoning, Nanos(u64::MAX), false)
        .expect("priced");
    let text = String::from_utf8(p.body).expect("utf8");
    assert!(text.contains("\"max_completion_tokens\":1000"), "{text}");
    assert!(!text.contains("\"max_tokens\""), "{text}");
    // The request's own field is kept (and capped).
    let p = chat(br#"{"model":"o","max_tokens":5000,"messages":[]}"#)
        .price(&reasoning, Nanos(u64::MAX), false)
        .expect("priced");
    assert!(String::from_utf8(p.body)
        .expect("utf8")
        .contains("\"max_tokens\":1000"));
}

#[test]
fn count_tokens_reserves_nothing_and_gets_no_limit() {
    let r = parse(
        Endpoint::CountTokens,
        br#"{"model":"m","messages":[{"role":"user","content":"hi"}],"tools":[{"type":"web_search_20250305","name":"s"}]}"#,
    )
    .expect("reads");
    let p = r.price(&price(), Nanos(0), false).expect("priced");
    assert_eq!(p.worst, Nanos(0));
    let text = String::from_utf8(p.body).expect("utf8");
    assert!(!text.contains("max_tokens"), "{text}");
}

#[test]
fn a_missing_max_tokens_is_what_the_budget_pays() {
    let body = br#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    let r = chat(body);
    let remaining = Nanos(1_000_000); // $0.001
    let p = r.price(&price(), remaining, false).expect("priced");
    assert!(p.injected);
    assert!(p.worst <= remaining, "{p:?}");
    assert!(p.max_tokens > 1 && p.max_tokens < 1000, "{p:?}");
    let text = String::from_utf8(p.body).expect("utf8");
    assert!(
        text.contains("\"stream_options\":{\"include_usage\":true}"),
        "{text}"
    );
    // Capped at the model's limit when the budget is large.
    let p = r.price(&price(), Nanos(u64::MAX), false).expect("priced");
    assert_eq!(p.max_tokens, 1000);
}

#[test]
fn what_the_walks_cannot_read_is_refused_as_before() {
    // The walks read the value serde_json reads from the canonical text: a body it reads
    // none from (a number beyond an f64, 128 arrays and objects nested) is not an object
    // the proxy reads, after its model is checked.
    let nested = |n: usize| format!(r#"{{"model":"m","x":{}1{}}}"#, "[".repeat(n), "]".repeat(n));
    for (body, want) in [
        (
            r#"{"model":"m","x":1e400}"#.to_string(),
            Some(RequestError::NotObject),
        ),
        (r#"{"x":1e400}"#.to_string(), None),
        (r#"{"model":"m","x":1e300}"#.to_string(), None),
        (nested(127), Some(RequestError::NotObject)),
        (nested(126), None),
        ("[1]".to_string(), Some(RequestError::NotObject)),
    ] {
        let got = parse(Endpoint::ChatCompletions, body.as_bytes());
        match want {
            Some(e) => assert_eq!(got.err(), Some(e), "{body}"),
            None => assert_ne!(got.err(), Some(RequestError::NotObject), "{body}"),
        }
    }
    // Every member's exact text, wherever it sorts among the ones the proxy sets.
    let r = chat(br#"{"z":18446744073709551617,"stream":true,"model":"m","a":0.10,"stream_options":{"x":1}}"#);
    let body = r
        .price(&price(), Nanos(u64::MAX), false)
        .expect("priced")
        .body;
    assert_eq!(
        String::from_utf8(body).expect("UTF-8"),
        r#"{"a":0.1,"max_tokens":1000,"model":"m","stream":true,"stream_options":{"include_usage":true,"x":1},"z":18446744073709551617}"#
    );
}

#[test]
fn the_measured_length_is_the_rendered_bodys() {
    let body = br#"{"model":"m","messages":[{"role":"user","content":"h\u00e9\n"}],"tab\tkey":1,"q\"uote":2,"zz":null,"stream":true}"#;
    let r = chat(body);
    use std::collections::BTreeMap;
    let mut sets: Vec<BTreeMap<&str, String>> = vec![BTreeMap::new()];
    let mut set = BTreeMap::new();
    set.insert("max_tokens", u64::MAX.to_string());
    set.insert("stream", "false".to_owned());
    set.insert("a\u{1}", "[]".to_owned());
    set.insert("zzz", "{}".to_owned());
    sets.push(set);
    for set in &sets {
        let text = r.render(set);
        assert_eq!(r.rendered_len(set), text.len(), "{text}");
        let _: serde_json::Value = serde_json::from_str(&text).expect(&text);
    }
}

#[test]
fn a_marker_key_an_agent_sends_back_is_an_ordinary_key() {
    // A model's tool input, sent back in the next turn, may carry serde_json's private
    // marker first in an object: the body reads and prices as any other, the marker
    // kept (the request's reader builds its own value, never serde_json's `Value`).
    let marker = "$serde_json::private::RawValue";
    let body = serde_json::json!({"model": "m", "max_tokens": 10, "messages": [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {marker: 1}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "ok"}]}]});
    let text = body.to_string();
    assert!(serde_json::from_str::<Value>(&text).is_err(), "{text}");
    let priced = messages(&body)
        .price(&price(), Nanos(u64::MAX), false)
        .expect("priced");
    assert!(String::from_utf8(priced.body)
        .expect("UTF-8")
        .contains(&format!(r#"{{"{marker}":1}}"#)));
    for (endpoint, body) in [
        (
            Endpoint::GenerateContent,
            format!(
                r#"{{"contents":[{{"parts":[{{"functionCall":{{"name":"f","args":{{"{marker}":1}}}}}}]}}],"generationConfig":{{"maxOutputTokens":5}}}}"#
            ),
        ),
        (
            Endpoint::Converse,
            format!(
                r#"{{"messages":[{{"role":"user","content":[{{"text":"go"}}]}},{{"role":"assistant","content":[{{"toolUse":{{"toolUseId":"t","name":"f","input":{{"{marker}":1}}}}}}]}}]}}"#
            ),
        ),
    ] {
        let r = parse_named(endpoint, Some("m"), body.as_bytes()).expect("reads");
        let priced = r.price(&price(), Nanos(u64::MAX), false).expect("priced");
        assert!(
            String::from_utf8(priced.body)
                .expect("UTF-8")
                .contains(marker),
            "{body}"
        );
    }
}

use super::*;

fn got(u: Usage) -> Reported {
    Reported::Usage(u)
}

#[test]
fn a_converse_stream_says_its_usage_once_and_never_after_an_exception() {
    let big = br#"{"usage":{"inputTokens":900000,"outputTokens":900000,"totalTokens":1800000}}"#;
    let wrong = br#"{"usage":{"inputTokens":900000,"outputTokens":900000,"totalTokens":5}}"#;
    let small = br#"{"usage":{"inputTokens":1,"outputTokens":1,"totalTokens":2}}"#;
    let mut one = StreamUsage::new(Endpoint::ConverseStream);
    one.frame("messageStart", b"{}");
    one.frame("metadata", small);
    assert!(matches!(one.reported(), Reported::Usage(u) if u.input == 1 && u.output == 1));
    // A second metadata event does not overwrite the first: the stream is implausible.
    let mut twice = StreamUsage::new(Endpoint::ConverseStream);
    twice.frame("metadata", big);
    twice.frame("metadata", small);
    assert!(matches!(twice.reported(), Reported::Implausible(why) if why.contains("second")));
    let mut twice = StreamUsage::new(Endpoint::ConverseStream);
    twice.frame("metadata", wrong);
    twice.frame("metadata", small);
    assert!(matches!(twice.reported(), Reported::Implausible(why) if why.contains("second")));
    // Usage after an exception cannot be the call's.
    let mut after = StreamUsage::new(Endpoint::ConverseStream);
    after.exception("throttlingException");
    after.frame("metadata", small);
    assert!(
        matches!(after.reported(), Reported::Implausible(why) if why.contains("throttlingException"))
    );
    // An exception and no usage: missing, as any stream that never said it.
    let mut cut = StreamUsage::new(Endpoint::ConverseStream);
    cut.exception("modelStreamErrorException");
    assert_eq!(cut.reported(), Reported::Missing);
}

#[test]
fn usage_is_read_from_bodies_and_streams() {
    let b = br#"{"usage":{"prompt_tokens":100,"completion_tokens":50,"prompt_tokens_details":{"cached_tokens":40}}}"#;
    assert_eq!(
        from_body(Endpoint::ChatCompletions, b),
        got(Usage {
            input: 60,
            cached: 40,
            output: 50,
            ..Usage::default()
        })
    );
    let b = br#"{"usage":{"input_tokens":10,"output_tokens":5,"cache_read_input_tokens":7}}"#;
    assert_eq!(
        from_body(Endpoint::Messages, b),
        got(Usage {
            input: 10,
            cached: 7,
            output: 5,
            ..Usage::default()
        })
    );
    assert_eq!(
        from_body(Endpoint::ChatCompletions, br#"{"usage":null}"#),
        Reported::Missing
    );
    assert_eq!(from_body(Endpoint::Messages, b"{}"), Reported::Missing);
    let mut s = StreamUsage::new(Endpoint::Messages);
    s.event(r#"{"type":"message_start","message":{"usage":{"input_tokens":9,"output_tokens":1}}}"#);
    assert_eq!(
        s.reported(),
        Reported::Missing,
        "no output yet: a cut stream has no usage"
    );
    s.event(r#"{"type":"message_delta","usage":{"output_tokens":30}}"#);
    assert_eq!(
        s.reported(),
        got(Usage {
            input: 9,
            output: 30,
            ..Usage::default()
        })
    );
    let mut s = StreamUsage::new(Endpoint::ChatCompletions);
    assert_eq!(
        s.event(r#"{"choices":[{"delta":{}}],"usage":null}"#),
        Keep::Pass
    );
    assert_eq!(
        s.event(r#"{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4}}"#),
        Keep::Drop
    );
    assert_eq!(
        s.reported(),
        got(Usage {
            input: 3,
            output: 4,
            ..Usage::default()
        })
    );
}

#[test]
fn responses_usage_is_read_from_the_body_and_the_final_event() {
    let body = br#"{"id":"resp_1","object":"response","status":"completed",
        "output":[{"type":"web_search_call","id":"ws_1","status":"completed"},
                  {"type":"message","content":[{"type":"output_text","text":"hi"}]}],
        "usage":{"input_tokens":120,"input_tokens_details":{"cached_tokens":20},
                 "output_tokens":30,"output_tokens_details":{"reasoning_tokens":10},"total_tokens":150}}"#;
    let want = Usage {
        input: 100,
        cached: 20,
        output: 30,
        web_searches: 1,
        ..Usage::default()
    };
    assert_eq!(from_body(Endpoint::Responses, body), got(want));
    let mut s = StreamUsage::new(Endpoint::Responses);
    s.event(r#"{"type":"response.created","response":{"usage":null}}"#);
    assert_eq!(s.reported(), Reported::Missing);
    s.event(r#"{"type":"response.output_text.delta","delta":"hi"}"#);
    let done = format!(
        r#"{{"type":"response.completed","response":{}}}"#,
        String::from_utf8_lossy(body)
    );
    assert_eq!(s.event(&done), Keep::Pass);
    assert_eq!(s.reported(), got(want));
    let mut s = StreamUsage::new(Endpoint::Responses);
    s.event(r#"{"type":"response.incomplete","response":{"usage":{"input_tokens":5,"output_tokens":7}}}"#);
    assert_eq!(
        s.reported(),
        got(Usage {
            input: 5,
            output: 7,
            ..Usage::default()
        })
    );
    let mut s = StreamUsage::new(Endpoint::Responses);
    s.event(r#"{"type":"response.failed","response":{"usage":null}}"#);
    assert_eq!(s.reported(), Reported::Missing);
    // Chat's field names are not Responses usage.
    assert!(matches!(
        from_body(
            Endpoint::Responses,
            br#"{"usage":{"prompt_tokens":1,"completion_tokens":1}}"#
        ),
        Reported::Implausible(_)
    ));
}

#[test]
fn count_tokens_costs_nothing() {
    let r = from_body(Endpoint::CountTokens, br#"{"input_tokens":4000}"#);
    assert_eq!(r, got(Usage::default()));
    assert_eq!(Usage::default().cost(&price(None, None)), Some(Nanos(0)));
}

#[test]
fn usage_that_cannot_be_true_is_told_from_none() {
    for (endpoint, body) in [
        (
            Endpoint::ChatCompletions,
            r#"{"usage":{"prompt_tokens":-1,"completion_tokens":1}}"#,
        ),
        (
            Endpoint::ChatCompletions,
            r#"{"usage":{"prompt_tokens":1.5,"completion_tokens":1}}"#,
        ),
        (
            Endpoint::ChatCompletions,
            r#"{"usage":{"prompt_tokens":"3","completion_tokens":1}}"#,
        ),
        (
            Endpoint::ChatCompletions,
            r#"{"usage":{"prompt_tokens":1e30,"completion_tokens":1}}"#,
        ),
        (
            Endpoint::ChatCompletions,
            r#"{"usage":{"completion_tokens":1}}"#,
        ),
        (
            Endpoint::ChatCompletions,
            r#"{"usage":{"prompt_tokens":5,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":6}}}"#,
        ),
        (Endpoint::ChatCompletions, r#"{"usage":7}"#),
        (
            Endpoint::Messages,
            r#"{"usage":{"input_tokens":1,"output_tokens":-5}}"#,
        ),
        (
            Endpoint::Messages,
            r#"{"usage":{"input_tokens":1,"output_tokens":1,"cache_read_input_tokens":0.5}}"#,
        ),
        (
            Endpoint::Messages,
            r#"{"usage":{"input_tokens":1,"output_tokens":1,"server_tool_use":{"web_search_requests":-1}}}"#,
        ),
        (
            Endpoint::Messages,
            r#"{"usage":{"input_tokens":1,"output_tokens":1,"cache_creation_input_tokens":8,"cache_creation":{"ephemeral_1h_input_tokens":9}}}"#,
        ),
        (Endpoint::Responses, r#"{"usage":{"input_tokens":1}}"#),
    ] {
        assert!(
            matches!(
                from_body(endpoint, body.as_bytes()),
                Reported::Implausible(_)
            ),
            "{body}"
        );
    }
    let mut s = StreamUsage::new(Endpoint::Messages);
    s.event(r#"{"type":"message_start","message":{"usage":{"input_tokens":-9}}}"#);
    s.event(r#"{"type":"message_delta","usage":{"output_tokens":30}}"#);
    assert!(matches!(s.reported(), Reported::Implausible(_)));
    let mut s = StreamUsage::new(Endpoint::Messages);
    s.event(r#"{"type":"message_start","message":{"usage":{"input_tokens":9}}}"#);
    s.event(r#"{"type":"message_delta","usage":{"output_tokens":3.5}}"#);
    assert!(matches!(s.reported(), Reported::Implausible(_)));
    // Above the model's context and output limit: not believed.
    let p = ModelPrice {
        context_tokens: 1000,
        ..price(None, None)
    };
    let big = Reported::Usage(Usage {
        input: 1000,
        output: 1001,
        ..Usage::default()
    });
    assert!(matches!(
        big.clone().within(Some(&p), 1),
        Reported::Implausible(_)
    ));
    assert_eq!(big.clone().within(None, 1), big, "no price, no bound");
    assert_eq!(big.within(Some(&p), 1).usage(), None);
    let fits = Reported::Usage(Usage {
        input: 1000,
        output: 1000,
        ..Usage::default()
    });
    assert_eq!(fits.clone().within(Some(&p), 1), fits);
    // A search is one more turn of sampling.
    let searched = Reported::Usage(Usage {
        input: 3000,
        output: 1000,
        web_searches: 1,
        ..Usage::default()
    });
    assert_eq!(searched.clone().within(Some(&p), 1), searched);
    // Each choice (OpenAI's `n`, Gemini's `candidateCount`) has its own output limit.
    let three = Reported::Usage(Usage {
        input: 1000,
        output: 3000,
        ..Usage::default()
    });
    assert_eq!(three.clone().within(Some(&p), 3), three);
    assert!(matches!(
        three.within(Some(&p), 2),
        Reported::Implausible(_)
    ));
}

fn price(cache_write: Option<u64>, cache_write_1h: Option<u64>) -> ModelPrice {
    ModelPrice {
        cached_input_per_mtok: Nanos(300_000_000),
        cache_write_per_mtok: cache_write.map(Nanos),
        cache_write_1h_per_mtok: cache_write_1h.map(Nanos),
        max_output_tokens: 1000,
        ..ModelPrice::new(Nanos(3_000_000_000), Nanos(15_000_000_000))
    }
}

#[test]
fn web_searches_are_priced_per_use_or_not_guessed() {
    let b = br#"{"usage":{"input_tokens":10,"output_tokens":5,"server_tool_use":{"web_search_requests":2}}}"#;
    let u = from_body(Endpoint::Messages, b).usage().expect("usage");
    assert_eq!(u.web_searches, 2);
    let p = ModelPrice {
        web_search_per_use: Some(Nanos(10_000_000)),
        ..price(None, None)
    };
    assert_eq!(u.cost(&p), Some(Nanos(30_000 + 75_000 + 20_000_000)));
    assert_eq!(u.cost(&price(None, None)), None);
    // A stream's delta carries the searches with the totals.
    let mut s = StreamUsage::new(Endpoint::Messages);
    s.event(
        r#"{"type":"message_start","message":{"usage":{"input_tokens":10,"output_tokens":1}}}"#,
    );
    s.event(r#"{"type":"message_delta","usage":{"input_tokens":900,"output_tokens":5,"server_tool_use":{"web_search_requests":1}}}"#);
    assert_eq!(
        s.reported(),
        got(Usage {
            input: 900,
            output: 5,
            web_searches: 1,
            ..Usage::default()
        })
    );
}

#[test]
fn cache_writes_are_priced_at_their_own_price_or_not_guessed() {
    // 1000 written, of them 400 to the 1-hour cache; 7 read; 10 plain in; 5 out.
    let b = br#"{"usage":{"input_tokens":10,"output_tokens":5,"cache_read_input_tokens":7,
        "cache_creation_input_tokens":1000,
        "cache_creation":{"ephemeral_5m_input_tokens":600,"ephemeral_1h_input_tokens":400}}}"#;
    let u = from_body(Endpoint::Messages, b).usage().expect("usage");
    assert_eq!(
        u,
        Usage {
            input: 10,
            cached: 7,
            written: 600,
            written_1h: 400,
            output: 5,
            web_searches: 0,
            other_modality: false,
        }
    );
    // $3.75 and $6 per million writes: exact nanodollars.
    let p = price(Some(3_750_000_000), Some(6_000_000_000));
    let want = 10 * 3_000 + 7 * 300 + 600 * 3_750 + 400 * 6_000 + 5 * 15_000;
    assert_eq!(u.cost(&p), Some(Nanos(want)));
    // Not at the plain input price (the old count, 25 % and 50 % under the bill).
    assert!(want > (10 + 1000) * 3_000 + 7 * 300 + 5 * 15_000);
    // A write with no price: no cost tally would have to guess.
    assert_eq!(u.cost(&price(Some(3_750_000_000), None)), None);
    assert_eq!(u.cost(&price(None, Some(6_000_000_000))), None);
    // No writes: no write price needed.
    let plain = Usage {
        input: 10,
        output: 5,
        ..Usage::default()
    };
    assert_eq!(plain.cost(&price(None, None)), Some(Nanos(30_000 + 75_000)));
    // Without the breakdown every write is a 5-minute one.
    let b = br#"{"usage":{"input_tokens":1,"output_tokens":1,"cache_creation_input_tokens":8}}"#;
    let u = from_body(Endpoint::Messages, b).usage().expect("usage");
    assert_eq!((u.written, u.written_1h), (8, 0));
    let mut s = StreamUsage::new(Endpoint::Messages);
    s.event(r#"{"type":"message_start","message":{"usage":{"input_tokens":2,"cache_creation_input_tokens":30}}}"#);
    s.event(r#"{"type":"message_delta","usage":{"output_tokens":3}}"#);
    assert_eq!(
        s.reported(),
        got(Usage {
            input: 2,
            written: 30,
            output: 3,
            ..Usage::default()
        })
    );
}

/// serde_json's private marker, as a model may write it as a key of its tool input.
const MARKER: &str = "$serde_json::private::RawValue";

#[test]
fn a_marker_key_in_a_models_tool_input_leaves_the_usage_read() {
    let usage = |input, output| {
        got(Usage {
            input,
            output,
            ..Usage::default()
        })
    };
    // Where each dialect carries keys a model chose: its tool input (first, and not
    // first, in the object), and elsewhere in what the readers do not keep.
    for input in [
        format!(r#"{{"{MARKER}":1}}"#),
        format!(r#"{{"q":"x","{MARKER}":{{"{MARKER}":"{{"}}}}"#),
    ] {
        for (endpoint, body, want) in [
            (
                Endpoint::Messages,
                format!(
                    r#"{{"id":"m","type":"message","content":[{{"type":"tool_use","id":"t","name":"f","input":{input}}}],"stop_reason":"tool_use","usage":{{"input_tokens":10,"output_tokens":5}}}}"#
                ),
                usage(10, 5),
            ),
            (
                Endpoint::GenerateContent,
                format!(
                    r#"{{"candidates":[{{"content":{{"parts":[{{"functionCall":{{"name":"f","args":{input}}}}}],"role":"model"}},"finishReason":"STOP"}}],"usageMetadata":{{"promptTokenCount":5,"candidatesTokenCount":3,"totalTokenCount":8}}}}"#
                ),
                usage(5, 3),
            ),
            (
                Endpoint::Converse,
                format!(
                    r#"{{"output":{{"message":{{"role":"assistant","content":[{{"toolUse":{{"toolUseId":"t","name":"f","input":{input}}}}}]}}}},"stopReason":"tool_use","usage":{{"inputTokens":3,"outputTokens":2,"totalTokens":5}}}}"#
                ),
                usage(3, 2),
            ),
            (
                Endpoint::ChatCompletions,
                format!(
                    r#"{{"choices":[{{"message":{{"content":"x","extra":{input}}}}}],"usage":{{"prompt_tokens":4,"completion_tokens":1}}}}"#
                ),
                usage(4, 1),
            ),
            (
                Endpoint::Responses,
                format!(
                    r#"{{"output":[{{"type":"function_call","extra":{input}}}],"usage":{{"input_tokens":4,"output_tokens":1}}}}"#
                ),
                usage(4, 1),
            ),
        ] {
            assert_eq!(from_body(endpoint, body.as_bytes()), want, "{body}");
        }
        // Streamed: Gemini's chunks carry the call's args; Anthropic's a tool block's
        // start its input.
        let mut s = StreamUsage::new(Endpoint::StreamGenerateContent);
        s.event(&format!(
            r#"{{"candidates":[{{"content":{{"parts":[{{"functionCall":{{"name":"f","args":{input}}}}}]}},"finishReason":"STOP"}}],"usageMetadata":{{"promptTokenCount":5,"candidatesTokenCount":3,"totalTokenCount":8}}}}"#
        ));
        assert_eq!(s.reported(), usage(5, 3), "{input}");
        let mut s = StreamUsage::new(Endpoint::Messages);
        for e in [
            r#"{"type":"message_start","message":{"usage":{"input_tokens":10,"output_tokens":1}}}"#
                .to_owned(),
            format!(
                r#"{{"type":"content_block_start","index":0,"content_block":{{"type":"tool_use","id":"t","name":"f","input":{input}}}}}"#
            ),
            format!(
                r#"{{"type":"message_delta","delta":{{"stop_reason":"tool_use","extra":{input}}},"usage":{{"output_tokens":5}}}}"#
            ),
        ] {
            s.event(&e);
        }
        assert_eq!(s.reported(), usage(10, 5), "{input}");
    }
    // A `Value`'s reader refuses the first of these: what made such an answer's usage
    // unreadable before.
    let first = format!(r#"{{"a":{{"{MARKER}":1}}}}"#);
    assert!(serde_json::from_str::<serde_json::Value>(&first).is_err());
}

#[test]
fn a_marker_key_in_the_usage_itself_is_read_as_a_value_reads_it() {
    // The usage is the upstream's, kept whole: a marker first in it is what a `Value`'s
    // reader refuses (no usage read), as before.
    let body = format!(r#"{{"usage":{{"{MARKER}":1,"input_tokens":10,"output_tokens":5}}}}"#);
    assert!(serde_json::from_str::<serde_json::Value>(&body).is_err());
    assert_eq!(
        from_body(Endpoint::Messages, body.as_bytes()),
        Reported::Missing
    );
    // Not first, it is an ordinary key there too.
    let body = format!(r#"{{"usage":{{"input_tokens":10,"{MARKER}":1,"output_tokens":5}}}}"#);
    assert_eq!(
        from_body(Endpoint::Messages, body.as_bytes()),
        got(Usage {
            input: 10,
            output: 5,
            ..Usage::default()
        })
    );
    // At the top of an answer, it names no member the readers read.
    let body =
        format!(r#"{{"{MARKER}":"{{\"usage\":{{\"input_tokens\":1,\"output_tokens\":2}}}}"}}"#);
    assert_eq!(
        from_body(Endpoint::Messages, body.as_bytes()),
        Reported::Missing
    );
}

//! The classifier's rule, line by line (docs/MCP.md, "What reaches the server"): test
//! vectors for what passes, as what, and for what is refused, why, and under which id it
//! is answered. The same lines against the real servers are `proxy/crafted.rs`.

use serde_json::{json, Map, Value};
use tally_mcp::classify::{
    classify, Call, Classified, Id, Message, Why, MAX_DEPTH, NOTIFICATIONS, REQUESTS,
};

fn ok(line: &str) -> Classified {
    classify(line.as_bytes())
        .unwrap_or_else(|r| panic!("refused {line:?}: {} ({:?})", r.why, r.why))
}

/// The refusal's reason code and the ids it is answered under.
fn refused(line: &[u8]) -> (&'static str, Vec<Id>) {
    match classify(line) {
        Ok(c) => panic!(
            "passed {:?} as {:?}",
            String::from_utf8_lossy(line),
            c.message
        ),
        Err(r) => (r.why.code(), r.answer),
    }
}

fn why(line: &[u8]) -> Why {
    classify(line).expect_err("refused").why
}

const CALL: &str = r#"{"name":"send","arguments":{"to":"bob"}}"#;

fn args(v: Value) -> Map<String, Value> {
    v.as_object().expect("object").clone()
}

#[test]
fn a_call_is_classified_with_its_id_name_and_arguments() {
    let line = format!(r#"{{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{CALL}}}"#);
    let c = ok(&line);
    assert_eq!(c.line, line, "forwarded as received");
    assert_eq!(
        c.message,
        Message::Call {
            id: Id::Number(7),
            call: Call {
                name: "send".into(),
                arguments: args(json!({"to": "bob"})),
                trace: None,
            },
        }
    );
    // Escapes are read as every parser reads them: the same method, so the gate decides.
    for method in [r"tools\/call", r"\u0074ools/call", r"tools\u002fcall"] {
        let line = format!(r#"{{"jsonrpc":"2.0","id":"a","method":"{method}","params":{CALL}}}"#);
        assert!(matches!(ok(&line).message, Message::Call { .. }), "{line}");
    }
    // No arguments, or null: none.
    let c = ok(
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","arguments":null,"_meta":{"progressToken":1}}}"#,
    );
    assert!(
        matches!(c.message, Message::Call { call: Call { ref arguments, .. }, .. } if arguments.is_empty())
    );
    // A CR before the newline is the line end (CRLF framing).
    let c = classify(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}\r").expect("CRLF");
    assert_eq!(c.line, r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#);
}

#[test]
fn every_method_on_the_allow_list_passes_byte_for_byte() {
    for m in REQUESTS.iter().filter(|m| **m != "tools/call") {
        let line = format!(r#"{{"jsonrpc":"2.0","id":1,"method":"{m}","params":{{}}}}"#);
        assert_eq!(
            ok(&line).message,
            Message::Request {
                id: Id::Number(1),
                method: m
            }
        );
        // A request method without an id is not a notification the proxy knows.
        let line = format!(r#"{{"jsonrpc":"2.0","method":"{m}"}}"#);
        assert_eq!(refused(line.as_bytes()).0, "unknown_notification");
    }
    for m in NOTIFICATIONS {
        let line = format!(r#"{{"jsonrpc":"2.0","method":"{m}"}}"#);
        assert!(matches!(ok(&line).message, Message::Notification { method, .. } if method == *m));
        // A notification method with an id is not a request the proxy knows.
        let line = format!(r#"{{"jsonrpc":"2.0","id":3,"method":"{m}"}}"#);
        assert_eq!(
            refused(line.as_bytes()),
            ("unknown_method", vec![Id::Number(3)])
        );
    }
    assert_eq!(
        ok(r#"{"jsonrpc":"2.0","id":"s1","result":{}}"#).message,
        Message::Response {
            id: Id::String("s1".into())
        }
    );
    assert_eq!(
        ok(r#"{"jsonrpc":"2.0","id":2,"error":{"code":-1,"message":"no"}}"#).message,
        Message::Response { id: Id::Number(2) }
    );
}

#[test]
fn method_spellings_a_lenient_server_might_accept_are_refused() {
    for method in [
        "Tools/call",
        "TOOLS/CALL",
        "tools/call ",
        " tools/call",
        "tools/call\\u0000",
        "tools/call\\n",
        "tools\u{2215}call",
        "\u{ff54}ools/call",
        "tools/Call",
        "tools//call",
        "tools/call/",
        "custom/thing",
        "",
    ] {
        let line = format!(r#"{{"jsonrpc":"2.0","id":9,"method":"{method}","params":{CALL}}}"#);
        assert_eq!(
            refused(line.as_bytes()),
            ("unknown_method", vec![Id::Number(9)]),
            "{method:?}"
        );
        assert_eq!(why(line.as_bytes()).rpc_code(), -32601);
    }
    assert_eq!(
        refused(br#"{"jsonrpc":"2.0","id":9,"method":7}"#).0,
        "method_not_string"
    );
}

#[test]
fn duplicate_members_at_any_depth_are_refused() {
    let cases: &[(&str, &str, Vec<Id>)] = &[
        // Two ids: no id to answer under.
        (
            r#"{"jsonrpc":"2.0","id":1,"id":2,"method":"tools/call","params":{}}"#,
            "",
            vec![],
        ),
        // The same name escaped is the same name.
        (
            r#"{"jsonrpc":"2.0","id":1,"i\u0064":2,"method":"ping"}"#,
            "",
            vec![],
        ),
        (
            r#"{"jsonrpc":"2.0","id":3,"method":"ping","method":"tools/call","params":{}}"#,
            "",
            vec![Id::Number(3)],
        ),
        (
            r#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"a"},"params":{"name":"b"}}"#,
            "",
            vec![Id::Number(4)],
        ),
        (
            r#"{"jsonrpc":"2.0","jsonrpc":"2.0","id":5,"method":"ping"}"#,
            "",
            vec![Id::Number(5)],
        ),
        (
            r#"{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":"a","name":"b"}}"#,
            ".params",
            vec![Id::Number(6)],
        ),
        (
            r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"a","arguments":{"x":{"y":1,"y":2}}}}"#,
            ".params.arguments.x",
            vec![Id::Number(7)],
        ),
        (
            r#"{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"a","arguments":{"x":[{},{"k":1,"k":1}]}}}"#,
            ".params.arguments.x[1]",
            vec![Id::Number(8)],
        ),
        (
            r#"{"jsonrpc":"2.0","id":9,"result":{"a":1,"a":1}}"#,
            ".result",
            vec![],
        ),
    ];
    for (line, at, answer) in cases {
        let c = classify(line.as_bytes()).expect_err(line);
        assert!(
            matches!(&c.why, Why::DuplicateKey { at: a, .. } if a == at),
            "{line}: {:?}",
            c.why
        );
        assert_eq!(&c.answer, answer, "{line}");
    }
}

#[test]
fn nesting_is_bounded() {
    // The envelope is level 1, params 2, arguments 3: MAX_DEPTH - 3 more levels fit.
    let nest = |n: usize| {
        format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"a","arguments":{{"x":{}{}}}}}}}"#,
            "[".repeat(n),
            "]".repeat(n)
        )
    };
    assert!(matches!(
        ok(&nest(MAX_DEPTH - 3)).message,
        Message::Call { .. }
    ));
    let (code, answer) = refused(nest(MAX_DEPTH - 2).as_bytes());
    assert_eq!((code, answer), ("too_deep", vec![Id::Number(1)]));
    // Far past serde_json's own recursion limit: still refused, still answered.
    let (code, answer) = refused(nest(100_000).as_bytes());
    assert_eq!((code, answer), ("too_deep", vec![Id::Number(1)]));
    let deep_id = format!(
        r#"{{"jsonrpc":"2.0","method":"ping","id":{}1{}}}"#,
        "[".repeat(200),
        "]".repeat(200)
    );
    assert_eq!(refused(deep_id.as_bytes()), ("too_deep", vec![]));
}

#[test]
fn ids_are_strings_or_integers_every_parser_reads_exactly() {
    let request = |id: &str| format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"ping"}}"#);
    for (id, want) in [
        ("0", Id::Number(0)),
        ("-5", Id::Number(-5)),
        ("9007199254740991", Id::Number(9_007_199_254_740_991)),
        ("-9007199254740991", Id::Number(-9_007_199_254_740_991)),
        (r#""""#, Id::String(String::new())),
        (r#""1""#, Id::String("1".into())),
        (r#""\u0031""#, Id::String("1".into())),
    ] {
        assert_eq!(
            ok(&request(id)).message,
            Message::Request {
                id: want,
                method: "ping"
            },
            "{id}"
        );
    }
    for id in [
        "null",
        "9007199254740992",
        "-9007199254740992",
        "123456789012345678901234567890",
        "1.0",
        "1.5",
        "1e0",
        "-0",
        "true",
        "[1]",
        "{}",
    ] {
        assert_eq!(refused(request(id).as_bytes()), ("bad_id", vec![]), "{id}");
    }
    assert_eq!(
        refused(br#"{"jsonrpc":"2.0","method":"ping","id":1e400}"#).0,
        "not_json"
    );
}

#[test]
fn what_is_not_one_json_object_of_json_rpc_is_refused() {
    let cases: &[(&[u8], &str)] = &[
        (b"", "not_json"),
        (b"   ", "not_json"),
        (b"\xef\xbb\xbf{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}", "not_json"),
        (b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"} {}", "not_json"),
        (b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\",}", "not_json"),
        (b"{'jsonrpc':'2.0'}", "not_json"),
        (b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\",\"params\":{\"s\":\"\\ud800\"}}", "not_json"),
        (b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\",\"params\":{\"s\":\"\xff\"}}", "not_utf8"),
        (b"{\"jsonrpc\":\"2.0\",\r\"id\":1,\"method\":\"ping\"}", "line_break"),
        (b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}\r\r", "line_break"),
        // The framing splits at LF; a caller that did not still gets no line break through.
        (b"\n{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}", "line_break"),
        (b"\"tools/call\"", "not_an_object"),
        (b"null", "not_an_object"),
        (b"[]", "batch"),
        (b"{\"id\":1,\"method\":\"ping\"}", "not_jsonrpc_2"),
        (b"{\"jsonrpc\":\"1.0\",\"id\":1,\"method\":\"ping\"}", "not_jsonrpc_2"),
        (b"{\"jsonrpc\":2.0,\"id\":1,\"method\":\"ping\"}", "not_jsonrpc_2"),
        (b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\",\"Method\":\"tools/call\"}", "unknown_member"),
        (b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\",\"paramS\":{}}", "unknown_member"),
        (b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\",\"params\":{\"name\":\"a\"},\"result\":{}}", "ambiguous"),
        (b"{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{},\"error\":{}}", "ambiguous"),
        (b"{\"jsonrpc\":\"2.0\",\"id\":1}", "ambiguous"),
        (b"{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":7}", "ambiguous"),
        (b"{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{},\"params\":{}}", "ambiguous"),
        (b"{\"jsonrpc\":\"2.0\",\"result\":{}}", "bad_id"),
        (b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\",\"params\":[1]}", "bad_params"),
    ];
    for (line, code) in cases {
        assert_eq!(
            refused(line).0,
            *code,
            "{:?}",
            String::from_utf8_lossy(line)
        );
    }
    // Where the id is usable and the line is not an answer, the refusal is answered.
    assert_eq!(
        refused(b"{\"jsonrpc\":\"1.0\",\"id\":1,\"method\":\"ping\"}").1,
        vec![Id::Number(1)]
    );
    assert_eq!(
        refused(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\",\"params\":{\"name\":\"a\"},\"result\":{}}").1,
        vec![]
    );
}

#[test]
fn a_batch_is_refused_and_each_request_in_it_answered() {
    let line = format!(
        r#"[{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{CALL}}},{{"jsonrpc":"2.0","method":"notifications/initialized"}},{{"jsonrpc":"2.0","id":"b","method":"Tools/call"}},{{"jsonrpc":"2.0","id":3,"result":{{}}}},[{{"jsonrpc":"2.0","id":4,"method":"ping"}}],7]"#
    );
    assert_eq!(
        refused(line.as_bytes()),
        ("batch", vec![Id::Number(1), Id::String("b".into())])
    );
}

#[test]
fn tools_call_params_are_read_strictly() {
    let call = |params: &str| {
        format!(r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{params}}}"#)
    };
    for params in [
        "null",
        "[]",
        r#"{}"#,
        r#"{"name":7}"#,
        r#"{"name":""}"#,
        r#"{"name":"send\u0000"}"#,
        r#"{"name":"se\nnd"}"#,
        r#"{"name":"send\u0085"}"#,
        r#"{"name":"a","Name":"send"}"#,
        r#"{"name":"a","arguments":[]}"#,
        r#"{"name":"a","arguments":"x"}"#,
        r#"{"name":"a","_meta":1}"#,
        r#"{"name":"a","task":{"ttl":1}}"#,
    ] {
        assert_eq!(
            refused(call(params).as_bytes()),
            ("bad_params", vec![Id::Number(1)]),
            "{params}"
        );
    }
    let text = why(call(r#"{"name":"a","task":{}}"#).as_bytes()).to_string();
    assert!(text.contains("task-augmented"), "{text}");
}

#[test]
fn line_separators_inside_strings_are_forwarded_escaped() {
    let line = "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\",\"params\":{\"name\":\"a\",\"arguments\":{\"t\":\"x\u{2028}y\u{2029}z\u{85}\"}}}";
    let c = ok(line);
    assert_eq!(
        c.line,
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a","arguments":{"t":"x\u2028y\u2029z\u0085"}}}"#
    );
    assert_eq!(
        serde_json::from_str::<Value>(&c.line).unwrap(),
        serde_json::from_str::<Value>(line).unwrap()
    );
    let Message::Call { call, .. } = c.message else {
        panic!("a call")
    };
    assert_eq!(call.arguments["t"], "x\u{2028}y\u{2029}z\u{85}");
}

#[test]
fn refusals_say_what_and_where_without_echoing_much() {
    let text = why(br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a","arguments":{"x":{"y":1,"y":2}}}}"#).to_string();
    assert_eq!(
        text,
        r#"the member "y" appears twice in ".params.arguments.x""#
    );
    let long = "m".repeat(10_000);
    let text =
        why(format!(r#"{{"jsonrpc":"2.0","id":1,"method":"{long}"}}"#).as_bytes()).to_string();
    assert!(text.len() < 200 && text.contains('…'), "{text}");
    let text =
        why(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\",\"params\":{\"s\":\"\xff\"}}")
            .to_string();
    assert_eq!(text, "the line is not UTF-8 (byte 55)");
}

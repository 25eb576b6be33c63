//! Crafted messages: every line the proxy cannot classify with certainty is refused and
//! never reaches the server, against both real servers (the MCP Python SDK's and the
//! reference server). What reached the server is read from a tap on its stdin (`tee`),
//! and from the server itself: the Python test server's call log, the reference server's
//! echo; the gate's allows from the verified ledger; the proxy's count from its stderr.

use super::*;

/// A tool that leaves a mark when it runs, and the argument that carries the mark.
pub(super) struct Target {
    pub(super) tool: &'static str,
    pub(super) arg: &'static str,
}

/// One crafted line, and the error the client must get (`None`: no answer at all, as it
/// has no id the proxy can answer).
pub(super) struct Variant {
    pub(super) name: &'static str,
    pub(super) line: Vec<u8>,
    pub(super) answer: Option<(u64, i64)>,
}

pub(super) fn mark(name: &str) -> String {
    format!("mark-{name}")
}

pub(super) fn variants(t: &Target) -> Vec<Variant> {
    let params = |name: &str| json!({"name": t.tool, "arguments": {t.arg: mark(name)}}).to_string();
    let harmless = json!({"name": "nonesuch", "arguments": {}}).to_string();
    let deep = format!("{}{}", "[".repeat(130), "]".repeat(130));
    let mut out = Vec::new();
    let mut add = |name: &'static str, line: String, answer: Option<(u64, i64)>| {
        out.push(Variant {
            name,
            line: line.into_bytes(),
            answer,
        })
    };
    let p = params;
    add(
        "duplicate_id",
        format!(
            r#"{{"jsonrpc":"2.0","id":101,"id":102,"method":"tools/call","params":{}}}"#,
            p("duplicate_id")
        ),
        None,
    );
    add(
        "duplicate_method",
        format!(
            r#"{{"jsonrpc":"2.0","id":103,"method":"ping","method":"tools/call","params":{}}}"#,
            p("duplicate_method")
        ),
        Some((103, -32600)),
    );
    add(
        "duplicate_params",
        format!(
            r#"{{"jsonrpc":"2.0","id":104,"method":"tools/call","params":{harmless},"params":{}}}"#,
            p("duplicate_params")
        ),
        Some((104, -32600)),
    );
    add(
        "arguments_130_deep",
        format!(
            r#"{{"jsonrpc":"2.0","id":105,"method":"tools/call","params":{{"name":"{}","arguments":{{"{}":"{}","deep":{deep}}}}}}}"#,
            t.tool,
            t.arg,
            mark("arguments_130_deep")
        ),
        Some((105, -32600)),
    );
    add(
        "id_null",
        format!(
            r#"{{"jsonrpc":"2.0","id":null,"method":"tools/call","params":{}}}"#,
            p("id_null")
        ),
        None,
    );
    add(
        "id_missing",
        format!(
            r#"{{"jsonrpc":"2.0","method":"tools/call","params":{}}}"#,
            p("id_missing")
        ),
        None,
    );
    for (name, id, method) in [
        ("method_capitalized", 107, "Tools/call"),
        ("method_trailing_space", 108, "tools/call "),
        ("method_upper_case", 109, "TOOLS/CALL"),
        ("method_lookalike_slash", 110, "tools\u{2215}call"),
        ("method_escaped_nul", 111, "tools/call\\u0000"),
        ("method_unknown", 125, "custom/thing"),
    ] {
        add(
            name,
            format!(
                r#"{{"jsonrpc":"2.0","id":{id},"method":"{method}","params":{}}}"#,
                p(name)
            ),
            Some((id, -32601)),
        );
    }
    add(
        "method_key_case",
        format!(
            r#"{{"jsonrpc":"2.0","id":112,"method":"ping","Method":"tools/call","params":{}}}"#,
            p("method_key_case")
        ),
        Some((112, -32600)),
    );
    add(
        "method_and_result",
        format!(
            r#"{{"jsonrpc":"2.0","id":113,"method":"tools/call","params":{},"result":{{}}}}"#,
            p("method_and_result")
        ),
        None,
    );
    add(
        "id_fraction",
        format!(
            r#"{{"jsonrpc":"2.0","id":1.5,"method":"tools/call","params":{}}}"#,
            p("id_fraction")
        ),
        None,
    );
    add(
        "id_beyond_2_53",
        format!(
            r#"{{"jsonrpc":"2.0","id":123456789012345678901234567890,"method":"tools/call","params":{}}}"#,
            p("id_beyond_2_53")
        ),
        None,
    );
    add(
        "no_jsonrpc",
        format!(
            r#"{{"id":116,"method":"tools/call","params":{}}}"#,
            p("no_jsonrpc")
        ),
        Some((116, -32600)),
    );
    add(
        "batch",
        format!(
            r#"[{{"jsonrpc":"2.0","id":117,"method":"tools/call","params":{}}}]"#,
            p("batch")
        ),
        Some((117, -32600)),
    );
    add(
        "byte_order_mark",
        format!(
            "\u{feff}{{\"jsonrpc\":\"2.0\",\"id\":118,\"method\":\"tools/call\",\"params\":{}}}",
            p("byte_order_mark")
        ),
        None,
    );
    add(
        "carriage_return_split",
        format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":120,\"method\":\"ping\",\"params\":{{\"x\":\r{{\"jsonrpc\":\"2.0\",\"id\":121,\"method\":\"tools/call\",\"params\":{}}}\r}}}}",
            p("carriage_return_split")
        ),
        None,
    );
    add(
        "tool_name_twice",
        format!(
            r#"{{"jsonrpc":"2.0","id":122,"method":"tools/call","params":{{"name":"nonesuch","name":"{}","arguments":{{"{}":"{}"}}}}}}"#,
            t.tool,
            t.arg,
            mark("tool_name_twice")
        ),
        Some((122, -32600)),
    );
    add(
        "tool_name_key_case",
        format!(
            r#"{{"jsonrpc":"2.0","id":123,"method":"tools/call","params":{{"name":"nonesuch","Name":"{}","arguments":{{"{}":"{}"}}}}}}"#,
            t.tool,
            t.arg,
            mark("tool_name_key_case")
        ),
        Some((123, -32602)),
    );
    add(
        "answer_to_nothing",
        format!(
            r#"{{"jsonrpc":"2.0","id":124,"result":{{"m":"{}"}}}}"#,
            mark("answer_to_nothing")
        ),
        None,
    );
    add(
        "notification_unknown",
        format!(
            r#"{{"jsonrpc":"2.0","method":"notifications/custom","params":{{"m":"{}"}}}}"#,
            mark("notification_unknown")
        ),
        None,
    );
    add(
        "task_augmented_call",
        format!(
            r#"{{"jsonrpc":"2.0","id":126,"method":"tools/call","params":{{"name":"{}","arguments":{{"{}":"{}"}},"task":{{"ttl":60000}}}}}}"#,
            t.tool,
            t.arg,
            mark("task_augmented_call")
        ),
        Some((126, -32602)),
    );
    // Invalid UTF-8 inside an argument.
    let mut bad = format!(
        r#"{{"jsonrpc":"2.0","id":119,"method":"tools/call","params":{{"name":"{}","arguments":{{"{}":"{}","x":""#,
        t.tool, t.arg, mark("invalid_utf8")
    )
    .into_bytes();
    bad.extend_from_slice(b"\xff\xfe\"}}}");
    out.push(Variant {
        name: "invalid_utf8",
        line: bad,
        answer: None,
    });
    out
}

/// Calls that must pass, through the gate: plain, method names escaped in JSON (the same
/// string once read), and an argument with a raw U+2028 (forwarded escaped).
pub(super) fn passing(t: &Target) -> Vec<(u64, String)> {
    let args = |m: &str| json!({t.arg: m}).to_string();
    vec![
        (
            201,
            format!(
                r#"{{"jsonrpc":"2.0","id":201,"method":"tools/call","params":{{"name":"{}","arguments":{}}}}}"#,
                t.tool,
                args("pass-plain")
            ),
        ),
        (
            202,
            format!(
                r#"{{"jsonrpc":"2.0","id":202,"method":"tools\/call","params":{{"name":"{}","arguments":{}}}}}"#,
                t.tool,
                args("pass-escaped-slash")
            ),
        ),
        (
            203,
            format!(
                r#"{{"jsonrpc":"2.0","id":203,"method":"\u0074ools/call","params":{{"name":"{}","arguments":{}}}}}"#,
                t.tool,
                args("pass-escaped-t")
            ),
        ),
        (
            204,
            format!(
                r#"{{"jsonrpc":"2.0","id":204,"method":"tools/call","params":{{"name":"{}","arguments":{}}}}}"#,
                t.tool,
                args("pass-line\u{2028}separator")
            ),
        ),
    ]
}

/// Lines until the answer to `id` (or `limit`), without failing.
fn lines_until(raw: &mut Raw, id: Option<u64>, limit: Duration) -> Vec<Value> {
    let mut got = Vec::new();
    let deadline = Instant::now() + limit;
    while let Ok(line) = raw
        .lines
        .recv_timeout(deadline.saturating_duration_since(Instant::now()))
    {
        let v: Value = serde_json::from_str(&line).unwrap_or(Value::String(line));
        let done = id.is_some_and(|id| v["id"] == json!(id) && v.get("method").is_none());
        got.push(v);
        if done {
            break;
        }
    }
    got
}

fn is_answer(v: &Value) -> bool {
    v.get("method").is_none() && (v.get("result").is_some() || v.get("error").is_some())
}

/// Send every crafted line through `tally mcp` in front of `server` (tapped), then the
/// passing calls; check each against the server's stdin, the client's answers, the
/// proxy's count and the ledger. `ran` says which marks the server itself shows it ran.
fn crafted_lines_never_reach(
    server: &[String],
    t: &Target,
    env: &[(&str, &str)],
    ran: impl Fn(&Gate) -> Vec<String>,
) -> Gate {
    let gate = Gate::start("");
    let tap = gate.path("server-stdin.log");
    // bash becomes the server (exec), its stdin a copy of what the proxy writes: the
    // proxy still waits for and stops the server itself.
    let mut tapped: Vec<String> = vec![
        "bash".into(),
        "-c".into(),
        r#"exec "$@" < <(exec tee -a "$0")"#.into(),
        tap.clone(),
    ];
    tapped.extend(server.iter().cloned());
    let stderr = std::fs::File::create(gate.path("proxy.stderr")).expect("stderr file");
    let mut raw = Raw::start_logged(&gate.proxy_to("crafted", &[], &tapped), env, stderr);
    initialize(&mut raw);

    let variants = variants(t);
    let mut failures: Vec<String> = Vec::new();
    let mut received: Vec<Value> = Vec::new();
    for v in &variants {
        raw.send_bytes(&v.line);
        match v.answer {
            Some((id, code)) => {
                let got = lines_until(&mut raw, Some(id), Duration::from_secs(10));
                received.extend(got.iter().cloned());
                let answer = got.iter().find(|l| l["id"] == json!(id) && is_answer(l));
                match answer {
                    Some(a)
                        if a["error"]["code"] == json!(code)
                            && a["error"]["message"]
                                .as_str()
                                .is_some_and(|m| m.contains("tally mcp refused"))
                            && a["error"]["data"]["tally/refused"]["reason"].is_string() => {}
                    other => failures.push(format!(
                        "{}: expected tally mcp's error {code} for id {id}, got {other:?}",
                        v.name
                    )),
                }
            }
            None => {
                let got = lines_until(&mut raw, None, Duration::from_millis(400));
                received.extend(got.iter().cloned());
                let answers: Vec<&Value> = got.iter().filter(|l| is_answer(l)).collect();
                if !answers.is_empty() {
                    failures.push(format!("{}: expected no answer, got {answers:?}", v.name));
                }
            }
        }
    }
    for (id, line) in passing(t) {
        raw.send(&line);
        let got = lines_until(&mut raw, Some(id), Duration::from_secs(30));
        received.extend(got.iter().cloned());
        match got.iter().find(|l| l["id"] == json!(id) && is_answer(l)) {
            Some(a) if a["result"]["isError"] != json!(true) && a.get("error").is_none() => {}
            other => failures.push(format!("passing call {id}: {other:?}")),
        }
    }
    raw.close();

    let tapped = std::fs::read(&tap).expect("the tap file");
    let tapped = String::from_utf8_lossy(&tapped);
    for v in &variants {
        if tapped.contains(&mark(v.name)) {
            failures.push(format!("{}: reached the server", v.name));
        }
    }
    let separator = tapped
        .lines()
        .find(|l| l.contains("pass-line"))
        .unwrap_or_default();
    if !separator.contains(r"pass-line\u2028separator") || separator.contains('\u{2028}') {
        failures.push(format!("U+2028 is forwarded escaped: {separator:?}"));
    }
    // What the server shows it ran: its answers to the client, and its own record.
    let answered = received
        .iter()
        .map(Value::to_string)
        .collect::<Vec<_>>()
        .join("\n");
    let recorded = ran(&gate).join("\n");
    for v in &variants {
        if answered.contains(&mark(v.name)) || recorded.contains(&mark(v.name)) {
            failures.push(format!("{}: the server ran the tool", v.name));
        }
    }
    let stderr = std::fs::read_to_string(gate.path("proxy.stderr")).expect("proxy stderr");
    let summary = format!(
        "{} messages from the client were refused and never reached the server",
        variants.len()
    );
    if !stderr.contains(&summary) {
        failures.push(format!(
            "the proxy's count: expected {summary:?} in\n{stderr}"
        ));
    }
    assert!(
        failures.is_empty(),
        "{} of {} crafted lines failed:\n{}",
        failures.len(),
        variants.len(),
        failures.join("\n")
    );
    gate
}

#[test]
fn crafted_lines_never_reach_the_python_sdk_server() {
    if !sdk_available() {
        return;
    }
    let t = Target {
        tool: "send",
        arg: "to",
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let calls = p(dir.path(), "calls.txt");
    let gate = crafted_lines_never_reach(
        &["python3".into(), server_py()],
        &t,
        &[
            ("TALLY_MCP_TEST_CALLS", &calls),
            ("TALLY_MCP_TEST_ARGS", "1"),
        ],
        |_| {
            std::fs::read_to_string(&calls)
                .unwrap_or_default()
                .lines()
                .map(str::to_string)
                .collect()
        },
    );
    // The server ran exactly the four passing calls, each once.
    let ran = std::fs::read_to_string(&calls).unwrap_or_default();
    assert_eq!(ran.lines().count(), 4, "{ran}");
    assert!(ran.lines().all(|l| l.starts_with("send pass-")), "{ran}");
    let ds = gate.finish("crafted");
    let tools: Vec<&str> = allows(&ds)
        .iter()
        .filter_map(|d| d.tool.as_deref())
        .collect();
    assert_eq!(
        tools,
        vec!["files/send"; 4],
        "the gate allowed the passing calls only"
    );
}

#[test]
fn crafted_lines_never_reach_the_mcp_reference_server() {
    if !sdk_available() {
        return;
    }
    let Some(server) = reference_server() else {
        return;
    };
    let t = Target {
        tool: "echo",
        arg: "message",
    };
    let gate = crafted_lines_never_reach(&[server], &t, &[], |_| Vec::new());
    let ds = gate.finish("crafted");
    let tools: Vec<&str> = allows(&ds)
        .iter()
        .filter_map(|d| d.tool.as_deref())
        .collect();
    assert_eq!(
        tools.len(),
        4,
        "the gate allowed the passing calls only: {tools:?}"
    );
    assert!(tools.iter().all(|t| t.ends_with("/echo")), "{tools:?}");
}

/// The client's answer to a request the server sent passes, once; an answer to anything
/// else is dropped (the reference server asks the client for sampling inside a tool).
#[test]
fn only_answers_to_the_servers_requests_pass() {
    if !sdk_available() {
        return;
    }
    let Some(server) = reference_server() else {
        return;
    };
    let gate = Gate::start("");
    let stderr = std::fs::File::create(gate.path("proxy.stderr")).expect("stderr file");
    let mut raw = Raw::start_logged(&gate.proxy_to("answers", &[], &[server]), &[], stderr);
    raw.exchange(
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{"sampling":{}},"clientInfo":{"name":"raw","version":"1"}}}"#,
        Some(&json!(1)),
    );
    raw.send(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
    lines_until(&mut raw, None, Duration::from_millis(500));

    raw.send(&call(2, "trigger-sampling-request", json!({"prompt": "p"})));
    let got = lines_until(&mut raw, None, Duration::from_secs(5));
    let asked = got
        .iter()
        .find(|l| l["method"] == "sampling/createMessage")
        .unwrap_or_else(|| panic!("the server asks for sampling: {got:?}"));
    let id = asked["id"].clone();
    let answer = |id: &Value| {
        json!({"jsonrpc": "2.0", "id": id, "result": {"role": "assistant", "content": {"type": "text", "text": "sampled-ok"}, "model": "m"}}).to_string()
    };
    // An answer to an id the server never used: dropped, the tool still waits.
    let forged = json!(format!("not-{id}"));
    raw.send(&answer(&forged));
    let nothing = lines_until(&mut raw, Some(2), Duration::from_millis(500));
    assert!(nothing.iter().all(|l| l["id"] != json!(2)), "{nothing:?}");
    // The real answer passes and the tool result carries it.
    raw.send(&answer(&id));
    let got = lines_until(&mut raw, Some(2), Duration::from_secs(10));
    let result = got
        .iter()
        .find(|l| l["id"] == json!(2))
        .expect("the tool's answer");
    assert!(result.to_string().contains("sampled-ok"), "{result}");
    // The same answer again answers nothing in flight: dropped.
    raw.send(&answer(&id));
    raw.exchange(
        r#"{"jsonrpc":"2.0","id":3,"method":"ping"}"#,
        Some(&json!(3)),
    );
    raw.close();
    let stderr = std::fs::read_to_string(gate.path("proxy.stderr")).expect("stderr");
    assert!(
        stderr.contains("2 messages from the client were refused and never reached the server"),
        "{stderr}"
    );
    assert_eq!(
        stderr
            .matches("answers no request the server has in flight")
            .count(),
        2,
        "{stderr}"
    );
}

/// A request reusing the id of one in flight is dropped: the server's answer could not
/// be told apart (the gate would record the wrong call's outcome).
#[test]
fn a_request_reusing_an_id_in_flight_is_dropped() {
    if !sdk_available() {
        return;
    }
    let gate = Gate::start("");
    let calls = gate.path("calls.txt");
    let stderr = std::fs::File::create(gate.path("proxy.stderr")).expect("stderr file");
    let mut raw = Raw::start_logged(
        &gate.proxy("reuse", &[]),
        &[
            ("TALLY_MCP_TEST_CALLS", &calls),
            ("TALLY_MCP_TEST_ARGS", "1"),
        ],
        stderr,
    );
    initialize(&mut raw);
    raw.send(&call(5, "slow", json!({"seconds": 1})));
    raw.send(&call(5, "send", json!({"to": "reused"})));
    raw.send(r#"{"jsonrpc":"2.0","id":5,"method":"ping"}"#);
    let got = lines_until(&mut raw, Some(5), Duration::from_secs(10));
    let answers: Vec<&Value> = got.iter().filter(|l| l["id"] == json!(5)).collect();
    assert_eq!(answers.len(), 1, "{got:?}");
    assert_eq!(text(answers[0]), "done");
    assert!(lines_until(&mut raw, None, Duration::from_millis(500))
        .iter()
        .all(|l| l["id"] != json!(5)));
    // Once answered, the id is free again.
    let again = raw.exchange(&call(5, "send", json!({"to": "fresh"})), Some(&json!(5)));
    assert_eq!(text(&answer(&again, 5)), "sent to fresh");
    raw.close();
    assert_eq!(
        std::fs::read_to_string(&calls).expect("calls"),
        "slow\nsend fresh\n"
    );
    let stderr = std::fs::read_to_string(gate.path("proxy.stderr")).expect("stderr");
    assert_eq!(stderr.matches("still in flight").count(), 2, "{stderr}");
    let ds = gate.finish("reuse");
    assert_eq!(allows(&ds).len(), 2);
}

/// A call sent before the server has answered `initialize` is not made: the proxy cannot
/// name the tool for the gate yet (and a lenient server might run it).
#[test]
fn a_call_before_initialize_is_not_made() {
    if !sdk_available() {
        return;
    }
    let gate = Gate::start("");
    let calls = gate.path("calls.txt");
    let mut raw = Raw::start(
        &gate.proxy("early", &[]),
        &[("TALLY_MCP_TEST_CALLS", &calls)],
    );
    let got = raw.exchange(&call(1, "send", json!({"to": "early"})), Some(&json!(1)));
    let refused = answer(&got, 1);
    assert_eq!(refused["result"]["isError"], true, "{refused}");
    assert!(text(&refused).contains("initialize"), "{refused}");
    initialize_with_id(&mut raw, 2);
    raw.close();
    assert!(
        std::fs::read_to_string(&calls)
            .unwrap_or_default()
            .is_empty(),
        "the call never reached the server"
    );
    let ds = gate.finish("early");
    assert!(allows(&ds).is_empty());
}

fn initialize_with_id(raw: &mut Raw, id: u64) {
    raw.exchange(
        &format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"initialize","params":{{"protocolVersion":"2025-06-18","capabilities":{{}},"clientInfo":{{"name":"raw","version":"1"}}}}}}"#),
        Some(&json!(id)),
    );
}

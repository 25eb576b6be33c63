//! The MCP client's trace: `params._meta.traceparent` (and `tracestate`) on a
//! `tools/call` makes the gate's check span its child, at an OTLP receiver the test
//! starts, and the decision records its trace id; a malformed or hostile one is ignored
//! (a fresh trace), never refused, crashed on or passed to the gate.

use super::*;
use tally_testkit::otlp::Receiver;

const SAMPLED: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const UNSAMPLED: &str = "0af7651916cd43dd8448eb211c80319c";
const STATE: &str = "5c1c63257de34c67b1d2ea1f0e1e7f7c";
const PARENT: &str = "00f067aa0ba902b7";

fn traced_call(id: u64, key: &str, meta: Value) -> String {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
           "params": {"name": "lookup", "arguments": {"key": key}, "_meta": meta}})
    .to_string()
}

#[test]
fn the_clients_traceparent_is_the_checks_parent_and_on_the_decision() {
    if !sdk_available() {
        return;
    }
    let receiver = Receiver::start();
    let dir = tempfile::tempdir().expect("tempdir");
    tally().init(
        dir.path(),
        "[ceiling]\nattempts = 100\n[breaker]\nfailures = 50\n",
    );
    // Sampling 0: only the traces the client sampled are exported.
    let gate = Gate {
        serve: tally().serve(
            dir.path(),
            &[
                "--otlp-endpoint",
                &receiver.endpoint(),
                "--otlp-sample",
                "0",
            ],
        ),
        dir,
    };
    let mut raw = Raw::start(&gate.proxy("traced", &[]), &[]);
    initialize(&mut raw);
    let mut id = 10;
    let mut ask = |raw: &mut Raw, key: &str, meta: Value| -> Value {
        id += 1;
        let got = raw.exchange(&traced_call(id, key, meta), Some(&json!(id)));
        let a = answer(&got, id);
        assert!(a.get("error").is_none(), "{key}: {a}");
        assert_eq!(a["result"]["isError"], json!(false), "{key}: {a}");
        a
    };
    ask(
        &mut raw,
        "sampled",
        json!({"traceparent": format!("00-{SAMPLED}-{PARENT}-01"), "tracestate": "mcp=1,vendor=x", "progressToken": 1}),
    );
    ask(
        &mut raw,
        "unsampled",
        json!({"traceparent": format!("00-{UNSAMPLED}-{PARENT}-00")}),
    );
    // A tracestate that would inject a header is dropped; its traceparent stands.
    ask(
        &mut raw,
        "state",
        json!({"traceparent": format!("00-{STATE}-{PARENT}-01"), "tracestate": "a=1\r\nx-evil: 1"}),
    );
    let hostile = [
        json!(format!("ff-{SAMPLED}-{PARENT}-01")),
        json!(format!("01-{SAMPLED}-{PARENT}-01")),
        json!(format!("00-{}-{PARENT}-01", SAMPLED.to_uppercase())),
        json!(format!("00-{SAMPLED}-{}-01", PARENT.to_uppercase())),
        json!("00-00000000000000000000000000000000-00f067aa0ba902b7-01"),
        json!(format!("00-{SAMPLED}-0000000000000000-01")),
        json!(format!("00-{SAMPLED}-{PARENT}-01-extra")),
        json!(format!("00-{SAMPLED}0-{PARENT}-01")),
        json!(format!("00-{SAMPLED}-{PARENT}1-01")),
        json!(format!("00-{SAMPLED}-{PARENT}-1")),
        json!(format!(" 00-{SAMPLED}-{PARENT}-01")),
        json!(format!("00-{SAMPLED}-{PARENT}-01\n")),
        json!("x".repeat(100_000)),
        json!(""),
        json!(5),
        json!(null),
        json!([format!("00-{SAMPLED}-{PARENT}-01")]),
        json!({"traceparent": format!("00-{SAMPLED}-{PARENT}-01")}),
    ];
    for (i, tp) in hostile.iter().enumerate() {
        ask(
            &mut raw,
            &format!("hostile-{i}"),
            json!({"traceparent": tp, "tracestate": "a=1"}),
        );
    }
    raw.close();
    let ds = gate.finish("traced");
    let allowed = allows(&ds);
    assert_eq!(allowed.len(), 3 + hostile.len());
    let trace = |d: &Decision| d.trace_id.clone().expect("the agent's trace id");
    assert_eq!(trace(allowed[0]), SAMPLED);
    assert_eq!(trace(allowed[1]), UNSAMPLED);
    assert_eq!(trace(allowed[2]), STATE);
    // A hostile traceparent starts a trace of the gate's own, which the sampler (ratio
    // 0) drops: nothing names it, so no trace id is recorded, and never theirs.
    for d in &allowed[3..] {
        assert_eq!(
            d.trace_id, None,
            "a hostile traceparent was believed: {d:?}"
        );
    }
    // The daemon has stopped, its batch flushed: the two sampled traces' spans only.
    let mut spans = receiver.spans.lock().unwrap().clone();
    spans.sort_by(|a, b| a.trace_id.cmp(&b.trace_id));
    assert_eq!(spans.len(), 2, "{spans:#?}");
    let (theirs, state) = (&spans[0], &spans[1]);
    assert_eq!(
        (theirs.trace_id.as_str(), state.trace_id.as_str()),
        (SAMPLED, STATE)
    );
    for s in [theirs, state] {
        assert_eq!(s.parent_span_id, PARENT);
        assert_eq!(s.name, "execute_tool files/lookup");
        assert!(
            s.attributes["gen_ai.tool.name"].contains("files/lookup"),
            "{s:?}"
        );
        assert!(s.attributes["tally.decision"].contains("allow"), "{s:?}");
    }
    assert_eq!(theirs.trace_state, "mcp=1,vendor=x");
    assert_eq!(state.trace_state, "");
}

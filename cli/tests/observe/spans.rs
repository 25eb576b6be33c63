//! A span per check at an OTLP receiver, its trace id on the decision in the ledger;
//! head sampling (`--otlp-sample`), and the trace id on every decision whose trace exists
//! (the agent's, sampled or not; the check's own span when it is exported).

use super::*;
use tally_testkit::otlp::Receiver;

const THEIRS: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT: &str = "00f067aa0ba902b7";

/// A check of `search` in `run` (arguments `{"i": i}`) over the agent socket with these
/// extra headers (curl: the test client sends none); its answer.
fn check_with(dir: &Path, run: &str, i: u64, headers: &[&str]) -> Value {
    let mut cmd = Command::new("curl");
    cmd.args(["-sS", "--unix-socket"])
        .arg(dir.join("agent.sock"));
    for h in headers {
        cmd.args(["-H", h]);
    }
    let out = cmd
        .args([
            "-H",
            "content-type: application/json",
            "-d",
            &format!(r#"{{"run":"{run}","tool":"search","effect":"read","args":{{"i":{i}}}}}"#),
            "http://localhost/v1/check",
        ])
        .output()
        .expect("curl");
    let v: Value = serde_json::from_slice(&out.stdout).expect("answer");
    assert_eq!(v["decision"], "allow", "{v}");
    v
}

/// A check's span reaches an OTLP receiver the test started, under the GenAI
/// conventions, and its trace id is on the decision in the ledger; an agent's
/// `traceparent` makes the span its child and its trace id the decision's.
#[test]
fn a_span_per_check_reaches_the_collector_and_its_trace_id_is_on_the_decision() {
    if !tally_testkit::have("curl", &[], "apt-get install curl") {
        return;
    }
    let receiver = Receiver::start();
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path();
    ledger(dir);
    let mut served = tally().serve(
        dir,
        &[
            "--otlp-endpoint",
            &receiver.endpoint(),
            "--otlp-sample",
            "1",
        ],
    );
    served.start_run("traced", 10);
    let own = served.check("traced", "search", json!({"i": 0}));
    let child = check_with(
        dir,
        "traced",
        1,
        &[
            &format!("traceparent: 00-{THEIRS}-{PARENT}-01"),
            "tracestate: vendor=opaque,other=1",
        ],
    );
    // A malformed traceparent is ignored, never an error.
    let bad = check_with(
        dir,
        "traced",
        2,
        &["traceparent: 00-00000000000000000000000000000000-00f067aa0ba902b7-01"],
    );
    // Stopping flushes the batch.
    served.stop();
    let spans = receiver.wait_for(3);
    assert_eq!(spans.len(), 3, "{spans:?}");
    let all = decisions(dir);
    let on = |seq: &Value| all[&seq.as_u64().expect("seq")]["trace_id"].clone();
    for s in &spans {
        assert_eq!(s.name, "execute_tool search");
        assert_eq!(s.kind, 1, "internal");
        assert!(
            s.attributes["gen_ai.operation.name"].contains("execute_tool"),
            "{s:?}"
        );
        assert!(s.attributes["gen_ai.tool.name"].contains("search"), "{s:?}");
        assert!(s.attributes["tally.decision"].contains("allow"), "{s:?}");
    }
    // The agent's trace: the decision carries it, the span is the child of its parent
    // and keeps its tracestate.
    assert_eq!(on(&child["seq"]), THEIRS);
    let theirs = spans
        .iter()
        .find(|s| s.trace_id == THEIRS)
        .expect("the span in the agent's trace");
    assert_eq!(theirs.parent_span_id, PARENT);
    assert_eq!(theirs.trace_state, "vendor=opaque,other=1");
    // The daemon's own traces: each decision's trace id is its span's.
    for answer in [&own, &bad] {
        let id = on(&answer["seq"]);
        let id = id.as_str().expect("a trace id on the decision");
        assert!(tally_ledger::decision::is_trace_id(id), "{id}");
        let span = spans.iter().find(|s| s.trace_id == id).expect("its span");
        assert!(span.parent_span_id.is_empty(), "{span:?}");
    }
}

/// `--otlp-sample 0`: a check that starts its own trace is not exported, one whose
/// agent sampled its trace is, one whose agent did not is not. A decision records the
/// agent's trace id, sampled or not; a check whose own trace was not sampled records
/// none (its trace exists nowhere). Hostile traceparents start a fresh (unsampled)
/// trace: no trace id, and never theirs.
#[test]
fn sampling_exports_what_the_parent_sampled_and_decisions_keep_the_traces_that_exist() {
    if !tally_testkit::have("curl", &[], "apt-get install curl") {
        return;
    }
    let receiver = Receiver::start();
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path();
    ledger(dir);
    let mut served = tally().serve(
        dir,
        &[
            "--otlp-endpoint",
            &receiver.endpoint(),
            "--otlp-sample",
            "0",
        ],
    );
    served.start_run("sampled", 100);
    let root = served.check("sampled", "search", json!({"i": 0}));
    let sampled = check_with(
        dir,
        "sampled",
        1,
        &[&format!("traceparent: 00-{THEIRS}-{PARENT}-01")],
    );
    let unsampled_trace = "0af7651916cd43dd8448eb211c80319c";
    let unsampled = check_with(
        dir,
        "sampled",
        2,
        &[&format!(
            "traceparent: 00-{unsampled_trace}-b7ad6b7169203331-00"
        )],
    );
    let hostile = [
        format!("traceparent: ff-{THEIRS}-{PARENT}-01"),
        format!("traceparent: 01-{THEIRS}-{PARENT}-01"),
        format!("traceparent: 00-{}-{PARENT}-01", THEIRS.to_uppercase()),
        format!("traceparent: 00-{THEIRS}-{PARENT}-01-extra"),
        format!("traceparent: 00-{THEIRS}0-{PARENT}-01"),
        format!("traceparent: 00-{THEIRS}-0000000000000000-01"),
    ];
    let mut fresh = Vec::new();
    for (i, h) in hostile.iter().enumerate() {
        fresh.push(check_with(dir, "sampled", 10 + i as u64, &[h]));
    }
    // Two traceparents: W3C says neither is valid.
    fresh.push(check_with(
        dir,
        "sampled",
        20,
        &[
            &format!("traceparent: 00-{THEIRS}-{PARENT}-01"),
            &format!("traceparent: 00-{THEIRS}-{PARENT}-01"),
        ],
    ));
    served.stop();
    let spans = receiver.spans.lock().unwrap().clone();
    // Only the sampled parent's span (the daemon has stopped: its batch is flushed).
    assert_eq!(spans.len(), 1, "{spans:?}");
    assert_eq!(spans[0].trace_id, THEIRS);
    assert_eq!(spans[0].parent_span_id, PARENT);
    let all = decisions(dir);
    let on = |a: &Value| all[&a["seq"].as_u64().expect("seq")]["trace_id"].clone();
    assert_eq!(on(&sampled), THEIRS);
    assert_eq!(on(&unsampled), unsampled_trace);
    for a in std::iter::once(&root).chain(&fresh) {
        assert_eq!(
            on(a),
            Value::Null,
            "an unsampled trace of tally's own is not recorded, nor a hostile one: {a}"
        );
    }
}

/// A ratio between 0 and 1 exports about that share of the traces the daemon starts;
/// exactly the exported spans' trace ids are on the decisions, one per span.
#[test]
fn a_ratio_exports_about_that_share_of_root_spans() {
    let receiver = Receiver::start();
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path();
    ledger(dir);
    let mut served = tally().serve(
        dir,
        &[
            "--otlp-endpoint",
            &receiver.endpoint(),
            "--otlp-sample",
            "0.5",
        ],
    );
    served.start_run("ratio", 1000);
    let n = 200;
    for i in 0..n {
        served.check("ratio", "search", json!({ "i": i }));
    }
    served.stop();
    let spans = receiver.spans.lock().unwrap().clone();
    // Binomial(200, 0.5): outside 60..=140 with a probability under 1e-8.
    assert!(
        (60..=140).contains(&spans.len()),
        "{} of {n} exported at 0.5",
        spans.len()
    );
    let mut recorded: Vec<String> = decisions(dir)
        .values()
        .filter_map(|d| d["trace_id"].as_str().map(str::to_owned))
        .collect();
    let mut exported: Vec<String> = spans.iter().map(|s| s.trace_id.clone()).collect();
    exported.sort();
    recorded.sort();
    assert_eq!(
        recorded, exported,
        "the decisions' trace ids are the exported spans'"
    );
}

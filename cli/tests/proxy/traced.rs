//! A span per proxied model call (OpenTelemetry GenAI conventions) at an OTLP receiver
//! the test starts, a child of the agent's `traceparent`; the decision records its trace
//! id; the upstream is sent a `traceparent` naming the proxy's span, never the agent's
//! garbage.

use super::*;
use tally_testkit::otlp::Receiver;

const SAMPLED: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const UNSAMPLED: &str = "0af7651916cd43dd8448eb211c80319c";
const PARENT: &str = "00f067aa0ba902b7";

/// The trace ids on the check decisions of `run`, in order (the daemon stopped).
fn trace_ids(dir: &Path, run: &str) -> Vec<Option<String>> {
    let ledger = dir.join("ledger");
    let mut options = tally_verify::Options::new(
        tally_ledger::LedgerPublic::read(&ledger.join("ledger.pub")).expect("ledger.pub"),
    );
    options.auditor = Some(tally_ledger::AuditorKey::read(&dir.join("auditor.key")).expect("key"));
    let mut out = Vec::new();
    let frames = tally_verify::walk::ledger_frames(&ledger).expect("log");
    let report = tally_verify::verify(frames, &options, |e| out.push(e), |_| {});
    assert_eq!(report.verdict(), tally_verify::Verdict::Intact);
    out.sort_by_key(|e| e.seq);
    out.into_iter()
        .map(|e| *e.decision)
        .filter(|d| d.run == run && d.kind == Some(tally_ledger::Kind::Allow))
        .map(|d| d.trace_id)
        .collect()
}

/// `00-{trace}-{span}-{flags}` split.
fn parts(tp: &str) -> (String, String, String) {
    let p = tally_ledger::trace::Traceparent::parse(tp).unwrap_or_else(|| panic!("{tp:?}"));
    let flags = if p.sampled { "01" } else { "00" };
    (p.trace_id, p.span_id, flags.to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_span_per_model_call_under_the_genai_conventions_the_agents_trace_its_parent() {
    let receiver = Receiver::start();
    let upstream = FakeUpstream::start(FakeOptions::default());
    let dir = tempfile::tempdir().expect("dir");
    let mut served = Served::new_with(
        dir.path(),
        &policy(&upstream, 1000),
        &[
            "--otlp-endpoint",
            &receiver.endpoint(),
            "--otlp-sample",
            "0",
        ],
    );
    let token = served.start_run("t1").await;
    // The agent sampled its trace: exported, the child of the agent's span.
    let a = call(
        served.proxy,
        "/openai/v1/chat/completions",
        &[
            ("authorization", &bearer(&token)),
            ("traceparent", &format!("00-{SAMPLED}-{PARENT}-01")),
            ("tracestate", "agent=1"),
        ],
        chat("fake-ok", json!({"max_tokens": 50})),
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.text());
    // The agent did not sample it: not exported, its trace id recorded all the same.
    let a = call(
        served.proxy,
        "/anthropic/v1/messages",
        &[
            ("x-api-key", &token),
            ("traceparent", &format!("00-{UNSAMPLED}-{PARENT}-00")),
        ],
        chat("fake-ok", json!({"max_tokens": 50})),
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.text());
    // A hostile traceparent (uppercase) with a tracestate: a fresh trace, neither sent on.
    let a = call(
        served.proxy,
        "/openai/v1/chat/completions",
        &[
            ("authorization", &bearer(&token)),
            (
                "traceparent",
                &format!("00-{}-{PARENT}-01", SAMPLED.to_uppercase()),
            ),
            ("tracestate", "agent=1"),
        ],
        chat("fake-ok", json!({"max_tokens": 50})),
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.text());
    let _ = served.settled("t1").await;
    served.daemon.stop();
    let seen = upstream.seen();
    assert_eq!(seen.len(), 3);
    // The upstream is sent the proxy's span as the parent, in the agent's trace, with the
    // sampler's flag and the agent's tracestate.
    let (t, proxy_span, flags) = parts(&seen[0].trace[0]);
    assert_eq!((t.as_str(), flags.as_str()), (SAMPLED, "01"));
    assert_ne!(proxy_span, PARENT);
    assert_eq!(seen[0].trace[1..], ["agent=1".to_owned()]);
    let (t, s, flags) = parts(&seen[1].trace[0]);
    assert_eq!((t.as_str(), flags.as_str()), (UNSAMPLED, "00"));
    assert_ne!(s, PARENT);
    assert_eq!(seen[1].trace.len(), 1, "{:?}", seen[1]);
    let (fresh, _, flags) = parts(&seen[2].trace[0]);
    assert_ne!(fresh, SAMPLED);
    assert_eq!(flags, "00", "a fresh trace at ratio 0");
    assert_eq!(
        seen[2].trace.len(),
        1,
        "no tracestate beside a new trace: {:?}",
        seen[2]
    );
    // The decisions' trace ids.
    assert_eq!(
        trace_ids(dir.path(), "t1"),
        vec![Some(SAMPLED.into()), Some(UNSAMPLED.into()), Some(fresh)]
    );
    // One span exported (the daemon has stopped: its batch is flushed).
    let spans = receiver.spans.lock().unwrap().clone();
    assert_eq!(spans.len(), 1, "{spans:#?}");
    let s = &spans[0];
    assert_eq!(s.name, "chat fake-ok");
    assert_eq!(s.kind, 3, "client");
    assert_eq!(
        (s.trace_id.as_str(), s.parent_span_id.as_str()),
        (SAMPLED, PARENT)
    );
    assert_eq!(
        s.span_id, proxy_span,
        "the upstream's parent is the proxy's span"
    );
    assert_eq!(s.trace_state, "agent=1");
    for (k, v) in [
        ("gen_ai.operation.name", "\"chat\""),
        ("gen_ai.provider.name", "\"openai\""),
        ("gen_ai.system", "\"openai\""),
        ("gen_ai.request.model", "\"fake-ok\""),
        ("gen_ai.usage.input_tokens", "IntValue(100)"),
        ("gen_ai.usage.output_tokens", "IntValue(50)"),
        ("http.response.status_code", "IntValue(200)"),
        ("tally.decision", "\"allow\""),
        ("tally.outcome", "\"ok\""),
        ("tally.run", "\"t1\""),
    ] {
        assert!(
            s.attributes.get(k).is_some_and(|got| got.contains(v)),
            "{k} = {:?}, not {v}",
            s.attributes.get(k)
        );
    }
    served.verifies_the_bill(&upstream, &prices(), 0);
}

/// Without `--otlp-endpoint` the proxy takes no part in the trace: an agent's valid
/// `traceparent` goes on as it came (and is on the decision), an invalid one and its
/// `tracestate` never reach the upstream, and none is made up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_collector_a_valid_traceparent_passes_and_garbage_does_not() {
    let upstream = FakeUpstream::start(FakeOptions::default());
    let dir = tempfile::tempdir().expect("dir");
    let mut served = Served::new(dir.path(), &policy(&upstream, 1000));
    let token = served.start_run("t2").await;
    let valid = format!("00-{SAMPLED}-{PARENT}-01");
    let cases: [&[(&str, &str)]; 4] = [
        &[("traceparent", &valid), ("tracestate", "agent=1")],
        &[("traceparent", "ff-garbage"), ("tracestate", "agent=1")],
        &[("traceparent", &valid), ("traceparent", &valid)],
        &[],
    ];
    for (i, headers) in cases.iter().enumerate() {
        let mut h = vec![("authorization", bearer(&token))];
        h.extend(headers.iter().map(|(k, v)| (*k, v.to_string())));
        let h: Vec<(&str, &str)> = h.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let a = call(
            served.proxy,
            "/openai/v1/chat/completions",
            &h,
            chat("fake-ok", json!({"max_tokens": 50 + i})),
        )
        .await;
        assert_eq!(a.status, 200, "{}", a.text());
    }
    let _ = served.settled("t2").await;
    served.daemon.stop();
    let seen = upstream.seen();
    assert_eq!(seen[0].trace, vec![valid.clone(), "agent=1".to_owned()]);
    for s in &seen[1..] {
        assert!(s.trace.is_empty(), "{s:?}");
    }
    assert_eq!(
        trace_ids(dir.path(), "t2"),
        vec![Some(SAMPLED.into()), None, None, None]
    );
    served.verifies_the_bill(&upstream, &prices(), 0);
}

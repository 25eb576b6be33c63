//! Sessions of the official MCP Python SDK's client and server through the proxy: the
//! session is the server's, a looping client is stopped at the cap, a retried call is told
//! retries are exhausted.

use super::*;

#[test]
fn a_session_through_the_proxy_is_the_session_with_the_server() {
    if !sdk_available() {
        return;
    }
    let gate = Gate::start("");
    let straight = client("session", &["python3".into(), server_py()], &[]);
    let proxied = client("session", &gate.proxy("s1", &[]), &[]);
    // initialize, every list, reads, prompts, tool results, progress and log
    // notifications: all as the server sent them.
    assert_eq!(proxied, straight);
    assert_eq!(proxied["progress"].as_array().map(Vec::len), Some(3));
    assert_eq!(proxied["log"].as_array().map(Vec::len), Some(3));

    let ds = gate.finish("s1");
    let effects = allowed_effects(&ds);
    // The effect class comes from each tool's annotations.
    assert_eq!(
        effects,
        vec![
            ("files/lookup".into(), Effect::Read),
            ("files/put".into(), Effect::IdempotentWrite),
            ("files/send".into(), Effect::NonIdempotentWrite),
            ("files/plain".into(), Effect::NonIdempotentWrite),
            ("files/steps".into(), Effect::Read),
        ]
    );
    for d in allows(&ds) {
        assert!(d.args.is_none(), "raw args never enter the ledger");
        assert!(d.args_digest.is_some(), "their digest does");
    }
    let outcomes: Vec<Status> = ds
        .iter()
        .filter(|d| d.kind == Some(Kind::Outcome))
        .filter_map(|d| d.status)
        .collect();
    assert_eq!(outcomes, vec![Status::Ok; 5]);
}

#[test]
fn a_looping_client_is_stopped_at_the_cap_and_the_ledger_says_so() {
    if !sdk_available() {
        return;
    }
    let gate = Gate::start(POLICY);
    let calls_file = gate.path("calls.txt");
    let out = client(
        "loop",
        &gate.proxy("loop1", &[]),
        &[("TALLY_MCP_TEST_CALLS", &calls_file)],
    );
    let calls = out["calls"].as_array().expect("calls");
    // Five attempts reach the failing tool; the sixth is refused and the agent stops.
    assert_eq!(calls.len(), 6, "{out:#}");
    for c in &calls[..5] {
        assert_eq!(c["is_error"], true);
        assert!(c["gate"].is_null(), "the server's own error: {c}");
        assert!(c["text"].as_str().unwrap().contains("upstream unavailable"));
    }
    let refusal = &calls[5];
    assert_eq!(refusal["is_error"], true);
    assert_eq!(refusal["gate"]["cause"], "attempts_exhausted", "{refusal}");
    assert_eq!(refusal["gate"]["action"], "ask");
    let text = refusal["text"].as_str().unwrap();
    assert!(
        text.contains("files/flaky")
            && text.contains("attempts_exhausted")
            && text.contains("Action: ask"),
        "{text}"
    );
    let reached = std::fs::read_to_string(&calls_file).expect("calls file");
    assert_eq!(
        reached.lines().count(),
        5,
        "the refused call never reached the server"
    );

    let ds = gate.finish("loop1");
    let kinds: Vec<Kind> = ds.iter().filter_map(|d| d.kind).collect();
    assert_eq!(kinds.first(), Some(&Kind::Start));
    assert_eq!(allows(&ds).len(), 5);
    let errors = ds
        .iter()
        .filter(|d| d.kind == Some(Kind::Outcome) && d.status == Some(Status::Error))
        .count();
    assert_eq!(
        errors, 5,
        "each failed call is recorded as an error outcome"
    );
    let refused: Vec<&Decision> = ds.iter().filter(|d| d.kind == Some(Kind::Deny)).collect();
    assert_eq!(refused.len(), 1, "{kinds:?}");
    assert_eq!(refused[0].tool.as_deref(), Some("files/flaky"));
}

/// An operation retried past its effect class is refused with its own
/// code (`retries_exhausted`, action stop), and the refusal says so and what the run has
/// left: not "a human must approve more" while the run still has attempts.
#[test]
fn regression_issue_20_a_retried_call_is_told_retries_exhausted_not_to_ask() {
    if !sdk_available() {
        return;
    }
    let gate = Gate::start("[ceiling]\nattempts = 6\n[breaker]\nfailures = 50\n");
    let out = client("retry", &gate.proxy("retry1", &[]), &[]);
    let calls = out["calls"].as_array().expect("calls");
    // A read may be tried three times between two ok outcomes; the fourth is refused.
    assert_eq!(calls.len(), 4, "{out:#}");
    let refusal = &calls[3];
    assert_eq!(refusal["gate"]["reason"], "retries_exhausted", "{refusal}");
    assert_eq!(refusal["gate"]["action"], "stop", "{refusal}");
    let text = refusal["text"].as_str().unwrap();
    assert!(
        text.contains("retried as often as its kind allows"),
        "{text}"
    );
    assert!(text.contains("used 3 of its 6 attempts"), "{text}");
    assert!(!text.contains("approve"), "{text}");
    gate.finish("retry1");
}

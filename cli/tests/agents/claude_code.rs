//! Claude Code through tally, as a user runs it: `claude -p` with no
//! `CLAUDE_CODE_MAX_RETRIES`, so what it retries is what tally's answers make it retry.

use super::*;

/// A model that keeps asking for the same failing Bash command (`exit 3`, every turn,
/// never giving up), each turn reporting 100,000 input tokens ($0.30): the hook lets the
/// command run [`BASH_RUNS`] time(s) and the gate refuses every later request for it
/// (`retries_exhausted`, the policy's retry bound for a non-idempotent write); the
/// turns go on until the spend budget cannot pay for the next model call, which is
/// refused (`reservation_insufficient`, action `ask`) once, not retried, and Claude Code
/// ends with tally's words as its error. Its reported cost equals the ledger's settled
/// spend and the upstream's bill; the handoff says the run is open, its last call
/// refused for the budget, and that the failing command must not be repeated.
#[test]
fn claude_code_a_failing_loop_is_stopped_and_the_bill_is_the_ledger() {
    if !claude_code() {
        return;
    }
    let upstream = FakeUpstream::start(FakeOptions::default());
    let failing = json!({"command": "exit 3", "description": "Run the test suite"});
    let mut script = Script::repeat("Bash", failing, 1000, "The tests pass.");
    script.usage = (100_000, 1_000);
    upstream.script(MODEL, script);
    let dir = tempfile::tempdir().expect("dir");
    let mut s = Session::start(dir.path(), &policy(&upstream, 300), "cc-loop");
    let result = s.claude("Run the test suite until it passes.", &[]);
    // Claude Code's own account of the end: the refused model call, in tally's words.
    assert_eq!(result["is_error"], true, "{result}");
    assert_eq!(result["api_error_status"], 402, "{result}");
    let said = result["result"].as_str().unwrap_or_default();
    assert!(
        said.contains("tally: ")
            && said.contains("reservation_insufficient")
            && said.contains("action ask"),
        "Claude Code shows tally's reason and action: {result}"
    );
    let st = s.standing();
    assert_eq!(st["held_nanos"], 0, "{st}");
    let settled = st["settled_nanos"].as_u64().expect("settled");
    assert!(settled > 0 && settled <= 300 * 10_000_000, "{st}");
    assert_eq!(
        cost_nanos(&result),
        settled,
        "Claude Code's cost against the ledger: {result} {st}"
    );
    let ledger = Ledger {
        settled_nanos: settled,
        held_nanos: 0,
    };
    assert_bill(&[&upstream], &[(MODEL, price())], ledger, Unbilled::NONE);
    // What Claude Code sends (2.1.332): streamed `/v1/messages?beta=true` turns with
    // `max_tokens` 32000, its `anthropic-beta` list, and the key as `x-api-key`.
    let seen = upstream.seen();
    assert!(
        seen.iter()
            .all(|r| r.path == "/v1/messages?beta=true" && r.stream && r.real_key),
        "{seen:?}"
    );
    // Every answer the model gave asked for the failing command again.
    let asked = upstream.billed().len();
    let sent = s.relay.requests();
    let decisions = s.decisions();
    let bash = ledger::checks(&decisions, &s.run, "claude-code/Bash");
    let digests: std::collections::BTreeSet<String> =
        bash.iter().map(|d| d["args_digest"].to_string()).collect();
    assert_eq!(digests.len(), 1, "one command, asked again: {bash:#?}");
    assert_eq!(bash.len(), asked, "each request for it reached the gate");
    assert_eq!(
        ledger::count(&bash, "allow"),
        BASH_RUNS,
        "the failing command ran within the bound: {bash:#?}"
    );
    assert!(
        bash[BASH_RUNS..]
            .iter()
            .all(|d| d["kind"] == "deny" && d["reason"] == "retries_exhausted"),
        "every request for it beyond the bound was refused: {bash:#?}"
    );
    assert!(
        bash.len() >= BASH_RUNS + 2,
        "the model kept asking, and was refused more than once: {bash:#?}"
    );
    // The model calls: each allowed one billed, then one refusal for the budget, sent
    // once (every request Claude Code made is a check in the ledger).
    let calls = ledger::checks(&decisions, &s.run, "anthropic");
    assert_eq!(ledger::count(&calls, "allow"), asked, "{calls:#?}");
    assert_eq!(ledger::count(&calls, "deny"), 1, "{calls:#?}");
    let last = calls.last().expect("model calls");
    assert_eq!(last["kind"], "deny", "{calls:#?}");
    assert_eq!(last["reason"], "reservation_insufficient", "{calls:#?}");
    assert_eq!(
        sent,
        calls.len(),
        "Claude Code's requests, counted on the wire"
    );
    // How it ended: open, its last call refused by the budget; what must not be
    // repeated is the failing command.
    let h = s.handoff();
    assert_eq!(h["stop"]["status"], "refused", "{h:#}");
    assert_eq!(h["stop"]["reason"], "reservation_insufficient", "{h:#}");
    assert!(
        h.to_string().contains("do not repeat claude-code/Bash"),
        "the handoff says what must not be repeated: {h:#}"
    );
}

/// A token Claude Code can no longer spend ends the session at its first model call,
/// sent once (a 401 or 403 it would send again ten times over minutes, running
/// `apiKeyHelper` again each time), with tally's reason and action as its error: a run
/// an operator stopped, and a run past its deadline. Nothing reaches the upstream, and
/// nothing is recorded (the run may spend no more), so the requests are counted on the
/// wire.
#[test]
fn claude_code_sends_a_stopped_or_expired_runs_call_once() {
    if !claude_code() {
        return;
    }
    let upstream = FakeUpstream::start(FakeOptions::default());
    for (run, reason) in [
        ("cc-stopped", "completed"),
        ("cc-expired", "run_deadline_exhausted"),
    ] {
        let dir = tempfile::tempdir().expect("dir");
        // A deadline of 1 ms: past before Claude Code has started.
        let budget = if reason == "run_deadline_exhausted" {
            json!({"deadline_ms": 1})
        } else {
            json!({})
        };
        let mut s = Session::start_with(
            dir.path(),
            &policy(&upstream, 100),
            json!({"run": run, "goal": "make the tests pass", "budget": budget}),
        );
        if reason == "completed" {
            let (status, v) =
                s.daemon
                    .agent("POST", &format!("/v1/runs/{run}/stop"), Some(json!({})));
            assert_eq!(status, 200, "{v}");
        }
        let result = s.claude("Look around.", &[]);
        assert_eq!(result["is_error"], true, "{result}");
        assert_eq!(result["api_error_status"], 402, "{result}");
        let said = result["result"].as_str().unwrap_or_default();
        assert!(
            said.contains(reason) && said.contains("action stop"),
            "{run}: Claude Code shows tally's reason and action: {result}"
        );
        assert_eq!(s.relay.requests(), 1, "{run}: sent once: {result}");
        assert_eq!(cost_nanos(&result), 0, "{result}");
        s.daemon.stop();
    }
    assert!(upstream.seen().is_empty(), "{:?}", upstream.seen());
}

use super::*;

/// The agent cannot report an outcome for an attempt the proxy made: the proxy observes
/// it (403 `outcome_owned_by_proxy`), and the state is what the proxy settled.
#[test]
fn the_agent_cannot_report_a_proxied_attempts_outcome() {
    if !sdks() {
        return;
    }
    let mut proxy = Proxy::start("");
    for sdk in SDKS {
        let run = format!("owned-{sdk}");
        let token = proxy.run(&run, json!({"spend_cents": 100}));
        let r = proxy.call(sdk, false, &token, &["--model", "fake-cut"]);
        assert_ne!(r["ok"], true, "{r}");
        let r = proxy.call(sdk, false, &token, &["--model", "fake-ok"]);
        let attempt: u64 = r["headers"]["x-tally-attempt"]
            .as_str()
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("no attempt header: {r}"));
        let before = proxy.standing(&run);
        // Both the call the proxy settled and the one it holds unknown (the one before).
        for a in [attempt, attempt - 1] {
            for body in [
                json!({"run": run, "attempt": a, "status": "ok", "settled_cents": 0}),
                json!({"run": run, "attempt": a, "status": "rejected"}),
            ] {
                let (status, v) = proxy.agent("POST", "/v1/outcome", Some(body));
                assert_eq!(status, 403, "{v}");
                assert_eq!(v["error"]["code"], "outcome_owned_by_proxy", "{v}");
            }
        }
        let after = proxy.standing(&run);
        assert_eq!(nanos(&after, "settled"), nanos(&before, "settled"));
        assert_eq!(nanos(&after, "held"), nanos(&before, "held"));
    }
    proxy.verifies_the_bill();
}

/// One uid starting run after run draws from its principal budget: the 31st run in a row
/// is refused `principal_budget_exceeded` (action ask), tokens or not.
#[test]
fn thirty_one_runs_in_a_row_stop_at_the_principal_budget() {
    if !sdks() {
        return;
    }
    let mut proxy = Proxy::start("[principals.default]\nruns = 30\n");
    for i in 0..30 {
        let run = format!("p{i}");
        let token = proxy.run(&run, json!({"spend_cents": 10}));
        let r = proxy.call("openai", false, &token, &["--model", "fake-ok"]);
        assert_eq!(r["ok"], true, "{run}: {r}");
        let (status, v) = proxy.agent("POST", &format!("/v1/runs/{run}/stop"), Some(json!({})));
        assert_eq!(status, 200, "{v}");
    }
    let (status, v) = proxy.agent(
        "POST",
        "/v1/runs",
        Some(json!({"run": "p30", "budget": {"spend_cents": 10}})),
    );
    assert_eq!(status, 403, "{v}");
    assert_eq!(v["error"]["code"], "principal_budget_exceeded", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("(action ask)"),
        "{v}"
    );
    // The 31st run got no token: nothing more reached the upstream.
    assert_eq!(proxy.upstreams_saw_only_the_key(&[]), 30);
    proxy.verifies_the_bill();
}

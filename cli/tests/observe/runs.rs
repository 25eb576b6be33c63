//! `tally runs --json`: the daemon's order, as data.

use super::*;

/// Names whose order by name is not their order by closeness: the list comes open runs
/// first, then nearest to a limit first, then by name (a tie), stopped runs last; the
/// agent socket's `GET /v1/runs` in the same order; the text in the same order with the
/// nearest limit and the last refusal.
#[test]
fn tally_runs_json_comes_nearest_to_a_limit_first_then_by_name() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path();
    ledger(dir);
    std::fs::write(
        dir.join("policy.toml"),
        format!("{POLICY}\n[rate]\ntool_per_sec = 0\ntool_in_flight = 0\n"),
    )
    .expect("policy");
    let served = tally().serve(dir, &[]);
    // (run, attempts, checks)
    let plan: [(&str, u64, u64); 6] = [
        ("a-far", 40, 1),
        ("b-near", 10, 8),
        ("c-mid", 10, 5),
        ("d-stopped", 10, 9),
        ("f-tie", 10, 3),
        ("e-tie", 10, 3),
    ];
    for (run, attempts, checks) in plan {
        served.start_run(run, attempts);
        for i in 0..checks {
            served.call(run, "search", json!({"i": i}));
        }
    }
    // The same call again and again: a loop, refused, the run's last refusal.
    let refused = (0..5)
        .map(|_| served.call("a-far", "search", json!({"same": 1})))
        .find(|a| a["decision"] == "deny")
        .expect("a loop is refused");
    assert_eq!(refused["reason"], "loop_repeated_call", "{refused}");
    let (status, v) = served.agent("POST", "/v1/runs/d-stopped/stop", Some(json!({})));
    assert_eq!(status, 200, "{v}");

    let expected = ["b-near", "c-mid", "e-tie", "f-tie", "a-far", "d-stopped"];
    let text = ok(
        dir,
        &["runs", "--operator-socket", "operator.sock", "--json"],
    );
    let runs: Value = serde_json::from_str(&text).expect("json");
    let names: Vec<&str> = runs
        .as_array()
        .expect("a list")
        .iter()
        .map(|r| r["run"].as_str().expect("run"))
        .collect();
    assert_eq!(names, expected, "{text}");
    let permille: Vec<u64> = runs
        .as_array()
        .expect("a list")
        .iter()
        .map(|r| r["closeness"]["permille"].as_u64().expect("permille"))
        .collect();
    assert_eq!(permille[..4], [800, 500, 300, 300], "{text}");
    // a-far: a few attempts of 40, below the ties.
    assert!(permille[4] < 300 && permille[4] >= 50, "{text}");
    assert_eq!(permille[5], 900, "{text}");
    assert_eq!(runs[0]["closeness"]["nearest"], "attempts", "{text}");
    assert_eq!(runs[5]["state"], "stopped", "{text}");
    let last = &runs[4]["last_refusal"];
    assert_eq!(last["reason"], "loop_repeated_call", "{text}");
    assert_eq!(last["tool"], "search", "{text}");
    assert!(last["action"].is_string(), "{text}");
    assert!(runs[0]["last_refusal"].is_null(), "{text}");

    // The agent socket lists its own runs (all of them here) in the same order.
    let (status, agent) = served.agent("GET", "/v1/runs", None);
    assert_eq!(status, 200, "{agent}");
    let agent_names: Vec<&str> = agent
        .as_array()
        .expect("a list")
        .iter()
        .map(|r| r["run"].as_str().expect("run"))
        .collect();
    assert_eq!(agent_names, expected, "{agent}");

    // The text: the same order, the nearest limit, the last refusal and its action.
    let text = ok(dir, &["runs", "--operator-socket", "operator.sock"]);
    let lines: Vec<&str> = text.lines().skip(1).collect();
    assert_eq!(lines.len(), expected.len(), "{text}");
    for (line, run) in lines.iter().zip(expected) {
        assert!(line.starts_with(run), "{text}");
    }
    assert!(lines[0].contains("attempts 80%"), "{text}");
    assert!(lines[4].contains("loop_repeated_call"), "{text}");
}

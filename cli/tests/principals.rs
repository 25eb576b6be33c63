//! Principal budgets on the real binary and daemon over its real Unix socket (31 runs in
//! a row from one uid stop at the principal budget): one uid starting run
//! after run draws from one budget; its runs and attempts of the period are counted
//! across them, a refused start says `principal_budget_exceeded` (action ask), the
//! budget survives the loss of the index, and `tally verify` replays the ledger clean.
//!
//! `TALLY_UNDER_TEST` runs these against another build (they fail against one from
//! before principal budgets: every new run was a fresh budget).

use serde_json::{json, Value};
use tally_testkit::Tally;

fn tally() -> Tally {
    Tally::new(env!("CARGO_BIN_EXE_tally"))
}

#[test]
fn thirty_one_runs_in_a_row_from_one_uid_stop_at_the_principal_budget() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let d = tmp.path();
    // 30 runs of 5 calls would be 150 allows; the uid's budget is 30 runs and 148
    // attempts a day, whatever each run's own budget says.
    tally().init(
        d,
        "[principals.default]\nruns = 30\nattempts = 148\nperiod_ms = 86400000\n",
    );
    let mut s = tally().serve(d, &[]);
    let mut allowed = 0;
    let mut denied = Vec::new();
    let mut refused_at = None;
    for i in 1..=31 {
        let run = format!("run-{i}");
        let (status, v) = s.agent(
            "POST",
            "/v1/runs",
            Some(json!({"run": run, "goal": "one more try", "budget": {"attempts": 10}})),
        );
        if status != 201 {
            assert_eq!(status, 403, "{v}");
            assert_eq!(v["error"]["code"], "principal_budget_exceeded", "{v}");
            let msg = v["error"]["message"].as_str().unwrap_or("");
            assert!(msg.contains("action ask"), "{v}");
            refused_at = Some(i);
            break;
        }
        for _ in 0..5 {
            match s.check_read(&run) {
                (d, _) if d == "allow" => allowed += 1,
                (d, r) => {
                    assert_eq!(
                        (d.as_str(), r.as_str()),
                        ("deny", "principal_budget_exceeded")
                    );
                    denied.push(i);
                }
            }
        }
        let (status, v) = s.agent("POST", &format!("/v1/runs/{run}/stop"), Some(json!({})));
        assert_eq!(status, 200, "{v}");
    }
    assert_eq!(allowed, 148, "the uid's attempts, across its runs");
    assert_eq!(denied, vec![30, 30], "the 30th run's last two calls");
    assert_eq!(refused_at, Some(31), "the 31st run does not start");
    // The uid's usage, as the gate counts it, in every run's standing (GET /v1/runs and
    // `tally runs`) and in a run's own (GET /v1/runs/RUN).
    let runs: Value = serde_json::from_str(&tally().ok(
        d,
        &["runs", "--operator-socket", "operator.sock", "--json"],
        "",
    ))
    .expect("runs json");
    let runs = runs.as_array().expect("a list");
    assert!(!runs.is_empty());
    for r in runs {
        assert_eq!(
            r["limits"]["principal_runs"],
            json!({"used": 30, "limit": 30}),
            "{r}"
        );
        assert_eq!(
            r["limits"]["principal_attempts"],
            json!({"used": 148, "limit": 148}),
            "{r}"
        );
        assert!(r["limits"].get("principal_spend_nanos").is_none(), "{r}");
    }
    let text = tally().ok(d, &["runs", "--operator-socket", "operator.sock"], "");
    // The nearest limit of every run is the uid's attempts, used up.
    assert_eq!(
        text.lines()
            .skip(1)
            .filter(|l| l.contains("owner's attempts 100%"))
            .count(),
        runs.len(),
        "{text}"
    );
    let (status, v) = s.agent("GET", "/v1/runs/run-30", None);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["limits"]["principal_attempts"]["used"], 148, "{v}");
    s.stop();

    // The budget is state with the decisions: the index lost, it comes back from the log.
    std::fs::remove_dir_all(d.join("ledger/index")).expect("rm index");
    let mut s = tally().serve(d, &[]);
    let (status, v) = s.agent("POST", "/v1/runs", Some(json!({"run": "after-restart"})));
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (403, Some("principal_budget_exceeded")),
        "{v}"
    );
    s.stop();

    let report = tally().verifies(d);
    assert_eq!(
        report["replay"]["replayed"].as_u64(),
        Some(150),
        "every allow and deny decided again: {report}"
    );
}

//! `tally policy backtest` against the live gate: one workload (the same calls in the
//! same order per run; an agent that gets a `stop` refusal stops) run twice on the real
//! daemon, once under each policy, two ledgers. Backtesting the second policy over the
//! first ledger must name exactly the calls the live gate refused under it, call by call,
//! and where each run ended. Plus its JSON against docs/schemas/backtest.json, and the
//! mistakes it refuses with exit 2.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{json, Value};
use tally_testkit::Tally;

fn tally() -> Tally {
    Tally::new(env!("CARGO_BIN_EXE_tally"))
}

// No refusal asks a human here: `attempts_exhausted` is a `stop`.
const TWELVE: &str = "[ceiling]\nattempts = 12\n[approvals]\nask_on = []\n";
const SIX: &str = "[ceiling]\nattempts = 6\n[approvals]\nask_on = []\n";

/// The runs and how many calls each would make.
const RUNS: [(&str, u64); 4] = [("short", 3), ("exact", 6), ("over", 9), ("long", 12)];

/// Each call's decision and reason (`""` for an allow), per run.
type Calls = BTreeMap<String, Vec<(String, String)>>;

/// The workload on a daemon serving `policy` in `dir`: every run makes its calls in
/// order, settles each allowed one at 2 cents, stops at a `stop` refusal, then ends.
fn workload(dir: &Path, policy: &str) -> Calls {
    tally().init(dir, policy);
    let mut s = tally().serve(dir, &[]);
    let mut calls = Calls::new();
    for (run, n) in RUNS {
        let (status, v) = s.agent(
            "POST",
            "/v1/runs",
            Some(json!({"run": run, "goal": "backtest"})),
        );
        assert_eq!(status, 201, "{v}");
        let made = calls.entry(run.to_owned()).or_default();
        for i in 1..=n {
            let body = json!({"run": run, "tool": "search", "operation": format!("q{i}"),
                              "effect": "read", "args": {"i": i}, "reserve_cents": 2});
            let (status, v) = s.agent("POST", "/v1/check", Some(body));
            assert_eq!(status, 200, "{v}");
            let decision = v["decision"].as_str().unwrap_or("?").to_owned();
            made.push((
                decision.clone(),
                v["reason"].as_str().unwrap_or("").to_owned(),
            ));
            if decision == "allow" {
                let outcome = json!({"run": run, "attempt": v["attempt"], "status": "ok",
                                     "settled_cents": 2});
                let (status, v) = s.agent("POST", "/v1/outcome", Some(outcome));
                assert_eq!(status, 200, "{v}");
            } else if v["action"] == "stop" {
                break;
            }
        }
        let (status, v) = s.agent("POST", &format!("/v1/runs/{run}/stop"), Some(json!({})));
        assert_eq!(status, 200, "{v}");
    }
    s.stop();
    calls
}

/// What the backtest says each run's calls would have been: the recorded ones up to
/// where it would have stopped, each change in place of the recorded decision.
fn predicted(report: &Value, recorded: &Calls) -> Calls {
    let mut out = Calls::new();
    for r in report["runs"].as_array().expect("runs") {
        let run = r["run"].as_str().expect("run");
        let made = r["calls_made"].as_u64().expect("calls_made") as usize;
        let mut calls: Vec<_> = recorded[run][..made].to_vec();
        for key in ["newly_refused", "newly_allowed"] {
            for c in r[key].as_array().expect("changes") {
                let i = c["call"].as_u64().expect("call") as usize - 1;
                calls[i] = match c["would"].as_str() {
                    Some(reason) => ("deny".into(), reason.into()),
                    None => ("allow".into(), String::new()),
                };
            }
        }
        out.insert(run.to_owned(), calls);
    }
    out
}

fn backtest(dir: &Path, policy: &Path, extra: &[&str]) -> std::process::Output {
    let mut args = vec![
        "policy",
        "backtest",
        "--policy",
        policy.to_str().expect("path"),
    ];
    args.extend_from_slice(&[
        "ledger",
        "--key",
        "ledger/ledger.pub",
        "--auditor-key",
        "auditor.key",
    ]);
    args.extend_from_slice(extra);
    tally().run(dir, &args, "")
}

#[test]
fn backtest_names_exactly_the_calls_the_live_gate_refuses_under_the_new_policy() {
    let (a, b) = (
        tempfile::tempdir().expect("tmp"),
        tempfile::tempdir().expect("tmp"),
    );
    let under_twelve = workload(a.path(), TWELVE);
    let under_six = workload(b.path(), SIX);
    // The workload is what the test says: under 12 attempts every call is allowed, under
    // 6 the longer runs are stopped at their 7th call.
    assert!(
        under_twelve.values().flatten().all(|(d, _)| d == "allow"),
        "{under_twelve:?}"
    );
    assert_eq!(under_six["long"].len(), 7, "{under_six:?}");

    std::fs::write(a.path().join("six.toml"), SIX).expect("write");
    let out = backtest(a.path(), &a.path().join("six.toml"), &["--json"]);
    assert!(out.status.success(), "{}", tally_testkit::tally::text(&out));
    let report: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(predicted(&report, &under_twelve), under_six, "{report:#}");
    assert_eq!(report["total"]["runs"], 4);
    assert_eq!(report["total"]["newly_refused"], 2, "{report:#}");
    // "over": 3 calls of 2 cents not made or refused, "long": 6; a refused call uses
    // nothing.
    assert_eq!(report["total"]["attempts_saved"], 3 + 6, "{report:#}");
    assert_eq!(
        report["total"]["spend_saved_nanos"],
        (3 + 6) * 2 * 10_000_000u64,
        "{report:#}"
    );

    let schema = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/schemas/backtest.json");
    let schema: Value =
        serde_json::from_str(&std::fs::read_to_string(schema).expect("schema")).expect("json");
    let validator = jsonschema::draft202012::new(&schema).expect("a valid schema");
    let errors: Vec<String> = validator
        .iter_errors(&report)
        .map(|e| e.to_string())
        .collect();
    assert!(errors.is_empty(), "{errors:?}\n{report:#}");

    let out = backtest(a.path(), &a.path().join("six.toml"), &[]);
    let text = tally_testkit::tally::text(&out);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("run long: stops at call 7 of 12 (attempts_exhausted"),
        "{text}"
    );
    assert!(
        text.contains("2 newly refused, 0 newly allowed, 7 not made"),
        "{text}"
    );
    // Calibration: the completed runs' attempts (3, 6, 9, 12) reach the limit of 12.
    let out = tally().run(
        a.path(),
        &[
            "stats",
            "ledger",
            "--key",
            "ledger/ledger.pub",
            "--auditor-key",
            "auditor.key",
            "--json",
        ],
        "",
    );
    let stats: Value = serde_json::from_slice(&out.stdout).expect("stats json");
    let family = &stats["calibration"][0];
    assert_eq!(family["family"], "backtest", "{stats:#}");
    assert_eq!(family["completed"], 4, "{stats:#}");
    assert_eq!(
        family["attempts"]["band"],
        json!({"p50": 6, "p95": 12}),
        "{stats:#}"
    );
    assert_eq!(family["attempts"]["judgement"], "inside_band", "{stats:#}");
    assert_eq!(
        family["spend_nanos"]["band"]["p95"],
        24 * 10_000_000u64,
        "{stats:#}"
    );
    let schema = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/schemas/stats.json");
    let schema: Value =
        serde_json::from_str(&std::fs::read_to_string(schema).expect("schema")).expect("json");
    let validator = jsonschema::draft202012::new(&schema).expect("a valid schema");
    let errors: Vec<String> = validator
        .iter_errors(&stats)
        .map(|e| e.to_string())
        .collect();
    assert!(errors.is_empty(), "{errors:?}\n{stats:#}");
    // The same policy changes nothing.
    std::fs::write(a.path().join("twelve.toml"), TWELVE).expect("write");
    let text = tally_testkit::tally::text(&backtest(a.path(), &a.path().join("twelve.toml"), &[]));
    assert!(text.contains("every run goes as it went"), "{text}");
}

#[test]
fn a_policy_that_does_not_parse_or_the_wrong_key_is_exit_2_and_says_what_to_do() {
    let a = tempfile::tempdir().expect("tmp");
    let d = a.path();
    tally().init(d, TWELVE);
    std::fs::write(d.join("bad.toml"), "[ceiling]\nattempts = \"five\"\n").expect("write");
    let out = backtest(d, &d.join("bad.toml"), &[]);
    let text = tally_testkit::tally::text(&out);
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert!(text.contains("not a valid policy"), "{text}");
    assert!(text.contains("tally policy check"), "{text}");
    // Another ledger's key.
    let other = tempfile::tempdir().expect("tmp");
    tally().ledger(other.path());
    std::fs::write(d.join("twelve.toml"), TWELVE).expect("write");
    let key = other.path().join("ledger/ledger.pub");
    let out = tally().run(
        d,
        &[
            "policy",
            "backtest",
            "--policy",
            "twelve.toml",
            "ledger",
            "--key",
            key.to_str().expect("path"),
            "--auditor-key",
            "auditor.key",
        ],
        "",
    );
    let text = tally_testkit::tally::text(&out);
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert!(text.contains("is the verification key of ledger"), "{text}");
}

//! The reports themselves: checkpoint coverage, the JSON fields, the text an operator
//! reads, the per-run cap on findings.

use super::*;

#[test]
fn coverage_says_covered_or_not_yet_sealed() {
    let mut ds = scenario("retry_after");
    ds.truncate(9);
    let mut r = analyse(&ds);
    r.set_coverage(6, "ab".repeat(32), 2);
    assert_eq!(
        r.handoff("ra-honoured").map(|h| &h.checkpoint),
        Some(&Coverage::Covered {
            size: 6,
            head: "ab".repeat(32),
            epoch: 2
        })
    );
    assert_eq!(
        r.handoff("ra-ignored").map(|h| &h.checkpoint),
        Some(&Coverage::NotYetSealed { sealed_size: 6 })
    );
    let text = render_handoffs_text(&r, Some("ra-ignored"));
    assert!(text.contains("NOT YET SEALED"), "{text}");
    assert!(!text.contains("ra-honoured"), "{text}");
}

#[test]
fn json_reports_have_the_documented_fields() {
    let r = analyse(&scenario("polling_past_allowance"));
    let loops: Value = serde_json::from_str(&render_loops_json(&r)).expect("loops JSON");
    assert_eq!(loops["version"], REPORT_VERSION);
    let l = &loops["loops"][0];
    let keys: Vec<&str> = l
        .as_object()
        .expect("object")
        .keys()
        .map(String::as_str)
        .collect();
    let mut want = vec![
        "pattern",
        "runs",
        "workers",
        "tool",
        "operation",
        "args_digest",
        "remote_ref",
        "count",
        "first_seq",
        "last_seq",
        "clock",
        "first_ms",
        "last_ms",
        "span_ms",
        "reserved_nanos",
        "settled_nanos",
        "model_spend_nanos",
        "failures",
        "ignored_retry_after",
        "poll",
        "ended_by",
    ];
    let mut got = keys.clone();
    want.sort_unstable();
    got.sort_unstable();
    assert_eq!(got, want);
    assert_eq!(l["pattern"], "polling");
    assert_eq!(
        l["ended_by"],
        json!({"kind": "refused", "reason": "poll_allowance_exhausted", "seq": 9})
    );
    assert_eq!(l["poll"]["over_allowance"], true);

    let h: Value = serde_json::from_str(&render_handoffs_json(&r, None)).expect("handoff JSON");
    let h = &h["handoffs"][0];
    let mut got: Vec<&str> = h
        .as_object()
        .expect("object")
        .keys()
        .map(String::as_str)
        .collect();
    got.sort_unstable();
    let mut want = vec![
        "run",
        "started",
        "goal",
        "parent",
        "workers",
        "first_seq",
        "last_seq",
        "stop",
        "attempts",
        "spend",
        "polls",
        "completed",
        "completed_total",
        "model_calls",
        "model_calls_total",
        "refused",
        "refused_total",
        "pending",
        "last_observed",
        "safe_resume",
        "unsafe_actions",
        "loops",
        "findings",
        "checkpoint",
    ];
    want.sort_unstable();
    assert_eq!(got, want);
    assert_eq!(h["stop"]["status"], "stopped");
    assert_eq!(h["stop"]["reason"], "poll_allowance_exhausted");
    assert_eq!(h["stop"]["action"], "stop");
    assert_eq!(h["pending"][0]["status"], "running");
    assert_eq!(h["pending"][0]["not_before"]["run_ms"], 5600);
    assert_eq!(h["safe_resume"][0]["action"], "check_remote");
    assert_eq!(h["unsafe_actions"][0]["kind"], "remote_job_running");
    // The polls used against the allowance are handed over too.
    assert_eq!(
        h["polls"],
        json!([{"remote_ref": "eb12", "used": 3, "allowance": 3}])
    );
    assert_eq!(h["checkpoint"], json!({"status": "unknown"}));

    let f = analyse(&scenario("spend_overrun"));
    let f: Value = serde_json::from_str(&render_findings_json(&f)).expect("findings JSON");
    assert_eq!(
        f["findings"][0],
        json!({"seq": 3, "run": "spend", "kind": "allow_beyond_limit",
               "dimension": "spend_nanos", "used": 1_250_000_000u64, "limit": 1_000_000_000u64})
    );
    assert_eq!(
        f["findings"][1],
        json!({"seq": 3, "run": "spend", "kind": "allow_after_overrun"})
    );
    assert_eq!(f["findings_omitted"], 0);
}

#[test]
fn text_reports_read_like_an_operators_note() {
    let r = analyse(&scenario("lost_post"));
    let text = render_handoffs_text(&r, None);
    for line in [
        "Run post: \"Charge customer c_17 for order 5512\"",
        "  Status: stopped: completed at seq 5, 6.0 s after the run started, recorded 2023-11-14 22:13:20 UTC",
        "  Attempts: 2 of 5",
        "  Spend: $0.30 reserved, $0.30 settled (limit $2.00)",
        "    - payments.charge (payments.charge:order-5512) -> ch_88 \"succeeded\" (seq 4, $0.30, 5.9 s after the run started, recorded 2023-11-14 22:13:20 UTC)",
        "    - payments.charge (payments.charge:order-5512) attempt 1: OUTCOME UNKNOWN (seq 2, 5.1 s after the run started, recorded 2023-11-14 22:13:20 UTC)",
        "  Must not repeat:",
        "  Checkpoint: not determined",
    ] {
        assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
    }
    assert!(
        text.contains("do not repeat payments.charge (payments.charge:order-5512) (attempt 1)"),
        "{text}"
    );

    let loops = render_loops_text(&analyse(&scenario("retry_storm")));
    assert!(loops.starts_with("1 loop found."), "{loops}");
    assert!(
        loops.contains("1. retry_storm in run storm: crm.lookup (crm.lookup:acme)"),
        "{loops}"
    );
    assert!(
        loops.contains("   7 calls, seq 1..13, from 100 ms to 2.0 s after the run started (1.9 s)"),
        "{loops}"
    );
    assert!(
        loops.contains("   ended: refused with circuit_open at seq 13"),
        "{loops}"
    );
    assert_eq!(
        render_loops_text(&analyse(&scenario("normal_run"))),
        "No loops found.\n"
    );

    let findings = render_findings_text(&analyse(&scenario("refund_refused")));
    assert!(findings.starts_with("2 findings."), "{findings}");
    assert!(
        findings.contains("seq 6  run refund  refund_without_attempt: refund of attempt 3, which was never allowed"),
        "{findings}"
    );
}

#[test]
fn findings_beyond_the_per_run_cap_are_counted() {
    let mut ds = vec![
        start("r", json!({})),
        d(json!({"run": "r", "kind": "stop", "at_ms": 1, "reason": "completed"})),
    ];
    for i in 0..5u64 {
        ds.push(d(
            json!({"run": "r", "kind": "refund", "at_ms": 2 + i, "of": 99}),
        ));
    }
    let config = Config {
        max_findings_per_run: 3,
        ..Config::default()
    };
    let r = Analysis::analyse(config, &events(&ds));
    // Each late refund is two findings: after the stop, and of an attempt never allowed.
    assert_eq!(r.findings.len(), 3);
    assert_eq!(r.findings_omitted, 7);
    assert_eq!(r.handoffs[0].findings, 10);
}

/// The handoff's status is the run's last state: a stop-action refusal an allow followed
/// is history (running), a refusal of the last call is why the open run cannot go on,
/// whatever its action; a completed write repeated is one "do not repeat" line per
/// distinct call, named by its argument digest.
#[test]
fn the_handoff_says_how_the_run_ended_and_names_each_completed_write() {
    let write = |run: &str, at_ms: u64, attempt: u64, n: u64| {
        d(
            json!({"run": run, "kind": "allow", "at_ms": at_ms, "tool": "deploy",
                 "args": {"n": n}, "effect": "non_idempotent_write", "attempt": attempt}),
        )
    };
    let deny = |run: &str, at_ms: u64, reason: &str| {
        d(
            json!({"run": run, "kind": "deny", "at_ms": at_ms, "tool": "deploy",
                 "reason": reason}),
        )
    };
    let r = analyse(&[
        start("went-on", json!({"attempts": 10})),
        deny("went-on", 10, "attempts_exhausted"),
        write("went-on", 20, 1, 1),
        ok("went-on", 30, 1),
        write("went-on", 40, 2, 1),
        ok("went-on", 50, 2),
        write("went-on", 60, 3, 2),
        ok("went-on", 70, 3),
        start("backing-off", json!({"attempts": 10})),
        deny("backing-off", 10, "attempts_exhausted"),
        deny("backing-off", 20, "rate_limit_exceeded"),
    ]);
    let went_on = r.handoffs.iter().find(|h| h.run == "went-on").expect("run");
    assert_eq!(went_on.stop.status, StopStatus::Running);
    assert_eq!(went_on.stop.reason, None);
    let lines: Vec<&str> = went_on
        .unsafe_actions
        .iter()
        .filter(|u| u.kind == UnsafeKind::AlreadyDone)
        .map(|u| u.what.as_str())
        .collect();
    let one = &args_digest(&json!({"n": 1}))[..12];
    let two = &args_digest(&json!({"n": 2}))[..12];
    assert_eq!(
        lines,
        [
            format!("do not repeat deploy with arguments {one}: it already completed (2 times, the last at seq 5)"),
            format!("do not repeat deploy with arguments {two}: it already completed"),
        ]
    );
    let backing = r
        .handoffs
        .iter()
        .find(|h| h.run == "backing-off")
        .expect("run");
    assert_eq!(backing.stop.status, StopStatus::Refused);
    assert_eq!(backing.stop.reason, Some(Reason::RateLimitExceeded));
    assert_eq!(backing.stop.action, Some(Action::Retry));
    assert_eq!(backing.stop.seq.map(|s| s.seq), Some(10));
    let text = render_handoffs_text(&r, None);
    assert!(
        text.contains("Status: open (no stop record), its last call refused with rate_limit_exceeded, action retry at seq 10"),
        "{text}"
    );
}

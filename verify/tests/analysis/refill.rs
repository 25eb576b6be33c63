//! Refill chains offline: runs continuing runs a loop refusal ended, appended by hand
//! (no gate refused them), are each judged by the core's count, and the last run's
//! handoff shows the chain and asks for a human's decision, never a new run.

use super::*;

/// `run` (continuing `prev`), the same build call three times, its loop refusal, and its
/// stop on it.
fn looping(run: &str, prev: Option<&str>) -> Vec<Decision> {
    let mut start = json!({"run": run, "kind": "start", "at_ms": 0, "goal": "fix the build",
        "budget": {"attempts": 10}});
    if let Some(p) = prev {
        start["continues"] = json!(p);
    }
    let mut ds = vec![d(start)];
    for i in 1..=3 {
        ds.push(d(
            json!({"run": run, "kind": "allow", "at_ms": i * 10, "tool": "make",
            "args": {"t": "all"}, "effect": "read", "attempt": i}),
        ));
        ds.push(d(
            json!({"run": run, "kind": "outcome", "at_ms": i * 10 + 1, "attempt": i,
            "status": "error"}),
        ));
    }
    ds.push(d(
        json!({"run": run, "kind": "deny", "at_ms": 40, "tool": "make",
        "args": {"t": "all"}, "effect": "read", "reason": "loop_repeated_call"}),
    ));
    ds.push(d(
        json!({"run": run, "kind": "stop", "at_ms": 41, "reason": "loop_repeated_call"}),
    ));
    ds
}

fn chain_of_six() -> Vec<Decision> {
    let names = ["r1", "r2", "r3", "r4", "r5", "r6"];
    let mut ds = Vec::new();
    for (i, n) in names.iter().enumerate() {
        ds.extend(looping(n, i.checked_sub(1).map(|j| names[j])));
    }
    ds
}

#[test]
fn a_chain_of_six_continuations_beyond_the_allowance_is_a_finding_per_start() {
    let r = analyse(&chain_of_six());
    let refills: Vec<(&str, &Inconsistency)> = r
        .findings
        .iter()
        .filter(|f| matches!(f.kind, Inconsistency::RefillWithoutApproval { .. }))
        .map(|f| (f.run.as_str(), &f.kind))
        .collect();
    let runs: Vec<&str> = refills.iter().map(|(r, _)| *r).collect();
    // r2 is the one continuation the default policy allows; every later start is beyond.
    assert_eq!(runs, ["r3", "r4", "r5", "r6"]);
    assert_eq!(
        refills[0].1,
        &Inconsistency::RefillWithoutApproval {
            predecessor: "r2".into(),
            continuations: 2,
            allowance: 1,
        }
    );
    let json: Value = serde_json::from_str(&render_findings_json(&r)).expect("json");
    let kinds: Vec<&str> = json["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .filter_map(|f| f["kind"].as_str())
        .filter(|k| *k == "refill_without_approval")
        .collect();
    assert_eq!(kinds.len(), 4, "{json}");
    let text = render_findings_text(&r);
    assert!(text.contains("started continuing r5"), "{text}");
}

#[test]
fn the_last_handoff_shows_the_chain_and_asks_a_human() {
    let r = analyse(&chain_of_six());
    let json: Value = serde_json::from_str(&render_handoffs_json(&r, Some("r6"))).expect("json");
    let h = &json["handoffs"][0];
    assert_eq!(h["run"], "r6", "{json}");
    let chain = &h["chain"];
    assert_eq!(
        chain["runs"],
        json!(["r1", "r2", "r3", "r4", "r5", "r6"]),
        "{json}"
    );
    assert_eq!(chain["attempts_used"], 18, "{json}");
    assert_eq!(chain["failure"], "loop_repeated_call", "{json}");
    assert_eq!(chain["tool"], "make", "{json}");
    let steps = h["safe_resume"].as_array().expect("steps");
    assert!(steps.iter().all(|s| s["action"] != "new_run"), "{json}");
    assert!(
        steps
            .iter()
            .any(|s| s["action"] == "ask_human" && s["reason"] == "refill_without_approval"),
        "{json}"
    );
    let text = render_handoffs_text(&r, Some("r6"));
    assert!(
        text.contains("Refill chain: 6 runs in a row stopped on loop_repeated_call"),
        "{text}"
    );
    assert!(text.contains("r1 -> r2 -> r3 -> r4 -> r5 -> r6"), "{text}");
    assert!(text.contains("a human decides"), "{text}");
    assert!(!text.contains("continue in a new run"), "{text}");
    // A run whose chain is within the allowance keeps its advice, and shows no chain.
    let one: Value = serde_json::from_str(&render_handoffs_json(
        &analyse(&looping("solo", None)),
        None,
    ))
    .expect("json");
    assert!(one["handoffs"][0].get("chain").is_none(), "{one}");
    assert_eq!(
        one["handoffs"][0]["safe_resume"][0]["action"], "new_run",
        "{one}"
    );
}

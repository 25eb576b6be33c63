//! Wording, and agent-supplied strings that never reach a terminal raw.

use super::*;

/// Handoff wording: a start without a goal, attempts without a limit,
/// storms without named workers, and times that say which clock they are on.
#[test]
fn handoff_wording_says_what_is_known() {
    let mut decisions = vec![json!({"run": "nogoal", "kind": "start", "at_ms": 0})];
    decisions.push(json!({"run": "nogoal", "kind": "stop", "reason": "completed", "at_ms": 5}));
    decisions.push(json!({"run": "orphan", "kind": "allow", "tool": "t", "attempt": 1}));
    // A storm across three runs with no worker named.
    for run in ["s1", "s2", "s3"] {
        decisions.push(json!({"run": run, "kind": "start", "goal": "sync"}));
        for a in 1..=2 {
            decisions.push(json!({"run": run, "kind": "allow", "tool": "billing", "attempt": a, "args": {"a": a}}));
            decisions.push(json!({"run": run, "kind": "outcome", "status": "error", "attempt": a}));
        }
    }
    let cli = Cli::new(&decisions);
    let out = cli.run(&with_keys(&["handoff", "L.tally"]));
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("Run nogoal: (its start record gives no goal)"),
        "{stdout}"
    );
    assert!(stdout.contains("Run orphan: (no start record)"), "{stdout}");
    assert!(stdout.contains("Attempts: 1 used (no limit)"), "{stdout}");
    assert!(!stdout.contains("of no limit"), "{stdout}");
    assert!(!stdout.contains("(s)"), "{stdout}");
    assert!(!stdout.contains("0 worker"), "{stdout}");
    assert!(
        stdout.contains("5 ms after the run started, recorded 20"),
        "{stdout}"
    );
}

/// True if `s` holds a character that drives a terminal: C0 controls but the line break,
/// DEL, C1 controls, bidi overrides.
fn drives_a_terminal(s: &str) -> Option<char> {
    s.chars().find(|&c| {
        (c.is_control() && c != '\n')
            || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    })
}

/// Agent-supplied strings are shown escaped. A run named to erase the
/// lines above it (`\r\e[10A\r\e[J`) hid another run's "Must not repeat" line.
#[test]
fn agent_strings_never_reach_the_terminal_raw() {
    let evil = "x\r\u{1b}[10A\r\u{1b}[J\u{7}\u{9b}2J\u{202e}\nMust not repeat: nothing known.";
    let decisions = vec![
        json!({"run": evil, "kind": "start", "goal": evil, "parent": evil, "budget": {"attempts": 9}}),
        json!({"run": evil, "kind": "allow", "tool": evil, "operation": evil, "worker": evil,
               "attempt": 1, "effect": "non_idempotent_write", "args": {"a": 1}, "at_ms": 1}),
        json!({"run": evil, "kind": "outcome", "status": "running", "attempt": 1,
               "remote_ref": evil, "observed": evil, "retry_after_ms": 10}),
        json!({"run": evil, "kind": "allow", "tool": evil, "operation": evil, "worker": evil,
               "attempt": 2, "effect": "non_idempotent_write", "args": {"a": 2}, "at_ms": 2}),
        json!({"run": evil, "kind": "outcome", "status": "ok", "attempt": 2,
               "remote_ref": format!("{evil}2"), "observed": evil}),
        json!({"run": evil, "kind": "allow", "tool": evil, "operation": evil, "worker": evil,
               "attempt": 3, "effect": "non_idempotent_write", "args": {"a": 3}, "at_ms": 3}),
        json!({"run": evil, "kind": "outcome", "status": "unknown", "attempt": 3}),
        json!({"run": evil, "kind": "allow", "tool": evil, "operation": evil, "worker": evil,
               "attempt": 4, "effect": "non_idempotent_write", "args": {"a": 3}, "at_ms": 4}),
        json!({"run": evil, "kind": "deny", "tool": evil, "operation": evil, "reason": "approval_required"}),
        json!({"run": evil, "kind": "refund", "of": 9}),
    ];
    let mut decisions = decisions;
    for a in 5..=8 {
        decisions.push(
            json!({"run": evil, "kind": "allow", "tool": evil, "attempt": a,
                              "args": {"same": true}, "at_ms": 10 + a}),
        );
    }
    let cli = Cli::new(&decisions);
    for args in [
        with_keys(&["verify", "L.tally"]),
        with_keys(&["loops", "L.tally"]),
        with_keys(&["handoff", "L.tally"]),
    ] {
        let out = cli.run(&args);
        let stdout = text(&out.stdout);
        if let Some(c) = drives_a_terminal(&stdout) {
            panic!("{args:?}: raw {c:?} on stdout:\n{stdout:?}");
        }
        assert!(
            stdout.contains("x\\u{d}\\u{1b}[10A"),
            "{args:?}: the run is named, escaped:\n{stdout}"
        );
        assert!(
            !stdout.contains("\nMust not repeat: nothing known."),
            "{stdout}"
        );
    }
}

//! Regression tests for core bugs found by the corpus and model tests, each held to what
//! the docs say.

use serde_json::json;
use tally_policy::{Call, Verdict};
use tally_record::{Effect, Reason};

use crate::approvals::{alice, grant, policy};
use crate::support::{call, Sim, NO_ASK};

fn spend(n: u64, cents: u64) -> Call {
    reserve(n, cents * 10_000_000)
}

fn reserve(n: u64, nanos: u64) -> Call {
    Call {
        reserve_nanos: nanos,
        ..call("llm", Effect::Read, json!({"n": n}))
    }
}

/// docs/GATE.md (spend): "after an overrun (settled above reserved: recorded) all further
/// spend until a human grants more". A signed grant of cents must lift it.
#[test]
fn a_grant_of_cents_lifts_budget_exceeded_after_an_overrun() {
    let mut sim = Sim::with_run(&policy(), json!({"spend_cents": 100}));
    let a = sim.allow(&spend(1, 10), 10);
    sim.outcome("r1", a, "ok", 20, json!({"settled_cents": 20}));
    let d = sim.refused(&spend(2, 5), 30, Reason::ApprovalRequired);
    assert_eq!(d.cause, Some(Reason::BudgetExceeded));
    sim.apply_json(grant(&alice(), "alice", json!({"cents": 50}), 100_000, 35));
    let d = sim.decide(&spend(2, 5), 40);
    assert_eq!(
        (d.verdict, d.reason()),
        (Verdict::Allow, None),
        "the human granted more; cause {:?}",
        d.cause
    );
}

/// docs/GATE.md (approvals): "a deny whose policy allows it answers `require_approval`". When a
/// grant lifts the first refusal but a second one (also in `ask_on`) stands, the answer
/// must still be `require_approval`, with that second refusal as its cause.
#[test]
fn a_second_refusal_a_human_may_lift_still_asks() {
    let mut sim = Sim::with_run(&policy(), json!({"attempts": 1, "spend_cents": 10}));
    sim.allow(&spend(1, 8), 10);
    sim.apply_json(grant(
        &alice(),
        "alice",
        json!({"attempts": 1}),
        100_000,
        15,
    ));
    let d = sim.decide(&spend(2, 5), 20);
    assert_eq!(
        d.verdict,
        Verdict::RequireApproval,
        "reason {:?}",
        d.reason()
    );
    assert_eq!(d.reason(), Some(Reason::ApprovalRequired));
    assert_eq!(d.cause, Some(Reason::ReservationInsufficient));
}

/// docs/GATE.md, how a budget is counted (amounts): "nanodollars, attempts and times are u64 and never wrap: a value that
/// would overflow is a bad-input error". The gate must never allow a call whose own
/// record then overflows the fold.
#[test]
fn decide_never_allows_a_reservation_that_overflows() {
    let mut sim = Sim::with_run(NO_ASK, json!({}));
    sim.allow(&reserve(1, u64::MAX), 10);
    let d = sim.decide(&reserve(2, 1), 20);
    let found = sim.apply(&d.record);
    assert!(
        d.verdict != Verdict::Allow && found.is_empty(),
        "{:?} {:?}, apply found {found:?}",
        d.verdict,
        d.reason()
    );
}

/// docs/GATE.md, how a budget is counted (amounts): attempt numbers never wrap, and every allow is its own attempt.
#[test]
fn decide_never_reuses_the_last_attempt_number() {
    let mut sim = Sim::with_run(NO_ASK, json!({}));
    let max = u64::MAX;
    let found = sim.apply_json(json!({
        "run": "r1", "kind": "allow", "at_ms": 5, "tool": "api", "effect": "read", "attempt": max,
    }));
    assert_eq!(found, vec![]);
    let d = sim.decide(&call("api", Effect::Read, json!({"n": 2})), 10);
    assert!(
        d.verdict != Verdict::Allow,
        "allowed again as attempt {:?}",
        d.record.attempt
    );
}

/// docs/GATE.md, how a budget is counted (spend): "held = the reservations of allowed attempts not yet settled". A
/// second allow naming an attempt already allowed replaces the first's bookkeeping: its
/// reservation stays in `held_cents` forever though attempt 1 is settled, and nothing
/// reports it.
#[test]
fn a_second_allow_of_one_attempt_is_a_finding_and_leaks_nothing() {
    let mut sim = Sim::with_run(NO_ASK, json!({}));
    let allow = |at: u64, cents: u64| {
        json!({
            "run": "r1", "kind": "allow", "at_ms": at, "tool": "api", "effect": "read",
            "attempt": 1, "reserve_cents": cents,
        })
    };
    assert_eq!(sim.apply_json(allow(5, 10)), vec![]);
    let found = sim.apply_json(allow(6, 20));
    sim.outcome("r1", 1, "ok", 7, json!({"settled_cents": 20}));
    let r = sim.run("r1");
    assert!(!found.is_empty(), "a reused attempt number is not reported");
    assert_eq!(
        r.held_nanos, 0,
        "attempt 1 is settled, yet spend stays held"
    );
}

/// A ceiling of 0 attempts (no call could ever be made) is refused in a policy put in
/// force, with its key and line; a ledger written by a build that accepted it still reads
/// its policy record, as it was enforced.
#[test]
fn a_useless_zero_is_refused_in_force_but_read_from_a_ledger() {
    use tally_policy::{Policy, PolicyError, Recorded};
    let text = "# ceilings\n[ceiling]\nattempts = 0\n";
    match Policy::from_toml(text) {
        Err(PolicyError::Invalid { key, line, .. }) => {
            assert_eq!((key.as_str(), line), ("ceiling.attempts", Some(3)))
        }
        other => panic!("{other:?}"),
    }
    assert!(Recorded::new(text).is_err());
    let recorded = Recorded::from_ledger(text).expect("a recorded policy reads");
    assert_eq!(recorded.policy.ceiling.attempts, Some(0));
    // What earlier builds refused stays refused everywhere.
    assert!(Recorded::from_ledger("[retries]\nread = 0\n").is_err());
}

/// docs/MCP.md: a remote server is `https://`, plain `http://` to a loopback host only.
/// Earlier builds took plain `http://` to any host (the docs' own example was
/// `http://10.0.0.7:8000/mcp`): such a policy is refused in force, with its key and line,
/// but a ledger that recorded it still reads its policy record.
#[test]
fn a_plain_http_server_elsewhere_is_refused_in_force_but_read_from_a_ledger() {
    use tally_policy::{Policy, PolicyError, Recorded};
    let text =
        "[mcp.search]\nurl = \"http://10.0.0.7:8000/mcp\"\ncredential_env = \"SEARCH_TOKEN\"\n";
    match Policy::from_toml(text) {
        Err(PolicyError::Invalid { key, line, .. }) => {
            assert_eq!((key.as_str(), line), ("mcp.search.url", Some(2)))
        }
        other => panic!("{other:?}"),
    }
    assert!(Recorded::new(text).is_err());
    let recorded = Recorded::from_ledger(text).expect("a recorded policy reads");
    assert_eq!(
        recorded.policy.mcp["search"].url.as_deref(),
        Some("http://10.0.0.7:8000/mcp")
    );
    assert!(recorded.policy.mcp["search"].in_force_problem().is_some());
    // What earlier builds refused stays refused everywhere.
    for url in [
        "ftp://h/mcp",
        "http://u:p@h/mcp",
        "http://h/mcp#x",
        "http:///mcp",
    ] {
        let text = format!("[mcp.search]\nurl = \"{url}\"\n");
        assert!(Recorded::from_ledger(&text).is_err(), "{url}");
    }
}

/// docs/MCP.md: a remote server's URL is held to what its HTTP client sends and says as
/// written. The `url` crate rewrites a dot segment (`/a/../t/TOKEN` is sent, and quoted
/// in an error, as `/t/TOKEN`), decodes nothing but may re-encode `%`, turns `\` into
/// `/` and percent-encodes `{ } " < >` and the backtick: a URL so written is refused in
/// force (so its redaction finds it as quoted), naming its key and line, the token in no
/// word of the refusal.
#[test]
fn a_server_url_its_client_would_rewrite_is_refused_in_force() {
    use tally_policy::{Policy, PolicyError};
    for url in [
        "https://h/a/../t/tok-SECRET/mcp",
        "https://h/./t/tok-SECRET/mcp",
        "https://h/a/%2e%2e/t/tok-SECRET/mcp",
        "https://h/t\\\\tok-SECRET/mcp",
        "https://h/t/{tok-SECRET}/mcp",
        "https://h/t/tok-SECRET`/mcp",
        "https://h/t/<tok-SECRET>/mcp",
        "http://localhost:8000/t/tok-SECRET/../mcp",
    ] {
        let text = format!("[mcp.search]\nurl = \"{url}\"\n");
        match Policy::from_toml(&text) {
            Err(e @ PolicyError::Invalid { .. }) => {
                let PolicyError::Invalid { key, line, .. } = &e else {
                    unreachable!()
                };
                assert_eq!((key.as_str(), *line), ("mcp.search.url", Some(2)), "{url}");
                assert!(!e.to_string().contains("SECRET"), "{url}: {e}");
            }
            other => panic!("{url}: {other:?}"),
        }
    }
    for url in [
        "https://h/t/tok-SECRET/mcp",
        "https://h",
        "https://h/",
        "http://[::1]:8/mcp",
    ] {
        let text = format!("[mcp.search]\nurl = \"{url}\"\n");
        assert!(Policy::from_toml(&text).is_ok(), "{url}");
    }
}

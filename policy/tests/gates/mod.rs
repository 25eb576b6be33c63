//! `decide` against docs/GATE.md's gates: deadline, depth, scope, the per-tool breaker (shared
//! by every run), token buckets and the in-flight bound.

use serde_json::json;
use tally_policy::{Breaker, Call, Verdict};
use tally_record::{Action, Effect, Reason};

use crate::support::{call, Sim, NO_ASK};

/// Wall time of run time `at` (see `support::now`).
fn wall(at: u64) -> u64 {
    1_000_000 + at
}

#[test]
fn deadline_refuses_and_no_allow_outlives_the_run() {
    let mut sim = Sim::with_run(NO_ASK, json!({"deadline_ms": 10_000}));
    let c = |n: u64, own: Option<u64>| Call {
        timeout_ms: own,
        ..call("api", Effect::Read, json!({"n": n}))
    };
    let d = sim.decide(&c(1, None), 2000);
    assert_eq!(
        d.record.timeout_ms,
        Some(8000),
        "the policy's 60 s cut to the 8 s left"
    );
    assert_eq!(
        sim.decide(&c(1, Some(5000)), 2000).record.timeout_ms,
        Some(5000)
    );
    assert_eq!(
        sim.decide(&c(1, Some(5000)), 9000).record.timeout_ms,
        Some(1000)
    );
    for at in (0..10_000).step_by(997) {
        for own in [None, Some(1), Some(3000), Some(u64::MAX)] {
            let d = sim.decide(&c(at, own), at);
            assert_eq!(d.verdict, Verdict::Allow);
            let t = d.record.timeout_ms.expect("an allow has a timeout");
            assert!(t <= 10_000 - at, "timeout {t} at {at} outlives the run");
        }
    }
    sim.refused(&c(2, None), 10_000, Reason::RunDeadlineExhausted);
    sim.refused(&c(3, None), 50_000, Reason::RunDeadlineExhausted);
    assert_eq!(Reason::RunDeadlineExhausted.action(), Action::Stop);
}

#[test]
fn calls_deeper_than_the_budget_are_refused() {
    let mut sim = Sim::with_run(NO_ASK, json!({"depth": 2}));
    let at = |depth: Option<u64>| Call {
        depth,
        ..call("agent", Effect::Read, json!({"depth": depth}))
    };
    sim.allow(&at(Some(2)), 10);
    sim.allow(&at(None), 20);
    sim.refused(&at(Some(3)), 30, Reason::ChainDepthExceeded);
}

#[test]
fn scope_and_blocked_tools() {
    let policy = concat!(
        "[approvals]\nask_on = []\n",
        "[scope]\ntools = [\"search*\", \"export\"]\nblocked = [\"export\"]\n",
        "targets = [\"*.example.com\"]\n",
    );
    let mut sim = Sim::with_run(policy, json!({}));
    sim.refused(
        &call("shell", Effect::NonIdempotentWrite, json!({})),
        10,
        Reason::ScopeViolation,
    );
    let to = |host: &str| Call {
        target: Some(host.into()),
        ..call("search.web", Effect::Read, json!({"host": host}))
    };
    sim.allow(&to("api.example.com"), 20);
    sim.refused(&to("example.com"), 30, Reason::ScopeViolation);
    sim.refused(&to("evil.com"), 40, Reason::ScopeViolation);
    sim.refused(&to("api.example.com.evil.com"), 50, Reason::ScopeViolation);
    let d = sim.refused(
        &call("export", Effect::Read, json!({})),
        60,
        Reason::ToolBlocked,
    );
    assert_eq!(d.verdict, Verdict::Deny);
    assert_eq!(Reason::ScopeViolation.action(), Action::Stop);
    assert_eq!(Reason::ToolBlocked.action(), Action::Ask);
}

const BREAKER: &str = concat!(
    "[approvals]\nask_on = []\n",
    "[breaker]\nfailures = 3\nopen_ms = 30000\nprobe_timeout_ms = 10000\n",
);

#[test]
fn breaker_opens_half_opens_one_probe_and_never_wedges() {
    let mut sim = Sim::with_run(BREAKER, json!({}));
    sim.start("r2", json!({}));
    let c = |run: &str, n: u64| Call {
        run: run.into(),
        ..call("api", Effect::Read, json!({"n": n}))
    };
    // Closed: two failures do not open it; a rejected one does not count.
    for n in 0..2 {
        let a = sim.allow(&c("r1", n), n * 100);
        assert!(sim
            .outcome("r1", a, "error", n * 100 + 50, json!({}))
            .is_empty());
    }
    let a = sim.allow(&c("r1", 2), 200);
    sim.outcome("r1", a, "rejected", 250, json!({}));
    assert_eq!(sim.tools["api"].breaker, Breaker::Closed { failures: 2 });
    // The third consecutive failure (a timeout counts) opens it, for every run.
    let a = sim.allow(&c("r1", 3), 300);
    sim.outcome("r1", a, "timeout", 350, json!({}));
    assert_eq!(
        sim.tools["api"].breaker,
        Breaker::Open {
            until_ms: wall(30_350)
        }
    );
    let d = sim.refused(&c("r1", 4), 400, Reason::CircuitOpen);
    assert_eq!(d.record.retry_after_ms, Some(29_950));
    assert_eq!(Reason::CircuitOpen.action(), Action::Retry);
    let d = sim.refused(&c("r2", 4), 30_349, Reason::CircuitOpen);
    assert_eq!(d.record.retry_after_ms, Some(1));
    // Another tool is not affected.
    sim.allow(&call("other", Effect::Read, json!({})), 500);

    // Expired: half-open, exactly one probe.
    let probe = sim.allow(&c("r1", 5), 30_350);
    let d = sim.refused(&c("r2", 5), 30_351, Reason::CircuitOpen);
    assert_eq!(
        d.record.retry_after_ms,
        Some(9_999),
        "until the probe's deadline"
    );
    sim.refused(&c("r1", 6), 35_000, Reason::CircuitOpen);

    // The probe never reports: taken as failed at its deadline, open again from there.
    let d = sim.refused(&c("r2", 6), 40_350, Reason::CircuitOpen);
    assert_eq!(d.record.retry_after_ms, Some(30_000));
    sim.refused(&c("r2", 7), 70_349, Reason::CircuitOpen);

    // Expired again: one new probe; its ok closes the breaker.
    let probe2 = sim.allow(&c("r2", 8), 70_350);
    sim.refused(&c("r1", 8), 70_360, Reason::CircuitOpen);
    // The first probe's late outcome proves nothing about the second.
    assert!(sim.outcome("r1", probe, "ok", 70_370, json!({})).is_empty());
    sim.refused(&c("r1", 9), 70_380, Reason::CircuitOpen);
    assert!(sim
        .outcome("r2", probe2, "ok", 70_400, json!({}))
        .is_empty());
    assert_eq!(sim.tools["api"].breaker, Breaker::Closed { failures: 0 });
    sim.allow(&c("r1", 10), 70_410);
    sim.allow(&c("r2", 11), 70_410);
}

#[test]
fn a_failed_probe_reopens_the_breaker() {
    let mut sim = Sim::with_run(BREAKER, json!({}));
    for n in 0..3 {
        let a = sim.allow(&call("api", Effect::Read, json!({"n": n})), n * 10);
        sim.outcome("r1", a, "error", n * 10 + 5, json!({}));
    }
    let probe = sim.allow(&call("api", Effect::Read, json!({"n": 3})), 30_100);
    sim.outcome("r1", probe, "error", 30_200, json!({}));
    let d = sim.refused(
        &call("api", Effect::Read, json!({"n": 4})),
        30_300,
        Reason::CircuitOpen,
    );
    assert_eq!(d.record.retry_after_ms, Some(29_900));
}

#[test]
fn the_run_bucket_refuses_with_retry_after() {
    let policy = "[approvals]\nask_on = []\n[rate]\nrun_per_sec = 1\nrun_burst = 1\n";
    let mut sim = Sim::with_run(policy, json!({}));
    sim.allow(&call("api", Effect::Read, json!({"n": 1})), 0);
    let d = sim.refused(
        &call("api", Effect::Read, json!({"n": 2})),
        0,
        Reason::RateLimitExceeded,
    );
    assert_eq!(d.record.retry_after_ms, Some(1000));
    assert_eq!(Reason::RateLimitExceeded.action(), Action::Retry);
    let d = sim.decide(&call("other", Effect::Read, json!({"n": 2})), 600);
    assert_eq!(
        d.reason(),
        Some(Reason::RateLimitExceeded),
        "the run's bucket, any tool"
    );
    assert_eq!(d.record.retry_after_ms, Some(400));
    sim.allow(&call("api", Effect::Read, json!({"n": 2})), 1000);
}

#[test]
fn the_tool_bucket_protects_the_dependency_across_runs() {
    let policy =
        "[approvals]\nask_on = []\n[rate]\nrun_per_sec = 0\ntool_per_sec = 1\ntool_burst = 1\n";
    let mut sim = Sim::with_run(policy, json!({}));
    sim.start("r2", json!({}));
    sim.allow(&call("api", Effect::Read, json!({"n": 1})), 0);
    let r2 = |tool: &str| Call {
        run: "r2".into(),
        ..call(tool, Effect::Read, json!({"n": 2}))
    };
    let d = sim.refused(&r2("api"), 10, Reason::RateLimitExceeded);
    assert_eq!(d.record.retry_after_ms, Some(990));
    sim.allow(&r2("other"), 10);
}

#[test]
fn calls_in_flight_per_tool_are_bounded() {
    let policy = "[approvals]\nask_on = []\n[rate]\ntool_in_flight = 1\n";
    let mut sim = Sim::with_run(policy, json!({}));
    sim.start("r2", json!({}));
    let slow = Call {
        timeout_ms: Some(5000),
        ..call("api", Effect::Read, json!({"n": 1}))
    };
    let a = sim.allow(&slow, 0);
    let r2 = |n: u64| Call {
        run: "r2".into(),
        timeout_ms: Some(5000),
        ..call("api", Effect::Read, json!({"n": n}))
    };
    let d = sim.refused(&r2(2), 100, Reason::RateLimitExceeded);
    assert_eq!(d.record.retry_after_ms, Some(4900));
    // Its final outcome ends its flight.
    assert!(sim.outcome("r1", a, "ok", 200, json!({})).is_empty());
    let b = sim.allow(&r2(2), 300);
    // A call that never reports stops counting after its timeout.
    sim.refused(&r2(3), 5299, Reason::RateLimitExceeded);
    sim.allow(&r2(3), 5300);
    let _ = b;
}

/// `[breaker.tools]`: a tool's own failure count (an exact name over the longest
/// prefix), and 0 for no breaker at all, so a coding agent's failing test runs never
/// open its shell's breaker for every run; every other tool keeps `[breaker]`'s.
#[test]
fn a_tool_has_its_own_breaker_failures_or_none() {
    let policy = concat!(
        "[approvals]\nask_on = []\n",
        "[breaker]\nfailures = 2\n",
        "[breaker.tools]\n\"claude-code/*\" = 0\n\"claude-code/Web*\" = 4\n\"claude-code/WebFetch\" = 3\n",
    );
    let mut sim = Sim::with_run(policy, json!({}));
    let b = &tally_policy::Policy::from_toml(policy)
        .expect("policy")
        .breaker;
    assert_eq!(b.failures_for("claude-code/Bash"), None);
    assert_eq!(b.failures_for("claude-code/WebSearch"), Some(4));
    assert_eq!(b.failures_for("claude-code/WebFetch"), Some(3));
    assert_eq!(b.failures_for("github/create_issue"), Some(2));
    let fail = |sim: &mut Sim, tool: &str, n: u64| {
        let a = sim.allow(&call(tool, Effect::Read, json!({"n": n})), n * 10);
        sim.outcome("r1", a, "error", n * 10 + 5, json!({}));
    };
    // No breaker: twenty failures in a row leave it closed, every call allowed.
    for n in 0..20 {
        fail(&mut sim, "claude-code/Bash", n);
    }
    assert_eq!(
        sim.tools["claude-code/Bash"].breaker,
        Breaker::Closed { failures: 0 }
    );
    // Its own count: the exact name's 3, not the prefix's 4 nor the policy's 2.
    for n in 20..22 {
        fail(&mut sim, "claude-code/WebFetch", n);
    }
    assert_eq!(
        sim.tools["claude-code/WebFetch"].breaker,
        Breaker::Closed { failures: 2 }
    );
    fail(&mut sim, "claude-code/WebFetch", 22);
    sim.refused(
        &call("claude-code/WebFetch", Effect::Read, json!({"n": 23})),
        230,
        Reason::CircuitOpen,
    );
    // Every other tool: the policy's 2.
    for n in 30..32 {
        fail(&mut sim, "api", n);
    }
    sim.refused(
        &call("api", Effect::Read, json!({"n": 32})),
        320,
        Reason::CircuitOpen,
    );
    sim.allow(
        &call("claude-code/Bash", Effect::Read, json!({"n": 33})),
        330,
    );
}

#[test]
fn breaker_tools_are_printed_and_a_nameless_one_refused() {
    use tally_policy::{Policy, PolicyError};
    let p = Policy::from_toml("[breaker.tools]\n\"claude-code/*\" = 0\n").expect("policy");
    let printed = p.to_toml();
    assert!(
        printed.contains("[breaker.tools]\n\"claude-code/*\" = 0"),
        "{printed}"
    );
    assert_eq!(Policy::from_toml(&printed).expect("reads back"), p);
    for bad in [
        "[breaker.tools]\n\"*\" = 3\n",
        "[breaker.tools]\n\"\" = 3\n",
    ] {
        match Policy::from_toml(bad) {
            Err(PolicyError::Invalid { key, line, .. }) => {
                assert_eq!((key.as_str(), line), ("breaker.tools", Some(1)), "{bad}")
            }
            other => panic!("{bad}: {other:?}"),
        }
    }
}

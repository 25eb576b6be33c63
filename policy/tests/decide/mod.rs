//! `decide` against docs/GATE.md's run policies: loops, polls, attempts, spend, retries by
//! effect class, unknown outcomes; and `decide` itself (pure, deterministic, valid records).

use serde_json::json;
use tally_policy::{decide, Inconsistency, Verdict, View};
use tally_record::{Action, Effect, Kind, Reason};

use crate::support::{call, now, op_call, Sim, NO_ASK};

#[test]
fn the_fourth_identical_consecutive_call_is_a_loop_whatever_the_attempts_cap() {
    for budget in [json!({"attempts": 3}), json!({"attempts": 1000}), json!({})] {
        let mut sim = Sim::with_run(NO_ASK, budget.clone());
        let c = call("search", Effect::Read, json!({"q": "tally"}));
        for i in 0..3 {
            let a = sim.allow(&c, i * 10);
            assert!(sim.outcome("r1", a, "ok", i * 10 + 5, json!({})).is_empty());
        }
        let d = sim.refused(&c, 40, Reason::LoopRepeatedCall);
        assert_eq!(d.verdict, Verdict::Deny, "budget {budget}");
        assert_eq!(Reason::LoopRepeatedCall.action(), Action::Stop);
        // Another call is not a repeat (where attempts remain).
        let other = call("search", Effect::Read, json!({"q": "other"}));
        if budget["attempts"] == json!(3) {
            sim.refused(&other, 50, Reason::AttemptsExhausted);
        } else {
            sim.allow(&other, 50);
        }
    }
}

#[test]
fn identical_calls_in_a_window_are_a_loop() {
    let mut sim = Sim::with_run(NO_ASK, json!({}));
    let a = call("search", Effect::Read, json!({"q": "a"}));
    let b = call("search", Effect::Read, json!({"q": "b"}));
    for (i, c) in [&a, &a, &a, &b, &a, &a].into_iter().enumerate() {
        let t = i as u64 * 10;
        let n = sim.allow(c, t);
        sim.outcome("r1", n, "ok", t + 1, json!({}));
    }
    // Only two consecutive, but the sixth identical one in the window.
    sim.refused(&a, 100, Reason::LoopRepeatedCall);
}

fn alternate(observed_change: bool) -> Sim {
    let mut sim = Sim::with_run(NO_ASK, json!({}));
    let a = call("browser", Effect::Read, json!({"click": "next"}));
    let b = call("browser", Effect::Read, json!({"click": "back"}));
    for (i, c) in [&a, &b, &a, &b].into_iter().enumerate() {
        let t = i as u64 * 10;
        let n = sim.allow(c, t);
        let extra = if observed_change && i == 3 {
            json!({"observed": "page 2"})
        } else {
            json!({})
        };
        sim.outcome("r1", n, "ok", t + 1, extra);
    }
    sim
}

#[test]
fn alternation_without_a_change_of_observed_state_refuses_the_fifth() {
    let mut sim = alternate(false);
    let a = call("browser", Effect::Read, json!({"click": "next"}));
    sim.refused(&a, 100, Reason::LoopRepeatedCall);
}

#[test]
fn a_change_of_observed_state_is_progress_and_lets_the_fifth_pass() {
    let mut sim = alternate(true);
    let a = call("browser", Effect::Read, json!({"click": "next"}));
    sim.allow(&a, 100);
}

/// A run that created remote operation `ea91` at 1000, whose outcome said Retry-After.
fn polling(budget: serde_json::Value, retry_after_ms: Option<u64>) -> Sim {
    let mut sim = Sim::with_run(NO_ASK, budget);
    let create = Call {
        idempotency_key: Some("k1".into()),
        ..op_call(
            "export",
            "export.create",
            Effect::IdempotentWrite,
            json!({"r": 1}),
        )
    };
    let n = sim.allow(&create, 900);
    let mut extra = json!({"remote_ref": "ea91"});
    if let Some(ms) = retry_after_ms {
        extra["retry_after_ms"] = json!(ms);
    }
    assert!(sim.outcome("r1", n, "ok", 1000, extra).is_empty());
    sim
}

use tally_policy::Call;

fn poll() -> Call {
    op_call(
        "export",
        "export.status:ea91",
        Effect::Read,
        json!({"id": "ea91"}),
    )
}

#[test]
fn a_poll_that_honours_retry_after_within_tolerance_is_allowed() {
    // Hint 5 s: the tolerance is the 1 s floor, so 4 s after the outcome is on time.
    let sim = polling(json!({"polls": 5}), Some(5000));
    let early = sim.decide(&poll(), 4999);
    assert_eq!(early.reason(), Some(Reason::UpstreamBackoff));
    assert_eq!(early.record.retry_after_ms, Some(1));
    assert_eq!(Reason::UpstreamBackoff.action(), Action::Retry);
    assert_eq!(sim.decide(&poll(), 5000).verdict, Verdict::Allow);

    // Hint 20 s: 10 % (2 s) is larger than 1 s.
    let mut sim = polling(json!({"polls": 5}), Some(20_000));
    let early = sim.decide(&poll(), 18_999);
    assert_eq!(early.reason(), Some(Reason::UpstreamBackoff));
    assert_eq!(early.record.retry_after_ms, Some(1));
    let d = sim.decide(&poll(), 2000);
    assert_eq!(d.record.retry_after_ms, Some(17_000), "wait until 19,000");
    let attempts = sim.run("r1").attempts_used;
    sim.allow(&poll(), 19_000);
    assert_eq!(
        sim.run("r1").attempts_used,
        attempts,
        "a poll uses no attempt"
    );
    assert_eq!(sim.run("r1").remote("ea91").expect("ref").polls, 1);
}

#[test]
fn a_poll_made_too_early_is_told_to_back_off() {
    let mut sim = polling(json!({"polls": 5}), Some(10_000));
    let d = sim.refused(&poll(), 3000, Reason::UpstreamBackoff);
    // 1000 + 10,000 - max(1000, 1000) = 10,000.
    assert_eq!(d.record.retry_after_ms, Some(7000));
    assert_eq!(d.verdict, Verdict::Deny);
}

#[test]
fn polling_that_keeps_its_interval_is_never_a_loop() {
    let mut sim = polling(json!({"polls": 30}), None);
    for i in 0..12u64 {
        let t = 2000 + i * 1000;
        let n = sim.allow(&poll(), t);
        let extra = json!({"observed": "running", "retry_after_ms": 1000});
        assert!(sim.outcome("r1", n, "running", t + 10, extra).is_empty());
    }
    assert_eq!(sim.run("r1").remote("ea91").expect("ref").polls, 12);
    assert_eq!(
        sim.run("r1").attempts_used,
        1,
        "only the create used an attempt"
    );
}

#[test]
fn polls_beyond_the_allowance_are_refused() {
    let mut sim = polling(json!({"polls": 2}), None);
    let by_ref = Call {
        remote_ref: Some("ea91".into()),
        ..call("export", Effect::Read, json!({"status": "ea91"}))
    };
    for (i, c) in [poll(), by_ref.clone()].iter().enumerate() {
        let t = 3000 + i as u64 * 2000;
        let n = sim.allow(c, t);
        sim.outcome("r1", n, "running", t + 10, json!({}));
    }
    let d = sim.refused(&poll(), 9000, Reason::PollAllowanceExhausted);
    assert_eq!(d.record.limits.as_ref().expect("limits")["polls"].used, 2);
    sim.refused(&by_ref, 9000, Reason::PollAllowanceExhausted);
}

#[test]
fn attempts_exhausted_but_exempt_tools_still_pass() {
    let policy = "[approvals]\nask_on = []\n[scope]\nexempt = [\"retrieve\"]\n";
    let mut sim = Sim::with_run(policy, json!({"attempts": 2}));
    sim.allow(&call("api", Effect::Read, json!({"n": 1})), 10);
    sim.allow(&call("api", Effect::Read, json!({"n": 2})), 20);
    let d = sim.refused(
        &call("api", Effect::Read, json!({"n": 3})),
        30,
        Reason::AttemptsExhausted,
    );
    let limits = d.record.limits.expect("limits");
    assert_eq!((limits["attempts"].used, limits["attempts"].limit), (2, 2));
    sim.allow(&call("retrieve", Effect::Read, json!({"n": 4})), 40);
    assert_eq!(sim.run("r1").attempts_used, 2);
}

#[test]
fn reservation_insufficient_when_settled_plus_held_plus_reserve_exceeds_spend() {
    let mut sim = Sim::with_run(NO_ASK, json!({"spend_cents": 100}));
    let reserve = |n: u64, cents: u64| Call {
        reserve_nanos: cents * 10_000_000,
        ..call("llm", Effect::Read, json!({"n": n}))
    };
    let first = sim.allow(&reserve(1, 60), 10);
    sim.refused(&reserve(2, 50), 20, Reason::ReservationInsufficient);
    sim.allow(&reserve(3, 40), 30); // 60 + 40 = 100 fits exactly
    sim.refused(&reserve(4, 1), 40, Reason::ReservationInsufficient);
    assert!(sim
        .outcome("r1", first, "ok", 50, json!({"settled_cents": 30}))
        .is_empty());
    // settled 30 + held 40 = 70.
    sim.refused(&reserve(5, 31), 60, Reason::ReservationInsufficient);
    sim.allow(&reserve(6, 30), 70);
    assert_eq!(Reason::ReservationInsufficient.action(), Action::Ask);
}

#[test]
fn budget_exceeded_after_an_overrun() {
    let mut sim = Sim::with_run(NO_ASK, json!({"spend_cents": 100}));
    let c = |n: u64, cents: u64| Call {
        reserve_nanos: cents * 10_000_000,
        ..call("llm", Effect::Read, json!({"n": n}))
    };
    let a = sim.allow(&c(1, 10), 10);
    // An overrun is a fact the upstream's bill records, not an inconsistency.
    let found = sim.outcome("r1", a, "ok", 20, json!({"settled_cents": 20}));
    assert!(found.is_empty(), "{found:?}");
    assert!(sim.run("r1").overrun);
    assert_eq!(sim.run("r1").overrun_nanos, 10 * 10_000_000);
    sim.refused(&c(2, 1), 30, Reason::BudgetExceeded);
    // Review finding: a call that reserves nothing was still allowed, and its outcome
    // could settle any amount, overrun after overrun. After an overrun no call is free.
    sim.refused(&c(3, 0), 40, Reason::BudgetExceeded);
}

/// The overrun an outcome records is the core's count of it: the right amount is
/// consistent, another amount (or one where nothing was overrun) is a finding.
#[test]
fn an_outcome_records_its_overrun_as_the_core_counts_it() {
    let c = |n: u64, cents: u64| Call {
        reserve_nanos: cents * 10_000_000,
        ..call("llm", Effect::Read, json!({"n": n}))
    };
    for (settled, recorded, finding) in [
        (20, Some(100_000_000), None),
        (20, Some(99_999_999), Some(Some(100_000_000))),
        (10, Some(1), Some(None)),
        (20, None, None),
    ] {
        let mut sim = Sim::with_run(NO_ASK, json!({"spend_cents": 100}));
        let a = sim.allow(&c(1, 10), 10);
        let mut extra = json!({"settled_cents": settled});
        if let Some(r) = recorded {
            extra["overrun_nanos"] = json!(r);
        }
        let found = sim.outcome("r1", a, "ok", 20, extra);
        let want: Vec<Inconsistency> = finding
            .map(|counted| Inconsistency::OverrunMisrecorded {
                recorded: recorded.unwrap_or(0),
                counted,
            })
            .into_iter()
            .collect();
        assert_eq!(found, want, "settled {settled}, recorded {recorded:?}");
    }
}

#[test]
fn a_spent_budget_still_allows_calls_that_reserve_nothing() {
    let mut sim = Sim::with_run(NO_ASK, json!({"spend_cents": 100}));
    let c = |n: u64, cents: u64| Call {
        reserve_nanos: cents * 10_000_000,
        ..call("llm", Effect::Read, json!({"n": n}))
    };
    let a = sim.allow(&c(1, 100), 10);
    assert!(sim
        .outcome("r1", a, "ok", 20, json!({"settled_cents": 100}))
        .is_empty());
    sim.refused(&c(2, 1), 30, Reason::BudgetExceeded);
    // Settled exactly what it reserved: no overrun, so a free call still fits.
    sim.allow(&c(3, 0), 40);
}

#[test]
fn retries_by_effect_class_and_ok_resets_them() {
    let mut sim = Sim::with_run(NO_ASK, json!({}));
    // read: 3 attempts of one logical operation.
    let read = |n: u64| op_call("web", "fetch:page", Effect::Read, json!({"try": n}));
    let a1 = sim.allow(&read(1), 10);
    sim.outcome("r1", a1, "error", 11, json!({}));
    let a2 = sim.allow(&read(2), 20);
    sim.outcome("r1", a2, "error", 21, json!({}));
    let a3 = sim.allow(&read(3), 30);
    sim.refused(&read(4), 40, Reason::RetriesExhausted);
    sim.outcome("r1", a3, "ok", 50, json!({}));
    sim.allow(&read(4), 60);

    // idempotent_write: 2, and a retry only with an idempotency key.
    let put = |n: u64, key: Option<&str>| Call {
        idempotency_key: key.map(str::to_owned),
        ..op_call(
            "crm",
            "crm.put:c1",
            Effect::IdempotentWrite,
            json!({"try": n}),
        )
    };
    let p1 = sim.allow(&put(1, None), 100);
    sim.outcome("r1", p1, "error", 101, json!({}));
    sim.refused(&put(2, None), 110, Reason::RetriesExhausted);
    let p2 = sim.allow(&put(2, Some("c1")), 120);
    sim.outcome("r1", p2, "error", 121, json!({}));
    sim.refused(&put(3, Some("c1")), 130, Reason::RetriesExhausted);

    // non_idempotent_write: 1.
    let send = |n: u64| {
        op_call(
            "mail",
            "mail.send:42",
            Effect::NonIdempotentWrite,
            json!({"try": n}),
        )
    };
    let s1 = sim.allow(&send(1), 200);
    sim.outcome("r1", s1, "error", 201, json!({}));
    sim.refused(&send(2), 210, Reason::RetriesExhausted);

    // A rejected attempt did nothing: it does not count against the operation either.
    let other = |n: u64| {
        op_call(
            "mail",
            "mail.send:43",
            Effect::NonIdempotentWrite,
            json!({"try": n}),
        )
    };
    let r1 = sim.allow(&other(1), 300);
    sim.outcome("r1", r1, "rejected", 301, json!({}));
    sim.allow(&other(2), 310);
}

#[test]
fn a_non_idempotent_write_whose_outcome_is_unknown_is_not_repeated() {
    for status in ["unknown", "timeout"] {
        let mut sim = Sim::with_run(NO_ASK, json!({}));
        let pay = |n: u64| {
            op_call(
                "pay",
                "pay.invoice:42",
                Effect::NonIdempotentWrite,
                json!({"try": n}),
            )
        };
        let a = sim.allow(&pay(1), 10);
        assert!(sim.outcome("r1", a, status, 20, json!({})).is_empty());
        let d = sim.refused(&pay(2), 30, Reason::OutcomeUnknownNonIdempotent);
        assert_eq!(d.verdict, Verdict::Deny, "{status}");
        assert_eq!(Reason::OutcomeUnknownNonIdempotent.action(), Action::Ask);
        // Another operation is not affected; reads of it neither.
        sim.allow(
            &op_call(
                "pay",
                "pay.invoice:43",
                Effect::NonIdempotentWrite,
                json!({}),
            ),
            40,
        );
        // A later outcome reconciles it: an ok ends the operation's retries too.
        assert!(sim.outcome("r1", a, "ok", 50, json!({})).is_empty());
        sim.allow(&pay(3), 60);
    }
}

#[test]
fn decide_is_pure_and_its_records_are_valid() {
    let mut sim = Sim::with_run(
        NO_ASK,
        json!({"attempts": 1, "spend_cents": 10, "deadline_ms": 5000}),
    );
    let c = Call {
        reserve_nanos: 5 * 10_000_000,
        worker: Some("w1".into()),
        target: Some("api.example.com".into()),
        depth: Some(1),
        ..call("api", Effect::Read, json!({"q": 1}))
    };
    let before = (sim.run("r1").clone(), sim.tools.clone());
    let allow = sim.decide(&c, 100);
    assert_eq!(allow.verdict, Verdict::Allow);
    assert_eq!(allow.cause, None);
    assert_eq!(allow.record.attempt, Some(1));
    assert_eq!(allow.record.reserve_nanos, Some(5 * 10_000_000));
    assert_eq!(allow.record.policy.as_deref(), Some(sim.digest.as_str()));
    // Straight through the library as well: nothing moved, same record twice.
    let view = View::of(sim.run("r1"));
    let again = decide(&sim.policy, &sim.digest, view, &c, now(100));
    assert_eq!(again, allow);
    assert_eq!((sim.run("r1").clone(), sim.tools.clone()), before);

    sim.ask(&c, 100);
    let deny = sim.decide(&call("api", Effect::Read, json!({"q": 2})), 200);
    assert_eq!(deny.record.kind, Some(Kind::Deny));
    assert_eq!(deny.reason(), Some(Reason::AttemptsExhausted));
    assert_eq!(deny.record.timeout_ms, None);
    deny.record.validate().expect("a valid deny");
}

#[test]
fn a_request_the_proxy_refused_is_that_refusal_and_reads_back_from_its_record() {
    // With approvals asked on every limit: a refusal of the request as sent is never one
    // a human can lift, nor one any state changes.
    let mut sim = Sim::with_run("", json!({"attempts": 5}));
    let mut c = call("openai", Effect::Read, json!({}));
    c.proxied = true;
    for reason in [Reason::RequestRefused, Reason::ScopeViolation] {
        c.refused = Some(reason);
        let d = sim.refused(&c, 10, reason);
        assert_eq!(d.verdict, Verdict::Deny);
        assert_eq!(d.record.kind, Some(Kind::Deny));
        assert_eq!(d.record.proxied, Some(true));
        assert_eq!(d.record.attempt, None, "a refusal uses no attempt");
        // Replay reads the call back from the record and decides the same.
        let again = tally_policy::Call::from_record(&d.record);
        assert_eq!(again.refused, Some(reason));
        assert_eq!(sim.decide(&again, 10).record, d.record);
    }
    // Only the proxy's refusals, and only for a proxied call.
    c.refused = Some(Reason::BudgetExceeded);
    sim.allow(&c, 20);
    c.refused = Some(Reason::RequestRefused);
    c.proxied = false;
    sim.allow(&c, 30);
    // An agent's own deny record is never read back as the proxy's refusal.
    let mut d = sim.decide(&c, 40).record;
    d.kind = Some(Kind::Deny);
    d.reason = Some(Reason::RequestRefused);
    assert_eq!(tally_policy::Call::from_record(&d).refused, None);
}

/// An outcome's `result_digest` of `text`.
fn result(text: &str) -> serde_json::Value {
    json!({"result_digest": tally_record::decision::args_digest(&json!(text))})
}

/// A coding agent's fix cycle: a shell command (a non-idempotent write, no retry), an
/// edit, the command again. The edit completed a write between the two runs of the
/// command, so the second is progress, not a retry of the first.
#[test]
fn edit_then_rerun_the_failing_test_is_progress_not_a_retry() {
    // The breaker (five failures of one tool in a row) is not what this is about.
    let policy = format!("{NO_ASK}[breaker]\nfailures = 1000\n");
    let mut sim = Sim::with_run(&policy, json!({"attempts": 1000, "side_effects": 1000}));
    let test = call(
        "claude-code/Bash",
        Effect::NonIdempotentWrite,
        json!({"command": "npm test"}),
    );
    let mut t = 0;
    for i in 0..20u64 {
        let a = sim.allow(&test, t);
        // The test still fails, with a different failure each time.
        let failed = result(&format!("{i} failing"));
        assert!(sim.outcome("r1", a, "error", t + 1, failed).is_empty());
        let edit = call(
            "claude-code/Edit",
            Effect::IdempotentWrite,
            json!({"file_path": "src/a.js", "new_string": i}),
        );
        let e = sim.allow(&edit, t + 2);
        assert!(sim.outcome("r1", e, "ok", t + 3, json!({})).is_empty());
        t += 10;
    }
    sim.allow(&test, t);
}

/// The same failing command with nothing changed in between is one operation retried:
/// refused at its class's bound, whether nothing ran in between, a read did, or an edit
/// that failed did.
#[test]
fn the_same_failing_command_with_nothing_changed_is_a_retry() {
    let test = call(
        "claude-code/Bash",
        Effect::NonIdempotentWrite,
        json!({"command": "npm test"}),
    );
    let read = call(
        "claude-code/Read",
        Effect::Read,
        json!({"file_path": "src/a.js"}),
    );
    let edit = call(
        "claude-code/Edit",
        Effect::IdempotentWrite,
        json!({"file_path": "src/a.js", "new_string": "x"}),
    );
    for between in [None, Some((&read, "ok")), Some((&edit, "error"))] {
        let mut sim = Sim::with_run(NO_ASK, json!({}));
        let a = sim.allow(&test, 0);
        let failed = result("3 failing");
        assert!(sim.outcome("r1", a, "error", 1, failed.clone()).is_empty());
        if let Some((c, status)) = between {
            let b = sim.allow(c, 2);
            assert!(sim.outcome("r1", b, status, 3, json!({})).is_empty());
        }
        sim.refused(&test, 10, Reason::RetriesExhausted);
    }
}

/// A retry whose preceding attempt's result changed is progress: its count starts again.
#[test]
fn a_changed_result_starts_the_retry_count_again() {
    let fetch = call(
        "web",
        Effect::Read,
        json!({"url": "https://example.com/status"}),
    );
    let run = |last: &str| {
        let mut sim = Sim::with_run(NO_ASK, json!({}));
        for (i, text) in ["503 page", "503 page", last].into_iter().enumerate() {
            let t = i as u64 * 10;
            let a = sim.allow(&fetch, t);
            let r = result(text);
            assert!(sim.outcome("r1", a, "error", t + 1, r).is_empty());
        }
        sim
    };
    // Three failures with nothing new: the read's three attempts are used.
    run("503 page").refused(&fetch, 40, Reason::RetriesExhausted);
    // The third answered something else: the fourth is allowed, and the count starts
    // again from it (a fifth is still within the read's three).
    let mut sim = run("502 page");
    let a = sim.allow(&fetch, 40);
    assert!(sim
        .outcome("r1", a, "error", 41, result("502 page"))
        .is_empty());
    sim.allow(&fetch, 50);
}

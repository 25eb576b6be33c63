//! Loops as the gate's rules define them: exact repetition, the window rule, alternation,
//! the per-tool bar, polling against Retry-After and stalls, storms from many workers.

use super::*;

/// `n` identical reads of `a.rs`, each followed by its `ok`, 10 s apart.
fn identical_reads(n: u64) -> Vec<Decision> {
    let mut ds = vec![start("r", json!({}))];
    for i in 0..n {
        ds.push(read("r", i * 10_000, i + 1, json!({"path": "a.rs"})));
        ds.push(ok("r", i * 10_000 + 10, i + 1));
    }
    ds
}

#[test]
fn exact_repetition_is_the_gates_loop_rule() {
    // The gate allows three identical calls in a row (`loops.identical_consecutive`)
    // and refuses the fourth: three are no loop, four are one.
    assert_eq!(analyse(&identical_reads(3)).loops, vec![]);
    let r = analyse(&identical_reads(4));
    assert_eq!(r.loops.len(), 1);
    let l = &r.loops[0];
    assert_eq!(l.pattern, Pattern::ExactRepetition);
    // A loop spans its first call to the last call the rule refused (the fourth).
    assert_eq!((l.count, l.first_seq.seq, l.last_seq.seq), (4, 1, 7));
    // The last call succeeded, and the run never stopped.
    assert_eq!(
        l.ended_by,
        LoopEnd::Succeeded {
            seq: Seq::single(8)
        }
    );
    let h = only_handoff(&r);
    assert_eq!(h.stop.status, StopStatus::Running);
    assert_eq!(h.safe_resume[0].action, ResumeAction::ConfirmStopped);

    // The rule is the policy's: under one that allows five in a row, four are no loop.
    let mut policy = tally_policy::Policy::default();
    policy.loops.identical_consecutive = 5;
    let config = Config {
        policy: std::sync::Arc::new(policy),
        ..Config::default()
    };
    let lenient = |n| Analysis::analyse(config.clone(), events(&identical_reads(n)).iter());
    assert_eq!(lenient(4).loops, vec![]);
    assert_eq!(lenient(6).loops.len(), 1);
}

#[test]
fn identical_calls_spread_among_others_trip_the_window_rule() {
    // a.rs six times among other reads, each read ok (else a.rs's fourth read is a retry
    // past the read class's three), never four in a row: the sixth is one more than
    // `identical_in_window` (5 in the last 20 calls).
    let mut ds = vec![start("r", json!({}))];
    let mut attempt = 0;
    for i in 0..6u64 {
        for path in ["a.rs".to_owned(), format!("other{i}.rs")] {
            attempt += 1;
            ds.push(read("r", attempt * 1000, attempt, json!({ "path": path })));
            ds.push(ok("r", attempt * 1000 + 10, attempt));
        }
    }
    let r = analyse(&ds);
    assert_eq!(r.loops.len(), 1, "{:?}", r.loops);
    assert_eq!(r.loops[0].pattern, Pattern::ExactRepetition);
    assert_eq!(r.loops[0].count, 6);
    // Five of them are not.
    ds.truncate(1 + 20);
    assert_eq!(analyse(&ds).loops, vec![]);
}

#[test]
fn two_calls_alternating_without_progress_are_a_loop() {
    let mut ds = vec![start("r", json!({}))];
    for i in 0..5u64 {
        let path = if i % 2 == 0 { "a.rs" } else { "b.rs" };
        ds.push(read("r", i * 1000, i + 1, json!({ "path": path })));
    }
    // A, B, A, B are allowed (`loops.alternating` = 4); the fifth, A again, is the loop.
    let r = analyse(&ds);
    assert_eq!(r.loops.len(), 1, "{:?}", r.loops);
    let l = &r.loops[0];
    assert_eq!(l.pattern, Pattern::Alternation);
    assert_eq!(
        (l.args_digest.as_deref(), l.count),
        (ds[1].args_digest.as_deref(), 3)
    );
    let h = only_handoff(&r);
    assert!(
        h.unsafe_actions
            .iter()
            .any(|u| u.what.contains("alternated")),
        "{:?}",
        h.unsafe_actions
    );
    ds.pop();
    assert_eq!(analyse(&ds).loops, vec![]);
}

#[test]
fn a_loop_still_going_at_the_end_never_stopped() {
    let mut ds = vec![start("r", json!({}))];
    for i in 0..4u64 {
        ds.push(read("r", i * 100, i + 1, json!({"path": "a.rs"})));
    }
    let r = analyse(&ds);
    assert_eq!(r.loops.len(), 1);
    assert_eq!(r.loops[0].ended_by, LoopEnd::NeverStopped);
    assert_eq!(r.loops[0].count, 4);
}

#[test]
fn high_call_count_is_the_policys_per_tool_bar() {
    // Two reads a second, each of another file: the gate allows 60 calls of one tool
    // in a minute (`loops.tool_calls`) and refuses the 61st.
    let run = |n: u64| {
        let mut ds = vec![start("r", json!({}))];
        for i in 0..n {
            ds.push(read(
                "r",
                i * 500,
                i + 1,
                json!({"path": format!("f{i}.rs")}),
            ));
        }
        ds.push(d(
            json!({"run": "r", "kind": "stop", "at_ms": n * 500, "reason": "completed"}),
        ));
        analyse(&ds)
    };
    assert_eq!(run(60).loops, vec![]);
    let r = run(61);
    assert_eq!(r.loops.len(), 1);
    let l = &r.loops[0];
    assert_eq!(l.pattern, Pattern::HighCallCount);
    assert_eq!(
        (l.count, l.first_seq.seq, l.last_seq.seq, l.span_ms),
        (61, 1, 61, 30_000)
    );
    assert_eq!(l.args_digest, None);
    assert_eq!(
        l.ended_by,
        LoopEnd::RunStopped {
            reason: Reason::Completed,
            seq: Seq::single(62)
        }
    );
    // One a second never reaches the bar: the window starts afresh each minute.
    let slow: Vec<Decision> = std::iter::once(start("r", json!({})))
        .chain(
            (0..120u64).map(|i| read("r", i * 1000, i + 1, json!({ "path": format!("f{i}.rs") }))),
        )
        .collect();
    assert_eq!(analyse(&slow).loops, vec![]);
}

fn create_job(run: &str, retry_after: u64) -> Vec<Decision> {
    vec![
        start(run, json!({})),
        d(
            json!({"run": run, "kind": "allow", "at_ms": 0, "tool": "export.create",
                 "operation": "export.create", "args": {"t": 1}, "effect": "idempotent_write",
                 "attempt": 1}),
        ),
        d(
            json!({"run": run, "kind": "outcome", "at_ms": 10, "attempt": 1, "status": "running",
                 "remote_ref": "j1", "observed": "queued", "retry_after_ms": retry_after}),
        ),
    ]
}

fn poll(
    run: &str,
    at_ms: u64,
    attempt: u64,
    status: &str,
    state: &str,
    retry_after: u64,
) -> [Decision; 2] {
    [
        d(
            json!({"run": run, "kind": "allow", "at_ms": at_ms, "tool": "export.status",
                 "operation": "export.status:j1", "args": {"id": "j1"}, "effect": "read",
                 "attempt": attempt}),
        ),
        d(
            json!({"run": run, "kind": "outcome", "at_ms": at_ms + 10, "attempt": attempt,
                 "status": status, "remote_ref": "j1", "observed": state,
                 "retry_after_ms": retry_after}),
        ),
    ]
}

#[test]
fn polling_that_ignores_retry_after_is_a_loop_even_if_the_job_finishes() {
    let mut ds = create_job("r", 5000);
    for i in 0..3u64 {
        ds.extend(poll("r", 1000 * (i + 1), i + 2, "running", "queued", 5000));
    }
    ds.extend(poll("r", 9000, 5, "ok", "done", 0));
    let r = analyse(&ds);
    assert_eq!(r.loops.len(), 1);
    let l = &r.loops[0];
    assert_eq!(l.pattern, Pattern::Polling);
    assert_eq!(l.ignored_retry_after, 3);
    // The loop is the three early polls; the fourth, on time, found the job done.
    assert_eq!(l.count, 3);
    assert_eq!(
        l.ended_by,
        LoopEnd::Succeeded {
            seq: Seq::single(10)
        }
    );
    let p = l.poll.as_ref().expect("poll evidence");
    assert_eq!(
        (p.allowance, p.over_allowance, p.state_changes),
        (None, false, 1)
    );
}

#[test]
fn polling_that_never_progresses_is_a_loop_past_the_policys_stall_bound() {
    let stalled = |config: Config, n: u64| {
        let mut ds = create_job("r", 1000);
        for i in 0..n {
            ds.extend(poll("r", 2000 * (i + 1), i + 2, "running", "queued", 1000));
        }
        Analysis::analyse(config, &events(&ds))
    };
    // By default polling that keeps its interval within its allowance is never a loop,
    // however long the job takes.
    assert_eq!(stalled(Config::default(), 40).loops, vec![]);
    // Under a policy with a stall bound of 20 the gate refuses the 21st unchanged poll.
    let mut policy = tally_policy::Policy::default();
    policy.polls.stall_polls = 20;
    let config = Config {
        policy: std::sync::Arc::new(policy),
        ..Config::default()
    };
    assert_eq!(stalled(config.clone(), 20).loops, vec![]);
    let r = stalled(config, 21);
    assert_eq!(r.loops.len(), 1);
    let l = &r.loops[0];
    assert_eq!(l.pattern, Pattern::Polling);
    assert_eq!(l.ignored_retry_after, 0);
    assert_eq!(l.poll.as_ref().map(|p| p.unchanged_polls), Some(21));
    assert_eq!(l.ended_by, LoopEnd::NeverStopped);
    // Polls are judged as polling only, never as high call count.
    assert!(r.loops.iter().all(|l| l.pattern == Pattern::Polling));
}

#[test]
fn retries_from_many_workers_of_one_run_are_one_storm() {
    let mut ds = vec![start("r", json!({}))];
    let mut attempt = 0;
    for round in 0..2u64 {
        for w in ["w1", "w2", "w3"] {
            attempt += 1;
            ds.push(d(
                json!({"run": "r", "kind": "allow", "worker": w, "at_ms": round * 100,
                             "tool": "db.query", "args": {"q": "select 1"}, "effect": "read",
                             "attempt": attempt}),
            ));
            ds.push(d(
                json!({"run": "r", "kind": "outcome", "worker": w, "at_ms": round * 100 + 50,
                             "attempt": attempt, "status": "timeout"}),
            ));
        }
    }
    let r = analyse(&ds);
    // One storm: the run's retries past the read class (its tool's breaker opened too,
    // a storm of one run that this one already shows).
    assert_eq!(r.loops.len(), 1, "{:#?}", r.loops);
    let l = &r.loops[0];
    assert_eq!((l.pattern, l.clock), (Pattern::RetryStorm, Clock::Run));
    assert_eq!(l.runs, vec!["r".to_owned()]);
    assert_eq!(
        l.workers,
        vec!["w1".to_owned(), "w2".to_owned(), "w3".to_owned()]
    );
    assert_eq!((l.failures, l.count), (6, 6));
}

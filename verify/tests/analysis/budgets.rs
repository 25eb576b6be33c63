//! Scenario stories about budgets and who spends them: an overrun, a runaway chain, an
//! override the agent wrote itself, refunds, workers and runs sharing one budget or tool,
//! a normal busy run, and every story in one ledger.

use super::*;

#[test]
fn spend_reservation_overrun() {
    let r = analyse(&scenario("spend_overrun"));
    assert_eq!(r.loops, vec![]);
    // Settling 85¢ on a 40¢ reservation is an overrun: the upstream billed more, a fact
    // recorded, not an inconsistency. Allowing another call after it is one.
    assert_eq!(
        r.findings,
        vec![
            finding(
                3,
                "spend",
                Inconsistency::AllowBeyondLimit {
                    dimension: Dimension::SpendNanos,
                    used: 125 * CENT,
                    limit: 100 * CENT
                }
            ),
            finding(3, "spend", Inconsistency::AllowAfterOverrun),
        ]
    );
    let h = only_handoff(&r);
    assert_eq!(h.stop, stopped(Reason::BudgetExceeded, 6, at(6110, 6)));
    assert_eq!(
        h.spend,
        Spend {
            reserved_nanos: 0, // every call settled
            settled_nanos: 120 * CENT,
            limit_nanos: Some(100 * CENT),
            approved_extra_nanos: 0,
            overrun_nanos: 45 * CENT,
            carved_out_nanos: 0,
        }
    );
    let done: Vec<_> = h
        .completed
        .iter()
        .map(|c| (c.seq.seq, c.attempt, c.remote_ref.clone(), c.at))
        .collect();
    assert_eq!(
        done,
        vec![
            (2, Some(1), s("resp_1"), at(3000, 2)),
            (4, Some(2), s("resp_2"), at(6000, 4))
        ]
    );
    // budget_exceeded asks a human: only a grant of more cents lets the run go on.
    assert_eq!(actions(h), vec![(ResumeAction::AskHuman, Some(5))]);
    assert_eq!(h.findings, 2);
    let cost: Vec<u64> = h.completed.iter().map(|c| c.settled_nanos / CENT).collect();
    assert_eq!(cost, vec![85, 35]);
}

#[test]
fn chain_depth_runaway() {
    let r = analyse(&scenario("chain_depth"));
    assert_eq!(
        r.loops,
        vec![Loop {
            pattern: Pattern::ExactRepetition,
            runs: vec!["chain".into()],
            workers: vec![],
            tool: s("agent.delegate"),
            operation: s("agent.delegate"),
            args_digest: digest(json!({"task": "research competitor pricing"})),
            remote_ref: None,
            count: 5,
            first_seq: Seq::single(1),
            last_seq: Seq::single(5),
            clock: Clock::Run,
            first_ms: 100,
            last_ms: 500,
            span_ms: 400,
            reserved_nanos: 0,
            settled_nanos: 0,
            model_spend_nanos: Some(0),
            failures: 0,
            ignored_retry_after: 0,
            poll: None,
            ended_by: LoopEnd::Refused {
                reason: Reason::ChainDepthExceeded,
                seq: Seq::single(5)
            },
        }]
    );
    assert_eq!(
        r.findings,
        vec![finding(
            4,
            "chain",
            Inconsistency::AllowBeyondLimit {
                dimension: Dimension::Depth,
                used: 4,
                limit: 3
            }
        )]
    );
    let h = only_handoff(&r);
    assert_eq!(h.stop, stopped(Reason::ChainDepthExceeded, 6, at(510, 6)));
    assert_eq!(h.attempts.used, 4);
    assert_eq!(actions(h), vec![(ResumeAction::NewRun, Some(6))]);
    assert_eq!(unsafe_kinds(h), vec![(UnsafeKind::LoopedCall, 5)]);
}

#[test]
fn an_override_the_agent_wrote_itself_grants_nothing() {
    // An agent-recorded "override" naming an approver, with no digest or signature: it is
    // not an approval (one approval model: a grant signed by an approver the policy
    // lists), so every allow beyond the two attempts is beyond the limit.
    let r = analyse(&scenario("override_forged"));
    assert_eq!(r.loops, vec![]);
    let beyond = |seq: u64, used: u64| {
        finding(
            seq,
            "override",
            Inconsistency::AllowBeyondLimit {
                dimension: Dimension::Attempts,
                used,
                limit: 2,
            },
        )
    };
    assert_eq!(
        r.findings,
        vec![
            finding(
                6,
                "override",
                Inconsistency::InvalidApproval {
                    why: "approval has no `digest`".into()
                }
            ),
            beyond(7, 3),
            beyond(9, 4),
            beyond(11, 5),
        ]
    );
    let h = only_handoff(&r);
    assert_eq!(h.stop, stopped(Reason::Completed, 13, at(6300, 13)));
    assert_eq!(
        h.attempts,
        Attempts {
            used: 5,
            limit: Some(2),
            approved_extra: 0,
            refunded: 0,
            carved_out: 0,
        }
    );
    let done: Vec<_> = h
        .completed
        .iter()
        .map(|c| {
            (
                c.seq.seq,
                c.attempt,
                c.operation.clone(),
                c.remote_ref.clone(),
                c.at.run_ms,
            )
        })
        .collect();
    assert_eq!(
        done,
        vec![
            (2, Some(1), s("deploy.push:eu-1"), s("dep_1"), 400),
            (4, Some(2), s("deploy.push:eu-2"), s("dep_2"), 800),
            (8, Some(3), s("deploy.push:us-1"), s("dep_3"), 5400),
            (10, Some(4), s("deploy.push:us-2"), s("dep_4"), 5800),
            (12, Some(5), s("deploy.push:ap-1"), s("dep_5"), 6200),
        ]
    );
    assert_eq!(actions(h), vec![(ResumeAction::Nothing, Some(13))]);
    assert_eq!(
        h.unsafe_actions,
        vec![],
        "idempotent writes may be repeated"
    );
}

#[test]
fn refund_of_a_refused_call() {
    let r = analyse(&scenario("refund_refused"));
    assert_eq!(r.loops, vec![]);
    assert_eq!(
        r.findings,
        vec![
            finding(6, "refund", Inconsistency::RefundWithoutAttempt { of: 3 }),
            // The bogus slot is not counted, so the gate's fourth send is one too many.
            finding(
                9,
                "refund",
                Inconsistency::AllowBeyondLimit {
                    dimension: Dimension::Attempts,
                    used: 4,
                    limit: 3
                }
            ),
        ]
    );
    let h = only_handoff(&r);
    assert_eq!(
        h.attempts,
        Attempts {
            used: 4,
            limit: Some(3),
            approved_extra: 0,
            refunded: 0,
            carved_out: 0,
        }
    );
    assert_eq!(h.completed_total, 4);
    assert_eq!(
        unsafe_kinds(h),
        vec![
            (UnsafeKind::AlreadyDone, 2),
            (UnsafeKind::AlreadyDone, 4),
            (UnsafeKind::AlreadyDone, 8),
            (UnsafeKind::AlreadyDone, 10)
        ]
    );
    assert_eq!(actions(h), vec![(ResumeAction::Nothing, Some(11))]);
}

#[test]
fn eight_workers_sharing_one_budget() {
    let r = analyse(&scenario("eight_workers"));
    assert_eq!(r.loops, vec![], "eight workers in parallel are not a loop");
    assert_eq!(
        r.findings,
        vec![
            finding(
                17,
                "fleet",
                Inconsistency::AllowBeyondLimit {
                    dimension: Dimension::Attempts,
                    used: 9,
                    limit: 8
                }
            ),
            finding(
                17,
                "fleet",
                Inconsistency::AllowBeyondLimit {
                    dimension: Dimension::SpendNanos,
                    used: 410 * CENT,
                    limit: 400 * CENT
                }
            )
        ]
    );
    let h = only_handoff(&r);
    assert_eq!(
        h.workers,
        (1..=8).map(|i| format!("w{i}")).collect::<Vec<_>>()
    );
    assert_eq!(h.stop, stopped(Reason::AttemptsExhausted, 20, at(2410, 20)));
    assert_eq!(
        h.attempts,
        Attempts {
            used: 9,
            limit: Some(8),
            approved_extra: 0,
            refunded: 0,
            carved_out: 0,
        }
    );
    assert_eq!(
        h.spend,
        Spend {
            reserved_nanos: 0, // every call settled
            settled_nanos: 405 * CENT,
            limit_nanos: Some(400 * CENT),
            approved_extra_nanos: 0,
            overrun_nanos: 0,
            carved_out_nanos: 0,
        }
    );
    let seqs: Vec<u64> = h.completed.iter().map(|c| c.seq.seq).collect();
    assert_eq!(seqs, vec![9, 10, 11, 12, 13, 14, 15, 16, 18]);
    assert_eq!(h.pending, vec![]);
    assert_eq!(actions(h), vec![(ResumeAction::NewRun, Some(20))]);
}

#[test]
fn many_runs_hammering_one_failing_tool_are_one_storm() {
    let r = analyse(&scenario("fleet_storm"));
    assert_eq!(
        r.loops,
        vec![Loop {
            pattern: Pattern::RetryStorm,
            runs: vec!["sync-a".into(), "sync-b".into(), "sync-c".into()],
            workers: vec![],
            tool: s("billing.api"),
            operation: s("billing.api:sync"),
            args_digest: None,
            remote_ref: None,
            // Nine failures opened the shared breaker at the fifth; the four calls made
            // while it was open are what it would have refused. The loop ends at the last.
            count: 12,
            first_seq: Seq::single(4),
            last_seq: Seq::single(19),
            clock: Clock::Wall,
            first_ms: wall(4),
            last_ms: wall(19),
            span_ms: 150,
            reserved_nanos: 0,
            settled_nanos: 0,
            model_spend_nanos: None,
            failures: 9,
            ignored_retry_after: 0,
            poll: None,
            ended_by: LoopEnd::RunStopped {
                reason: Reason::KilledByOperator,
                seq: Seq::single(23)
            },
        }]
    );
    assert_eq!(r.findings, vec![]);
    for (run, stop_seq) in [("sync-a", 21), ("sync-b", 22), ("sync-c", 23)] {
        let h = r.handoff(run).expect(run);
        assert_eq!(
            h.stop,
            stopped(Reason::KilledByOperator, stop_seq, at(3500, stop_seq))
        );
        assert_eq!(h.attempts.used, 3);
        assert_eq!(h.loops, 1);
        assert_eq!(unsafe_kinds(h), vec![(UnsafeKind::LoopedCall, 19)]);
    }
}

#[test]
fn a_normal_busy_run_reports_nothing() {
    let r = analyse(&scenario("normal_run"));
    assert_eq!(r.loops, vec![]);
    assert_eq!(r.findings, vec![]);
    assert_eq!(r.findings_omitted, 0);
    let h = only_handoff(&r);
    assert_eq!(h.stop.reason, Some(Reason::Completed));
    assert_eq!(h.pending, vec![]);
    // Every call that finished ok is completed, reads too; the writes and the build are
    // the ones a person resuming must not redo.
    assert_eq!(h.completed_total, 27);
    let done: Vec<_> = h
        .completed
        .iter()
        .filter(|c| c.tool.as_deref() != Some("repo.read"))
        .map(|c| (c.tool.clone(), c.remote_ref.clone(), c.observed.clone()))
        .collect();
    assert_eq!(
        done,
        vec![
            (s("repo.write"), None, None),
            (s("repo.write"), None, None),
            (s("ci.lint"), None, None),
            (s("ci.build"), s("b7"), s("passed")),
        ]
    );
    assert_eq!(
        actions(h),
        vec![(ResumeAction::Nothing, Some(h.last_seq.seq))]
    );
    assert_eq!(h.unsafe_actions, vec![]);
}

#[test]
fn all_scenarios_in_one_ledger_report_what_each_reports_alone() {
    let mut all = Vec::new();
    let mut loops = 0;
    let mut findings = 0;
    let mut runs = 0;
    for (_, ds) in scenarios() {
        let alone = analyse(&ds);
        loops += alone.loops.len();
        findings += alone.findings.len();
        runs += alone.handoffs.len();
        all.extend(ds);
    }
    let together = analyse(&all);
    assert_eq!(together.loops.len(), loops);
    assert_eq!(together.findings.len(), findings);
    assert_eq!(together.handoffs.len(), runs);
    assert_eq!((loops, findings, runs), (5, 12, 16));
}

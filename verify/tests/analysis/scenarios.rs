//! The scenario corpus (`corpus/stories/`): each story's loops, findings and handoff,
//! asserted field by field. Here: failing tools, polling, lost writes, deadlines
//! (`budgets.rs` has the rest).

use super::*;

#[test]
fn every_scenario_is_a_valid_sequence_of_decisions_with_run_time() {
    let all = scenarios();
    assert_eq!(all.len(), 13);
    for (name, ds) in all {
        assert!(!ds.is_empty(), "{name}");
        for d in &ds {
            d.validate()
                .unwrap_or_else(|e| panic!("{name}: {e}: {d:?}"));
            assert!(d.at_ms.is_some(), "{name}: at_ms missing");
            assert!(d.args.is_none(), "{name}: raw args");
        }
    }
}

#[test]
fn retry_storm_against_a_failing_tool() {
    let r = analyse(&scenario("retry_storm"));
    assert_eq!(
        r.loops,
        vec![Loop {
            pattern: Pattern::RetryStorm,
            runs: vec!["storm".into()],
            workers: vec!["w1".into()],
            tool: s("crm.lookup"),
            operation: s("crm.lookup:acme"),
            args_digest: digest(json!({"account": "acme"})),
            remote_ref: None,
            count: 7,
            first_seq: Seq::single(1),
            last_seq: Seq::single(13),
            clock: Clock::Run,
            first_ms: 100,
            last_ms: 2000,
            span_ms: 1900,
            reserved_nanos: 60 * CENT,
            settled_nanos: 0,
            model_spend_nanos: Some(0),
            failures: 7,
            ignored_retry_after: 0,
            poll: None,
            ended_by: LoopEnd::Refused {
                reason: Reason::CircuitOpen,
                seq: Seq::single(13)
            },
        }]
    );
    assert_eq!(r.findings, vec![]);
    let h = only_handoff(&r);
    assert_eq!(h.goal, s("Sync CRM contacts for acme"));
    assert_eq!(h.workers, vec!["w1".to_owned()]);
    assert_eq!((h.first_seq.seq, h.last_seq.seq), (0, 14));
    assert_eq!(h.stop, stopped(Reason::CircuitOpen, 14, at(2010, 14)));
    assert_eq!(h.stop.action, Some(Action::Retry));
    assert_eq!(
        h.attempts,
        Attempts {
            used: 6,
            limit: Some(20),
            approved_extra: 0,
            refunded: 0,
            carved_out: 0,
        }
    );
    assert_eq!(
        h.spend,
        Spend {
            reserved_nanos: 0, // error outcomes settle ($0): nothing is held
            settled_nanos: 0,
            limit_nanos: Some(500 * CENT),
            approved_extra_nanos: 0,
            overrun_nanos: 0,
            carved_out_nanos: 0,
        }
    );
    assert_eq!((h.completed.len(), h.completed_total), (0, 0));
    assert_eq!(h.pending, vec![]);
    assert_eq!(h.last_observed, None);
    assert_eq!(actions(h), vec![(ResumeAction::Retry, Some(13))]);
    let retry = &h.safe_resume[0];
    assert_eq!(retry.tool, s("crm.lookup"));
    assert_eq!(retry.reason, Some(Reason::CircuitOpen));
    assert_eq!(
        retry.not_before,
        Some(When {
            run_ms: 32_000,
            wall_ms: wall(13) + 30_000
        })
    );
    assert_eq!(unsafe_kinds(h), vec![(UnsafeKind::LoopedCall, 13)]);
    assert_eq!((h.loops, h.findings), (1, 0));
    assert_eq!(h.checkpoint, Coverage::Unknown);
}

#[test]
fn legitimate_polling_is_not_a_loop() {
    let r = analyse(&scenario("legit_polling"));
    assert_eq!(r.loops, vec![]);
    assert_eq!(r.findings, vec![]);
    let h = only_handoff(&r);
    assert_eq!(h.stop, stopped(Reason::Completed, 11, at(10_200, 11)));
    // The four status reads of the export are polls: they use its poll allowance, not
    // attempts (docs/GATE.md, how a budget is counted, one model with the gate).
    assert_eq!(h.attempts.used, 1);
    assert_eq!(h.spend.reserved_nanos, 5 * CENT);
    assert_eq!(
        h.completed,
        vec![Completed {
            seq: Seq::single(10),
            attempt: Some(1),
            tool: s("export.create"),
            operation: s("export.create"),
            args_digest: s("7fd068f59ba71590e4d3a9315f84ed1e8ec2390331304bddc8943e4748cfbc32"),
            effect: Some(Effect::IdempotentWrite),
            remote_ref: s("ea91"),
            observed: s("done"),
            settled_nanos: 0,
            at: at(10_100, 10),
        }]
    );
    assert_eq!(h.completed_total, 1);
    assert_eq!(h.pending, vec![]);
    assert_eq!(
        h.last_observed,
        Some(Observed {
            state: "done".into(),
            remote_ref: s("ea91"),
            seq: Seq::single(10),
            at: at(10_100, 10),
        })
    );
    assert_eq!(actions(h), vec![(ResumeAction::Nothing, Some(11))]);
    assert_eq!(h.unsafe_actions, vec![]);
}

#[test]
fn polling_past_its_allowance() {
    let r = analyse(&scenario("polling_past_allowance"));
    assert_eq!(
        r.loops,
        vec![Loop {
            pattern: Pattern::Polling,
            runs: vec!["poll-over".into()],
            workers: vec![],
            tool: s("export.status"),
            operation: s("export.status:eb12"),
            args_digest: s("a1b83b2e950bc7337385f4090f17f636d92a5c9ce17c8b736b3053130e143721"),
            remote_ref: s("eb12"),
            count: 4,
            first_seq: Seq::single(3),
            last_seq: Seq::single(9),
            clock: Clock::Run,
            first_ms: 1500,
            last_ms: 6000,
            span_ms: 4500,
            reserved_nanos: 0,
            settled_nanos: 0,
            model_spend_nanos: Some(0),
            failures: 0,
            ignored_retry_after: 0,
            poll: Some(PollEvidence {
                allowance: Some(3),
                over_allowance: true,
                state_changes: 0,
                unchanged_polls: 4,
                last_observed: s("queued"),
            }),
            ended_by: LoopEnd::Refused {
                reason: Reason::PollAllowanceExhausted,
                seq: Seq::single(9)
            },
        }]
    );
    assert_eq!(
        r.findings,
        vec![],
        "three polls of three allowed is within budget"
    );
    let h = only_handoff(&r);
    assert_eq!(
        h.stop,
        stopped(Reason::PollAllowanceExhausted, 10, at(6010, 10))
    );
    assert_eq!(
        h.pending,
        vec![Pending {
            seq: Seq::single(8),
            attempt: Some(1),
            tool: s("export.create"),
            operation: s("export.create"),
            effect: Some(Effect::IdempotentWrite),
            remote_ref: s("eb12"),
            status: PendingStatus::Running,
            observed: s("queued"),
            since: at(4600, 8),
            not_before: Some(When {
                run_ms: 5600,
                wall_ms: wall(8) + 1000
            }),
        }]
    );
    assert_eq!(
        actions(h),
        vec![
            (ResumeAction::CheckRemote, Some(8)),
            (ResumeAction::NewRun, Some(10))
        ]
    );
    assert_eq!(h.safe_resume[0].remote_ref, s("eb12"));
    assert_eq!(h.safe_resume[0].not_before, h.pending[0].not_before);
    assert_eq!(
        unsafe_kinds(h),
        vec![
            (UnsafeKind::RemoteJobRunning, 8),
            (UnsafeKind::LoopedCall, 9)
        ]
    );
    assert_eq!(
        h.last_observed
            .as_ref()
            .map(|o| (o.state.as_str(), o.seq.seq)),
        Some(("queued", 8))
    );
}

#[test]
fn non_idempotent_post_whose_response_was_lost() {
    let r = analyse(&scenario("lost_post"));
    assert_eq!(r.loops, vec![]);
    // Repeating the charge while the first's outcome was unknown: the gate refuses it
    // (`outcome_unknown_non_idempotent`), so the core finds it inconsistent here.
    assert_eq!(
        r.findings,
        vec![finding(
            3,
            "post",
            Inconsistency::RepeatedUnknownWrite { attempt: 1 }
        )]
    );
    let h = only_handoff(&r);
    assert_eq!(h.stop, stopped(Reason::Completed, 5, at(6000, 5)));
    assert_eq!(
        h.spend,
        Spend {
            reserved_nanos: 30 * CENT, // the timed-out write's reservation stays held
            settled_nanos: 30 * CENT,
            limit_nanos: Some(200 * CENT),
            approved_extra_nanos: 0,
            overrun_nanos: 0,
            carved_out_nanos: 0,
        }
    );
    assert_eq!(
        h.completed,
        vec![Completed {
            seq: Seq::single(4),
            attempt: Some(2),
            tool: s("payments.charge"),
            operation: s("payments.charge:order-5512"),
            args_digest: s("209f408bc14354d3394a6938a2557bd0e024ee82ada5971b9e81bad4edbe9df1"),
            effect: Some(Effect::NonIdempotentWrite),
            remote_ref: s("ch_88"),
            observed: s("succeeded"),
            settled_nanos: 30 * CENT,
            at: at(5900, 4),
        }]
    );
    assert_eq!(
        h.pending,
        vec![Pending {
            seq: Seq::single(2),
            attempt: Some(1),
            tool: s("payments.charge"),
            operation: s("payments.charge:order-5512"),
            effect: Some(Effect::NonIdempotentWrite),
            remote_ref: None,
            status: PendingStatus::Unknown,
            observed: None,
            since: at(5100, 2),
            not_before: None,
        }]
    );
    // Even a "completed" run hands over a hazard: attempt 1 may have charged too.
    assert_eq!(actions(h), vec![(ResumeAction::AskHuman, Some(2))]);
    assert_eq!(
        h.safe_resume[0].reason,
        Some(Reason::OutcomeUnknownNonIdempotent)
    );
    assert_eq!(
        unsafe_kinds(h),
        vec![
            (UnsafeKind::OutcomeUnknownWrite, 2),
            (UnsafeKind::AlreadyDone, 4)
        ]
    );
    assert_eq!(h.unsafe_actions[0].attempt, Some(1));
    assert_eq!(h.unsafe_actions[1].remote_ref, s("ch_88"));
    assert_eq!((h.loops, h.findings), (0, 1));
}

#[test]
fn retry_after_honoured_is_quiet_and_retries_past_their_class_are_a_storm() {
    let r = analyse(&scenario("retry_after"));
    assert_eq!(
        r.loops,
        vec![Loop {
            pattern: Pattern::RetryStorm,
            runs: vec!["ra-ignored".into()],
            workers: vec![],
            tool: s("maps.geocode"),
            operation: s("maps.geocode"),
            args_digest: digest(json!({"q": "Paris"})),
            remote_ref: None,
            count: 4,
            first_seq: Seq::single(7),
            last_seq: Seq::single(13),
            clock: Clock::Run,
            first_ms: 100,
            last_ms: 1000,
            span_ms: 900,
            reserved_nanos: 0,
            settled_nanos: 0,
            model_spend_nanos: Some(0),
            failures: 4,
            // Retry-After binds polls at the gate (`upstream_backoff`); a plain retry is
            // bound by its effect class's retries, which the fourth read is past.
            ignored_retry_after: 0,
            poll: None,
            ended_by: LoopEnd::Refused {
                reason: Reason::UpstreamBackoff,
                seq: Seq::single(13)
            },
        }],
        "four failures of one tool do not open its breaker (five do)"
    );
    assert_eq!(r.findings, vec![]);
    let ok = r.handoff("ra-honoured").expect("honoured run");
    assert_eq!(ok.stop, stopped(Reason::Completed, 5, at(2500, 5)));
    assert_eq!(ok.attempts.used, 2);
    assert_eq!(ok.loops, 0);
    assert_eq!(actions(ok), vec![(ResumeAction::Nothing, Some(5))]);
    let bad = r.handoff("ra-ignored").expect("ignored run");
    assert_eq!(bad.stop, stopped(Reason::UpstreamBackoff, 14, at(1010, 14)));
    assert_eq!(actions(bad), vec![(ResumeAction::Retry, Some(13))]);
    assert_eq!(
        bad.safe_resume[0].not_before,
        Some(When {
            run_ms: 5750,
            wall_ms: wall(13) + 4750
        })
    );
    assert_eq!(unsafe_kinds(bad), vec![(UnsafeKind::LoopedCall, 13)]);
}

#[test]
fn deadline_exhausted_while_waiting_for_approval() {
    let r = analyse(&scenario("approval_deadline"));
    assert_eq!(r.loops, vec![]);
    assert_eq!(r.findings, vec![]);
    let h = only_handoff(&r);
    assert_eq!(
        h.stop,
        stopped(Reason::RunDeadlineExhausted, 5, at(61_010, 5))
    );
    assert_eq!(h.attempts.used, 1);
    // Completed calls are every call whose outcome was ok, reads too.
    assert_eq!(h.completed_total, 1);
    assert_eq!(h.completed[0].operation, s("orders.get:7731"));
    assert_eq!(
        h.last_observed,
        Some(Observed {
            state: "paid".into(),
            remote_ref: None,
            seq: Seq::single(2),
            at: at(1200, 2),
        })
    );
    assert_eq!(
        actions(h),
        vec![
            (ResumeAction::AskHuman, Some(3)),
            (ResumeAction::NewRun, Some(5))
        ]
    );
    let ask = &h.safe_resume[0];
    assert_eq!(ask.reason, Some(Reason::ApprovalRequired));
    assert_eq!(ask.operation, s("payments.refund:7731"));
    assert_eq!(h.safe_resume[1].reason, Some(Reason::RunDeadlineExhausted));
    assert_eq!(h.unsafe_actions, vec![]);
}

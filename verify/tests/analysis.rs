//! Loops, consistency audit and handoffs, on the scenario corpus and on small
//! hand-written sequences. Expected reports are asserted field by field.

use serde_json::{json, Value};
use tally_ledger::decision::args_digest;
use tally_ledger::{Action, Decision, Effect, Reason};
use tally_verify::analysis::*;
use tally_verify::{Event, Seq};

/// Wall time of seq 0; each later record is 10 ms later (one ledger batch).
const T0: u64 = 1_700_000_000_000;

/// The stories of `corpus/stories/`, in file-name order.
fn scenarios() -> Vec<(String, Vec<Decision>)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../corpus/stories");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|f| f.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "ndjson"))
        .collect();
    files.sort();
    assert!(files.len() >= 13, "stories missing from {}", dir.display());
    files
        .iter()
        .map(|p| {
            let name = p.file_stem().unwrap().to_string_lossy().into_owned();
            let text = std::fs::read_to_string(p).unwrap();
            let ds = text
                .lines()
                .enumerate()
                .map(|(i, l)| {
                    Decision::from_json(l)
                        .unwrap_or_else(|e| panic!("{}:{}: {e}", p.display(), i + 1))
                })
                .collect();
            (name, ds)
        })
        .collect()
}

fn wall(seq: u64) -> u64 {
    T0 + 10 * seq
}

fn at(run_ms: u64, seq: u64) -> When {
    When {
        run_ms,
        wall_ms: wall(seq),
    }
}

fn events(ds: &[Decision]) -> Vec<Event> {
    (0u64..)
        .zip(ds)
        .map(|(seq, d)| Event {
            seq: Seq::single(seq),
            wall_ms: wall(seq),
            epoch: 0,
            decision: Box::new(d.clone()),
        })
        .collect()
}

fn analyse(ds: &[Decision]) -> Report {
    Analysis::analyse(Config::default(), &events(ds))
}

fn scenario(name: &str) -> Vec<Decision> {
    scenarios()
        .into_iter()
        .find(|(n, _)| n == name)
        .map(|(_, ds)| ds)
        .unwrap_or_else(|| panic!("no scenario {name}"))
}

/// One decision from the agent's JSON, validated and sealed as the ledger would.
fn d(v: Value) -> Decision {
    let mut d = Decision::from_json(&v.to_string()).expect("valid decision JSON");
    d.validate().expect("valid decision");
    d.seal_args();
    d
}

fn digest(v: Value) -> Option<String> {
    Some(args_digest(&v))
}

fn s(x: &str) -> Option<String> {
    Some(x.to_owned())
}

fn finding(seq: u64, run: &str, kind: Inconsistency) -> AuditFinding {
    AuditFinding {
        seq: Seq::single(seq),
        run: run.to_owned(),
        kind,
    }
}

fn stopped(reason: Reason, seq: u64, when: When) -> StopReason {
    StopReason {
        status: StopStatus::Stopped,
        reason: Some(reason),
        action: Some(reason.action()),
        seq: Some(Seq::single(seq)),
        at: Some(when),
    }
}

fn actions(h: &Handoff) -> Vec<(ResumeAction, Option<u64>)> {
    h.safe_resume
        .iter()
        .map(|s| (s.action, s.seq.map(|q| q.seq)))
        .collect()
}

fn unsafe_kinds(h: &Handoff) -> Vec<(UnsafeKind, u64)> {
    h.unsafe_actions
        .iter()
        .map(|u| (u.kind, u.seq.seq))
        .collect()
}

fn only_handoff(r: &Report) -> &Handoff {
    assert_eq!(r.handoffs.len(), 1, "one run expected");
    &r.handoffs[0]
}

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
            reserved_cents: 60,
            settled_cents: 0,
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
            reserved_cents: 0, // error outcomes settle (0¢): nothing is held
            settled_cents: 0,
            limit_cents: Some(500),
            approved_extra_cents: 0,
            overrun_cents: 0,
            carved_out_cents: 0,
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
    assert_eq!(h.spend.reserved_cents, 5);
    assert_eq!(
        h.completed,
        vec![Completed {
            seq: Seq::single(10),
            attempt: Some(1),
            tool: s("export.create"),
            operation: s("export.create"),
            effect: Some(Effect::IdempotentWrite),
            remote_ref: s("ea91"),
            observed: s("done"),
            settled_cents: 0,
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
            reserved_cents: 0,
            settled_cents: 0,
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
            reserved_cents: 30, // the timed-out write's reservation stays held
            settled_cents: 30,
            limit_cents: Some(200),
            approved_extra_cents: 0,
            overrun_cents: 0,
            carved_out_cents: 0,
        }
    );
    assert_eq!(
        h.completed,
        vec![Completed {
            seq: Seq::single(4),
            attempt: Some(2),
            tool: s("payments.charge"),
            operation: s("payments.charge:order-5512"),
            effect: Some(Effect::NonIdempotentWrite),
            remote_ref: s("ch_88"),
            observed: s("succeeded"),
            settled_cents: 30,
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
            reserved_cents: 0,
            settled_cents: 0,
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
                    dimension: Dimension::SpendCents,
                    used: 125,
                    limit: 100
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
            reserved_cents: 0, // every call settled
            settled_cents: 120,
            limit_cents: Some(100),
            approved_extra_cents: 0,
            overrun_cents: 45,
            carved_out_cents: 0,
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
    let cost: Vec<u64> = h.completed.iter().map(|c| c.settled_cents).collect();
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
            reserved_cents: 0,
            settled_cents: 0,
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
                    dimension: Dimension::SpendCents,
                    used: 410,
                    limit: 400
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
            reserved_cents: 0, // every call settled
            settled_cents: 405,
            limit_cents: Some(400),
            approved_extra_cents: 0,
            overrun_cents: 0,
            carved_out_cents: 0,
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
            reserved_cents: 0,
            settled_cents: 0,
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

/// A run with a budget of `attempts`, as its first record.
fn start(run: &str, budget: Value) -> Decision {
    d(json!({"run": run, "kind": "start", "at_ms": 0, "goal": "test", "budget": budget}))
}

/// A read of `args` (its logical operation is its tool and arguments: a read of another
/// file is another operation, as the gate counts retries).
fn read(run: &str, at_ms: u64, attempt: u64, args: Value) -> Decision {
    d(
        json!({"run": run, "kind": "allow", "at_ms": at_ms, "tool": "repo.read",
             "args": args, "effect": "read", "attempt": attempt}),
    )
}

fn ok(run: &str, at_ms: u64, attempt: u64) -> Decision {
    d(json!({"run": run, "kind": "outcome", "at_ms": at_ms, "attempt": attempt, "status": "ok"}))
}

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

fn over(run: &str, at_ms: u64, attempt: u64, args: Value) -> Decision {
    d(
        json!({"run": run, "kind": "allow", "at_ms": at_ms, "tool": "deploy.push",
             "operation": "deploy.push", "args": args, "effect": "idempotent_write",
             "attempt": attempt}),
    )
}

/// The approver of the tests' policy.
fn dana() -> ed25519_dalek::SigningKey {
    ed25519_dalek::SigningKey::from_bytes(&[9u8; 32])
}

/// Runs read under a policy that lists dana as an approver.
fn with_dana() -> Config {
    let key = hex::encode(dana().verifying_key().as_bytes());
    let text = format!("[approvals]\napprovers = {{ dana = \"{key}\" }}\n");
    Config {
        policy: std::sync::Arc::new(tally_policy::Policy::from_toml(&text).expect("policy")),
        ..Config::default()
    }
}

/// An approval of run `r`, signed by dana: the override record and its digest.
fn approval(at_ms: u64, scope: Value, expires_ms: u64) -> (Decision, String) {
    let sc: tally_ledger::decision::Scope = serde_json::from_value(scope.clone()).expect("scope");
    let digest = tally_policy::approval::digest("r", "dana", &sc, expires_ms);
    let signature = tally_policy::approval::sign(&dana(), &digest);
    let record = d(
        json!({"run": "r", "kind": "override", "at_ms": at_ms, "approver": "dana",
                          "scope": scope, "digest": digest, "expires_ms": expires_ms,
                          "signature": signature}),
    );
    (record, digest)
}

/// An allow that uses the approval `digest`.
fn granted(mut allow: Decision, digest: &str) -> Decision {
    allow.grant = Some(digest.to_owned());
    allow
}

fn analyse_with(config: Config, ds: &[Decision]) -> Report {
    Analysis::analyse(config, &events(ds))
}

#[test]
fn a_signed_grant_puts_its_attempts_in_force_as_the_cli_says() {
    // dana grants 3 more attempts: the allow that needs them names the grant, and the
    // run's limit is 1 + 3 from there on (three calls, one grant used once).
    let (grant, digest) = approval(500, json!({"attempts": 3}), 60_000);
    let ds = vec![
        start("r", json!({"attempts": 1})),
        over("r", 100, 1, json!({"r": 1})),
        grant,
        granted(over("r", 600, 2, json!({"r": 2})), &digest),
        over("r", 700, 3, json!({"r": 3})),
        over("r", 800, 4, json!({"r": 4})),
    ];
    let r = analyse_with(with_dana(), &ds);
    assert_eq!(r.findings, vec![], "an honest approval is consistent");
    let h = only_handoff(&r);
    assert_eq!(
        (h.attempts.used, h.attempts.limit, h.attempts.approved_extra),
        (4, Some(4), 3)
    );
    // A fifth call is beyond even the granted limit.
    let mut more = ds.clone();
    more.push(over("r", 900, 5, json!({"r": 5})));
    assert_eq!(
        analyse_with(with_dana(), &more).findings,
        vec![finding(
            6,
            "r",
            Inconsistency::AllowBeyondLimit {
                dimension: Dimension::Attempts,
                used: 5,
                limit: 4
            }
        )]
    );
}

#[test]
fn an_expired_grant_covers_nothing() {
    let (grant, digest) = approval(500, json!({"attempts": 1}), 1000);
    let ds = vec![
        start("r", json!({"attempts": 1})),
        over("r", 100, 1, json!({"r": 1})),
        grant,
        granted(over("r", 2000, 2, json!({"r": 2})), &digest),
    ];
    assert_eq!(
        analyse_with(with_dana(), &ds).findings,
        vec![
            finding(
                3,
                "r",
                Inconsistency::GrantExpired {
                    digest,
                    expires_ms: 1000,
                    at_ms: 2000
                }
            ),
            finding(
                3,
                "r",
                Inconsistency::AllowBeyondLimit {
                    dimension: Dimension::Attempts,
                    used: 2,
                    limit: 1
                }
            )
        ]
    );
}

#[test]
fn a_grant_for_another_tool_covers_nothing_and_is_not_used_up() {
    let (grant, digest) = approval(500, json!({"attempts": 1, "tool": "other"}), 60_000);
    let ds = vec![
        start("r", json!({"attempts": 1})),
        over("r", 100, 1, json!({"r": 1})),
        grant,
        granted(over("r", 600, 2, json!({"r": 3})), &digest),
    ];
    let r = analyse_with(with_dana(), &ds);
    assert_eq!(
        r.findings,
        vec![
            finding(
                3,
                "r",
                Inconsistency::GrantMismatch {
                    digest: digest.clone()
                }
            ),
            finding(
                3,
                "r",
                Inconsistency::AllowBeyondLimit {
                    dimension: Dimension::Attempts,
                    used: 2,
                    limit: 1
                }
            )
        ]
    );
    assert_eq!(r.handoffs[0].attempts.approved_extra, 0);
}

#[test]
fn an_unsigned_or_unlisted_approval_grants_nothing() {
    // No signature, or signed by a key the policy does not list: not an approval.
    let (mut unsigned, digest) = approval(500, json!({"attempts": 5}), 60_000);
    unsigned.signature = None;
    let ds = vec![
        start("r", json!({"attempts": 1})),
        over("r", 100, 1, json!({"r": 1})),
        unsigned,
        granted(over("r", 600, 2, json!({"r": 2})), &digest),
    ];
    assert_eq!(
        analyse_with(with_dana(), &ds).findings,
        vec![
            finding(
                2,
                "r",
                Inconsistency::InvalidApproval {
                    why: "approval has no `signature`".into()
                }
            ),
            finding(
                3,
                "r",
                Inconsistency::GrantNotHeld {
                    digest: digest.clone()
                }
            ),
            finding(
                3,
                "r",
                Inconsistency::AllowBeyondLimit {
                    dimension: Dimension::Attempts,
                    used: 2,
                    limit: 1
                }
            ),
        ]
    );
    // Under a policy that lists no approver, dana's signature grants nothing either.
    let (grant, digest) = approval(500, json!({"attempts": 5}), 60_000);
    let ds = vec![
        start("r", json!({"attempts": 1})),
        over("r", 100, 1, json!({"r": 1})),
        grant,
        granted(over("r", 600, 2, json!({"r": 2})), &digest),
    ];
    let found = analyse(&ds).findings;
    assert!(
        matches!(&found[0].kind, Inconsistency::InvalidApproval { why } if why.contains("not listed")),
        "{found:?}"
    );
}

#[test]
fn a_valid_refund_returns_its_slot_once() {
    let refund = |at_ms: u64| {
        d(json!({"run": "r", "kind": "refund", "at_ms": at_ms, "of": 1, "slots": 1, "cents": 10}))
    };
    let ds = vec![
        start("r", json!({"attempts": 2})),
        d(
            json!({"run": "r", "kind": "allow", "at_ms": 0, "tool": "t", "args": {}, "attempt": 1,
                 "reserve_cents": 10}),
        ),
        d(json!({"run": "r", "kind": "outcome", "at_ms": 5, "attempt": 1, "status": "error"})),
        refund(6),
        refund(7),
        read("r", 10, 2, json!({"p": 2})),
        read("r", 20, 3, json!({"p": 3})),
    ];
    let r = analyse(&ds);
    assert_eq!(
        r.findings,
        vec![finding(4, "r", Inconsistency::RefundedTwice { of: 1 })],
        "three allows less one refunded slot is within two attempts"
    );
    let h = only_handoff(&r);
    assert_eq!(
        h.attempts,
        Attempts {
            used: 2,
            limit: Some(2),
            approved_extra: 0,
            refunded: 1,
            carved_out: 0,
        }
    );
    assert_eq!(h.spend.reserved_cents, 0);
}

#[test]
fn records_after_a_stop_and_outcomes_never_allowed() {
    let ds = vec![
        start("r", json!({})),
        d(json!({"run": "r", "kind": "outcome", "at_ms": 1, "attempt": 4, "status": "ok"})),
        d(json!({"run": "r", "kind": "stop", "at_ms": 2, "reason": "completed"})),
        read("r", 3, 1, json!({})),
    ];
    assert_eq!(
        analyse(&ds).findings,
        vec![
            finding(1, "r", Inconsistency::OutcomeWithoutAllow { attempt: 4 }),
            finding(
                3,
                "r",
                Inconsistency::AfterStop {
                    record: tally_ledger::Kind::Allow,
                    stop: Reason::Completed
                }
            ),
        ]
    );
}

fn charge(at_ms: u64, attempt: u64, key: Option<&str>) -> Decision {
    let mut v = json!({"run": "r", "kind": "allow", "at_ms": at_ms, "tool": "pay",
                       "operation": "pay:1", "args": {"n": 1}, "effect": "non_idempotent_write",
                       "attempt": attempt});
    if let Some(k) = key {
        v["idempotency_key"] = json!(k);
    }
    d(v)
}

#[test]
fn a_repeat_after_an_unknown_write_is_fine_only_after_a_human_check() {
    let lost =
        d(json!({"run": "r", "kind": "outcome", "at_ms": 10, "attempt": 1, "status": "unknown"}));
    // A human checked the remote side and approved the call (a grant naming its tool).
    let (grant, digest) = approval(20, json!({"tool": "pay"}), 60_000);
    let checked = vec![
        start("r", json!({})),
        charge(0, 1, None),
        lost.clone(),
        grant,
        granted(charge(30, 2, None), &digest),
    ];
    assert_eq!(analyse_with(with_dana(), &checked).findings, vec![]);
    // An idempotency key does not make a non-idempotent write repeatable: the gate
    // refuses the repeat, so the audit finds it (declare such a call idempotent_write).
    let keyed = vec![
        start("r", json!({})),
        charge(0, 1, Some("k1")),
        lost.clone(),
        charge(30, 2, Some("k1")),
    ];
    assert_eq!(
        analyse(&keyed).findings,
        vec![finding(
            3,
            "r",
            Inconsistency::RepeatedUnknownWrite { attempt: 1 }
        )]
    );
    let timed_out = vec![
        start("r", json!({})),
        charge(0, 1, None),
        d(json!({"run": "r", "kind": "outcome", "at_ms": 10, "attempt": 1, "status": "timeout"})),
        charge(30, 2, None),
    ];
    assert_eq!(
        analyse(&timed_out).findings,
        vec![finding(
            3,
            "r",
            Inconsistency::RepeatedUnknownWrite { attempt: 1 }
        )]
    );
}

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
        "reserved_cents",
        "settled_cents",
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
               "dimension": "spend_cents", "used": 125, "limit": 100})
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
        "  Spend: 30¢ reserved, 30¢ settled (limit 200¢)",
        "    - payments.charge (payments.charge:order-5512) -> ch_88 \"succeeded\" (seq 4, 30¢, 5.9 s after the run started, recorded 2023-11-14 22:13:20 UTC)",
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

/// Peak resident memory of this process, from `/proc/self/status` (Linux), in MiB.
fn peak_rss_mib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024)
}

/// Feed `n` generated decisions to an analysis and time it; `make(i)` builds the i-th.
fn timed(config: Config, n: u64, make: impl Fn(u64) -> Decision) -> (Report, std::time::Duration) {
    let began = std::time::Instant::now();
    let mut a = Analysis::new(config);
    for seq in 0..n {
        a.push(&Event {
            seq: Seq::single(seq),
            wall_ms: T0 + seq,
            epoch: 0,
            decision: Box::new(make(seq)),
        });
    }
    let report = a.finish();
    (report, began.elapsed())
}

/// Distinct argument digests to draw from, so generating the ledger costs little.
fn digest_pool() -> Vec<String> {
    (0..1024u64)
        .map(|i| args_digest(&json!({"page": i})))
        .collect()
}

/// One million decisions: 10 000 runs of 100 records each (start, 49 reads at a call
/// every 2 s with their outcomes, stop), runs following each other. Run alone, in release:
/// `cargo test --release -p tally-verify -- --ignored --test-threads 1 --nocapture`.
#[test]
#[ignore = "timing: run in release"]
fn a_million_decisions_in_seconds() {
    let pool = digest_pool();
    let allow = read("r", 0, 1, json!({}));
    let done = ok("r", 0, 1);
    let (report, took) = timed(Config::default(), 1_000_000, |seq| {
        let (run, i) = (seq / 100, seq % 100);
        let mut d = match i {
            0 => start("r", json!({"attempts": 60})),
            99 => d(json!({"run": "r", "kind": "stop", "at_ms": 99_000, "reason": "completed"})),
            i if i % 2 == 1 => {
                let mut a = allow.clone();
                a.args_digest = Some(pool[(i as usize) % pool.len()].clone());
                a.attempt = Some(i / 2 + 1);
                a.at_ms = Some(i / 2 * 2000);
                a
            }
            i => {
                let mut o = done.clone();
                o.attempt = Some(i / 2);
                o.at_ms = Some((i / 2 - 1) * 2000 + 5);
                o.settled_cents = Some(1);
                o
            }
        };
        d.run = format!("run-{run}");
        d
    });
    eprintln!(
        "10 000 runs, 1 000 000 decisions: {took:?}, peak RSS {:?} MiB",
        peak_rss_mib()
    );
    assert_eq!(report.handoffs.len(), 10_000);
    assert_eq!(report.handoffs[9_999].attempts.used, 49);
    assert_eq!(report.loops, vec![]);
    assert_eq!(report.findings, vec![]);
    assert!(took.as_secs() < 10, "took {took:?}");
}

/// One run of a million decisions: a start, then 500 000 reads, one a second, and
/// their outcomes.
/// Its loop windows are swept as they fall silent, so its memory stays flat.
#[test]
#[ignore = "timing: run in release"]
fn one_run_of_a_million_decisions_in_bounded_memory() {
    let pool = digest_pool();
    let allow = read("long", 0, 1, json!({}));
    let done = ok("long", 0, 1);
    let mut policy = tally_policy::Policy::default();
    policy.loops.tool_calls = 100;
    let config = Config {
        policy: std::sync::Arc::new(policy),
        ..Config::default()
    };
    let (report, took) = timed(config, 1_000_000, |seq| {
        if seq == 0 {
            return start("long", json!({"attempts": 1_000_000}));
        }
        let call = (seq - 1) / 2;
        if seq % 2 == 1 {
            let mut a = allow.clone();
            a.args_digest = Some(pool[(call as usize) % pool.len()].clone());
            a.attempt = Some(call + 1);
            a.at_ms = Some(call * 1000);
            a
        } else {
            let mut o = done.clone();
            o.attempt = Some(call + 1);
            o.at_ms = Some(call * 1000 + 5);
            o
        }
    });
    eprintln!(
        "one run, 1 000 000 decisions: {took:?}, peak RSS {:?} MiB",
        peak_rss_mib()
    );
    assert_eq!(report.loops, vec![]);
    assert_eq!(report.findings, vec![]);
    assert_eq!(report.handoffs[0].attempts.used, 500_000);
    assert!(took.as_secs() < 10, "took {took:?}");
}

/// A `timeout` outcome, then a late `ok` settling the same reservation, was
/// counted twice, so an honest run was reported over budget. One model (the policy
/// core) counts it once; a refund without `slots` returns one attempt.
#[test]
fn regression_issue_10_a_late_outcome_settles_once_and_refunds_return_one_slot() {
    let ds = vec![
        d(
            json!({"run": "r", "kind": "start", "at_ms": 0, "budget": {"attempts": 2, "spend_cents": 50}}),
        ),
        d(
            json!({"run": "r", "kind": "allow", "at_ms": 1, "tool": "llm", "operation": "a", "attempt": 1, "reserve_cents": 50}),
        ),
        d(json!({"run": "r", "kind": "outcome", "at_ms": 2, "attempt": 1, "status": "timeout"})),
        d(
            json!({"run": "r", "kind": "outcome", "at_ms": 3, "attempt": 1, "status": "ok", "settled_cents": 50}),
        ),
        d(
            json!({"run": "r", "kind": "allow", "at_ms": 4, "tool": "db", "operation": "b", "attempt": 2}),
        ),
        d(json!({"run": "r", "kind": "refund", "at_ms": 5, "of": 2})),
        d(
            json!({"run": "r", "kind": "allow", "at_ms": 6, "tool": "db", "operation": "c", "attempt": 3}),
        ),
        d(json!({"run": "r", "kind": "stop", "at_ms": 7, "reason": "completed"})),
    ];
    let r = analyse(&ds);
    assert_eq!(r.findings, vec![], "an honest run has no finding");
    let h = only_handoff(&r);
    assert_eq!((h.attempts.used, h.attempts.refunded), (2, 1));
    assert_eq!((h.spend.reserved_cents, h.spend.settled_cents), (0, 50));
}

/// Open attempts and loop windows share their tool, operation and worker names, in a
/// bounded table that starts afresh when full: a run with more distinct names than it
/// holds, and a loop at its end, is reported as before (names, workers in order, count).
#[test]
fn a_run_with_very_many_names_and_a_loop_at_the_end() {
    let mut ds = vec![start("r", json!({}))];
    let mut attempt = 0;
    for i in 0..5_000u64 {
        attempt += 1;
        ds.push(d(json!({"run": "r", "kind": "allow", "at_ms": i * 1_000,
            "tool": "repo.read", "operation": format!("op-{i}"), "worker": format!("w{:02}", i % 20),
            "args": {"page": i}, "effect": "read", "attempt": attempt})));
        ds.push(ok("r", i * 1_000 + 5, attempt));
    }
    let t = 5_000 * 1_000;
    for (k, worker) in ["w-z", "w-a", "w-m", "w-a"].into_iter().enumerate() {
        attempt += 1;
        ds.push(d(
            json!({"run": "r", "kind": "allow", "at_ms": t + k as u64 * 1_000,
            "tool": "repo.read", "operation": format!("final-{k}"), "worker": worker,
            "args": {"page": "again"}, "effect": "read", "attempt": attempt}),
        ));
    }
    let r = analyse(&ds);
    assert_eq!(r.loops.len(), 1, "{:?}", r.loops);
    let l = &r.loops[0];
    assert_eq!(l.pattern, Pattern::ExactRepetition);
    assert_eq!(
        l.workers,
        vec!["w-a".to_owned(), "w-m".into(), "w-z".into()]
    );
    assert_eq!(l.tool, s("repo.read"));
    assert_eq!(l.operation, s("final-3"));
    assert_eq!(l.args_digest, digest(json!({"page": "again"})));
    assert_eq!(l.count, 4);
    assert_eq!((l.first_seq.seq, l.last_seq.seq), (10_001, 10_004));
    assert_eq!(l.ended_by, LoopEnd::NeverStopped);
    let h = only_handoff(&r);
    let first: Vec<String> = (0..16).map(|i| format!("w{i:02}")).collect();
    assert_eq!(h.workers, first, "the first 16 workers, in order");
    assert_eq!(
        h.completed_total, 5_000,
        "every read that ended ok completed"
    );
    assert_eq!(h.completed.len(), 50, "the latest 50 are listed");
    assert_eq!(h.attempts.used, 5_004);
    assert_eq!(h.loops, 1);
}

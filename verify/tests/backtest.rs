//! Backtest on ledgers written the way the gate writes them: each call decided by the
//! policy core under the policy in force and folded, each allow followed by its outcome.
//! The live gate's own ledgers are `cli/tests/backtest.rs`'s.

use serde_json::json;
use tally_ledger::{Decision, Kind, Reason, Status};
use tally_policy::{
    apply, decide, grant_budget, Call, Now, Recorded, RunState, Verdict, View, ViewMut,
};
use tally_verify::backtest::{Backtest, BacktestError, BacktestReport};
use tally_verify::{Event, Seq};

const T0: u64 = 1_700_000_000_000;
const CENT: u64 = 10_000_000;

/// A gate made of the core alone: the records it writes, as events.
struct Gate {
    policy: Recorded,
    events: Vec<Event>,
    runs: std::collections::BTreeMap<String, RunState>,
}

impl Gate {
    fn new(text: &str) -> Gate {
        let policy = Recorded::new(text).expect("policy");
        let mut g = Gate {
            policy,
            events: Vec::new(),
            runs: Default::default(),
        };
        let record = Decision {
            kind: Some(Kind::Policy),
            policy: Some(g.policy.digest.clone()),
            policy_text: Some(g.policy.text.clone()),
            ..Decision::default()
        };
        g.record(record);
        g
    }

    fn now(&self) -> Now {
        Now {
            wall_ms: T0 + 10 * self.events.len() as u64,
            at_ms: None,
        }
    }

    /// Append `d` and fold it.
    fn record(&mut self, mut d: Decision) {
        let now = self.now();
        if let Some(run) = self.runs.get_mut(&d.run) {
            d.at_ms = Some(run.run_ms(now));
            apply(&self.policy.policy, ViewMut::of(run), &d, now);
        }
        self.events.push(Event {
            seq: Seq::single(self.events.len() as u64),
            wall_ms: now.wall_ms,
            epoch: 0,
            decision: Box::new(d),
        });
    }

    fn start(&mut self, run: &str) {
        let budget = grant_budget(&self.policy.policy, None, None, None);
        let d = Decision {
            run: run.into(),
            kind: Some(Kind::Start),
            at_ms: Some(0),
            budget: Some(Box::new(budget)),
            policy: Some(self.policy.digest.clone()),
            ..Decision::default()
        };
        let mut state = RunState::new(run);
        apply(&self.policy.policy, ViewMut::of(&mut state), &d, self.now());
        self.runs.insert(run.into(), state);
        self.record(d);
    }

    /// Call `n` of `run`, reserving `cents`; an allow settles them. The reason it was
    /// refused for, if it was.
    fn call(&mut self, run: &str, n: u64, cents: u64) -> Option<Reason> {
        let call = Call {
            run: run.into(),
            tool: "search".into(),
            operation: Some(format!("q{n}")),
            args_digest: Some(tally_ledger::decision::args_digest(&json!({ "n": n }))),
            effect: Some(tally_ledger::Effect::Read),
            reserve_nanos: cents * CENT,
            ..Call::default()
        };
        let now = self.now();
        let state = &self.runs[run];
        let decided = decide(
            &self.policy.policy,
            &self.policy.digest,
            View::of(state),
            &call,
            now,
        );
        let attempt = decided.record.attempt;
        self.record(decided.record.clone());
        if decided.verdict != Verdict::Allow {
            return decided.reason();
        }
        let mut outcome = Decision {
            run: run.into(),
            kind: Some(Kind::Outcome),
            attempt,
            status: Some(Status::Ok),
            ..Decision::default()
        };
        outcome.settled_nanos = Some(cents * CENT);
        self.record(outcome);
        None
    }

    /// A workload: each run makes its calls until one is refused with action `stop`.
    fn workload(text: &str, runs: &[(&str, u64)], cents: u64) -> Gate {
        let mut g = Gate::new(text);
        for &(run, calls) in runs {
            g.start(run);
            for n in 1..=calls {
                if let Some(r) = g.call(run, n, cents) {
                    if r.action() == tally_ledger::Action::Stop {
                        break;
                    }
                }
            }
        }
        g
    }
}

fn backtest(text: &str, events: &[Event]) -> BacktestReport {
    let mut b = Backtest::new(text).expect("policy");
    for e in events {
        b.push(e);
    }
    b.finish()
}

// No refusal is turned into a request for approval: `attempts_exhausted` stops a run.
const TEN: &str = "[ceiling]\nattempts = 10\n[approvals]\nask_on = []\n";
const FIVE: &str = "[ceiling]\nattempts = 5\n[approvals]\nask_on = []\n";

#[test]
fn the_same_policy_changes_nothing() {
    let g = Gate::workload(TEN, &[("a", 3), ("b", 12)], 2);
    let r = backtest(TEN, &g.events);
    assert!(!r.changes_anything(), "{}", r.to_text());
    assert_eq!(r.total.runs, 2);
    assert_eq!(r.total.attempts_saved, 0);
    assert_eq!(r.total.spend_saved_nanos, 0);
    assert!(
        r.to_text().contains("every run goes as it went"),
        "{}",
        r.to_text()
    );
}

#[test]
fn half_the_attempts_refuses_the_sixth_call_and_the_run_ends_there() {
    let g = Gate::workload(TEN, &[("short", 4), ("long", 9)], 3);
    let r = backtest(FIVE, &g.events);
    assert_eq!(r.total.newly_refused, 1, "{}", r.to_text());
    let long = &r.runs[1];
    assert_eq!(long.run, "long");
    assert_eq!(long.calls, 9);
    assert_eq!(long.calls_made, 6);
    let stop = long.stops_at.expect("stops");
    assert_eq!((stop.call, stop.reason), (6, Reason::AttemptsExhausted));
    assert_eq!(long.newly_refused.len(), 1);
    assert_eq!(long.newly_refused[0].would, Some(Reason::AttemptsExhausted));
    assert_eq!(long.newly_refused[0].recorded, None);
    // Calls 6 to 9 never happen: 4 attempts and what they settled are saved.
    assert_eq!((long.attempts_recorded, long.attempts_would), (9, 5));
    assert_eq!(r.total.attempts_saved, 4);
    assert_eq!(r.total.spend_saved_nanos, (4 * 3 * CENT) as i64);
    assert_eq!(r.total.calls_not_made, 3);
    assert_eq!(r.total.runs_stopping_earlier, 1);
    assert_eq!(r.runs[0].stops_at, None, "the short run goes as it went");
    let text = r.to_text();
    assert!(
        text.contains("stops at call 6 of 9 (attempts_exhausted"),
        "{text}"
    );
    assert!(text.contains("4 attempts saved"), "{text}");
}

#[test]
fn a_looser_policy_allows_what_was_refused() {
    // Under 5 attempts the run stopped at its 6th call; under 10 that call is allowed
    // (it has no outcome in the ledger, so its reservation stays held).
    let g = Gate::workload(FIVE, &[("r", 8)], 1);
    let r = backtest(TEN, &g.events);
    let run = &r.runs[0];
    assert_eq!(run.calls, 6, "the agent stopped at the refusal");
    assert_eq!(run.newly_allowed.len(), 1, "{}", r.to_text());
    let c = &run.newly_allowed[0];
    assert_eq!(
        (c.call, c.recorded, c.would),
        (6, Some(Reason::AttemptsExhausted), None)
    );
    assert_eq!(run.stops_at, None);
    assert_eq!(r.total.attempts_saved, -1);
    assert_eq!(r.total.spend_saved_nanos, -(CENT as i64));
    assert!(r.to_text().contains("1 attempt more"), "{}", r.to_text());
}

#[test]
fn a_spend_limit_refuses_with_its_cause_and_saves_what_would_not_be_spent() {
    let g = Gate::workload(TEN, &[("s", 5)], 10);
    // $0.25 a run: the third call of 10 cents does not fit.
    // The default approvals: a refusal for spend asks a human (action ask), so the run is
    // not stopped; each refused call uses nothing.
    let r = backtest("[ceiling]\nattempts = 10\nspend_cents = 25\n", &g.events);
    let run = &r.runs[0];
    let refused: Vec<_> = run
        .newly_refused
        .iter()
        .map(|c| (c.call, c.would, c.cause))
        .collect();
    let ask = (
        Some(Reason::ApprovalRequired),
        Some(Reason::ReservationInsufficient),
    );
    assert_eq!(
        refused,
        vec![(3, ask.0, ask.1), (4, ask.0, ask.1), (5, ask.0, ask.1)],
        "{}",
        r.to_text()
    );
    assert_eq!(run.stops_at, None);
    assert_eq!(run.calls_made, 5);
    assert_eq!(r.total.spend_saved_nanos, (30 * CENT) as i64);
    assert!(
        r.to_text().contains("(cause reservation_insufficient)"),
        "{}",
        r.to_text()
    );
}

#[test]
fn a_policy_that_does_not_parse_is_a_typed_error() {
    let err = Backtest::new("[ceiling]\nattempts = \"five\"\n").expect_err("invalid");
    assert!(matches!(err, BacktestError::Policy { .. }));
    let msg = err.to_string();
    assert!(msg.contains("not a valid policy"), "{msg}");
    assert!(msg.contains("tally policy check"), "{msg}");
}

//! A reference model of docs/GATE.md, how a budget is counted's attempts and spend, written from the table alone, and
//! random runs folded through both `apply` and the model: the numbers must agree, and
//! `held_nanos` must always be the sum of what the open attempts hold.

/// Nanodollars in a cent: the model counts the records' cents.
const CENT: u64 = 10_000_000;
use std::collections::BTreeMap;

use proptest::prelude::*;
use serde_json::{json, Value};
use tally_policy::Inconsistency;

use crate::support::Sim;

#[derive(Clone, Debug)]
enum Op {
    Allow {
        reserve: u64,
        write: bool,
        exempt: bool,
    },
    Outcome {
        pick: u64,
        status: usize,
        settled: Option<u64>,
    },
    Refund {
        pick: u64,
        slots: Option<u64>,
        cents: Option<u64>,
    },
}

const STATUSES: [&str; 6] = ["ok", "error", "rejected", "timeout", "running", "unknown"];

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0u64..50, any::<bool>(), any::<bool>()).prop_map(|(reserve, write, exempt)| Op::Allow {
            reserve,
            write,
            exempt
        }),
        (0u64..12, 0usize..6, proptest::option::of(0u64..60)).prop_map(
            |(pick, status, settled)| Op::Outcome {
                pick,
                status,
                settled
            }
        ),
        (
            0u64..12,
            proptest::option::of(0u64..3),
            proptest::option::of(0u64..60)
        )
            .prop_map(|(pick, slots, cents)| Op::Refund { pick, slots, cents }),
    ]
}

#[derive(Default)]
struct Attempt {
    reserved: u64,
    held: u64,
    counted: bool,
    write: bool,
    settled: bool,
    closed: bool,
    refunded: bool,
}

/// docs/GATE.md, how a budget is counted, attempts and spend, and nothing else.
#[derive(Default)]
struct Model {
    attempts: u64,
    side_effects: u64,
    held: u64,
    settled: u64,
    overrun: bool,
    findings: Vec<&'static str>,
    all: BTreeMap<u64, Attempt>,
}

impl Model {
    fn allow(&mut self, n: u64, reserve: u64, write: bool, counted: bool) {
        self.attempts += u64::from(counted);
        self.side_effects += u64::from(write);
        self.held += reserve;
        let a = Attempt {
            reserved: reserve,
            held: reserve,
            counted,
            write,
            ..Attempt::default()
        };
        self.all.insert(n, a);
    }

    fn outcome(&mut self, n: u64, status: &str, settled: Option<u64>) {
        let Some(a) = self.all.get_mut(&n) else {
            return self.findings.push("outcome_without_allow");
        };
        if a.closed {
            return self.findings.push("duplicate_outcome");
        }
        let is_final = matches!(status, "ok" | "error" | "rejected");
        // An outcome settles its attempt once; unknown, timeout and running without
        // settled_cents keep the reservation held.
        if settled.is_some() || is_final {
            if a.settled {
                if settled.is_some() {
                    self.findings.push("duplicate_outcome");
                }
            } else {
                let s = settled.unwrap_or(0);
                self.held -= a.held;
                self.settled += s;
                a.held = 0;
                a.settled = true;
                // An overrun is recorded, not an inconsistency.
                if s > a.reserved {
                    self.overrun = true;
                }
            }
        }
        // Rejected: nothing happened, the attempt is refunded by itself.
        if status == "rejected" && !a.refunded {
            a.refunded = true;
            self.attempts = self.attempts.saturating_sub(u64::from(a.counted));
            self.side_effects = self.side_effects.saturating_sub(u64::from(a.write));
        }
        a.closed = is_final;
    }

    fn refund(&mut self, n: u64, slots: Option<u64>, cents: Option<u64>) {
        let Some(a) = self.all.get_mut(&n) else {
            return self.findings.push("refund_without_attempt");
        };
        if a.refunded {
            return self.findings.push("refunded_twice");
        }
        a.refunded = true;
        self.attempts = self.attempts.saturating_sub(slots.unwrap_or(1));
        let release = cents.unwrap_or(a.held).min(a.held);
        a.held -= release;
        self.held -= release;
    }
}

fn kinds(found: &[Inconsistency]) -> Vec<String> {
    found
        .iter()
        .map(|i| {
            let v = serde_json::to_value(i).expect("an inconsistency serializes");
            v["kind"].as_str().expect("a kind tag").to_owned()
        })
        .collect()
}

fn record(op: &Op, at: u64, next: &mut u64, model: &mut Model) -> Value {
    match *op {
        Op::Allow {
            reserve,
            write,
            exempt,
        } => {
            *next += 1;
            model.allow(*next, reserve, write, !exempt);
            let effect = if write { "idempotent_write" } else { "read" };
            let tool = if exempt { "search" } else { "api" };
            json!({"run": "r1", "kind": "allow", "at_ms": at, "tool": tool, "effect": effect,
                   "operation": format!("op:{next}"), "attempt": *next, "reserve_cents": reserve})
        }
        Op::Outcome {
            pick,
            status,
            settled,
        } => {
            model.outcome(pick, STATUSES[status], settled);
            let mut v = json!({"run": "r1", "kind": "outcome", "at_ms": at, "attempt": pick,
                               "status": STATUSES[status]});
            if let Some(s) = settled {
                v["settled_cents"] = json!(s);
            }
            v
        }
        Op::Refund { pick, slots, cents } => {
            model.refund(pick, slots, cents);
            let mut v = json!({"run": "r1", "kind": "refund", "at_ms": at, "of": pick});
            if let Some(s) = slots {
                v["slots"] = json!(s);
            }
            if let Some(c) = cents {
                v["cents"] = json!(c);
            }
            v
        }
    }
}

proptest! {
    #[test]
    fn apply_counts_attempts_and_spend_as_spec_3_1_says(ops in proptest::collection::vec(op(), 1..40)) {
        let mut sim = Sim::with_run("[scope]\nexempt = [\"search\"]\n", json!({}));
        let mut model = Model::default();
        let mut next = 0u64;
        let mut found = Vec::new();
        for (i, op) in ops.iter().enumerate() {
            let v = record(op, 10 + i as u64, &mut next, &mut model);
            found.extend(sim.apply_json(v));
            let r = sim.run("r1");
            let open_held: u64 = r.open.values().map(|a| a.held).sum();
            prop_assert_eq!(r.held_nanos, open_held, "held_nanos is not what open attempts hold, after {:?}", op);
            prop_assert_eq!(r.held_nanos, model.held * CENT, "held after {:?}", op);
            prop_assert_eq!(r.settled_nanos, model.settled * CENT, "settled after {:?}", op);
            prop_assert_eq!(r.attempts_used, model.attempts, "attempts after {:?}", op);
            prop_assert_eq!(r.side_effects_used, model.side_effects, "side effects after {:?}", op);
            prop_assert_eq!(r.overrun, model.overrun, "overrun after {:?}", op);
        }
        prop_assert_eq!(kinds(&found), model.findings);
    }
}

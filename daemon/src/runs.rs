//! Per-run counters, kept in memory from the decisions this daemon appends.
//!
//! The writer holds no key that opens past epochs (SPEC 5.4), so counters cannot be
//! rebuilt from the store at startup: they start empty and cover what this process
//! appended (see [`crate::wire::RunCounters`]).

use std::collections::HashMap;
use std::sync::Mutex;

use tally_ledger::decision::Budget;
use tally_ledger::{Decision, Kind, Reason, Receipt, Status};

use crate::wire::{LastDecision, RunCounters};

/// What one decision contributes to its run's counters, taken before the decision is
/// consumed by `prepare`.
pub(crate) struct Delta {
    run: String,
    kind: Kind,
    at_ms: Option<u64>,
    reason: Option<Reason>,
    status: Option<Status>,
    budget: Option<Budget>,
    reserve_cents: u64,
    settled_cents: u64,
    refund_slots: u64,
    refund_cents: u64,
}

impl Delta {
    pub fn of(d: &Decision) -> Delta {
        let kind = d.kind();
        let refund = kind == Kind::Refund;
        Delta {
            run: d.run.clone(),
            kind,
            at_ms: d.at_ms,
            reason: d.reason,
            status: d.status,
            budget: if kind == Kind::Start {
                d.budget.clone()
            } else {
                None
            },
            reserve_cents: d.reserve_cents.unwrap_or(0),
            settled_cents: d.settled_cents.unwrap_or(0),
            refund_slots: if refund { d.slots.unwrap_or(1) } else { 0 },
            refund_cents: if refund { d.cents.unwrap_or(0) } else { 0 },
        }
    }
}

/// Runs whose counters are kept. Beyond it, the tenth least recently active are dropped
/// (their `GET /v1/runs/{run}` answers 404): memory stays bounded whatever run names
/// clients invent.
pub(crate) const MAX_RUNS: usize = 100_000;

/// Drop the tenth of the runs least recently active (amortised: once per MAX_RUNS / 10
/// new runs).
fn evict(table: &mut HashMap<String, RunCounters>) {
    let mut by_age: Vec<(u64, String)> = table
        .iter()
        .map(|(run, c)| (c.last.as_ref().map_or(0, |l| l.seq), run.clone()))
        .collect();
    let drop = table.len() - MAX_RUNS + MAX_RUNS / 10;
    let last = by_age.len() - 1;
    by_age.select_nth_unstable(drop.min(last));
    for (_, run) in by_age.into_iter().take(drop) {
        table.remove(&run);
    }
}

/// The counter table.
pub(crate) struct Runs {
    since_seq: u64,
    table: Mutex<HashMap<String, RunCounters>>,
}

impl Runs {
    pub fn new(since_seq: u64) -> Runs {
        Runs {
            since_seq,
            table: Mutex::new(HashMap::new()),
        }
    }

    /// Apply durable decisions: `deltas[i]` was acknowledged with `receipts[i]`.
    pub fn apply(&self, deltas: Vec<Delta>, receipts: &[Receipt]) {
        let mut table = self.table.lock().unwrap_or_else(|e| e.into_inner());
        for (delta, receipt) in deltas.into_iter().zip(receipts) {
            let c = table
                .entry(delta.run.clone())
                .or_insert_with(|| RunCounters {
                    run: delta.run.clone(),
                    since_seq: self.since_seq,
                    ..RunCounters::default()
                });
            c.decisions += 1;
            match delta.kind {
                Kind::Start => {
                    if delta.budget.is_some() {
                        c.budget = delta.budget;
                    }
                }
                Kind::Allow => {
                    c.allows += 1;
                    c.spend_reserved_cents =
                        c.spend_reserved_cents.saturating_add(delta.reserve_cents);
                }
                Kind::Deny => c.denies += 1,
                Kind::Outcome => {
                    c.outcomes += 1;
                    c.spend_settled_cents =
                        c.spend_settled_cents.saturating_add(delta.settled_cents);
                }
                Kind::Refund => {
                    c.attempts_refunded = c.attempts_refunded.saturating_add(delta.refund_slots);
                    c.spend_released_cents =
                        c.spend_released_cents.saturating_add(delta.refund_cents);
                    c.spend_reserved_cents =
                        c.spend_reserved_cents.saturating_sub(delta.refund_cents);
                }
                Kind::Stop => c.stopped = delta.reason,
                Kind::Override | Kind::Policy => {}
            }
            c.attempts_used = c.allows.saturating_sub(c.attempts_refunded);
            // Concurrent requests finish out of seq order: keep the highest seq.
            let newest = match &c.last {
                None => true,
                Some(l) => l.seq < receipt.seq,
            };
            if newest {
                c.last = Some(LastDecision {
                    seq: receipt.seq,
                    kind: delta.kind,
                    at_ms: delta.at_ms,
                    reason: delta.reason,
                    status: delta.status,
                });
            }
        }
        if table.len() > MAX_RUNS {
            evict(&mut table);
        }
    }

    /// A run's counters, if this daemon appended any of its decisions.
    pub fn get(&self, run: &str) -> Option<RunCounters> {
        self.table
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(run)
            .cloned()
    }

    /// The seq from which counters are complete.
    pub fn since_seq(&self) -> u64 {
        self.since_seq
    }
}

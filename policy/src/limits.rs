//! What a run's limits answer at a moment, asked by the gate, the proxy and the reports
//! alike: whether the run is past its deadline, how long a call may take, what the run
//! and its principal may still spend. Only this crate compares a limit.

use tally_record::decision::Budget;

/// Whether a run at `run_ms` on its own clock is past the deadline of `budget`: its next
/// check is refused `run_deadline_exhausted`, and the gate stops it.
pub fn past_deadline(budget: &Budget, run_ms: u64) -> bool {
    budget.deadline_ms.is_some_and(|d| run_ms >= d)
}

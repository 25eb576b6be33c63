//! What a run's limits answer at a moment, asked by the gate, the proxy and the reports
//! alike: whether the run is past its deadline, how long a call may take, what the run
//! and its principal may still spend. Only this crate compares a limit.

use std::collections::BTreeMap;

use tally_record::decision::{Budget, Limit};
use tally_record::money::Nanos;
use tally_record::{LimitKey, Reason};

use crate::state::RunState;

/// Whether a run at `run_ms` on its own clock is past the deadline of `budget`: its next
/// check is refused `run_deadline_exhausted`, and the gate stops it.
pub fn past_deadline(budget: &Budget, run_ms: u64) -> bool {
    budget.deadline_ms.is_some_and(|d| run_ms >= d)
}

/// Run time left before the deadline of `budget` at `run_ms` on the run's clock (`None`:
/// no deadline): how long an approval request of the run stays open to an answer.
pub fn deadline_left(budget: &Budget, run_ms: u64) -> Option<u64> {
    budget.deadline_ms.map(|d| d.saturating_sub(run_ms))
}

/// The stop an open run is owed at `run_ms` on its own clock, if any: past its deadline
/// it is stopped (`run_deadline_exhausted`) before anything else of its owner's is done.
pub fn deadline_stop(run: &RunState, run_ms: u64) -> Option<Reason> {
    past_deadline(&run.budget, run_ms).then_some(Reason::RunDeadlineExhausted)
}

/// How long a call may take, asked for `own_ms`, by a run at `run_ms` under `budget`:
/// never past the run's deadline.
pub fn call_timeout(budget: &Budget, run_ms: u64, own_ms: u64) -> u64 {
    match budget.deadline_ms {
        Some(d) => own_ms.min(d.saturating_sub(run_ms)),
        None => own_ms,
    }
}

/// What is left of a limit: nothing once it is used up or past.
pub fn left(limit: &Limit) -> u64 {
    limit.limit.saturating_sub(limit.used)
}

/// Whether `used` is past `limit` (`None`: no limit); a run gets there when a limit in
/// force shrinks below what it had used.
pub fn over_limit(used: u64, limit: Option<u64>) -> bool {
    limit.is_some_and(|l| used > l)
}

/// What a run may still spend, from its limits snapshot (a decision's `limits`, or
/// the run's standing): the least of what is left of its own spend limit (grants and
/// carve-outs counted) and of its principal's. [`Nanos::MAX`] where neither is limited.
pub fn spend_left(limits: &BTreeMap<LimitKey, Limit>) -> Nanos {
    let left_of = |dimension: LimitKey| match limits.get(&dimension) {
        None => Nanos::MAX,
        Some(l) => Nanos(left(l)),
    };
    left_of(LimitKey::SpendNanos).min(left_of(LimitKey::PrincipalSpendNanos))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(deadline_ms: Option<u64>) -> Budget {
        Budget {
            deadline_ms,
            ..Budget::default()
        }
    }

    #[test]
    fn a_run_is_past_its_deadline_from_the_deadline_on() {
        assert!(!past_deadline(&budget(Some(100)), 99));
        assert!(past_deadline(&budget(Some(100)), 100));
        assert!(!past_deadline(&budget(None), u64::MAX));
    }

    #[test]
    fn a_call_never_outlasts_its_runs_deadline() {
        assert_eq!(call_timeout(&budget(Some(1_000)), 400, 30_000), 600);
        assert_eq!(call_timeout(&budget(Some(1_000)), 400, 100), 100);
        assert_eq!(call_timeout(&budget(Some(1_000)), 2_000, 100), 0);
        assert_eq!(call_timeout(&budget(None), 2_000, 100), 100);
    }

    #[test]
    fn a_limit_is_over_only_past_it() {
        assert!(!over_limit(5, Some(5)));
        assert!(over_limit(6, Some(5)));
        assert!(!over_limit(u64::MAX, None));
        assert_eq!(left(&Limit { used: 7, limit: 5 }), 0);
        assert_eq!(left(&Limit { used: 2, limit: 5 }), 3);
    }

    #[test]
    fn what_is_left_is_the_less_of_the_runs_and_its_owners() {
        let limit = |used, limit| Limit { used, limit };
        let mut s = BTreeMap::new();
        assert_eq!(spend_left(&s), Nanos::MAX, "no limit");
        s.insert(LimitKey::SpendNanos, limit(40, 100));
        assert_eq!(spend_left(&s), Nanos(60));
        s.insert(LimitKey::PrincipalSpendNanos, limit(990, 1000));
        assert_eq!(spend_left(&s), Nanos(10), "the owner has less left");
        s.remove(&LimitKey::SpendNanos);
        assert_eq!(spend_left(&s), Nanos(10));
        s.insert(LimitKey::PrincipalSpendNanos, limit(2000, 1000));
        assert_eq!(spend_left(&s), Nanos(0), "never below nothing");
    }
}

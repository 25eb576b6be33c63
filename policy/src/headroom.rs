//! How close a run is to each of its limits: the one rule the live page, `tally top`,
//! `tally runs` and the metrics use (none of them counts a budget itself).
//!
//! Closeness is per mille of a limit used (`used * 1000 / limit`, at most 1000; a limit
//! of 0 is reached). A run's closeness is that of its nearest limit. Runs are ordered
//! open first, then nearest to a limit first, then by name.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};

use tally_record::decision::Limit;
use tally_record::LimitKey;

use crate::{Now, Policy, RunState};

pub use tally_record::{Closeness, Headroom};

/// `used` per mille of `limit`, at most 1000; a limit of 0 is reached.
pub fn permille(used: u64, limit: u64) -> u32 {
    if limit == 0 || used >= limit {
        return 1000;
    }
    // used < limit, so the quotient is below 1000 (u128: no overflow).
    (u128::from(used) * 1000 / u128::from(limit)) as u32
}

/// How close a `{dimension: {used, limit}}` snapshot is to its limits.
/// A snapshot of a record written before nanodollars (`spend_cents`) is read in
/// nanodollars (`spend_nanos`).
pub fn closeness(limits: &BTreeMap<LimitKey, Limit>) -> Closeness {
    let limits = tally_record::decision::limits_in_nanos(limits);
    let mut each: Vec<Headroom> = limits
        .iter()
        .map(|(d, l)| Headroom {
            dimension: d.clone(),
            used: l.used,
            limit: l.limit,
            permille: permille(l.used, l.limit),
        })
        .collect();
    each.sort_by(|a, b| {
        b.permille
            .cmp(&a.permille)
            .then_with(|| a.dimension.cmp(&b.dimension))
    });
    Closeness {
        nearest: each.first().map(|h| h.dimension.clone()),
        permille: each.first().map_or(0, |h| h.permille),
        each,
    }
}

/// A run's limits at `now`, every dimension its state holds: attempts, spend, side
/// effects and deadline (as a decision's snapshot has them), and polls: the most polled
/// remote operation against the per-operation allowance. Depth belongs to a call, not to
/// the run's state: a caller that saw the run's decisions adds their `depth` snapshot.
/// The run owner's principal usage is [`crate::principal_limits`].
pub fn limits_now(run: &RunState, now: Now) -> BTreeMap<LimitKey, Limit> {
    let mut out = crate::apply::standing(run, now);
    if let Some(limit) = run.budget.polls {
        if let Some(used) = run.refs.values().map(|r| r.polls).max() {
            out.insert(LimitKey::Polls, Limit { used, limit });
        }
    }
    out
}

/// The order runs are shown in: open runs before stopped ones, then the nearest to a
/// limit first, then by name.
pub fn order(a: (&str, bool, &Closeness), b: (&str, bool, &Closeness)) -> Ordering {
    let (a_name, a_open, a_c) = a;
    let (b_name, b_open, b_c) = b;
    b_open
        .cmp(&a_open)
        .then_with(|| b_c.permille.cmp(&a_c.permille))
        .then_with(|| a_name.cmp(b_name))
}

impl Policy {
    /// The tools the policy names exactly (in `scope.tools`, `scope.blocked`,
    /// `scope.exempt`; prefixes ending in `*` name no one tool): the only tool names
    /// that may become a metric's label. Every other tool is `other`, so an agent that
    /// invents tool names cannot grow the metrics.
    pub fn named_tools(&self) -> BTreeSet<String> {
        let s = &self.scope;
        s.tools
            .iter()
            .chain(&s.blocked)
            .chain(&s.exempt)
            .filter(|t| !t.ends_with('*') && !t.is_empty())
            .cloned()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(pairs: &[(&str, u64, u64)]) -> BTreeMap<LimitKey, Limit> {
        pairs
            .iter()
            .map(|(d, used, limit)| {
                (
                    LimitKey::from_name(d),
                    Limit {
                        used: *used,
                        limit: *limit,
                    },
                )
            })
            .collect()
    }

    #[test]
    fn the_nearest_limit_wins() {
        let c = closeness(&limits(&[
            ("attempts", 9, 10),
            ("spend_nanos", 100, 1000),
            ("deadline_ms", 10, 3_600_000),
        ]));
        assert_eq!(c.nearest, Some(LimitKey::Attempts));
        assert_eq!(c.permille, 900);
        assert_eq!(
            c.each
                .iter()
                .map(|h| h.dimension.as_str())
                .collect::<Vec<_>>(),
            ["attempts", "spend_nanos", "deadline_ms"]
        );
        assert_eq!(closeness(&BTreeMap::new()), Closeness::default());
    }

    #[test]
    fn per_mille_is_exact_and_bounded() {
        assert_eq!(permille(0, 10), 0);
        assert_eq!(permille(1, 3), 333);
        assert_eq!(permille(10, 10), 1000);
        assert_eq!(permille(11, 10), 1000);
        assert_eq!(permille(0, 0), 1000);
        assert_eq!(permille(u64::MAX - 1, u64::MAX), 999);
    }

    #[test]
    fn open_runs_first_then_nearest_then_name() {
        let near = closeness(&limits(&[("attempts", 9, 10)]));
        let far = closeness(&limits(&[("attempts", 1, 10)]));
        let mut runs = [
            ("z", true, far.clone()),
            ("stopped", false, near.clone()),
            ("b", true, near.clone()),
            ("a", true, near.clone()),
        ];
        runs.sort_by(|x, y| order((x.0, x.1, &x.2), (y.0, y.1, &y.2)));
        let names: Vec<&str> = runs.iter().map(|r| r.0).collect();
        assert_eq!(names, ["a", "b", "z", "stopped"]);
    }

    #[test]
    fn polls_are_the_most_polled_operation() {
        let mut run = RunState::new("r");
        run.budget.polls = Some(30);
        run.budget.attempts = Some(50);
        for (key, polls) in [(1u64, 4u64), (2, 27), (3, 0)] {
            run.refs.insert(
                key,
                crate::state::RemoteRef {
                    polls,
                    ..Default::default()
                },
            );
        }
        let l = limits_now(&run, Now::default());
        assert_eq!(
            l["polls"],
            Limit {
                used: 27,
                limit: 30
            }
        );
        assert_eq!(closeness(&l).nearest, Some(LimitKey::Polls));
    }

    #[test]
    fn only_exact_names_become_labels() {
        let p = Policy::from_toml(
            "[scope]\ntools = [\"search\", \"fetch*\"]\nblocked = [\"shell\"]\nexempt = [\"status\"]\n",
        )
        .unwrap();
        let named: Vec<String> = p.named_tools().into_iter().collect();
        assert_eq!(named, ["search", "shell", "status"]);
    }
}

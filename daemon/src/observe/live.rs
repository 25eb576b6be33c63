//! What the live page and `tally top` show beyond the gate's own state: each run's recent
//! trajectory (attempts, spend, polls and depth as its checks saw them), its last refusal
//! and the action it was told, refusals by reason per minute, and calls waiting for a
//! human's approval. Everything is bounded: an agent that makes up run names cannot grow
//! it past [`MAX_RUNS`] runs (the least recently seen is forgotten first).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Mutex;

use serde::Serialize;
use tally_ledger::decision::Limit;
use tally_ledger::money::Nanos;

/// Runs whose trajectory is kept.
pub(crate) const MAX_RUNS: usize = 20_000;
/// Points kept per run and dimension.
pub(crate) const POINTS: usize = 60;
/// Minutes of refusals kept.
pub(crate) const MINUTES: u64 = 15;
/// Calls waiting for approval that are kept.
pub(crate) const MAX_PENDING: usize = 1_000;

/// The dimensions a trajectory follows.
pub(crate) const TRACKED: [&str; 4] = ["attempts", "spend_nanos", "polls", "depth"];

/// The last refusal a run was given.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Refusal {
    pub reason: &'static str,
    pub action: Option<&'static str>,
    pub tool: String,
    pub seq: Option<u64>,
    pub at_ms: u64,
}

/// A call waiting for a human's approval: exactly the call an approval would allow.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Pending {
    pub run: String,
    pub tool: String,
    /// The BLAKE3 digest of the call's arguments (never the arguments).
    pub args_digest: Option<String>,
    pub seq: Option<u64>,
    pub at_ms: u64,
}

#[derive(Default)]
struct RunLive {
    /// Per tracked dimension, `(at_ms, used, limit)`.
    points: [VecDeque<(u64, u64, u64)>; 4],
    last_refusal: Option<Refusal>,
    /// The depth limit as the last check saw it (depth belongs to a call).
    depth: Option<Limit>,
    last_ms: u64,
}

/// A run's trajectory and last refusal, as the page shows it.
#[derive(Clone, Debug, Default, Serialize)]
pub(crate) struct RunView {
    /// Per dimension, the used values in time order (and the limit last seen).
    pub spark: BTreeMap<&'static str, Spark>,
    pub last_refusal: Option<Refusal>,
    pub depth: Option<Limit>,
}

/// One sparkline.
#[derive(Clone, Debug, Default, Serialize)]
pub(crate) struct Spark {
    pub used: Vec<u64>,
    pub limit: u64,
    /// The last point as people read it: `used/limit`, spend in dollars (`$0.15/$10.00`).
    pub shown: String,
}

#[derive(Default)]
struct Inner {
    runs: HashMap<String, RunLive>,
    /// minute (ms since the epoch / 60000) -> reason -> refusals.
    refusals: BTreeMap<u64, BTreeMap<&'static str, u64>>,
    pending: VecDeque<Pending>,
}

/// The live state, shared by the handlers.
#[derive(Default)]
pub(crate) struct Live {
    inner: Mutex<Inner>,
}

impl Live {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A check's answer for `run`.
    #[allow(clippy::too_many_arguments)]
    pub fn check(
        &self,
        run: &str,
        tool: &str,
        refusal: Option<(&'static str, Option<&'static str>)>,
        approval: bool,
        args_digest: Option<String>,
        limits: &BTreeMap<String, Limit>,
        seq: Option<u64>,
        now_ms: u64,
    ) {
        let mut inner = self.lock();
        if !inner.runs.contains_key(run) && inner.runs.len() >= MAX_RUNS {
            let oldest = inner
                .runs
                .iter()
                .min_by_key(|(_, r)| r.last_ms)
                .map(|(n, _)| n.clone());
            if let Some(o) = oldest {
                inner.runs.remove(&o);
            }
        }
        let r = inner.runs.entry(run.to_owned()).or_default();
        r.last_ms = now_ms;
        for (i, dim) in TRACKED.iter().enumerate() {
            if let Some(l) = limits.get(*dim) {
                let p = &mut r.points[i];
                if p.len() == POINTS {
                    p.pop_front();
                }
                p.push_back((now_ms, l.used, l.limit));
            }
        }
        if let Some(d) = limits.get("depth") {
            r.depth = Some(*d);
        }
        if let Some((reason, action)) = refusal {
            r.last_refusal = Some(Refusal {
                reason,
                action,
                tool: tool.to_owned(),
                seq,
                at_ms: now_ms,
            });
            let minute = now_ms / 60_000;
            *inner
                .refusals
                .entry(minute)
                .or_default()
                .entry(reason)
                .or_default() += 1;
            while inner
                .refusals
                .first_key_value()
                .is_some_and(|(m, _)| *m + MINUTES <= minute)
            {
                inner.refusals.pop_first();
            }
        }
        if approval {
            if inner.pending.len() == MAX_PENDING {
                inner.pending.pop_front();
            }
            inner.pending.push_back(Pending {
                run: run.to_owned(),
                tool: tool.to_owned(),
                args_digest,
                seq,
                at_ms: now_ms,
            });
        }
    }

    /// An approval was recorded for `run`: its waiting calls are no longer pending.
    pub fn approved(&self, run: &str) {
        self.lock().pending.retain(|p| p.run != run);
    }

    /// The trajectory of each of `runs`.
    pub fn views(&self, runs: &[&str]) -> Vec<RunView> {
        let inner = self.lock();
        runs.iter()
            .map(|name| match inner.runs.get(*name) {
                None => RunView::default(),
                Some(r) => RunView {
                    spark: TRACKED
                        .iter()
                        .enumerate()
                        .filter(|(i, _)| !r.points[*i].is_empty())
                        .map(|(i, d)| {
                            let p = &r.points[i];
                            let (used, limit) = p.back().map_or((0, 0), |x| (x.1, x.2));
                            let shown = if *d == "spend_nanos" {
                                format!("{}/{}", Nanos(used), Nanos(limit))
                            } else {
                                format!("{used}/{limit}")
                            };
                            (
                                *d,
                                Spark {
                                    used: p.iter().map(|x| x.1).collect(),
                                    limit,
                                    shown,
                                },
                            )
                        })
                        .collect(),
                    last_refusal: r.last_refusal.clone(),
                    depth: r.depth,
                },
            })
            .collect()
    }

    /// Refusals by reason for each of the last [`MINUTES`] minutes up to `now_ms`,
    /// oldest first: `(minute start ms, reason, count)`.
    pub fn refusals(&self, now_ms: u64) -> Vec<(u64, &'static str, u64)> {
        let inner = self.lock();
        let now = now_ms / 60_000;
        inner
            .refusals
            .range(now.saturating_sub(MINUTES - 1)..=now)
            .flat_map(|(m, by)| by.iter().map(move |(r, n)| (m * 60_000, *r, *n)))
            .collect()
    }

    /// The calls waiting for approval, oldest first.
    pub fn pending(&self) -> Vec<Pending> {
        self.lock().pending.iter().cloned().collect()
    }
}

//! What the live page and `tally top` show beyond the gate's own state: each run's recent
//! trajectory (attempts, spend, polls and depth as its checks saw them), its last refusal
//! and the action it was told, refusals by reason per minute, and calls waiting for a
//! human's approval. Everything is bounded: an agent that makes up run names cannot grow
//! it past [`MAX_RUNS`] runs (the least recently seen is forgotten first).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::Path;
use std::sync::Mutex;

use super::journal::{Journal, Line};

use tally_ledger::decision::Limit;
use tally_ledger::money::Nanos;
use tally_wire::{LimitKey, Spark};

/// Runs whose trajectory is kept.
pub(crate) const MAX_RUNS: usize = 20_000;
/// Points kept per run and dimension.
pub(crate) const POINTS: usize = 60;
/// Minutes of refusals kept.
pub(crate) const MINUTES: u64 = 15;
/// Calls waiting for approval that are kept.
pub(crate) const MAX_PENDING: usize = 1_000;

/// The dimensions a trajectory follows.
pub(crate) const TRACKED: [LimitKey; 4] = [
    LimitKey::Attempts,
    LimitKey::SpendNanos,
    LimitKey::Polls,
    LimitKey::Depth,
];

/// The last refusal a run was given.
pub(crate) use tally_wire::LastRefusal as Refusal;

/// A call waiting for a human's approval: exactly the call an approval would allow.
pub(crate) use tally_wire::LivePending as Pending;

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
#[derive(Clone, Debug, Default)]
pub(crate) struct RunView {
    /// Per dimension, the used values in time order (and the limit last seen).
    pub spark: BTreeMap<LimitKey, Spark>,
    pub last_refusal: Option<Refusal>,
    pub depth: Option<Limit>,
}

impl RunView {
    /// Ends each trajectory at `limits`, where the run stands now (what the page's bar is
    /// drawn from), so that a row's numbers are its bar's: a dimension the run has that
    /// no check has shown yet gets a trajectory of that one point.
    pub fn now(&mut self, limits: &BTreeMap<LimitKey, Limit>) {
        for dim in TRACKED {
            if dim == LimitKey::Depth {
                // Depth belongs to a call, not to the run: its last check's.
                continue;
            }
            let Some(l) = limits.get(&dim) else { continue };
            let spark = self.spark.entry(dim.clone()).or_default();
            if spark.used.last() != Some(&l.used) || spark.limit != l.limit {
                if spark.used.len() == POINTS {
                    spark.used.remove(0);
                }
                spark.used.push(l.used);
                spark.limit = l.limit;
            }
            spark.shown = shown(&dim, l.used, l.limit);
        }
    }
}

/// A point as people read it: `used/limit`, spend in dollars (`$0.15/$10.00`).
fn shown(dim: &LimitKey, used: u64, limit: u64) -> String {
    if *dim == LimitKey::SpendNanos {
        format!("{}/{}", Nanos(used), Nanos(limit))
    } else {
        format!("{used}/{limit}")
    }
}

#[derive(Default)]
struct Inner {
    runs: HashMap<String, RunLive>,
    /// minute (ms since the epoch / 60000) -> reason -> refusals.
    refusals: BTreeMap<u64, BTreeMap<&'static str, u64>>,
    pending: VecDeque<Pending>,
    /// Where the trajectories are kept across a restart.
    journal: Option<Journal>,
}

impl Inner {
    /// Add `points` (dimension index, used, limit) taken at `at_ms` to `run`'s
    /// trajectory; the least recently seen run is forgotten first past [`MAX_RUNS`].
    fn push(&mut self, run: &str, at_ms: u64, points: &[(u8, u64, u64)]) -> &mut RunLive {
        if !self.runs.contains_key(run) && self.runs.len() >= MAX_RUNS {
            let oldest = self
                .runs
                .iter()
                .min_by_key(|(_, r)| r.last_ms)
                .map(|(n, _)| n.clone());
            if let Some(o) = oldest {
                self.runs.remove(&o);
            }
        }
        let r = self.runs.entry(run.to_owned()).or_default();
        r.last_ms = r.last_ms.max(at_ms);
        for &(i, used, limit) in points {
            let Some(p) = r.points.get_mut(i as usize) else {
                continue;
            };
            if p.len() == POINTS {
                p.pop_front();
            }
            p.push_back((at_ms, used, limit));
            if TRACKED[i as usize] == LimitKey::Depth {
                r.depth = Some(Limit { used, limit });
            }
        }
        r
    }

    /// The tracked dimensions of `limits` as `run`'s point at `at_ms`, journaled.
    fn point(&mut self, run: &str, limits: &BTreeMap<LimitKey, Limit>, at_ms: u64) -> &mut RunLive {
        let points: Vec<(u8, u64, u64)> = TRACKED
            .iter()
            .enumerate()
            .filter_map(|(i, dim)| limits.get(dim).map(|l| (i as u8, l.used, l.limit)))
            .collect();
        if !points.is_empty() {
            if let Some(journal) = self.journal.as_mut() {
                journal.append(&Line {
                    run: run.to_owned(),
                    at_ms,
                    points: points.clone(),
                });
            }
        }
        self.push(run, at_ms, &points)
    }

    /// Every point held, one line each, runs least recently seen first.
    fn lines(&self) -> Vec<Line> {
        let mut runs: Vec<(&String, &RunLive)> = self.runs.iter().collect();
        runs.sort_by(|a, b| a.1.last_ms.cmp(&b.1.last_ms).then_with(|| a.0.cmp(b.0)));
        let mut out = Vec::new();
        for (name, r) in runs {
            // One line per check, as they were appended: its dimensions share its time.
            let mut at: BTreeMap<u64, Vec<(u8, u64, u64)>> = BTreeMap::new();
            for (i, p) in r.points.iter().enumerate() {
                for &(at_ms, used, limit) in p {
                    at.entry(at_ms).or_default().push((i as u8, used, limit));
                }
            }
            out.extend(at.into_iter().map(|(at_ms, points)| Line {
                run: name.clone(),
                at_ms,
                points,
            }));
        }
        out
    }
}

/// The live state, shared by the handlers.
#[derive(Default)]
pub(crate) struct Live {
    inner: std::sync::Arc<Mutex<Inner>>,
}

impl Inner {
    /// Rewrite the journal from memory (it holds exactly what the page shows).
    fn compact(&mut self) {
        let lines = self.lines();
        if let Some(j) = self.journal.as_mut() {
            j.compact(lines);
        }
    }
}

/// Read `dir`'s file back into `live` (see [`Live::open`]).
fn load(live: &Mutex<Inner>, dir: &Path) {
    // Two passes over the file, streamed: which runs are the most recently seen, then
    // their points (so no run is read in only to be forgotten, and the file is never
    // held whole).
    let mut last: HashMap<String, u64> = HashMap::new();
    Journal::scan(dir, |l| {
        let e = last.entry(l.run).or_default();
        *e = (*e).max(l.at_ms);
    });
    if last.len() > MAX_RUNS {
        let mut by: Vec<(String, u64)> = last.into_iter().collect();
        by.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        by.truncate(MAX_RUNS);
        last = by.into_iter().collect();
    }
    let mut restored = Inner::default();
    let bad = Journal::scan(dir, |l| {
        if last.contains_key(&l.run) {
            restored.push(&l.run, l.at_ms, &l.points);
        }
    });
    drop(last);
    let (runs, points) = (
        restored.runs.len(),
        restored
            .runs
            .values()
            .map(|r| r.points.iter().map(VecDeque::len).sum::<usize>())
            .sum::<usize>(),
    );
    let mut inner = live.lock().unwrap_or_else(|e| e.into_inner());
    // What the first checks added is newer: it goes after what was read.
    for (name, old) in restored.runs {
        let room = inner.runs.len() < MAX_RUNS;
        match inner.runs.get_mut(&name) {
            Some(now) => {
                for (n, o) in now.points.iter_mut().zip(old.points) {
                    let mut merged = o;
                    merged.extend(n.drain(..));
                    while merged.len() > POINTS {
                        merged.pop_front();
                    }
                    *n = merged;
                }
                now.last_ms = now.last_ms.max(old.last_ms);
                if now.depth.is_none() {
                    now.depth = old.depth;
                }
            }
            None if room => {
                inner.runs.insert(name, old);
            }
            None => {}
        }
    }
    let lines = inner.lines();
    match Journal::start(dir, lines) {
        Ok(j) => inner.journal = Some(j),
        Err(e) => super::log_line(
            "error",
            &format!(
                "tally serve: cannot keep the live view's trajectories in {}: {e}; they are kept in memory only",
                dir.join(super::journal::FILE).display()
            ),
        ),
    }
    drop(inner);
    if bad > 0 {
        super::log_line(
            "error",
            &format!(
                "tally serve: {} line(s) of {} did not parse and were skipped (a write cut by a crash); the live view kept {points} point(s) of {runs} run(s)",
                bad,
                dir.join(super::journal::FILE).display(),
            ),
        );
    }
}

impl Live {
    /// The live state, empty at once; a thread of its own (`tally-live-load`) reads the
    /// trajectories kept in `dir` (the ledger's directory) back, bounded as the page is
    /// ([`MAX_RUNS`] runs, [`POINTS`] points each), merges them before whatever the
    /// first checks added meanwhile, and has the file rewritten with exactly what is
    /// held, then appended to. Nothing waits for it: the daemon decides from its first
    /// moment, and the page fills in once the file is read.
    pub fn open(dir: &Path) -> Live {
        let inner = std::sync::Arc::new(Mutex::new(Inner::default()));
        let shared = std::sync::Arc::clone(&inner);
        let dir = dir.to_path_buf();
        let spawned = std::thread::Builder::new()
            .name("tally-live-load".into())
            .spawn(move || load(&shared, &dir));
        if let Err(e) = spawned {
            super::log_line(
                "error",
                &format!("tally serve: cannot start the thread that reads the live view's trajectories: {e}; the page starts empty"),
            );
        }
        Live { inner }
    }

    /// At a clean stop: the trajectories' file gets every point taken (the writer is
    /// joined; it may take [`super::journal::WRITE_EVERY`]). Blocks: call it off the
    /// async workers.
    pub fn close(&self) {
        let journal = self.lock().journal.take();
        if let Some(j) = journal {
            j.close();
        }
    }

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
        limits: &BTreeMap<LimitKey, Limit>,
        seq: Option<u64>,
        now_ms: u64,
    ) {
        let mut inner = self.lock();
        let r = inner.point(run, limits, now_ms);
        if let Some(d) = limits.get(&LimitKey::Depth) {
            r.depth = Some(*d);
        }
        if let Some((reason, action)) = refusal {
            r.last_refusal = Some(Refusal {
                reason: reason.to_owned(),
                action: action.map(str::to_owned),
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
        if inner.journal.as_ref().is_some_and(Journal::due) {
            inner.compact();
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

    /// An outcome was recorded for `run`: `limits` are the run's after it (its spend
    /// settled), so the trajectory shows the settlement without waiting for a next check.
    pub fn settled(&self, run: &str, limits: &BTreeMap<LimitKey, Limit>, now_ms: u64) {
        let mut inner = self.lock();
        inner.point(run, limits, now_ms);
        if inner.journal.as_ref().is_some_and(Journal::due) {
            inner.compact();
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
                            let shown = shown(d, used, limit);
                            (
                                d.clone(),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn line(run: &str, at_ms: u64, used: u64) -> String {
        serde_json::to_string(&Line {
            run: run.into(),
            at_ms,
            points: vec![(0, used, 100)],
        })
        .expect("json")
    }

    /// A journal past every bound (one run more than kept, one run with more points than
    /// kept, a line that does not parse, a dimension that does not exist): read back as
    /// the page keeps it, and rewritten with exactly that.
    #[test]
    fn a_journal_past_its_bounds_is_read_back_bounded() {
        let dir = tempfile::tempdir().expect("tmp");
        let mut text = String::new();
        for i in 0..=MAX_RUNS as u64 {
            text.push_str(&line(&format!("run-{i}"), 1_000 + i, 1));
            text.push('\n');
        }
        for p in 0..(POINTS as u64 + 10) {
            text.push_str(&line("busy", 100_000 + p, p));
            text.push('\n');
        }
        text.push_str("{\"run\":\"busy\",\"at_ms\":1,\"points\":[[7,1,1]]}\n");
        text.push_str("{\"run\":\"torn\",\"at");
        std::fs::write(dir.path().join(super::super::journal::FILE), text).expect("write");
        let file = dir.path().join(super::super::journal::FILE);
        let live = Live::open(dir.path());
        // Read back by a thread of its own: wait until the file is rewritten as held.
        let until = |what: &dyn Fn() -> bool| {
            for _ in 0..6000 {
                if what() {
                    return;
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            panic!("not within a minute");
        };
        until(&|| {
            let r = super::super::journal::Journal::read(dir.path());
            r.bad == 0 && r.lines.len() == MAX_RUNS - 1 + POINTS
        });
        assert_eq!(live.lock().runs.len(), MAX_RUNS);
        // The least recently seen run (run-0) and run-1 gave way to `busy`.
        let views = live.views(&["run-0", "run-1", "run-2", "busy"]);
        assert!(views[0].spark.is_empty() && views[1].spark.is_empty());
        assert_eq!(views[2].spark["attempts"].used, [1]);
        let busy = &views[3].spark["attempts"].used;
        assert_eq!(busy.len(), POINTS);
        assert_eq!(busy[0], 10);
        // A check is appended, and read back next time.
        live.check(
            "busy",
            "t",
            None,
            false,
            None,
            &[(
                LimitKey::Attempts,
                Limit {
                    used: 77,
                    limit: 100,
                },
            )]
            .into(),
            Some(1),
            200_000,
        );
        until(&|| {
            std::fs::read_to_string(&file)
                .map(|t| t.lines().count() == MAX_RUNS + POINTS)
                .unwrap_or(false)
        });
        drop(live);
        let live = Live::open(dir.path());
        until(&|| live.views(&["busy"])[0].spark.contains_key("attempts"));
        let busy = live.views(&["busy"]).remove(0).spark["attempts"]
            .used
            .clone();
        assert_eq!(busy.last(), Some(&77));
        assert_eq!(busy.len(), POINTS);
    }
}

//! Tools' breakers from a view (docs/FLEET.md, "The leased mode", "Breakers from a
//! view"): where the policy gives tools no fleet-wide counter per call (no rate bucket,
//! no limit on calls in flight: [`tally_policy::tools_counted_per_call`]), a decision at
//! home reads the tool's breaker from this holder's view of it instead of locking the
//! tool's row. The view is the row's breaker as last read or written here, with the
//! outcomes seen here since folded on top by the policy core's own rule
//! ([`tally_policy::breaker_outcome`]): this daemon's failures count at once. Those
//! outcomes are kept, in order, and folded into the row at the next tick (and at
//! shutdown), one transaction per tool that locks the row: then they count fleet-wide.
//! Each tick also reads every viewed tool's row again, so a breaker tripped by other
//! daemons' failures refuses here within one refresh interval.
//!
//! A view that says closed decides here; one that says open refuses here, as the core
//! does from the row (its reason); one that says half-open (its time is up) does not:
//! that decision goes the central way, which locks the row and leases the one probe.
//! So does a decision on a tool whose view keeps a full batch of outcomes not yet in
//! its row, whose row the decoder refused at the last refresh, or that has no view
//! (never seen here, dropped idle, or beyond the number of views kept).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tally_gate::backend::{Idle, Observed};
use tally_gate::GateError;
use tally_policy::state::{call_id, Breaker};
use tally_policy::{Policy, ToolState};

use crate::Postgres;

/// How much a holder's views keep.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ViewLimits {
    /// Outcomes kept per tool, not yet in its row: at this many, the tool's decisions
    /// go the central way until a flush folds them in (the bound holds while flushes
    /// succeed).
    pub batch: usize,
    /// Tools viewed at once: a tool seen beyond them is decided the central way.
    pub views: usize,
}

impl Default for ViewLimits {
    /// 4,096 outcomes per tool, 1,024 tools.
    fn default() -> ViewLimits {
        ViewLimits {
            batch: 4096,
            views: 1024,
        }
    }
}

/// What a tick (or a clean stop) did with the views.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct BreakersTicked {
    /// Tools whose outcomes kept here were folded into their rows.
    pub flushed: usize,
    /// Tools whose flush failed for certain (not answered before its COMMIT was sent,
    /// refused, or its row refused by the decoder): their outcomes are kept for the next
    /// time.
    pub flush_failed: usize,
    /// Tools whose flush's COMMIT went unanswered: their outcomes were let go (they are
    /// in the row if it committed, lost if not), never folded twice.
    pub flush_unsure: usize,
    /// Reading the viewed tools' rows again failed: the views stay as they were.
    pub refresh_failed: bool,
    /// Viewed tools whose rows the decoder refused: decided the central way until their
    /// rows read again.
    pub unreadable: usize,
    /// Views dropped, idle.
    pub dropped: usize,
    /// Outcomes kept here not yet in their rows, after this.
    pub unflushed: usize,
}

impl BreakersTicked {
    /// Whether some of the work failed (or may have).
    pub fn failed(&self) -> bool {
        self.flush_failed > 0 || self.flush_unsure > 0 || self.refresh_failed || self.unreadable > 0
    }
}

/// One tool's view.
#[derive(Clone, Debug)]
struct View {
    /// The breaker as the tool's row held it when last read or written here.
    row: Breaker,
    /// Outcomes seen here since, not yet folded into the row, in order (a batch of at
    /// most about [`ViewLimits::batch`]: past it, decisions go central).
    pending: Vec<Observed>,
    /// The outcomes of decisions here queued in the group commit, not yet committed, by
    /// ticket (in the order queued): they count in `now`, moved to `pending` once their
    /// group may have committed, dropped if it rolled back for certain.
    queued: BTreeMap<u64, Vec<Observed>>,
    /// `row` with `pending` and `queued` folded in: what a decision here reads.
    now: Breaker,
    /// The row could not be decoded at the last refresh: decisions go central.
    unreadable: bool,
    /// A decision read the view (or made it) since the last refresh.
    used: bool,
}

/// This holder's views of its tools' breakers.
#[derive(Default)]
pub(crate) struct Views {
    views: Mutex<BTreeMap<String, View>>,
    /// What outcomes fold under: the policy's breaker, as last seen.
    policy: Mutex<Option<Arc<Policy>>>,
    limits: ViewLimits,
    /// The latest wall time (ms) a decision here read the views at: what a view is
    /// judged idle at.
    now_ms: AtomicU64,
    /// The next ticket for a queued decision's outcomes.
    tickets: AtomicU64,
}

/// `outcomes` folded, in order, into `t` by the core's rule.
fn fold(policy: &Policy, tool: &str, mut t: ToolState, outcomes: &[Observed]) -> ToolState {
    for o in outcomes {
        let id = || call_id(&o.run, o.attempt);
        tally_policy::breaker_outcome(policy, tool, &mut t, id, o.status, o.now);
    }
    t
}

/// A tool's state holding only `breaker` (no bucket, nothing in flight: the policy
/// counts neither when it is viewable).
fn only(breaker: Breaker) -> ToolState {
    ToolState {
        breaker,
        ..ToolState::default()
    }
}

impl View {
    /// `now` made again from the row, what is pending, then what is queued.
    fn recompute(&mut self, policy: Option<&Policy>, tool: &str) {
        self.now = match policy {
            Some(p) if self.unflushed() > 0 => {
                let t = fold(p, tool, only(self.row.clone()), &self.pending);
                let t = self.queued.values().fold(t, |t, o| fold(p, tool, t, o));
                t.breaker
            }
            _ => self.row.clone(),
        };
    }

    /// Outcomes here not in the row: pending and queued.
    fn unflushed(&self) -> usize {
        self.pending.len() + self.queued.values().map(Vec::len).sum::<usize>()
    }
}

impl Views {
    pub(crate) fn new(limits: ViewLimits) -> Views {
        Views {
            limits,
            ..Views::default()
        }
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<String, View>> {
        self.views.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The policy outcomes fold under (its breaker's part, with the tools' per-call
    /// counters off, as they are while views are read), kept once and replaced when its
    /// breaker differs.
    pub(crate) fn remember(&self, policy: &Policy) {
        let mut kept = self.policy.lock().unwrap_or_else(|e| e.into_inner());
        if kept.as_ref().is_some_and(|p| p.breaker == policy.breaker) {
            return;
        }
        let mut p = Policy {
            breaker: policy.breaker.clone(),
            ..Policy::default()
        };
        p.rate.tool_per_sec = 0;
        p.rate.tool_in_flight = 0;
        *kept = Some(Arc::new(p));
    }

    fn policy(&self) -> Option<Arc<Policy>> {
        self.policy
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The tool's state to decide from here at `now_ms`: its view, unless there is none,
    /// its row was unreadable, its batch is full, or it is half-open (then the decision
    /// goes the central way).
    pub(crate) fn decide_from(&self, tool: &str, now_ms: u64, open_ms: u64) -> Option<ToolState> {
        self.now_ms.fetch_max(now_ms, Ordering::Relaxed);
        let mut views = self.lock();
        let v = views.get_mut(tool)?;
        if v.unreadable || v.unflushed() >= self.limits.batch {
            return None;
        }
        v.used = true;
        match v.now.at(now_ms, open_ms) {
            Breaker::HalfOpen { .. } => None,
            _ => Some(only(v.now.clone())),
        }
    }

    /// A decision here left the tool's breaker at `after`, having folded `observed`.
    pub(crate) fn decided(&self, tool: &str, after: Breaker, observed: Vec<Observed>) {
        if let Some(v) = self.lock().get_mut(tool) {
            v.now = after;
            v.pending.extend(observed);
        }
    }

    /// A ticket for a decision to be queued in the group commit.
    pub(crate) fn ticket(&self) -> u64 {
        self.tickets.fetch_add(1, Ordering::Relaxed)
    }

    /// A decision here, queued in the group commit under `ticket`, folded `observed`:
    /// they count in the view (the decisions after it read them) and are kept apart, to
    /// fold into the row only once it may have committed ([`Views::observed`]); a
    /// certain rollback takes them out ([`Views::undone`]). A read of the row meanwhile
    /// keeps them in the view.
    pub(crate) fn queued(&self, tool: &str, ticket: u64, observed: Vec<Observed>) {
        let policy = self.policy();
        if let Some(v) = self.lock().get_mut(tool) {
            v.queued.insert(ticket, observed);
            v.recompute(policy.as_deref(), tool);
        }
    }

    /// The group of the decision queued under `ticket` committed (or its `COMMIT` went
    /// unanswered): its outcomes are pending, for the row.
    pub(crate) fn observed(&self, tool: &str, ticket: u64) {
        let policy = self.policy();
        if let Some(v) = self.lock().get_mut(tool) {
            if let Some(mut observed) = v.queued.remove(&ticket) {
                v.pending.append(&mut observed);
                v.recompute(policy.as_deref(), tool);
            }
        }
    }

    /// The decision queued under `ticket` rolled back for certain: its outcomes are
    /// taken out of the view.
    pub(crate) fn undone(&self, tool: &str, ticket: u64) {
        let policy = self.policy();
        if let Some(v) = self.lock().get_mut(tool) {
            if v.queued.remove(&ticket).is_some() {
                v.recompute(policy.as_deref(), tool);
            }
        }
    }

    /// The tool's row read or written with `row`: the view is `row` with what is still
    /// pending here folded on top. A tool not viewed yet is viewed from now on, unless
    /// as many tools as the limit are.
    pub(crate) fn seen(&self, tool: &str, row: Breaker) {
        let policy = self.policy();
        let mut views = self.lock();
        if !views.contains_key(tool) && views.len() >= self.limits.views {
            return;
        }
        let v = views.entry(tool.to_owned()).or_insert_with(|| View {
            row: row.clone(),
            pending: Vec::new(),
            queued: BTreeMap::new(),
            now: row.clone(),
            unreadable: false,
            used: true,
        });
        v.row = row;
        v.unreadable = false;
        v.recompute(policy.as_deref(), tool);
    }

    /// The tool's row could not be decoded: its decisions go central until it is read.
    fn unreadable(&self, tool: &str) {
        if let Some(v) = self.lock().get_mut(tool) {
            v.unreadable = true;
        }
    }

    /// The tools viewed.
    pub(crate) fn tools(&self) -> Vec<String> {
        self.lock().keys().cloned().collect()
    }

    /// Outcomes not folded into rows yet, in all.
    pub(crate) fn pending(&self) -> usize {
        self.lock().values().map(|v| v.pending.len()).sum()
    }

    /// The tools with outcomes pending, and those outcomes (taken out).
    fn take_pending(&self) -> Vec<(String, Vec<Observed>)> {
        self.lock()
            .iter_mut()
            .filter(|(_, v)| !v.pending.is_empty())
            .map(|(t, v)| (t.clone(), std::mem::take(&mut v.pending)))
            .collect()
    }

    /// A flush of `outcomes` failed for certain: they go back before any seen since,
    /// and the view is the row with all of them on top again.
    fn restore(&self, tool: &str, mut outcomes: Vec<Observed>) {
        let policy = self.policy();
        if let Some(v) = self.lock().get_mut(tool) {
            outcomes.append(&mut v.pending);
            v.pending = outcomes;
            v.recompute(policy.as_deref(), tool);
        }
    }

    /// The views no decision read since the last refresh, with nothing pending or queued, whose
    /// breaker is idle by the gate's rule ([`Idle::tool`]) are dropped (their rows hold
    /// all they knew); the rest are marked unread. How many were dropped.
    fn drop_idle(&self) -> usize {
        let Some(policy) = self.policy() else {
            return 0;
        };
        let idle = Idle {
            policy: &policy,
            now_ms: self.now_ms.load(Ordering::Relaxed),
        };
        let mut views = self.lock();
        let before = views.len();
        views.retain(|_, v| {
            let keep =
                v.used || v.unreadable || v.unflushed() > 0 || !idle.tool(&only(v.now.clone()));
            v.used = false;
            keep
        });
        before - views.len()
    }
}

/// Every tool's pending outcomes folded into its row, one transaction per tool (the
/// row locked, the outcomes folded in order by the core's rule, written, committed),
/// and the view set to what was written. A tool whose flush failed for certain keeps
/// its outcomes for the next time; one whose COMMIT went unanswered lets them go (it
/// may have committed: folded again, they would count twice).
pub(crate) fn flush(central: &Postgres, views: &Views, out: &mut BreakersTicked) {
    if let Some(policy) = views.policy() {
        for (tool, outcomes) in views.take_pending() {
            match flush_one(central, views, &policy, &tool, outcomes) {
                Flushed::Done => out.flushed += 1,
                Flushed::Unsure => out.flush_unsure += 1,
                Flushed::Failed(outcomes) => {
                    views.restore(&tool, outcomes);
                    out.flush_failed += 1;
                }
            }
        }
    }
    out.unflushed = views.pending();
}

/// How one tool's flush ended.
enum Flushed {
    Done,
    /// The COMMIT was sent and not answered: the outcomes are let go.
    Unsure,
    /// Not committed, for certain: the outcomes, to keep.
    Failed(Vec<Observed>),
}

/// One tool's flush, in the central backend's turn, taken before any decision waiting
/// (no decision of this holder between its read and its view's update).
fn flush_one(
    central: &Postgres,
    views: &Views,
    policy: &Policy,
    tool: &str,
    outcomes: Vec<Observed>,
) -> Flushed {
    let Ok(mut t) = central.begin_first() else {
        return Flushed::Failed(outcomes);
    };
    let written = (|| {
        let row = t.load_tool(tool)?;
        let state = fold(policy, tool, row, &outcomes);
        let breaker = state.breaker.clone();
        t.tools.insert(tool.to_owned(), state);
        t.write(None, Some(tool), None, true)?;
        views.seen(tool, breaker);
        Ok::<(), GateError>(())
    })();
    match written {
        Ok(()) => Flushed::Done,
        Err(_) if t.unsure => Flushed::Unsure,
        Err(_) => Flushed::Failed(outcomes),
    }
}

/// The views dropped idle, then every viewed tool's row read again (not locked), each
/// decoded apart: each view is its row with what is pending here folded on top; a
/// view whose row the decoder refuses sends its decisions the central way (where
/// reading the row fails the same way: refused, never decided on a guess).
pub(crate) fn refresh(central: &Postgres, views: &Views, out: &mut BreakersTicked) {
    if views.tools().is_empty() {
        return;
    }
    let read = (|| {
        let mut t = central.begin_first()?;
        // In the turn: no decision is between reading a view and leaving its outcomes.
        out.dropped = views.drop_idle();
        let tools = views.tools();
        if tools.is_empty() {
            return Ok(Vec::new());
        }
        t.breakers_of(&tools)
    })();
    let Ok(rows) = read else {
        out.refresh_failed = true;
        return;
    };
    for (name, breaker) in rows {
        match breaker {
            Ok(breaker) => views.seen(&name, breaker),
            Err(_) => {
                views.unreadable(&name);
                out.unreadable += 1;
            }
        }
    }
}

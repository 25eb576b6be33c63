//! Replay, consistency audit, loops and handoffs over verified, decrypted decisions: one
//! fold through the policy core.
//!
//! Feed every [`Event`] of a verified ledger, in seq order, to [`Analysis::push`], then
//! [`Analysis::finish`] for a [`Report`]. Each record is applied once to its run's state
//! by the core ([`tally_policy::apply`], which the gate decided with); what the core's
//! [`tally_policy::judge`] finds is the audit, what its `decide` would have decided
//! differently is the replay, what its loop, retry, poll and breaker rules refused is a
//! loop, and its state at the end is each run's handoff. Nothing here counts or judges on
//! its own: the reports only turn the core's verdicts into text and JSON
//! ([`render_loops_text`], [`render_findings_text`], [`render_handoffs_text`], and the
//! `*_json` functions, schemas in `docs/REPORTS.md`).
//!
//! Memory is bounded by the runs the ledger holds and the core's own per-run bounds,
//! never by the number of decisions.
//!
//! Modules depend one way, each only on those before it (checked by `tests/layers.rs`):
//! `names`, `findings`, `loops`, `handoff` (the handoff's types), `report`, `run` (one
//! run's fold; it builds the run's handoff), `refill` (the refill chains a start
//! makes, judged by the core), `leases` (the leased slices and the decisions made on
//! them, against their bounds and their scopes' caps), `render`; this root ties them
//! together.

mod findings;
mod handoff;
mod leases;
mod loops;
mod names;
mod refill;
mod render;
mod report;
mod run;

use std::collections::HashMap;
use std::sync::Arc;

use serde::Serialize;
use tally_ledger::{Decision, Kind, Reason};
use tally_policy::{Keyed, Now, Policy, Recorded, RunCount, RunState, ViewMut};

pub use findings::AuditFinding;
pub use handoff::{
    Attempts, Completed, Coverage, Handoff, LedgerCoverage, Observed, Pending, PendingStatus,
    PollsUsed, ResumeAction, ResumeStep, Spend, StopReason, StopStatus, UnsafeAction, UnsafeKind,
    When,
};
pub use loops::{Clock, Loop, LoopEnd, Pattern, PollEvidence};
pub use render::{
    render_findings_json, render_findings_text, render_handoffs_json, render_handoffs_text,
    render_leases_text, render_loops_json, render_loops_text, render_overruns_text,
    render_usage_refused_text, REPORT_VERSION,
};
pub use report::{Cap, LeaseAmounts, Overrun, RefusedUsage, Report, ScopeLeases};
pub use tally_policy::{Dimension, Inconsistency};

use crate::replay::{self, ReplayKind, ReplayReport};
use crate::Event;
use loops::ToolStorms;
use names::Names;
use run::RunAnalysis;

/// What the analysis reads runs under. `Config::default()` holds the documented
/// defaults.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Config {
    /// The policy a run with no recorded policy (one the gate did not start) is read
    /// under: its exempt tools, loop breakers, retries, polling rules and approvers. A
    /// run the gate governs is always read under the policy its records name. Default
    /// `Policy::default()`, the gate's defaults.
    #[serde(skip)]
    pub policy: Arc<Policy>,
    /// Findings reported per run; the rest are counted in `findings_omitted`.
    /// Default 1000.
    pub max_findings_per_run: u64,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            policy: Arc::new(Policy::default()),
            max_findings_per_run: 1000,
        }
    }
}

/// A recorded policy: as the gate enforced it, and as replay applies it offline.
#[derive(Debug)]
struct RecordedPolicy {
    offline: Arc<Policy>,
}

/// The streaming analysis: push events in seq order, then finish.
#[derive(Debug)]
pub struct Analysis {
    config: Config,
    /// The policy the config names, as applied offline.
    default_policy: Arc<Policy>,
    /// Every run, in order of its first record.
    runs: Vec<RunAnalysis>,
    /// Where each run is in `runs`, by name.
    index: crate::hash::Map<String, usize>,
    /// Policies the ledger recorded, by digest.
    policies: crate::hash::Map<String, RecordedPolicy>,
    /// Credentials' spend, from every run under them (their backstop).
    credentials: crate::hash::Map<String, tally_policy::CredentialState>,
    /// Principals' use of their budgets, from every run each uid owns.
    principals: crate::hash::Map<u32, tally_policy::PrincipalState>,
    storms: ToolStorms,
    names: Names,
    loops: Vec<Loop>,
    findings: Vec<AuditFinding>,
    findings_omitted: u64,
    overruns: Vec<Overrun>,
    usage_refused: Vec<RefusedUsage>,
    replay: ReplayReport,
    /// Which starts continue the run they name (the refill chains).
    links: refill::Links,
    /// The leased slices and the decisions made on them.
    leases: leases::Leases,
    /// The keys of the tools, operations and remote operations calls name, each hashed
    /// once.
    name_keys: tally_policy::NameKeys,
}

/// What one record is judged under, as the fold's steps share it.
struct Judged<'a> {
    e: &'a Event,
    policy: &'a Policy,
    /// The record's time on its run's clock, and as the core reads it.
    at: When,
    now: Now,
    /// Whether the gate governs the run.
    governed: bool,
    /// The credential and principal whose budgets the record counts against.
    credential: Option<String>,
    principal_uid: Option<u32>,
}

/// The run at `slot` and, apart from it, its parent's at `parent_at`: both changed by
/// one record.
fn family(
    runs: &mut [RunAnalysis],
    slot: usize,
    parent_at: Option<usize>,
) -> (&mut RunAnalysis, Option<&mut RunAnalysis>) {
    match parent_at {
        Some(p) if p < slot => {
            let (low, high) = runs.split_at_mut(slot);
            (&mut high[0], Some(&mut low[p]))
        }
        Some(p) => {
            let (low, high) = runs.split_at_mut(p);
            (&mut low[slot], Some(&mut high[0]))
        }
        None => (&mut runs[slot], None),
    }
}

/// A start continuing the run at `c`: the run at `slot` takes over the names its calls
/// were described by.
fn carry_names(runs: &mut [RunAnalysis], slot: usize, c: usize) {
    if c == slot {
        return;
    }
    let (run, old) = if c < slot {
        let (low, high) = runs.split_at_mut(slot);
        (&mut high[0], &low[c])
    } else {
        let (low, high) = runs.split_at_mut(c);
        (&mut low[slot], &high[0])
    };
    run.carry_names(old);
}

impl Analysis {
    /// A new analysis.
    pub fn new(config: Config) -> Analysis {
        Analysis {
            default_policy: Arc::new(replay::offline(&config.policy)),
            config,
            runs: Vec::new(),
            index: crate::hash::Map::default(),
            policies: crate::hash::Map::default(),
            credentials: crate::hash::Map::default(),
            principals: crate::hash::Map::default(),
            storms: ToolStorms::default(),
            names: Names::default(),
            loops: Vec::new(),
            findings: Vec::new(),
            findings_omitted: 0,
            overruns: Vec::new(),
            usage_refused: Vec::new(),
            replay: ReplayReport::default(),
            links: refill::Links::default(),
            leases: leases::Leases::default(),
            name_keys: tally_policy::NameKeys::default(),
        }
    }

    /// Take the next event. Events must arrive in seq order.
    pub fn push(&mut self, e: &Event) {
        let d = &e.decision;
        if d.kind() == Kind::Policy {
            match Recorded::from_ledger(d.policy_text.as_deref().unwrap_or("")) {
                Ok(r) => {
                    let offline = Arc::new(replay::offline(&r.policy));
                    self.policies.insert(r.digest, RecordedPolicy { offline });
                }
                Err(err) => self.replay.find(
                    e.seq,
                    "",
                    ReplayKind::InvalidPolicy {
                        why: err.to_string(),
                    },
                ),
            }
            return;
        }
        if d.kind() == Kind::Lease {
            self.leases.record(e);
            return;
        }
        let slot = match self.index.get(&d.run) {
            Some(&i) => i,
            None => {
                self.index.insert(d.run.clone(), self.runs.len());
                self.runs.push(RunAnalysis::new(&d.run, e));
                self.runs.len() - 1
            }
        };
        // The runs are taken out while one is folded, so its parent (another run) can be
        // changed beside it and the rest of the analysis beside both.
        let mut runs = std::mem::take(&mut self.runs);
        // A decision made on a leased slice: what it changed in its run's count is what
        // it used of the slice (`tally_policy::leased`).
        let before = d.lease.map(|_| RunCount::of(&runs[slot].core));
        self.fold(&mut runs, slot, e);
        if let (Some(id), Some(before)) = (d.lease, before) {
            let after = RunCount::of(&runs[slot].core);
            self.leases
                .decision(e, id, (before, after), &runs[slot].core);
        }
        self.runs = runs;
    }

    /// The policy a record of `run` is judged under: for a run the gate governs, the one
    /// the record names (else its start's); for any other run, the configured one.
    fn policy_for(&mut self, run: &mut RunAnalysis, e: &Event) -> Option<Arc<Policy>> {
        let d = &e.decision;
        let governed = if d.kind() == Kind::Start {
            d.policy.is_some()
        } else {
            run.digest.is_some()
        };
        if !governed {
            return Some(Arc::clone(&self.default_policy));
        }
        let call = matches!(d.kind(), Kind::Allow | Kind::Deny);
        if d.policy.is_none() && call {
            self.replay
                .find(e.seq, &d.run, ReplayKind::NotFromGate { record: d.kind() });
        }
        let digest = d.policy.as_ref().or(run.digest.as_ref())?;
        // Most records name the policy the one before them did.
        if let Some((cached, policy)) = &run.policy {
            if cached == digest {
                return Some(Arc::clone(policy));
            }
        }
        match self.policies.get(digest) {
            Some(p) => {
                run.policy = Some((digest.clone(), Arc::clone(&p.offline)));
                Some(Arc::clone(&p.offline))
            }
            None => {
                self.replay.find(
                    e.seq,
                    &d.run,
                    ReplayKind::UnknownPolicy {
                        digest: digest.clone(),
                    },
                );
                None
            }
        }
    }

    fn fold(&mut self, runs: &mut [RunAnalysis], slot: usize, e: &Event) {
        let d = &e.decision;
        let kind = d.kind();
        self.links.start(runs, &self.index, slot, d);
        // A start's family: its parent is carved from, the run it continues hands over
        // what must not be repeated.
        let parent_at = match (kind, &d.parent) {
            (Kind::Start, Some(p)) => self.index.get(p).copied().filter(|&p| p != slot),
            _ => None,
        };
        let continued = match (kind, &d.continues) {
            (Kind::Start, Some(c)) => self.index.get(c).map(|&c| runs[c].core.clone()),
            _ => None,
        };
        let (run, mut parent) = family(runs, slot, parent_at);
        let Some(policy) = self.policy_for(run, e) else {
            // A decision under a policy the ledger never recorded cannot be judged; the
            // replay reported it.
            return;
        };
        let j = self.judged(run, e, &policy);
        if j.governed && kind != Kind::Start {
            self.authority(run, e);
        }
        // What the rules say of a call before it counts: replay's decision, the loop
        // rules' verdicts.
        // Attempts a governed run's allow skips are counted first, so the allow is judged
        // (and decided again) on the state that counts them.
        let mut found = tally_policy::count_unrecorded(&mut run.core, d);
        let mut verdicts = run::Verdicts::default();
        // The call an allow or deny describes, hashed once for the rules, replay and the
        // fold.
        let keyed = matches!(kind, Kind::Allow | Kind::Deny)
            .then(|| Keyed::from_record_named(d, &mut self.name_keys));
        if let Some(keyed) = &keyed {
            verdicts = self.verdicts(run, &j, keyed);
            self.replay_call(run, &j, keyed);
        }
        self.list_settlement(run, e);
        // The one fold.
        found.extend(self.apply(
            &j,
            run,
            parent.as_mut().map(|p| &mut p.core),
            continued.as_ref(),
            keyed.as_ref(),
        ));
        if let (Kind::Start, Some(&c)) =
            (kind, d.continues.as_ref().and_then(|c| self.index.get(c)))
        {
            carry_names(runs, slot, c);
        }
        // A start refilling a budget beyond the allowance: the core's count, on the runs
        // as they stand (the one started is not in its own chain).
        found.extend(self.links.judge(&policy, runs, &self.index, d));
        let run = &mut runs[slot];
        self.keep_findings(run, e, found);
        run.describe(
            e,
            j.at,
            verdicts,
            &mut self.names,
            &mut self.storms,
            &policy,
            &mut self.loops,
        );
    }

    /// What a record of `run` is judged under: the policy, its time on the run's clock,
    /// whether the gate governs the run, and the credential and principal it counts
    /// against.
    fn judged<'a>(&self, run: &RunAnalysis, e: &'a Event, policy: &'a Policy) -> Judged<'a> {
        let d = &e.decision;
        let kind = d.kind();
        let at = run.when(d, e.wall_ms);
        let now = Now {
            wall_ms: run.core.start_wall_ms.saturating_add(at.run_ms),
            at_ms: Some(at.run_ms),
        };
        let governed = run.digest.is_some() || (kind == Kind::Start && d.policy.is_some());
        let credential = d
            .credential
            .clone()
            .or_else(|| run.core.credential.clone())
            .filter(|_| {
                matches!(
                    kind,
                    Kind::Allow | Kind::Deny | Kind::Outcome | Kind::Refund
                )
            });
        // The principal: for a start the starting uid, else the run's owner; only where
        // the policy gives the uid a budget (as the gate keeps one only then).
        let principal_uid = match kind {
            Kind::Start => d.uid,
            _ => run.core.owner_uid,
        }
        .filter(|u| governed && policy.principal(*u).is_some());
        Judged {
            e,
            policy,
            at,
            now,
            governed,
            credential,
            principal_uid,
        }
    }

    /// What the rules say of an allow or deny before it counts; for an
    /// `approval_required` refusal, the limit a grant would lift.
    fn verdicts(&self, run: &RunAnalysis, j: &Judged, keyed: &Keyed) -> run::Verdicts {
        let d = &j.e.decision;
        let breaker = d.tool.as_deref().and_then(|t| self.storms.breaker(t));
        let mut verdicts = run.verdicts(j.policy, keyed, j.at.run_ms, breaker, j.e.wall_ms);
        let recorded = d.reason.filter(|_| d.kind() == Kind::Deny);
        if recorded == Some(Reason::ApprovalRequired) {
            // The record names no cause: the core, deciding the call again on the
            // state before it, says which limit a grant would lift.
            let view = tally_policy::View {
                run: &run.core,
                tool: None,
                credential: j.credential.as_ref().and_then(|c| self.credentials.get(c)),
                principal: j.principal_uid.and_then(|u| self.principals.get(&u)),
                family: Default::default(),
            };
            let digest = d.policy.as_deref().unwrap_or("");
            verdicts.cause = tally_policy::decide(j.policy, digest, view, &keyed.call, j.now).cause;
        }
        verdicts
    }

    /// Replay: the core decides a governed run's call again, and a different decision
    /// is a finding (a decision the records cannot replay is taken as recorded).
    fn replay_call(&mut self, run: &RunAnalysis, j: &Judged, keyed: &Keyed) {
        let (e, policy, now) = (j.e, j.policy, j.now);
        let d = &e.decision;
        let recorded = d.reason.filter(|_| d.kind() == Kind::Deny);
        if !(j.governed && d.policy.is_some() && run.core.stop.is_none()) {
            return;
        }
        if recorded.is_some_and(replay::outside_the_records) {
            self.replay.taken_as_recorded += 1;
            return;
        }
        self.replay.replayed += 1;
        let cred = j.credential.as_ref().and_then(|c| self.credentials.get(c));
        let principal = j.principal_uid.and_then(|u| self.principals.get(&u));
        let digest = d.policy.as_deref().unwrap_or("");
        let period = j
            .principal_uid
            .and_then(|u| policy.principal(u))
            .map(|l| l.period_ms);
        if let Some(kind) = replay::judge(
            policy,
            digest,
            &run.core,
            (cred, principal),
            d,
            &keyed.call,
            recorded,
            now,
        ) {
            let at_edge = principal
                .zip(period)
                .is_some_and(|(p, period)| replay::near_period_end(p, period, now));
            if replay::about_principal(&kind) && at_edge {
                // Replay times a run by its start's ledger time, which trails
                // the gate's clock by the commit: at a period's edge the two
                // may roll it over a decision apart. Not judged.
                self.replay.replayed -= 1;
                self.replay.taken_as_recorded += 1;
            } else {
                self.replay.find(e.seq, &d.run, kind);
            }
        }
    }

    /// An outcome settling above its reservation, as the core counts it, or whose usage
    /// the proxy refused: listed.
    fn list_settlement(&mut self, run: &RunAnalysis, e: &Event) {
        let d = &e.decision;
        if let Some(o) = tally_policy::overrun(&run.core, d) {
            self.overruns.push(Overrun {
                seq: e.seq,
                run: d.run.clone(),
                attempt: o.attempt,
                reserved_nanos: o.reserved_nanos,
                settled_nanos: o.settled_nanos,
                overrun_nanos: o.excess().0,
            });
        }
        if let (Kind::Outcome, Some(why), Some(attempt)) = (d.kind(), d.usage_refused, d.attempt) {
            self.usage_refused.push(RefusedUsage {
                seq: e.seq,
                run: d.run.clone(),
                attempt,
                why,
                settled_nanos: d.settled().map_or(0, |n| n.0),
            });
        }
    }

    /// The one fold: the core applies the record to the run, its parent, and the
    /// credential's and principal's budgets, and says what was inconsistent.
    fn apply(
        &mut self,
        j: &Judged,
        run: &mut RunAnalysis,
        parent: Option<&mut RunState>,
        continued: Option<&RunState>,
        keyed: Option<&Keyed>,
    ) -> Vec<Inconsistency> {
        let cred_state = j
            .credential
            .as_ref()
            .map(|c| self.credentials.entry(c.clone()).or_default());
        let principal_state = j
            .principal_uid
            .map(|u| self.principals.entry(u).or_default());
        tally_policy::apply_keyed(
            j.policy,
            ViewMut {
                run: &mut run.core,
                tool: None,
                credential: cred_state,
                principal: principal_state,
                parent,
                continued,
            },
            &j.e.decision,
            keyed,
            j.now,
        )
    }

    /// The findings of a record: kept up to the per-run limit, counted beyond it.
    fn keep_findings(&mut self, run: &mut RunAnalysis, e: &Event, found: Vec<Inconsistency>) {
        for kind in found {
            run.findings += 1;
            if run.findings > self.config.max_findings_per_run {
                self.findings_omitted += 1;
            } else {
                self.findings.push(AuditFinding {
                    seq: e.seq,
                    run: e.decision.run.clone(),
                    kind,
                });
            }
        }
    }

    /// What only the gate writes, checked for a run it governs (SECURITY.md 5.7): who
    /// wrote the record, and whether its clock went back.
    fn authority(&mut self, run: &RunAnalysis, e: &Event) {
        let d: &Decision = &e.decision;
        let kind = d.kind();
        if kind == Kind::Refund {
            self.replay
                .find(e.seq, &d.run, ReplayKind::GateNeverWrites { record: kind });
        }
        if let Some(at) = d.at_ms.filter(|&at| at < run.core.last_ms) {
            self.replay.find(
                e.seq,
                &d.run,
                ReplayKind::ClockBackwards {
                    at_ms: at,
                    before_ms: run.core.last_ms,
                },
            );
        }
        // The operator's settlement (`tally settle`) is the operator's, under the
        // operator's uid: only the gate writes `operator`, for its operator socket.
        let by_operator = kind == Kind::Outcome && d.operator == Some(true);
        if matches!(kind, Kind::Allow | Kind::Deny | Kind::Outcome)
            && d.uid != run.core.owner_uid
            && !by_operator
        {
            self.replay
                .find(e.seq, &d.run, ReplayKind::NotOwner { uid: d.uid });
        }
    }

    /// Close every open series and build the report.
    pub fn finish(self) -> Report {
        let Analysis {
            mut runs,
            index,
            storms,
            mut loops,
            mut findings,
            mut findings_omitted,
            overruns,
            usage_refused,
            replay,
            default_policy,
            links,
            leases,
            policies,
            ..
        } = self;
        let cap = |kind, key: &str| lease_cap(&runs, &index, &policies, kind, key);
        let (lease_findings, lease_omitted, leases) = leases.finish(cap);
        findings.extend(lease_findings);
        findings_omitted += lease_omitted;
        for run in &mut runs {
            run.finish(&mut loops);
        }
        loops.extend(storms.finish(|r| index.get(r).and_then(|&i| runs[i].halt())));
        loops::dedupe(&mut loops);
        loops.sort_by_key(|l| (l.first_seq, l.last_seq));
        findings.sort_by_key(|f| f.seq);
        // Each run's loops, in report order: one pass over the loops, not one per run.
        let mut of_run: HashMap<&str, Vec<&Loop>> = HashMap::new();
        for l in &loops {
            for (i, r) in l.runs.iter().enumerate() {
                if !l.runs[..i].contains(r) {
                    of_run.entry(r.as_str()).or_default().push(l);
                }
            }
        }
        let handoffs = runs
            .iter()
            .map(|run| {
                let loops = of_run.get(run.name.as_str()).map_or(&[][..], Vec::as_slice);
                let mut h = run::build_handoff(run, loops, run.findings);
                let policy = run.policy.as_ref().map_or(&default_policy, |(_, p)| p);
                links.show(policy, &runs, &index, run, &mut h);
                h
            })
            .collect();
        Report {
            loops,
            findings,
            findings_omitted,
            overruns,
            usage_refused,
            replay,
            handoffs,
            leases,
        }
    }

    /// The analysis on a thread of its own, fed in batches: the walk that verifies and
    /// decrypts goes on while the fold runs (it is the walk's thread that bounds
    /// `verify --auditor-key`'s speed otherwise). Events arrive in the order pushed. If
    /// no thread can be started, it runs on the caller's.
    pub fn in_background(config: Config) -> Background {
        let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<Event>>(BACKGROUND_BATCHES);
        let inline = config.clone();
        let spawned = std::thread::Builder::new()
            .name("tally-analysis".into())
            .spawn(move || {
                let mut analysis = Analysis::new(config);
                for batch in rx {
                    for e in &batch {
                        analysis.push(e);
                    }
                }
                analysis.finish()
            });
        match spawned {
            Ok(handle) => Background::Thread {
                tx,
                batch: Vec::with_capacity(BACKGROUND_BATCH),
                handle,
            },
            Err(_) => Background::Inline(Box::new(Analysis::new(inline))),
        }
    }

    /// Analyse a whole sequence of events.
    pub fn analyse<'a>(config: Config, events: impl IntoIterator<Item = &'a Event>) -> Report {
        let mut analysis = Analysis::new(config);
        for e in events {
            analysis.push(e);
        }
        analysis.finish()
    }
}

/// A scope's cap as the ledgers say it: a started run's from its start, a principal's
/// from the recorded policies' principal limits when they all give the uid the same;
/// otherwise (a credential, a bucket, a run not started here, policies that disagree or
/// say nothing) not known.
fn lease_cap(
    runs: &[RunAnalysis],
    index: &crate::hash::Map<String, usize>,
    policies: &crate::hash::Map<String, RecordedPolicy>,
    kind: tally_ledger::decision::LeaseScope,
    key: &str,
) -> Option<tally_ledger::decision::SliceAmounts> {
    use tally_ledger::decision::LeaseScope;
    match kind {
        LeaseScope::Run => {
            let run = &runs[*index.get(key)?].core;
            run.started.then(|| tally_policy::run_cap(&run.budget))
        }
        LeaseScope::Principal => {
            let uid: u32 = key.parse().ok()?;
            let mut limits = policies.values().map(|p| p.offline.principal(uid));
            let first = limits.next()??;
            limits
                .all(|l| l == Some(first))
                .then(|| tally_policy::principal_cap(first))
        }
        _ => None,
    }
}

/// Events handed to the background analysis at once. Few, so what the decryption
/// workers wrote is still in a cache when the fold reads it: a decision is about two
/// kilobytes, and 1,024 of them in each of five batches in flight (with the workers'
/// own) were read back from memory (measured in docs/PERFORMANCE.md).
const BACKGROUND_BATCH: usize = 128;
/// Batches queued for it at most (bounded memory: the walk waits beyond).
const BACKGROUND_BATCHES: usize = 2;

/// An [`Analysis`] running on its own thread ([`Analysis::in_background`]).
#[derive(Debug)]
pub enum Background {
    /// On its thread, fed batches.
    Thread {
        /// Where batches go.
        tx: std::sync::mpsc::SyncSender<Vec<Event>>,
        /// The batch being filled.
        batch: Vec<Event>,
        /// The thread, whose result is the report.
        handle: std::thread::JoinHandle<Report>,
    },
    /// On the caller's thread (no thread could be started).
    Inline(Box<Analysis>),
}

impl Background {
    /// Take the next event (in seq order).
    pub fn push(&mut self, e: Event) {
        match self {
            Background::Thread { tx, batch, .. } => {
                batch.push(e);
                if batch.len() >= BACKGROUND_BATCH {
                    let full = std::mem::replace(batch, Vec::with_capacity(BACKGROUND_BATCH));
                    // Fails only if the thread is gone (it panicked): `finish` says so.
                    let _ = tx.send(full);
                }
            }
            Background::Inline(a) => a.push(&e),
        }
    }

    /// Wait for the analysis of every event pushed, and its report.
    pub fn finish(self) -> Report {
        match self {
            Background::Thread { tx, batch, handle } => {
                let _ = tx.send(batch);
                drop(tx);
                handle
                    .join()
                    .unwrap_or_else(|p| std::panic::resume_unwind(p))
            }
            Background::Inline(a) => a.finish(),
        }
    }
}

/// The streaming replay alone: the analysis's one fold ([`Analysis`]),
/// whose replay report it returns. Push events in seq order, then finish.
#[derive(Debug)]
pub struct Replay(Analysis);

impl Default for Replay {
    fn default() -> Replay {
        Replay::new()
    }
}

impl Replay {
    /// A new replay.
    pub fn new() -> Replay {
        Replay(Analysis::new(Config::default()))
    }

    /// Take the next event.
    pub fn push(&mut self, e: &Event) {
        self.0.push(e);
    }

    /// The report.
    pub fn finish(self) -> ReplayReport {
        self.0.finish().replay
    }
}

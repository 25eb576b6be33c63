//! A merged audit: the ledgers of several hosts whose gates share one state (docs/FLEET.md)
//! read as one, so that each run gets one report and one handoff, and replay decides
//! every call again on the state the whole fleet left before it.
//!
//! Every record a gate writes carries the state version it was decided at
//! (`state_version`): one counter per state, taken once every scope the decision
//! touched is held. So of two decisions that touched a common run, tool or credential,
//! the later has the larger version, and merging the ledgers by version puts every
//! run's records in the order they were decided. Each ledger's own order is kept as it
//! is (a merge only interleaves); a record without a version (a policy record, a raw
//! append) goes with the versioned record before it in its ledger.
//!
//! What a merge can see wrong, it reports: versions that go backwards within a ledger
//! (its gate never numbers so), and one version in two ledgers (they were not written
//! on one state, or a record was copied).

use std::collections::HashMap;

use serde::Serialize;

use crate::event::{Event, Seq};

/// Most findings listed; the rest are counted.
pub const MAX_LISTED: usize = 1000;

/// What the merge found wrong with one record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[non_exhaustive]
pub enum MergeKind {
    /// The record's state version is below one its ledger recorded before it.
    VersionBackwards {
        /// Its version.
        version: u64,
        /// The highest version its ledger recorded before it.
        before: u64,
    },
    /// The record repeats the version of the record before it in its ledger, and the
    /// two are not both stop records: one gate operation writes several records at one
    /// version only when a kill stops a run and its descendants.
    VersionRepeated {
        /// The version.
        version: u64,
    },
    /// The version is past what any gate numbers (a PostgreSQL `bigint` sequence, or an
    /// embedded ledger's size): it would move the record past every other.
    VersionOutOfRange {
        /// The version.
        version: u64,
    },
    /// The run has records in several ledgers, some without a state version (written
    /// before its gates numbered their decisions, or not by a gate): the merge cannot
    /// order them, and what the audit says of the run's order across ledgers is unproven.
    Unordered,
    /// Another ledger recorded a decision at the same state version.
    VersionShared {
        /// The version.
        version: u64,
        /// The other ledger's record.
        other: Seq,
    },
}

/// One finding of the merge.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct MergeFinding {
    /// The record.
    pub seq: Seq,
    /// Its run.
    pub run: String,
    /// What is wrong.
    #[serde(flatten)]
    pub kind: MergeKind,
}

/// What a merge read and found.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct MergeReport {
    /// Decisions read, per ledger in the order given.
    pub decisions: Vec<u64>,
    /// Of those, how many carry a state version, per ledger.
    pub versioned: Vec<u64>,
    /// Findings, in merged order.
    pub findings: Vec<MergeFinding>,
    /// Findings beyond [`MAX_LISTED`].
    pub omitted: u64,
}

impl MergeReport {
    /// Whether the merge found nothing wrong.
    pub fn is_clean(&self) -> bool {
        self.findings.is_empty() && self.omitted == 0
    }

    /// The findings as text, one line each (empty if none).
    pub fn to_text(&self) -> String {
        use std::fmt::Write as _;
        let mut out = String::new();
        for f in &self.findings {
            let run = crate::text::shown(&f.run);
            let _ = match &f.kind {
                MergeKind::VersionBackwards { version, before } => writeln!(
                    out,
                    "seq {}  run {run}  state version {version} after {before} in the same ledger: its gate never numbers backwards",
                    f.seq
                ),
                MergeKind::VersionRepeated { version } => writeln!(
                    out,
                    "seq {}  run {run}  repeats state version {version} of the record before it: only a kill's stops share one",
                    f.seq
                ),
                MergeKind::VersionOutOfRange { version } => writeln!(
                    out,
                    "seq {}  run {run}  state version {version} is past what any gate numbers",
                    f.seq
                ),
                MergeKind::Unordered => writeln!(
                    out,
                    "seq {}  run {run}  has records in several ledgers, some without a state version: their order across ledgers is unknown",
                    f.seq
                ),
                MergeKind::VersionShared { version, other } => writeln!(
                    out,
                    "seq {}  run {run}  state version {version} is also seq {other}'s: the ledgers were not written on one state",
                    f.seq
                ),
            };
        }
        if self.omitted > 0 {
            let _ = writeln!(out, "... and {} more merge findings", self.omitted);
        }
        out
    }
}

struct RunSeen {
    first: usize,
    several: bool,
    unversioned: bool,
    reported: bool,
}

struct Source<I> {
    events: I,
    head: Option<Event>,
    /// The highest version read from this ledger so far (0 before any).
    key: u64,
    /// Whether the last versioned record read from it was a stop.
    last_stop: bool,
}

impl<I: Iterator<Item = Event>> Source<I> {
    fn open(mut events: I) -> Self {
        Source {
            head: events.next(),
            events,
            key: 0,
            last_stop: false,
        }
    }

    /// The key its head merges by: its version (a head without one goes with its
    /// ledger's last), never below its ledger's last; `None` once the ledger is read.
    fn head_key(&self) -> Option<u64> {
        let e = self.head.as_ref()?;
        Some(e.decision.state_version.unwrap_or(self.key).max(self.key))
    }

    /// Take its head and read the next.
    fn advance(&mut self) -> Option<Event> {
        let e = self.head.take()?;
        self.head = self.events.next();
        Some(e)
    }
}

impl MergeReport {
    /// List a finding, or count it past [`MAX_LISTED`].
    fn flag(&mut self, f: MergeFinding) {
        if self.findings.len() < MAX_LISTED {
            self.findings.push(f);
        } else {
            self.omitted += 1;
        }
    }

    /// List a finding about the record `e`.
    fn flag_at(&mut self, e: &Event, kind: MergeKind) {
        self.flag(MergeFinding {
            seq: e.seq,
            run: e.decision.run.clone(),
            kind,
        });
    }
}

/// Merge the events of several ledgers, each in its own order, into `sink` in state
/// version order. Events are renumbered: `Seq::ledger` is the source's place in
/// `sources` from 1, `Seq::order` the place in the merged order.
///
/// Equal keys (records without a version, or a version two ledgers claim) go in the
/// order of `ranks` (give each ledger's id: then the merged order, and so every finding,
/// does not depend on the order the ledgers were given in). A run with records in more
/// than one ledger, some without a version, cannot be ordered: it is reported
/// (`unordered`), once.
pub fn merge<I: Iterator<Item = Event>, R: Ord>(
    sources: Vec<(R, I)>,
    mut sink: impl FnMut(Event),
) -> MergeReport {
    let mut report = MergeReport {
        decisions: vec![0; sources.len()],
        versioned: vec![0; sources.len()],
        ..MergeReport::default()
    };
    let (ranks, sources): (Vec<R>, Vec<I>) = sources.into_iter().unzip();
    let mut sources: Vec<Source<I>> = sources.into_iter().map(Source::open).collect();
    // Per run: the first ledger it has records in, whether it has records in another,
    // whether any has no version, and whether it was reported unordered.
    let mut runs: HashMap<String, RunSeen> = HashMap::new();
    let mut order = 0u64;
    // The last versioned record given out: its version and where it is.
    let mut last: Option<(u64, Seq)> = None;
    while let Some(i) = next_source(&sources, &ranks) {
        let source = &mut sources[i];
        let Some(mut e) = source.advance() else {
            break;
        };
        let ledger = u16::try_from(i + 1).unwrap_or(u16::MAX);
        e.seq = Seq {
            order,
            ledger,
            seq: e.seq.seq,
        };
        order += 1;
        report.decisions[i] += 1;
        check_run(&mut report, &mut runs, i, &e);
        if let Some(v) = e.decision.state_version {
            report.versioned[i] += 1;
            let first = report.versioned[i] == 1;
            check_version(&mut report, source, first, &mut last, &e, v);
        }
        sink(e);
    }
    report
}

/// The source whose head comes first: by key (see [`Source::head_key`]), then by the
/// ledgers' ranks, then by the order they were given; `None` once every one is read.
fn next_source<I: Iterator<Item = Event>, R: Ord>(
    sources: &[Source<I>],
    ranks: &[R],
) -> Option<usize> {
    sources
        .iter()
        .enumerate()
        .filter_map(|(i, s)| Some((s.head_key()?, &ranks[i], i)))
        .min()
        .map(|(_, _, i)| i)
}

/// Note the record's run as seen in ledger `i`, and report the run unordered (once)
/// when it has records in several ledgers and some without a version. Policy and
/// lease records belong to no run.
fn check_run(report: &mut MergeReport, runs: &mut HashMap<String, RunSeen>, i: usize, e: &Event) {
    if matches!(
        e.decision.kind(),
        tally_ledger::Kind::Policy | tally_ledger::Kind::Lease
    ) {
        return;
    }
    let run = runs.entry(e.decision.run.clone()).or_insert(RunSeen {
        first: i,
        several: false,
        unversioned: false,
        reported: false,
    });
    run.several |= run.first != i;
    run.unversioned |= e.decision.state_version.is_none();
    if run.several && run.unversioned && !run.reported {
        run.reported = true;
        report.flag_at(e, MergeKind::Unordered);
    }
}

/// Check the version `v` of the record `e`, read from `source` (`first`: its ledger's
/// first versioned record), against its ledger's versions before it and the last
/// versioned record given out (`last`, moved on to `e` unless its version went back).
fn check_version<I>(
    report: &mut MergeReport,
    source: &mut Source<I>,
    first: bool,
    last: &mut Option<(u64, Seq)>,
    e: &Event,
    v: u64,
) {
    let stop = e.decision.kind() == tally_ledger::Kind::Stop;
    let repeated = v == source.key && !first;
    if repeated && !(stop && source.last_stop) {
        report.flag_at(e, MergeKind::VersionRepeated { version: v });
    }
    source.last_stop = stop;
    if v > i64::MAX as u64 {
        report.flag_at(e, MergeKind::VersionOutOfRange { version: v });
    }
    if v < source.key {
        let before = source.key;
        report.flag_at(e, MergeKind::VersionBackwards { version: v, before });
        return;
    }
    source.key = v;
    if let Some((lv, other)) = *last {
        if lv == v && other.ledger != e.seq.ledger {
            report.flag_at(e, MergeKind::VersionShared { version: v, other });
        }
    }
    *last = Some((v, e.seq));
}

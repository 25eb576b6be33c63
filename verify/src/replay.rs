//! Replay (SECURITY.md 5.8): every `allow` and `deny` the gate recorded is decided again, offline,
//! by the same policy core (`tally_policy::decide`) under the policy the ledger says was
//! in force, on the state the ledger's own earlier decisions give (`tally_policy::apply`).
//! Each decision the policy would not have made is reported with its seq.
//!
//! What replay cannot re-derive from the ledger alone it does not judge: refusals that
//! come from state outside the run's records (rate buckets, the shared breaker, a pause,
//! an unavailable gate) are taken as recorded, and replay decides with those checks off.
//! Runs not started through the gate (their start names no policy) are left to the
//! consistency audit.

use crate::event::Seq;
use std::collections::BTreeMap;

use serde::Serialize;
use tally_ledger::{Decision, Kind, Reason};
use tally_policy::{apply, decide, Call, Now, Recorded, RunState, Verdict, View, ViewMut};

use crate::Event;

/// Refusals whose cause is not in the run's records: replay takes them as recorded.
const OUTSIDE_THE_RECORDS: &[Reason] = &[
    Reason::RateLimitExceeded,
    Reason::CircuitOpen,
    Reason::RunPaused,
    Reason::GateUnavailable,
];

/// Most findings listed; the rest are counted.
pub const MAX_LISTED: usize = 1000;

/// Most skipped attempts marked allowed one by one (a forged attempt number may be huge;
/// the count of attempts used takes the whole gap anyway).
const MAX_GAP: u64 = 4096;

/// What replay found wrong with one recorded decision.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[non_exhaustive]
pub enum ReplayKind {
    /// Recorded `allow`; the policy refuses the call.
    AllowedAgainstPolicy {
        /// What the policy says.
        would: Reason,
    },
    /// Recorded a refusal; the policy allows the call.
    RefusedAgainstPolicy {
        /// The recorded reason.
        recorded: Reason,
    },
    /// Both refuse, for different reasons.
    ReasonDiffers {
        /// The recorded reason.
        recorded: Reason,
        /// What the policy says.
        would: Reason,
    },
    /// An allow or deny in a gate-governed run that names no policy: the gate did not
    /// write it (SECURITY.md 5.7).
    NotFromGate {
        /// The record's kind.
        record: Kind,
    },
    /// A decision names a policy the ledger never recorded before it.
    UnknownPolicy {
        /// The digest named.
        digest: String,
    },
    /// A start whose granted budget is not what the policy grants for what it shows
    /// (beyond the ceiling, or beyond the parent's remaining budget).
    BudgetBeyondPolicy,
    /// A kind of record the gate never writes in a run it governs (a refund).
    GateNeverWrites {
        /// The record's kind.
        record: Kind,
    },
    /// The run's clock went backwards: the gate's never does.
    ClockBackwards {
        /// The record's run time.
        at_ms: u64,
        /// The latest run time before it.
        before_ms: u64,
    },
    /// A call's decision or outcome recorded under another uid than the run's owner.
    NotOwner {
        /// The uid recorded.
        uid: Option<u32>,
    },
    /// The allow differs from the policy's in a field (its attempt number, or a
    /// timeout past the run's deadline).
    FieldDiffers {
        /// The field.
        field: &'static str,
    },
    /// The allow's attempt number skips attempts that no record given allows: the
    /// gate's state issued them and no ledger read records them (a networked gate
    /// killed between committing its state and recording, docs/FLEET.md; or a ledger of
    /// the fleet not given). Replay goes on as if they were allowed and never settled.
    AttemptsUnrecorded {
        /// The first attempt skipped.
        from: u64,
        /// The last attempt skipped.
        to: u64,
    },
    /// A policy record whose text is not a valid policy.
    InvalidPolicy {
        /// Why.
        why: String,
    },
}

/// One replay finding.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ReplayFinding {
    /// The record's seq.
    pub seq: Seq,
    /// Its run.
    pub run: String,
    /// What is wrong.
    #[serde(flatten)]
    pub kind: ReplayKind,
}

impl std::fmt::Display for ReplayFinding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let run = crate::text::shown(&self.run);
        match &self.kind {
            ReplayKind::AllowedAgainstPolicy { would } => write!(
                f,
                "seq {}  run {run}  allowed, but the recorded policy refuses it: {would}",
                self.seq
            ),
            ReplayKind::RefusedAgainstPolicy { recorded } => write!(
                f,
                "seq {}  run {run}  refused ({recorded}), but the recorded policy allows it",
                self.seq
            ),
            ReplayKind::ReasonDiffers { recorded, would } => write!(
                f,
                "seq {}  run {run}  refused for {recorded}, but the recorded policy refuses for {would}",
                self.seq
            ),
            ReplayKind::NotFromGate { record } => write!(
                f,
                "seq {}  run {run}  {record} names no policy in a run the gate governs: not written by the gate",
                self.seq
            ),
            ReplayKind::UnknownPolicy { digest } => write!(
                f,
                "seq {}  run {run}  decided under policy {}, which the ledger never recorded",
                self.seq,
                crate::text::shown(digest)
            ),
            ReplayKind::BudgetBeyondPolicy => write!(
                f,
                "seq {}  run {run}  started with a budget the recorded policy does not grant",
                self.seq
            ),
            ReplayKind::GateNeverWrites { record } => write!(
                f,
                "seq {}  run {run}  a {record} record in a run the gate governs: the gate never writes one",
                self.seq
            ),
            ReplayKind::ClockBackwards { at_ms, before_ms } => write!(
                f,
                "seq {}  run {run}  run time {at_ms} ms after {before_ms} ms: the gate's clock never goes back",
                self.seq
            ),
            ReplayKind::NotOwner { uid } => write!(
                f,
                "seq {}  run {run}  recorded for uid {}, not the run's owner",
                self.seq,
                uid.map_or("none".to_owned(), |u| u.to_string())
            ),
            ReplayKind::FieldDiffers { field } => write!(
                f,
                "seq {}  run {run}  allowed with a `{field}` the recorded policy would not give",
                self.seq
            ),
            ReplayKind::AttemptsUnrecorded { from, to } => write!(
                f,
                "seq {}  run {run}  attempts {from}..={to} were issued and no ledger given records them (a gate killed before recording, or a ledger missing)",
                self.seq
            ),
            ReplayKind::InvalidPolicy { why } => {
                write!(
                    f,
                    "seq {}  policy record is not a valid policy: {}",
                    self.seq,
                    crate::text::shown(why)
                )
            }
        }
    }
}

/// What replay found.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ReplayReport {
    /// Gate decisions (allow or deny) decided again.
    pub replayed: u64,
    /// Refusals taken as recorded (their cause is outside the records).
    pub taken_as_recorded: u64,
    /// Findings, by seq (at most [`MAX_LISTED`]).
    pub findings: Vec<ReplayFinding>,
    /// Findings beyond the listed ones.
    pub omitted: u64,
}

impl ReplayReport {
    fn find(&mut self, seq: Seq, run: &str, kind: ReplayKind) {
        if self.findings.len() < MAX_LISTED {
            self.findings.push(ReplayFinding {
                seq,
                run: run.to_owned(),
                kind,
            });
        } else {
            self.omitted += 1;
        }
    }

    /// The report as text.
    pub fn to_text(&self) -> String {
        let mut out = format!(
            "Replay: {} gate decisions decided again under their recorded policy ({} refusals from outside the records taken as recorded): ",
            self.replayed, self.taken_as_recorded
        );
        let n = self.findings.len() as u64 + self.omitted;
        if n == 0 {
            out.push_str("every one is what the policy decides.\n");
        } else {
            out.push_str(&format!("{n} the policy would not have made.\n"));
            for f in &self.findings {
                out.push_str(&format!("  {f}\n"));
            }
            if self.omitted > 0 {
                out.push_str(&format!("  ... and {} more\n", self.omitted));
            }
        }
        out
    }
}

/// The streaming replay: push events in seq order, then finish.
#[derive(Debug, Default)]
pub struct Replay {
    /// Policies by digest, each with a copy whose cross-run checks are off.
    policies: BTreeMap<String, (Recorded, tally_policy::Policy)>,
    runs: BTreeMap<String, (String, RunState)>,
    /// Credentials' spend, from every run under them (their buckets are off offline).
    credentials: BTreeMap<String, tally_policy::CredentialState>,
    report: ReplayReport,
}

impl Replay {
    /// A new replay.
    pub fn new() -> Replay {
        Replay::default()
    }

    fn find(&mut self, seq: Seq, run: &str, kind: ReplayKind) {
        self.report.find(seq, run, kind);
    }

    /// Take the next event.
    pub fn push(&mut self, e: &Event) {
        let d = &e.decision;
        let kind = d.kind();
        if kind == Kind::Policy {
            let text = d.policy_text.as_deref().unwrap_or("");
            match Recorded::new(text) {
                Ok(r) => {
                    let mut offline = r.policy.clone();
                    // Buckets and in-flight bounds depend on every run's wall times: off.
                    offline.rate.run_per_sec = 0;
                    offline.rate.credential_per_sec = 0;
                    offline.rate.tool_per_sec = 0;
                    offline.rate.tool_in_flight = 0;
                    self.policies.insert(r.digest.clone(), (r, offline));
                }
                Err(err) => self.find(
                    e.seq,
                    "",
                    ReplayKind::InvalidPolicy {
                        why: err.to_string(),
                    },
                ),
            }
            return;
        }
        if kind == Kind::Start {
            let Some(digest) = d.policy.clone() else {
                return;
            };
            if !self.policies.contains_key(&digest) {
                self.find(e.seq, &d.run, ReplayKind::UnknownPolicy { digest });
                return;
            }
            // The budget it shows must be what the policy grants: no more than the ceiling
            // for its credential, nor than its parent had left.
            if let (Some((_, policy)), Some(granted)) = (self.policies.get(&digest), &d.budget) {
                let parent = d
                    .parent
                    .as_ref()
                    .and_then(|p| self.runs.get(p))
                    .map(|r| &r.1);
                let again = tally_policy::grant_budget(
                    policy,
                    Some(granted),
                    d.credential.as_deref(),
                    parent,
                );
                if &again != granted {
                    self.find(e.seq, &d.run, ReplayKind::BudgetBeyondPolicy);
                }
            }
            let entry = self
                .runs
                .entry(d.run.clone())
                .or_insert_with(|| (digest.clone(), RunState::new(&d.run)));
            if let Some((_, policy)) = self.policies.get(&entry.0) {
                let now = Now {
                    wall_ms: e.wall_ms,
                    at_ms: d.at_ms,
                };
                apply(policy, bare(&mut entry.1), d, now);
            }
            // What the gate did beside the start record: carry a continued run's unknown
            // writes over, carve a child's budget out of its parent.
            let old = d
                .continues
                .as_ref()
                .and_then(|c| self.runs.get(c))
                .map(|(_, r)| r.clone());
            let budget = d.budget.clone().unwrap_or_default();
            if let (Some(old), Some((_, new))) = (old, self.runs.get_mut(&d.run)) {
                tally_policy::state::carry_over(new, &old);
            }
            if let Some((_, parent)) = d.parent.as_ref().and_then(|p| self.runs.get_mut(p)) {
                tally_policy::delegate(parent, &budget);
            }
            return;
        }
        let Some((start_digest, _)) = self.runs.get(&d.run) else {
            return;
        };
        let start_digest = start_digest.clone();
        let call = matches!(kind, Kind::Allow | Kind::Deny);
        let digest = match (&d.policy, call) {
            (Some(p), _) => p.clone(),
            (None, true) => {
                self.find(e.seq, &d.run, ReplayKind::NotFromGate { record: kind });
                start_digest
            }
            (None, false) => start_digest,
        };
        // Borrowed apart, so the policy is read in place (not copied for every record).
        let Replay {
            policies,
            runs,
            credentials,
            report,
        } = self;
        let Some((_, policy)) = policies.get(&digest) else {
            report.find(e.seq, &d.run, ReplayKind::UnknownPolicy { digest });
            return;
        };
        let Some((_, run)) = runs.get_mut(&d.run) else {
            return;
        };
        let mut notes = Vec::new();
        if kind == Kind::Refund {
            notes.push(ReplayKind::GateNeverWrites { record: kind });
        }
        if let Some(at) = d.at_ms.filter(|&at| at < run.last_ms) {
            notes.push(ReplayKind::ClockBackwards {
                at_ms: at,
                before_ms: run.last_ms,
            });
        }
        if matches!(kind, Kind::Allow | Kind::Deny | Kind::Outcome) && d.uid != run.owner_uid {
            notes.push(ReplayKind::NotOwner { uid: d.uid });
        }
        let credential_name = d.credential.clone().or_else(|| run.credential.clone());
        let credential = credential_name.map(|c| credentials.entry(c).or_default());
        let now = Now {
            wall_ms: run.start_wall_ms.saturating_add(d.at_ms.unwrap_or(0)),
            at_ms: d.at_ms,
        };
        // Attempts the state issued that no record given allows: counted as the state
        // counted them (used, never settled), so what follows is judged on that state.
        if let (Kind::Allow, Some(_), Some(attempt)) = (kind, &d.policy, d.attempt) {
            let expected = run.last_attempt.saturating_add(1);
            if attempt > expected && !run.allowed.contains(attempt) {
                let to = attempt - 1;
                for skipped in expected..=to.min(expected.saturating_add(MAX_GAP)) {
                    run.allowed.insert(skipped);
                }
                run.attempts_used = run.attempts_used.saturating_add(to - expected + 1);
                run.last_attempt = to;
                notes.push(ReplayKind::AttemptsUnrecorded { from: expected, to });
            }
        }
        let mut finding = None;
        if call && d.policy.is_some() && run.stop.is_none() {
            let recorded = d.reason.filter(|_| kind == Kind::Deny);
            if recorded.is_some_and(|r| OUTSIDE_THE_RECORDS.contains(&r)) {
                report.taken_as_recorded += 1;
            } else {
                report.replayed += 1;
                finding = judge(
                    policy,
                    &digest,
                    run,
                    credential.as_deref(),
                    d,
                    recorded,
                    now,
                );
            }
        }
        let view = ViewMut {
            run,
            tool: None,
            credential,
        };
        apply(policy, view, d, now);
        for kind in notes {
            report.find(e.seq, &d.run, kind);
        }
        if let Some(kind) = finding {
            report.find(e.seq, &d.run, kind);
        }
    }

    /// The report.
    pub fn finish(self) -> ReplayReport {
        self.report
    }
}

fn bare(run: &mut RunState) -> ViewMut<'_> {
    ViewMut {
        run,
        tool: None,
        credential: None,
    }
}

/// Decide the recorded call again; what differs, if anything.
fn judge(
    policy: &tally_policy::Policy,
    digest: &str,
    run: &RunState,
    credential: Option<&tally_policy::CredentialState>,
    d: &Decision,
    recorded: Option<Reason>,
    now: Now,
) -> Option<ReplayKind> {
    let view = View {
        run,
        tool: None,
        credential,
    };
    let again = decide(policy, digest, view, &Call::from_record(d), now);
    let would = match again.verdict {
        Verdict::Allow => None,
        Verdict::Deny | Verdict::RequireApproval => again.reason(),
    };
    if recorded.is_none() && would.is_none() {
        if again.record.attempt != d.attempt {
            return Some(ReplayKind::FieldDiffers { field: "attempt" });
        }
        if again.record.timeout_ms != d.timeout_ms {
            return Some(ReplayKind::FieldDiffers {
                field: "timeout_ms",
            });
        }
    }
    match (recorded, would) {
        (None, None) => None,
        (None, Some(would)) => Some(ReplayKind::AllowedAgainstPolicy { would }),
        (Some(recorded), None) => Some(ReplayKind::RefusedAgainstPolicy { recorded }),
        (Some(r), Some(w)) if r != w => Some(ReplayKind::ReasonDiffers {
            recorded: r,
            would: w,
        }),
        _ => None,
    }
}

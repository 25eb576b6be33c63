//! Text for people and JSON for programs (schemas in `docs/REPORTS.md`).

use std::fmt::Write;

use serde::Serialize;

use crate::text::{after_start, duration, plural, shown, utc};

use super::findings::AuditFinding;
use super::handoff::{Coverage, Handoff, PendingStatus, StopStatus, When};
use super::loops::{Clock, Loop, LoopEnd};
use super::Report;
use tally_policy::{Inconsistency, StartRefusal};

/// The version of the JSON report schemas; it changes only when a field is removed or
/// changes meaning (new fields may be added within a version).
pub const REPORT_VERSION: u32 = 2;

/// A moment, saying which clock each half is on: the run's own (from its first record
/// or the writer's `at_ms`) and the ledger's wall clock when it was recorded (a run
/// appended in one batch shows one recording time for all its records).
fn moment(w: When) -> String {
    format!("{}, recorded {}", after_start(w.run_ms), utc(w.wall_ms))
}

/// A tool and operation for people, every agent-supplied character shown escaped.
fn name(tool: Option<&str>, operation: Option<&str>) -> String {
    match (tool, operation) {
        (Some(t), Some(o)) if o != t => format!("{} ({})", shown(t), shown(o)),
        (Some(t), _) => shown(t).into_owned(),
        (None, Some(o)) => shown(o).into_owned(),
        (None, None) => "(no tool)".to_owned(),
    }
}

/// Names joined for people, each escaped.
fn names(list: &[String]) -> String {
    list.iter()
        .map(|n| shown(n).into_owned())
        .collect::<Vec<_>>()
        .join(", ")
}

fn loop_end(end: &LoopEnd) -> String {
    match end {
        LoopEnd::Refused { reason, seq } => format!("refused with {reason} at seq {seq}"),
        LoopEnd::RunStopped { reason, seq } => format!("the run stopped ({reason}) at seq {seq}"),
        LoopEnd::Succeeded { seq } => format!("a call succeeded at seq {seq}"),
        LoopEnd::Abandoned => "the agent stopped repeating by itself".to_owned(),
        LoopEnd::NeverStopped => "never stopped: still going when the ledger ends".to_owned(),
    }
}

/// The loops as text, one paragraph each.
pub fn render_loops_text(report: &Report) -> String {
    let mut out = String::new();
    if report.loops.is_empty() {
        out.push_str("No loops found.\n");
        return out;
    }
    let _ = writeln!(
        out,
        "{} found.",
        plural(report.loops.len() as u64, "loop", "loops")
    );
    for (i, l) in report.loops.iter().enumerate() {
        let _ = writeln!(out);
        let runs = match l.runs.as_slice() {
            [one] => format!("run {}", shown(one)),
            many => format!("{} runs ({})", many.len(), names(many)),
        };
        let _ = writeln!(
            out,
            "{}. {} in {runs}: {}",
            i + 1,
            l.pattern.as_str(),
            name(l.tool.as_deref(), l.operation.as_deref())
        );
        let span = match l.clock {
            Clock::Run => format!(
                "from {} to {} after the run started ({})",
                duration(l.first_ms),
                duration(l.last_ms),
                duration(l.span_ms)
            ),
            Clock::Wall => format!(
                "recorded {} .. {} ({})",
                utc(l.first_ms),
                utc(l.last_ms),
                duration(l.span_ms)
            ),
        };
        let _ = writeln!(
            out,
            "   {}, seq {}..{}, {span}",
            plural(l.count, "call", "calls"),
            l.first_seq,
            l.last_seq
        );
        let mut evidence = Vec::new();
        if l.failures > 0 {
            evidence.push(plural(l.failures, "failure", "failures"));
        }
        if l.ignored_retry_after > 0 {
            evidence.push(format!(
                "{} before the upstream's Retry-After",
                plural(l.ignored_retry_after, "call", "calls")
            ));
        }
        if let Some(p) = &l.poll {
            if p.over_allowance {
                match p.allowance {
                    Some(a) => evidence.push(format!("past its poll allowance of {a}")),
                    None => evidence.push("refused for its poll allowance".to_owned()),
                }
            }
            evidence.push(format!(
                "{} of observed state, longest stretch unchanged {}",
                plural(p.state_changes, "change", "changes"),
                plural(p.unchanged_polls, "poll", "polls")
            ));
            if let Some(s) = &p.last_observed {
                evidence.push(format!("last seen \"{}\"", shown(s)));
            }
        }
        if let Some(r) = &l.remote_ref {
            evidence.push(format!("remote operation {}", shown(r)));
        }
        if !evidence.is_empty() {
            let _ = writeln!(out, "   {}", evidence.join("; "));
        }
        let _ = writeln!(
            out,
            "   spend during the loop: {}¢ reserved, {}¢ settled",
            l.reserved_cents, l.settled_cents
        );
        if !l.workers.is_empty() {
            let _ = writeln!(out, "   workers: {}", names(&l.workers));
        }
        let _ = writeln!(out, "   ended: {}", loop_end(&l.ended_by));
    }
    out
}

fn finding_text(f: &Inconsistency) -> String {
    match f {
        Inconsistency::AllowBeyondLimit {
            dimension,
            used,
            limit,
        } => match dimension {
            tally_policy::Dimension::DeadlineMs => format!(
                "allowed {}, past the run's deadline of {}",
                after_start(*used),
                duration(limit.saturating_add(1))
            ),
            tally_policy::Dimension::SpendCents => format!(
                "allowed beyond its spend limit in force ({used}¢ of {limit}¢, approvals used \
                 and what its child runs took counted)"
            ),
            d => format!(
                "allowed beyond its {} limit in force ({used} of {limit}, approvals used and \
                 what its child runs took counted)",
                d.as_str().replace('_', " ")
            ),
        },
        Inconsistency::AllowAfterOverrun => "allowed after an overrun with no human grant of \
            cents since (no call is free after one: its outcome could settle any amount)"
            .to_owned(),
        Inconsistency::AfterStop { record, stop } => {
            format!("{record} record after the run stopped ({stop})")
        }
        Inconsistency::SecondStart => "the run started a second time".to_owned(),
        Inconsistency::StartBeyondGrant {
            dimension,
            granted,
            most,
        } => {
            let granted = if *granted == u64::MAX {
                "no limit".to_owned()
            } else {
                granted.to_string()
            };
            format!(
                "started with {} {granted}, more than could be granted ({most}: the policy's \
                 ceiling, or what its parent had left)",
                dimension.as_str().replace('_', " ")
            )
        }
        Inconsistency::StartRefused { refusal } => format!(
            "started though the gate refuses such a start: {}",
            match refusal {
                StartRefusal::ParentStopped => "its parent had stopped".to_owned(),
                other => other.to_string(),
            }
        ),
        Inconsistency::OutcomeWithoutAllow { attempt } => {
            format!("outcome for attempt {attempt}, which was never allowed")
        }
        Inconsistency::DuplicateOutcome { attempt } => format!(
            "an outcome for attempt {attempt} after it was settled (it had its final outcome, \
             or settled cents once already)"
        ),
        Inconsistency::RefundWithoutAttempt { of } => {
            format!("refund of attempt {of}, which was never allowed")
        }
        Inconsistency::RefundedTwice { of } => format!("attempt {of} refunded a second time"),
        Inconsistency::RepeatedUnknownWrite { attempt } => match attempt {
            0 => "non-idempotent write repeated while the same write of the run it continues \
                  had an unknown outcome, with no human approval"
                .to_owned(),
            a => format!(
                "non-idempotent write repeated while attempt {a}'s outcome was unknown, with \
                 no human approval"
            ),
        },
        Inconsistency::InvalidApproval { why } => {
            format!("approval not valid: {}", shown(why))
        }
        Inconsistency::GrantNotHeld { digest } => format!(
            "allowed on approval {}, which the run does not hold unused",
            shown(digest.get(..16).unwrap_or(digest))
        ),
        Inconsistency::GrantMismatch { digest } => format!(
            "allowed on approval {}, which approved another tool or operation",
            shown(digest.get(..16).unwrap_or(digest))
        ),
        Inconsistency::GrantExpired {
            digest,
            expires_ms,
            at_ms,
        } => format!(
            "allowed {} on approval {}, which expired {}",
            after_start(*at_ms),
            shown(digest.get(..16).unwrap_or(digest)),
            after_start(*expires_ms)
        ),
        Inconsistency::DuplicateAllow { attempt } => {
            format!("attempt {attempt} allowed a second time")
        }
        Inconsistency::AttemptsUnrecorded { from, to } => format!(
            "attempts {from}..={to} were issued and no ledger given records them (a gate \
             killed before recording, or a ledger of the fleet missing)"
        ),
        Inconsistency::Overflow { field } => {
            format!("{field} would overflow; counted as the largest number, never wrapped")
        }
        other => other.as_str().replace('_', " "),
    }
}

/// The audit findings as text, one line each.
pub fn render_findings_text(report: &Report) -> String {
    let mut out = String::new();
    let total = report.findings.len() as u64 + report.findings_omitted;
    if total == 0 {
        out.push_str(
            "No inconsistencies: every decision is consistent with its run's budget and history.\n",
        );
        return out;
    }
    let _ = writeln!(out, "{}.", plural(total, "finding", "findings"));
    for AuditFinding { seq, run, kind } in &report.findings {
        let _ = writeln!(
            out,
            "seq {seq}  run {}  {}: {}",
            shown(run),
            kind.as_str(),
            finding_text(kind)
        );
    }
    if report.findings_omitted > 0 {
        let _ = writeln!(
            out,
            "({} more not listed: over the per-run limit)",
            report.findings_omitted
        );
    }
    out
}

fn handoff_text(h: &Handoff, out: &mut String) {
    let goal = match (&h.goal, h.started) {
        (Some(g), _) => format!("\"{}\"", shown(g)),
        (None, true) => "(its start record gives no goal)".to_owned(),
        (None, false) => "(no start record)".to_owned(),
    };
    let _ = writeln!(out, "Run {}: {goal}", shown(&h.run));
    if let Some(p) = &h.parent {
        let _ = writeln!(out, "  Parent run: {}", shown(p));
    }
    if !h.workers.is_empty() {
        let _ = writeln!(out, "  Workers: {}", names(&h.workers));
    }
    let stop = match (h.stop.status, h.stop.reason) {
        (StopStatus::Stopped, Some(r)) => format!("stopped: {r}"),
        (StopStatus::Refused, Some(r)) => format!("refused with {r} (no stop record)"),
        _ => "still running (no stop record)".to_owned(),
    };
    let when = match (h.stop.seq, h.stop.at) {
        (Some(seq), Some(at)) => format!(" at seq {seq}, {}", moment(at)),
        _ => String::new(),
    };
    let _ = writeln!(out, "  Status: {stop}{when}");
    let mut attempts = match h.attempts.limit {
        Some(l) => format!("{} of {l}", h.attempts.used),
        None => format!("{} used (no limit)", h.attempts.used),
    };
    let mut notes = Vec::new();
    if h.attempts.approved_extra > 0 {
        notes.push(format!("{} granted by approval", h.attempts.approved_extra));
    }
    if h.attempts.carved_out > 0 {
        notes.push(format!(
            "{} carved out for child runs",
            h.attempts.carved_out
        ));
    }
    if h.attempts.refunded > 0 {
        notes.push(format!("{} refunded", h.attempts.refunded));
    }
    if !notes.is_empty() {
        let _ = write!(attempts, " ({})", notes.join(", "));
    }
    let _ = writeln!(out, "  Attempts: {attempts}");
    let mut spend_limit = h
        .spend
        .limit_cents
        .map_or("no limit".to_owned(), |l| format!("limit {l}¢"));
    if h.spend.approved_extra_cents > 0 {
        let _ = write!(
            spend_limit,
            ", {}¢ granted by approval",
            h.spend.approved_extra_cents
        );
    }
    if h.spend.carved_out_cents > 0 {
        let _ = write!(
            spend_limit,
            ", {}¢ carved out for child runs",
            h.spend.carved_out_cents
        );
    }
    let _ = writeln!(
        out,
        "  Spend: {}¢ reserved, {}¢ settled ({spend_limit})",
        h.spend.reserved_cents, h.spend.settled_cents
    );
    if h.spend.overrun_cents > 0 {
        let _ = writeln!(
            out,
            "  Overrun: {}¢ settled above what calls reserved (the upstream billed more); no call is allowed after an overrun until a human grants cents",
            h.spend.overrun_cents
        );
    }
    for p in &h.polls {
        let of = p
            .allowance
            .map_or_else(|| "no allowance".to_owned(), |a| format!("of {a}"));
        let _ = writeln!(out, "  Polls of {}: {} {of}", shown(&p.remote_ref), p.used);
    }
    if h.completed_total == 0 {
        let _ = writeln!(out, "  Completed: nothing.");
    } else {
        let listed = h.completed.len() as u64;
        let more = if listed < h.completed_total {
            format!(" (latest {listed} of {})", h.completed_total)
        } else {
            String::new()
        };
        let _ = writeln!(out, "  Completed{more}:");
        for c in &h.completed {
            let remote = c
                .remote_ref
                .as_deref()
                .map(|r| format!(" -> {}", shown(r)))
                .unwrap_or_default();
            let seen = c
                .observed
                .as_deref()
                .map(|s| format!(" \"{}\"", shown(s)))
                .unwrap_or_default();
            let cost = if c.settled_cents > 0 {
                format!(", {}¢", c.settled_cents)
            } else {
                String::new()
            };
            let _ = writeln!(
                out,
                "    - {}{remote}{seen} (seq {}{cost}, {})",
                name(c.tool.as_deref(), c.operation.as_deref()),
                c.seq,
                moment(c.at)
            );
        }
    }
    if h.pending.is_empty() {
        let _ = writeln!(out, "  Pending external work: none.");
    } else {
        let _ = writeln!(out, "  Pending external work:");
        for p in &h.pending {
            let state = match p.status {
                PendingStatus::Running => "still running",
                PendingStatus::Unknown => "OUTCOME UNKNOWN",
                PendingStatus::Timeout => "timed out, outcome unknown",
                PendingStatus::NoOutcome => "no outcome recorded",
            };
            let remote = p
                .remote_ref
                .as_deref()
                .map(|r| format!(" {}", shown(r)))
                .unwrap_or_default();
            let attempt = p
                .attempt
                .map(|a| format!(" attempt {a}"))
                .unwrap_or_default();
            let seen = p
                .observed
                .as_deref()
                .map(|s| format!(", last seen \"{}\"", shown(s)))
                .unwrap_or_default();
            let _ = writeln!(
                out,
                "    - {}{remote}{attempt}: {state}{seen} (seq {}, {})",
                name(p.tool.as_deref(), p.operation.as_deref()),
                p.seq,
                moment(p.since)
            );
        }
    }
    match &h.last_observed {
        Some(o) => {
            let remote = o
                .remote_ref
                .as_deref()
                .map(|r| format!(" of {}", shown(r)))
                .unwrap_or_default();
            let _ = writeln!(
                out,
                "  Last observed state{remote}: \"{}\" at seq {}, {}",
                shown(&o.state),
                o.seq,
                moment(o.at)
            );
        }
        None => {
            let _ = writeln!(out, "  Last observed state: none recorded.");
        }
    }
    let _ = writeln!(out, "  Safe to resume:");
    if h.safe_resume.is_empty() {
        let _ = writeln!(
            out,
            "    - nothing certain: read the loops and findings first"
        );
    }
    for s in &h.safe_resume {
        let when = s
            .not_before
            .map(|w| format!(", not before {}", moment(w)))
            .unwrap_or_default();
        let _ = writeln!(out, "    - {}{when}", shown(&s.what));
    }
    if h.unsafe_actions.is_empty() {
        let _ = writeln!(out, "  Must not repeat: nothing known.");
    } else {
        let _ = writeln!(out, "  Must not repeat:");
        for u in &h.unsafe_actions {
            let _ = writeln!(out, "    - {} (seq {})", shown(&u.what), u.seq);
        }
    }
    if h.loops > 0 || h.findings > 0 {
        let _ = writeln!(
            out,
            "  Evidence: {} and {} (see tally loops)",
            plural(h.loops, "loop", "loops"),
            plural(h.findings, "audit finding", "audit findings")
        );
    }
    let cover = match &h.checkpoint {
        Coverage::Covered { size, head, epoch } => format!(
            "covered by the checkpoint over {size} entries (head {}, epoch {epoch})",
            head.get(..16).unwrap_or(head)
        ),
        Coverage::NotYetSealed { sealed_size } => format!(
            "NOT YET SEALED: records up to seq {} are past the latest checkpoint ({sealed_size} entries)",
            h.last_seq
        ),
        Coverage::Ledgers { ledgers } => ledgers
            .iter()
            .map(|c| match (&c.head, c.covered) {
                (Some(head), true) => format!(
                    "ledger {}: covered by its checkpoint over {} entries (head {})",
                    c.ledger,
                    c.size,
                    head.get(..16).unwrap_or(head)
                ),
                _ => format!(
                    "ledger {}: NOT YET SEALED: records up to seq {}:{} are past its latest checkpoint ({} entries)",
                    c.ledger, c.ledger, c.last_seq, c.size
                ),
            })
            .collect::<Vec<_>>()
            .join("; "),
        Coverage::Unknown => "not determined".to_owned(),
    };
    let _ = writeln!(out, "  Checkpoint: {cover}");
}

/// The handoffs as text: every run's, or only `run`'s.
pub fn render_handoffs_text(report: &Report, run: Option<&str>) -> String {
    let mut out = String::new();
    let mut any = false;
    for h in report
        .handoffs
        .iter()
        .filter(|h| run.is_none_or(|r| r == h.run))
    {
        if any {
            out.push('\n');
        }
        any = true;
        handoff_text(h, &mut out);
    }
    if !any {
        match run {
            Some(r) => {
                let _ = writeln!(out, "No run named {} in this ledger.", shown(r));
            }
            None => out.push_str("No runs in this ledger.\n"),
        }
    }
    out
}

#[derive(Serialize)]
struct LoopsDoc<'a> {
    version: u32,
    loops: &'a [Loop],
}

#[derive(Serialize)]
struct FindingsDoc<'a> {
    version: u32,
    findings: &'a [AuditFinding],
    findings_omitted: u64,
}

#[derive(Serialize)]
struct HandoffsDoc<'a> {
    version: u32,
    handoffs: Vec<&'a Handoff>,
}

fn pretty(doc: &impl Serialize) -> String {
    // These documents have only string keys, so serialization cannot fail.
    let mut text = serde_json::to_string_pretty(doc).unwrap_or_default();
    text.push('\n');
    text
}

/// The loops as JSON: `{"version": 1, "loops": [...]}`.
pub fn render_loops_json(report: &Report) -> String {
    pretty(&LoopsDoc {
        version: REPORT_VERSION,
        loops: &report.loops,
    })
}

/// The findings as JSON: `{"version": 1, "findings": [...], "findings_omitted": n}`.
pub fn render_findings_json(report: &Report) -> String {
    pretty(&FindingsDoc {
        version: REPORT_VERSION,
        findings: &report.findings,
        findings_omitted: report.findings_omitted,
    })
}

/// The handoffs as JSON, every run's or only `run`'s: `{"version": 1, "handoffs": [...]}`.
pub fn render_handoffs_json(report: &Report, run: Option<&str>) -> String {
    pretty(&HandoffsDoc {
        version: REPORT_VERSION,
        handoffs: report
            .handoffs
            .iter()
            .filter(|h| run.is_none_or(|r| r == h.run))
            .collect(),
    })
}

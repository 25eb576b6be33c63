//! Text for people and JSON for programs (schemas in `docs/REPORTS.md`).

mod handoffs;

pub use handoffs::render_handoffs_text;

use std::fmt::Write;
use tally_record::money::Nanos;

use serde::Serialize;

use crate::text::{after_start, duration, plural, shown, utc};

use super::findings::AuditFinding;
use super::handoff::{Handoff, When};
use super::loops::{Clock, Loop, LoopEnd};
use super::report::Report;
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
        loop_text(&mut out, i, l);
    }
    out
}

/// One loop's paragraph: what repeated and where, how often and when, the evidence,
/// the spend meanwhile, the workers, and how it ended.
fn loop_text(out: &mut String, i: usize, l: &Loop) {
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
    let _ = writeln!(
        out,
        "   {}, seq {}..{}, {}",
        plural(l.count, "call", "calls"),
        l.first_seq,
        l.last_seq,
        loop_span(l)
    );
    let evidence = loop_evidence(l);
    if !evidence.is_empty() {
        let _ = writeln!(out, "   {}", evidence.join("; "));
    }
    let model = match l.model_spend_nanos {
        Some(m) if m > 0 => format!("; model calls meanwhile settled {}", Nanos(m)),
        _ => String::new(),
    };
    let _ = writeln!(
        out,
        "   spend during the loop: {} reserved, {} settled{model}",
        Nanos(l.reserved_nanos),
        Nanos(l.settled_nanos)
    );
    if !l.workers.is_empty() {
        let _ = writeln!(out, "   workers: {}", names(&l.workers));
    }
    let _ = writeln!(out, "   ended: {}", loop_end(&l.ended_by));
}

/// When a loop ran, on the clock its calls were timed by.
fn loop_span(l: &Loop) -> String {
    match l.clock {
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
    }
}

/// What shows a loop is one: failures, calls before Retry-After, a poll's allowance and
/// what it observed, the remote operation it waited on.
fn loop_evidence(l: &Loop) -> Vec<String> {
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
    evidence
}

/// An inconsistency for people: what the record shows and why it should not have been.
fn finding_text(f: &Inconsistency) -> String {
    limit_text(f)
        .or_else(|| settlement_text(f))
        .or_else(|| lifecycle_text(f))
        .or_else(|| attempt_text(f))
        .or_else(|| approval_text(f))
        .or_else(|| lease_text(f))
        .unwrap_or_else(|| f.as_str().replace('_', " "))
}

/// A finding about a run's limits: allowed beyond one or after an overrun, started
/// beyond its grant, or refilled by restarting without approval.
fn limit_text(f: &Inconsistency) -> Option<String> {
    Some(match f {
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
            tally_policy::Dimension::SpendNanos => format!(
                "allowed beyond its spend limit in force ({} of {}, approvals used and what \
                 its child runs took counted)",
                Nanos(*used),
                Nanos(*limit)
            ),
            d => format!(
                "allowed beyond its {} limit in force ({used} of {limit}, approvals used and \
                 what its child runs took counted)",
                d.as_str().replace('_', " ")
            ),
        },
        Inconsistency::AllowAfterOverrun => "allowed after an overrun with no human grant of \
            spend since (no call is free after one: its outcome could settle any amount)"
            .to_owned(),
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
        Inconsistency::RefillWithoutApproval {
            predecessor,
            continuations,
            allowance,
        } => format!(
            "started continuing {}, which a stop refusal ended, with no human's approval: \
             unapproved continuation {continuations} in a row, beyond the {allowance} the \
             policy allows (a budget refilled by restarting)",
            shown(predecessor)
        ),
        _ => return None,
    })
}

/// A finding about what was reserved and settled: below the price, a misrecorded
/// overrun, a count that would overflow.
fn settlement_text(f: &Inconsistency) -> Option<String> {
    Some(match f {
        Inconsistency::ReserveBelowPrice { reserved, price } => format!(
            "allowed reserving {}, below the policy's price of {} for the tool (a call \
             reserves at least its tool's price)",
            Nanos(*reserved),
            Nanos(*price)
        ),
        Inconsistency::OverrunMisrecorded { recorded, counted } => match counted {
            Some(c) => format!(
                "records an overrun of {}, but its settlement is {} above the attempt's \
                 reservation",
                Nanos(*recorded),
                Nanos(*c)
            ),
            None => format!(
                "records an overrun of {}, but its settlement is within the attempt's \
                 reservation",
                Nanos(*recorded)
            ),
        },
        Inconsistency::Overflow { field } => {
            format!("{field} would overflow; counted as the largest number, never wrapped")
        }
        _ => return None,
    })
}

/// A finding about a run's start and stop: a record after the stop, a second start, a
/// start the gate refuses.
fn lifecycle_text(f: &Inconsistency) -> Option<String> {
    Some(match f {
        Inconsistency::AfterStop { record, stop } => {
            format!("{record} record after the run stopped ({stop})")
        }
        Inconsistency::SecondStart => "the run started a second time".to_owned(),
        Inconsistency::StartRefused { refusal } => format!(
            "started though the gate refuses such a start: {}",
            match refusal {
                StartRefusal::ParentStopped => "its parent had stopped".to_owned(),
                other => other.to_string(),
            }
        ),
        _ => return None,
    })
}

/// A finding about an attempt's allow, outcome and refund.
fn attempt_text(f: &Inconsistency) -> Option<String> {
    Some(match f {
        Inconsistency::OutcomeWithoutAllow { attempt } => {
            format!("outcome for attempt {attempt}, which was never allowed")
        }
        Inconsistency::DuplicateOutcome { attempt } => format!(
            "an outcome for attempt {attempt} after it was settled (it had its final outcome, \
             or settled spend once already)"
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
        Inconsistency::DuplicateAllow { attempt } => {
            format!("attempt {attempt} allowed a second time")
        }
        Inconsistency::AttemptsUnrecorded { from, to } => format!(
            "attempts {from}..={to} were issued and no ledger given records them (a gate \
             killed before recording, or a ledger of the fleet missing)"
        ),
        Inconsistency::OutcomeOwnedByProxy { attempt } => format!(
            "an outcome for attempt {attempt}, a call tally's proxy made, not reported by the \
             proxy (the proxy observes those outcomes)"
        ),
        _ => return None,
    })
}

/// A finding about a human's approval the run was allowed on.
fn approval_text(f: &Inconsistency) -> Option<String> {
    Some(match f {
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
        _ => return None,
    })
}

/// A lease finding as text (docs/VERIFY.md, "Leases").
fn lease_text(f: &Inconsistency) -> Option<String> {
    Some(match f {
        Inconsistency::LeaseOverspent {
            lease,
            dimension,
            used,
            bound,
        } => format!(
            "decisions made on lease {lease} used {used} {dimension}, past the slice's {bound}"
        ),
        Inconsistency::SlicesOverCap {
            scope_kind,
            scope_key,
            dimension,
            leased,
            cap,
            lease,
        } => format!(
            "with lease {lease}, the slices of {} {} open at once bound {leased} {dimension}, past its cap of {cap}",
            scope_kind.as_str(),
            shown(scope_key)
        ),
        Inconsistency::DecisionOutsideLease { lease, why } => format!(
            "decided on lease {lease}, which {}",
            match why {
                tally_policy::OutsideLease::Unknown => "no ledger given grants before it",
                tally_policy::OutsideLease::OtherHolder => "is another host's (granted in another ledger)",
                tally_policy::OutsideLease::Closed => "was returned or reclaimed before it",
                tally_policy::OutsideLease::Expired => "had expired",
                tally_policy::OutsideLease::OtherScope => {
                    "is cut from another scope (run, principal or credential) than its run's"
                }
                tally_policy::OutsideLease::NotTheAllows => {
                    "is not the slice its attempt's allow took the reservation on"
                }
                _ => "it may not be decided on",
            }
        ),
        Inconsistency::LeaseMisrecorded { lease, why } => {
            format!("lease {lease}: {}", shown(why))
        }
        _ => return None,
    })
}

/// The scopes slices were leased from, as text: nothing when there are none, else one
/// line each (its slices, the most leased at once, its cap or that it is unknown).
pub fn render_leases_text(report: &Report) -> String {
    let mut out = String::new();
    if report.leases.is_empty() {
        return out;
    }
    let _ = writeln!(out, "Leased slices, per scope:");
    for s in &report.leases {
        let amounts = |a: &super::report::LeaseAmounts| {
            let dims = [a.attempts, a.nanos, a.side_effects, a.polls];
            let names = tally_record::decision::SliceAmounts::NAMES;
            let shown: Vec<String> = (dims.iter().zip(names))
                .filter_map(|(v, n)| v.map(|v| format!("{n} {v}")))
                .collect();
            if shown.is_empty() {
                "no limit".to_owned()
            } else {
                shown.join(", ")
            }
        };
        let cap = match &s.cap {
            super::report::Cap::Known(c) => format!("cap {}", amounts(c)),
            super::report::Cap::Unknown => {
                "cap unknown from the ledgers: the slices were not checked against it".to_owned()
            }
        };
        let _ = writeln!(
            out,
            "{} {}  {}  most leased at once: {}  {cap}",
            s.scope_kind.as_str(),
            shown(&s.scope_key),
            plural(s.slices, "slice", "slices"),
            amounts(&s.most_leased),
        );
    }
    out
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

/// The overruns as text: nothing when there are none, else one line each (the seq of
/// the outcome, the run and attempt, what was reserved and what was settled).
pub fn render_overruns_text(report: &Report) -> String {
    let mut out = String::new();
    if report.overruns.is_empty() {
        return out;
    }
    let total: u64 = report
        .overruns
        .iter()
        .fold(0u64, |t, o| t.saturating_add(o.overrun_nanos));
    let _ = writeln!(
        out,
        "{}: the upstream billed {} above what the gate reserved (each run spends nothing more until a human grants it; find out why the estimate was short).",
        plural(report.overruns.len() as u64, "overrun", "overruns"),
        Nanos(total)
    );
    for o in &report.overruns {
        let _ = writeln!(
            out,
            "seq {}  run {}  overrun: attempt {} settled {} on a reservation of {} ({} over)",
            o.seq,
            shown(&o.run),
            o.attempt,
            Nanos(o.settled_nanos),
            Nanos(o.reserved_nanos),
            Nanos(o.overrun_nanos)
        );
    }
    out
}

/// The outcomes whose usage the proxy refused, as text: nothing when there are none.
pub fn render_usage_refused_text(report: &Report) -> String {
    let mut out = String::new();
    if report.usage_refused.is_empty() {
        return out;
    }
    let _ = writeln!(
        out,
        "{} whose usage the proxy did not believe or could not price: each is an error settled at its reservation (the provider's console has the real bill).",
        plural(report.usage_refused.len() as u64, "call", "calls"),
    );
    for u in &report.usage_refused {
        let _ = writeln!(
            out,
            "seq {}  run {}  usage_refused: attempt {} ({}), settled {}",
            u.seq,
            shown(&u.run),
            u.attempt,
            u.why.as_str(),
            Nanos(u.settled_nanos)
        );
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

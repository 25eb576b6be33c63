//! Handoffs as text: where each run stands, for the human or the next run.

use std::fmt::Write;
use tally_record::money::Nanos;

use crate::text::shown;

use crate::analysis::handoff::{Coverage, Handoff, PendingStatus, StopStatus};
use crate::analysis::report::Report;

use super::{moment, name, names, plural};

/// The refill chain a run ends, where continuing it needs a human.
fn chain_text(h: &Handoff, out: &mut String) {
    let Some(c) = &h.chain else {
        return;
    };
    let on = c
        .failure
        .map_or("refusals".to_owned(), |r| r.as_str().to_owned());
    let tool = c
        .tool
        .as_deref()
        .map(|t| format!(" (last refused: {})", shown(t)))
        .unwrap_or_default();
    let runs: Vec<String> = c.runs.iter().map(|r| shown(r).to_string()).collect();
    let _ = writeln!(
        out,
        "  Refill chain: {} runs in a row stopped on {on}{tool}: {}",
        c.runs.len(),
        runs.join(" -> ")
    );
    let _ = writeln!(
        out,
        "    {} attempts and {} spent across them; a new run would be unapproved continuation {} (the policy allows {} without an approver): a human decides, not a new run",
        c.attempts_used,
        Nanos(c.spent_nanos),
        c.continuations,
        c.allowance
    );
}

/// One run's handoff: where it stands, what it did and may not repeat, what is sealed.
fn handoff_text(h: &Handoff, out: &mut String) {
    status_text(h, out);
    budget_text(h, out);
    completed_text(h, out);
    model_calls_text(h, out);
    refused_text(h, out);
    pending_text(h, out);
    observed_text(h, out);
    chain_text(h, out);
    resume_text(h, out);
    coverage_text(h, out);
}

/// The run, its goal, parent and workers, and whether it stopped.
fn status_text(h: &Handoff, out: &mut String) {
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
        (StopStatus::Refused, Some(r)) => {
            let cause = h.stop.cause.map(|c| format!(": {c}")).unwrap_or_default();
            let action = h
                .stop
                .action
                .map(|a| format!(", action {a}"))
                .unwrap_or_default();
            format!("open (no stop record), its last call refused with {r}{cause}{action}")
        }
        _ => "still running (no stop record)".to_owned(),
    };
    let when = match (h.stop.seq, h.stop.at) {
        (Some(seq), Some(at)) => format!(" at seq {seq}, {}", moment(at)),
        _ => String::new(),
    };
    let _ = writeln!(out, "  Status: {stop}{when}");
}

/// The attempts and spend the run used of its limits, an overrun, and its polls.
fn budget_text(h: &Handoff, out: &mut String) {
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
        .limit_nanos
        .map_or("no limit".to_owned(), |l| format!("limit {}", Nanos(l)));
    if h.spend.approved_extra_nanos > 0 {
        let _ = write!(
            spend_limit,
            ", {} granted by approval",
            Nanos(h.spend.approved_extra_nanos)
        );
    }
    if h.spend.carved_out_nanos > 0 {
        let _ = write!(
            spend_limit,
            ", {} carved out for child runs",
            Nanos(h.spend.carved_out_nanos)
        );
    }
    let _ = writeln!(
        out,
        "  Spend: {} reserved, {} settled ({spend_limit})",
        Nanos(h.spend.reserved_nanos),
        Nanos(h.spend.settled_nanos)
    );
    if h.spend.overrun_nanos > 0 {
        let _ = writeln!(
            out,
            "  Overrun: {} settled above what calls reserved (the upstream billed more); no call is allowed after an overrun until a human grants spend",
            Nanos(h.spend.overrun_nanos)
        );
    }
    for p in &h.polls {
        let of = p
            .allowance
            .map_or_else(|| "no allowance".to_owned(), |a| format!("of {a}"));
        let _ = writeln!(out, "  Polls of {}: {} {of}", shown(&p.remote_ref), p.used);
    }
}

/// The calls the run completed (the latest ones, when not all are listed).
fn completed_text(h: &Handoff, out: &mut String) {
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
            let cost = if c.settled_nanos > 0 {
                format!(", {}", Nanos(c.settled_nanos))
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
}

/// The external work the run started whose outcome is not known to be final.
fn pending_text(h: &Handoff, out: &mut String) {
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
}

/// The last state the run observed of a remote operation.
fn observed_text(h: &Handoff, out: &mut String) {
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
}

/// What is safe to resume, what must not be repeated, and the evidence to read.
fn resume_text(h: &Handoff, out: &mut String) {
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
}

/// Whether the run's records are covered by a checkpoint, per ledger when merged.
fn coverage_text(h: &Handoff, out: &mut String) {
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

/// "(latest N of M)" when not every one is listed.
fn latest(listed: usize, total: u64) -> String {
    if (listed as u64) < total {
        format!(" (latest {listed} of {total})")
    } else {
        String::new()
    }
}

/// The model calls the proxy observed: model, tokens, cost, and how each ended.
fn model_calls_text(h: &Handoff, out: &mut String) {
    if h.model_calls_total == 0 {
        return;
    }
    let more = latest(h.model_calls.len(), h.model_calls_total);
    let _ = writeln!(out, "  Model calls{more}:");
    for c in &h.model_calls {
        let what = match (&c.upstream, &c.model) {
            (Some(u), Some(m)) => format!("{} {}", shown(u), shown(m)),
            (Some(u), None) => shown(u).into_owned(),
            (None, Some(m)) => shown(m).into_owned(),
            (None, None) => "a model call".to_owned(),
        };
        let tokens = c
            .usage
            .map(|u| {
                let searches = match u.web_searches {
                    Some(n) => format!(", {}", plural(n, "web search", "web searches")),
                    None => String::new(),
                };
                format!(", {} tokens in, {} out{searches}", u.input(), u.output())
            })
            .unwrap_or_default();
        let mut notes = String::new();
        if let Some(o) = c.overrun_nanos {
            let _ = write!(notes, "; OVERRUN: {} above its reservation", Nanos(o));
        }
        if let Some(r) = c.usage_refused {
            let _ = write!(
                notes,
                "; usage not believed ({}): settled at its reservation",
                r.as_str()
            );
        }
        let _ = writeln!(
            out,
            "    - {what}: {}{tokens}, {}{notes} (attempt {}, seq {}, {})",
            c.status,
            Nanos(c.settled_nanos),
            c.attempt,
            c.seq,
            moment(c.at)
        );
    }
}

/// The calls the gate refused, and why; the one the status line already names is not
/// said twice.
fn refused_text(h: &Handoff, out: &mut String) {
    let listed: Vec<_> = h
        .refused
        .iter()
        .filter(|r| Some(r.seq) != h.stop.seq)
        .collect();
    if listed.is_empty() {
        return;
    }
    let more = latest(h.refused.len(), h.refused_total);
    let _ = writeln!(out, "  Refused{more}:");
    for r in listed {
        let preview = r
            .preview
            .as_deref()
            .map(|p| format!(" \"{}\"", shown(p)))
            .unwrap_or_default();
        let cause = r.cause.map(|c| format!(" ({c})")).unwrap_or_default();
        let _ = writeln!(
            out,
            "    - {}{preview}: {}{cause}, action {} (seq {}, {})",
            name(r.tool.as_deref(), r.operation.as_deref()),
            r.reason,
            r.action,
            r.seq,
            moment(r.at)
        );
    }
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

//! `tally approvals`: the approval requests the gate holds, as a table a human answers
//! from (docs/APPROVALS.md). Every text an agent chose (run, tool, operation, target,
//! preview, worker, credential) is escaped and bounded before it is shown.

use anyhow::Result;
use tally_api::{ApprovalRequest, LimitKey, RequestState};
use tally_ledger::decision::Scope;
use tally_ledger::money::Nanos;
use tally_verify::text::{duration, shown};

use crate::cli::ApprovalsArgs;
use crate::operator::{block_on, gate, refused};
use crate::output::outln;
use crate::Exit;

/// The longest an agent-chosen text is shown, in characters.
const MAX_SHOWN: usize = 40;

/// `tally approvals`.
pub fn approvals(args: &ApprovalsArgs) -> Result<Exit> {
    block_on(async {
        let mut gate = gate(&args.operator_socket).await?;
        let list = gate.approval_requests().await.map_err(refused)?;
        if args.json {
            outln!("{}", serde_json::to_string_pretty(&list)?);
        } else {
            outln!("{}", table(&list));
        }
        Ok(Exit::Success)
    })
}

/// The requests as a table: a header, then one row each, columns padded to their
/// widest cell.
pub fn table(list: &[ApprovalRequest]) -> String {
    if list.is_empty() {
        return "no approval requests".to_owned();
    }
    let header = [
        "ID", "STATE", "RUN", "CALL", "TARGET", "COST", "STANDING", "WHO",
    ];
    let rows: Vec<[String; 8]> = list.iter().map(row).collect();
    let mut widths = header.map(|h| h.chars().count());
    for r in &rows {
        for (w, cell) in widths.iter_mut().zip(r) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: &[String]| {
        let padded: Vec<String> = cells
            .iter()
            .zip(widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        padded.join("  ").trim_end().to_owned()
    };
    let mut out = vec![line(&header.map(str::to_owned))];
    out.extend(rows.iter().map(|r| line(r)));
    out.join("\n")
}

/// One request's cells.
pub(crate) fn row(r: &ApprovalRequest) -> [String; 8] {
    [
        r.id.clone(),
        state(r),
        bounded(&r.run),
        call(r),
        r.target.as_deref().map_or("-".to_owned(), bounded),
        cost(&r.cost),
        standing(r),
        who(r),
    ]
}

/// Agent-chosen text, escaped, then cut to [`MAX_SHOWN`] characters.
fn bounded(s: &str) -> String {
    let safe = shown(s);
    if safe.chars().count() <= MAX_SHOWN {
        return safe.into_owned();
    }
    let mut cut: String = safe.chars().take(MAX_SHOWN - 1).collect();
    cut.push('…');
    cut
}

/// Pending with its countdown, or the state it ended in.
fn state(r: &ApprovalRequest) -> String {
    let by = r.answered_by.as_deref().map(bounded);
    match (r.state, r.expires_in_ms) {
        (RequestState::Pending, Some(ms)) => format!("pending, {} left", duration(ms)),
        (RequestState::Approved, _) => format!("approved by {}", by.unwrap_or_default()),
        (RequestState::Denied, _) => format!("denied by {}", by.unwrap_or_default()),
        (s, _) => s.as_str().to_owned(),
    }
}

/// The call in plain words: its effect, tool, operation and argument preview.
fn call(r: &ApprovalRequest) -> String {
    let mut words = vec![match r.effect {
        Some(e) => format!("{} {}", effect(e), bounded(&r.tool)),
        None => bounded(&r.tool),
    }];
    if let Some(op) = &r.operation {
        words.push(format!("op {}", bounded(op)));
    }
    if let Some(p) = &r.args_preview {
        words.push(format!("args {}", bounded(p)));
    } else if let Some(d) = &r.args_digest {
        words.push(format!("args {}", d.get(..12).unwrap_or(d)));
    }
    words.push(format!("({})", r.cause.as_str()));
    words.join(" ")
}

/// A side-effect class in plain words.
fn effect(e: tally_ledger::Effect) -> &'static str {
    match e {
        tally_ledger::Effect::Read => "read",
        tally_ledger::Effect::IdempotentWrite => "idempotent write",
        tally_ledger::Effect::NonIdempotentWrite => "write",
    }
}

/// What granting it costs, in the words `tally approve` would grant it with.
fn cost(s: &Scope) -> String {
    let mut words = Vec::new();
    if let Some(a) = s.attempts {
        words.push(format!("{a} attempt{}", if a == 1 { "" } else { "s" }));
    }
    if let Some(n) = s.spend() {
        words.push(format!("{n}"));
    }
    match (&s.tool, &s.operation, words.is_empty()) {
        (Some(t), Some(o), true) => words.push(format!("the write {} {}", bounded(t), bounded(o))),
        (Some(t), None, true) => words.push(format!("tool {}", bounded(t))),
        (Some(t), _, false) => words.push(format!("for {}", bounded(t))),
        _ => {}
    }
    words.join(" ")
}

/// Where the run stood: attempts and spend used of limit, calls so far, time left.
fn standing(r: &ApprovalRequest) -> String {
    let mut words = Vec::new();
    if let Some(l) = r.limits.get(&LimitKey::Attempts) {
        words.push(format!("attempts {}/{}", l.used, l.limit));
    }
    if let Some(l) = r.limits.get(&LimitKey::SpendNanos) {
        words.push(format!("spend {}/{}", Nanos(l.used), Nanos(l.limit)));
    }
    words.push(format!("{} calls", r.calls));
    if let Some(ms) = r.left_ms {
        words.push(format!("{} to deadline", duration(ms)));
    }
    words.join(", ")
}

/// Who asked: uid, worker, credential.
fn who(r: &ApprovalRequest) -> String {
    let mut words = Vec::new();
    if let Some(u) = r.uid {
        words.push(format!("uid {u}"));
    }
    if let Some(w) = &r.worker {
        words.push(format!("worker {}", bounded(w)));
    }
    if let Some(c) = &r.credential {
        words.push(format!("cred {}", bounded(c)));
    }
    if words.is_empty() {
        "-".to_owned()
    } else {
        words.join(" ")
    }
}

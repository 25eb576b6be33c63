//! A notification's `text`: the event in plain words for a chat (a Slack incoming
//! webhook shows it as it is). Every string the agent chose is made inert first
//! ([`inert`]): control characters, ANSI escapes and bidi overrides go, Slack's `&`,
//! `<`, `>` are escaped (so `<!channel>` pings nobody and no link is forged), and it is
//! cut to [`MAX_FIELD`] characters.

use tally_ledger::words::is_bidi;
use tally_wire::{ApprovalRequest, LimitKey, NotifyKind, RequestState};

/// The most characters of one agent-chosen string shown.
pub const MAX_FIELD: usize = 80;

/// `s` made inert and bounded (module docs).
pub fn inert(s: &str) -> String {
    let mut out = String::new();
    let mut chars = s.chars().peekable();
    let mut shown = 0;
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // An ANSI escape: ESC, then a CSI's parameters up to its final byte.
            if chars.peek() == Some(&'[') {
                chars.next();
                while chars.next().is_some_and(|p| !('@'..='~').contains(&p)) {}
            }
            continue;
        }
        if c.is_control() || is_bidi(c) {
            continue;
        }
        if shown == MAX_FIELD {
            out.push('…');
            break;
        }
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            c => out.push(c),
        }
        shown += 1;
    }
    out
}

/// A duration in words: `4 min 10 s`.
fn duration(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0..=59 => format!("{s} s"),
        _ => format!("{} min {:02} s", s / 60, s % 60),
    }
}

/// Nanodollars as dollars: `$0.05`.
fn dollars(nanos: u64) -> String {
    format!(
        "${}.{:02}",
        nanos / 1_000_000_000,
        nanos % 1_000_000_000 / 10_000_000
    )
}

/// The call in plain words: `email.send send:42 (non_idempotent_write) to smtp: "to
/// x@example.com"`.
fn call(r: &ApprovalRequest) -> String {
    let mut s = inert(&r.tool);
    if let Some(op) = &r.operation {
        s.push_str(&format!(" {}", inert(op)));
    }
    // The wire name of the side-effect class.
    if let Some(serde_json::Value::String(e)) =
        r.effect.map(serde_json::to_value).and_then(Result::ok)
    {
        s.push_str(&format!(" ({e})"));
    }
    if let Some(t) = &r.target {
        s.push_str(&format!(" to {}", inert(t)));
    }
    if let Some(p) = &r.args_preview {
        s.push_str(&format!(": \"{}\"", inert(p)));
    }
    s
}

/// What granting it costs: `1 attempt`, `$0.05`, or nothing more than the call.
fn cost(r: &ApprovalRequest) -> String {
    let c = &r.cost;
    match (c.attempts, c.nanos.or(c.cents.map(|n| n * 10_000_000))) {
        (Some(n), _) => format!("{n} attempt{}", if n == 1 { "" } else { "s" }),
        (None, Some(n)) => dollars(n),
        (None, None) => "this call".to_owned(),
    }
}

/// Where the run stood: `attempts 1/1, spend $0.00/$10.00, 1 call allowed, 59 s to
/// deadline`.
fn standing(r: &ApprovalRequest) -> String {
    let mut parts: Vec<String> = r
        .limits
        .iter()
        .filter_map(|(dim, l)| match dim {
            // Shown as the time left below.
            LimitKey::DeadlineMs => None,
            LimitKey::SpendNanos => Some(format!("spend {}/{}", dollars(l.used), dollars(l.limit))),
            _ => Some(format!("{} {}/{}", inert(dim.as_str()), l.used, l.limit)),
        })
        .collect();
    let plural = if r.calls == 1 { "" } else { "s" };
    parts.push(format!("{} call{plural} allowed", r.calls));
    if let Some(left) = r.left_ms {
        parts.push(format!("{} to deadline", duration(left)));
    }
    parts.join(", ")
}

/// The event's `text`.
pub fn text(kind: NotifyKind, r: &ApprovalRequest) -> String {
    let id = inert(&r.id);
    let head = match (kind, r.state) {
        (NotifyKind::Requested, _) => format!("Approval requested ({id})"),
        (NotifyKind::Answered, RequestState::Denied) => format!("Approval denied ({id})"),
        (NotifyKind::Answered, _) => format!("Approval granted ({id})"),
        (NotifyKind::Expired, _) => format!("Approval request expired unanswered ({id})"),
        // A kind added later reads as what it is called.
        (k, _) => format!("Approval request {} ({id})", k.as_str()),
    };
    let mut lines = vec![
        head,
        format!("run {}: {} ({})", inert(&r.run), call(r), r.cause.as_str()),
        format!(
            "granting costs {}; the run stood at {}",
            cost(r),
            standing(r)
        ),
    ];
    let who = match (&r.worker, r.uid) {
        (Some(w), Some(u)) => format!("asked by worker {} (uid {u})", inert(w)),
        (Some(w), None) => format!("asked by worker {}", inert(w)),
        (None, Some(u)) => format!("asked by uid {u}"),
        (None, None) => "asked by the run".to_owned(),
    };
    lines.push(who);
    match kind {
        NotifyKind::Requested => {
            let within = r
                .expires_in_ms
                .map(|ms| format!(" within {}", duration(ms)))
                .unwrap_or_default();
            lines.push(format!(
                "answer{within}: `tally approve {id}` or `tally deny {id}`"
            ));
        }
        NotifyKind::Answered => {
            let by = r.answered_by.as_deref().map(inert).unwrap_or_default();
            let note = r.note.as_deref().map(|n| format!(": {}", inert(n)));
            lines.push(format!("by {by}{}", note.unwrap_or_default()));
        }
        _ => {}
    }
    lines.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agent_text_is_stripped_escaped_and_bounded() {
        let hostile = "\u{1b}[31mred\u{1b}[0m <!channel> a&b \u{202e}evil\u{7}";
        assert_eq!(inert(hostile), "red &lt;!channel&gt; a&amp;b evil");
        let long = "x".repeat(500);
        let cut = inert(&long);
        assert_eq!(cut.chars().count(), MAX_FIELD + 1);
        assert!(cut.ends_with('…'));
        assert_eq!(duration(250_000), "4 min 10 s");
        assert_eq!(dollars(50_000_000), "$0.05");
    }
}

//! What the proxy itself answers the client: a tool result with `isError` for a call it
//! did not make (a refusal the model can act on), and a JSON-RPC error for a message it
//! refused to forward.

use rmcp::model::{CallToolResult, ContentBlock, MetaObject};
use serde_json::{json, Value};
use tally_wire::Verdict;
use tally_wire::{CheckAnswer, LimitKey};

use crate::classify::{Id, Why};

/// A JSON-RPC error answer.
pub fn error(id: &Value, code: i64, message: &str, data: Option<Value>) -> String {
    let mut error = json!({"code": code, "message": message});
    if let Some(d) = data {
        error["data"] = d;
    }
    json!({"jsonrpc": "2.0", "id": id, "error": error}).to_string()
}

/// The error answering a message that was refused, not forwarded: what was wrong, and
/// how many the proxy has refused so far (`data["tally/refused"]`).
pub fn refused(id: &Id, why: &Why, count: u64) -> String {
    error(
        &id.to_value(),
        why.rpc_code(),
        &format!("tally mcp refused this message and did not forward it to the server: {why}"),
        Some(json!({"tally/refused": {"reason": why.code(), "count": count}})),
    )
}

/// An MCP tool result with `isError` and a text the model can act on; the gate's answer
/// also goes in `_meta` under `tally/gate`, for programs.
pub fn tool_error(text: String, answer: Option<&CheckAnswer>) -> Value {
    let mut result = CallToolResult::error(vec![ContentBlock::text(text)]);
    // Older protocol versions have no resultType; leave it out, as a server would.
    result.result_type = None;
    if let Some(a) = answer {
        let mut meta = serde_json::Map::new();
        meta.insert(
            "tally/gate".into(),
            json!({
                "decision": a.decision,
                "reason": a.reason,
                "action": a.action,
                "cause": a.cause,
                "retry_after_ms": a.retry_after_ms,
                "seq": a.seq,
            }),
        );
        result.meta = Some(MetaObject(meta));
    }
    serde_json::to_value(result).expect("a tool result serializes")
}

/// The answer to a call that was not made: a tool result with `isError`.
pub fn not_made(id: &Value, answer: Option<&CheckAnswer>, text: String) -> String {
    json!({"jsonrpc": "2.0", "id": id, "result": tool_error(text, answer)}).to_string()
}

/// What the model reads when the gate refuses: what, why, what to do, and when.
pub fn refusal_text(tool: &str, a: &CheckAnswer) -> String {
    let reason = a.reason.map(|r| r.as_str()).unwrap_or("refused");
    let action = a.action.map(|x| x.as_str()).unwrap_or("stop");
    let todo = match action {
        "retry" => "wait, then try again",
        "ask" => "a human must approve more (tally approve) before this can go on; say so and wait",
        _ => "do not call it again for this task; report what happened and what is left to do",
    };
    // Each code says which limit it is: the run's attempts are not an operation's retries.
    let meaning = |r: Option<tally_record::Reason>| r.map_or("", |r| r.meaning());
    let mut text = match (a.decision, a.cause) {
        (Verdict::RequireApproval, Some(cause)) => format!(
            "tally refused this call to {tool}: {cause} ({}), and going on needs a human's approval ({reason}). Action: {action}: {todo}.",
            cause.meaning()
        ),
        _ => format!(
            "tally refused this call to {tool}: {reason} ({}). Action: {action}: {todo}.",
            meaning(a.reason)
        ),
    };
    if let Some(note) = &a.note {
        // A human's words, for the model: escaped, and bounded as the gate bounds them.
        let escaped =
            |t: &str| -> String { t.chars().take(500).flat_map(char::escape_debug).collect() };
        let by = a.denied_by.as_deref().map_or("an approver".into(), escaped);
        text.push_str(&format!(
            " {by} denied this exact call: \"{}\".",
            escaped(note)
        ));
    }
    if let Some(l) = a.limits.get(&LimitKey::Attempts) {
        text.push_str(&format!(
            " The run has used {} of its {} attempts.",
            l.used, l.limit
        ));
    }
    if let Some(ms) = a.retry_after_ms {
        text.push_str(&format!(" Retry after {ms} ms."));
    }
    if let Some(seq) = a.seq {
        text.push_str(&format!(" (Recorded in tally's ledger, seq {seq}.)"));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_denial_tells_the_model_who_and_why_escaped() {
        let a: CheckAnswer = serde_json::from_value(json!({
            "decision": "deny", "reason": "denied_by_approver", "action": "stop",
            "cause": null, "denied_by": "dana", "note": "not to x\u{1b}[31m",
            "retry_after_ms": null, "timeout_ms": null, "attempt": null, "limits": {},
            "seq": 7, "hash": null
        }))
        .expect("an answer");
        let text = refusal_text("email.send", &a);
        assert!(text.contains("denied_by_approver"), "{text}");
        assert!(text.contains("do not call it again"), "{text}");
        assert!(
            text.contains("dana denied this exact call: \"not to x\\u{1b}[31m\"."),
            "{text}"
        );
    }
}

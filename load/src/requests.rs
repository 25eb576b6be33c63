//! What one iteration sends: decisions appended, or a call through the gate.

use tally_api::client::{Client, Method};
use tally_api::{CheckAnswer, Verdict};

use crate::plan::Mode;

/// A realistic `allow` decision (~350 bytes on the wire).
pub(crate) fn decision(client: usize, n: u64) -> String {
    format!(
        concat!(
            r#"{{"run":"bench-{}-{}","kind":"allow","worker":"w{}","at_ms":{},"tool":"http.post","#,
            r#""operation":"export.create:{:x}","args":{{"url":"https://api.example.com/v1/export","body":{{"n":{}}}}},"#,
            r#""effect":"idempotent_write","idempotency_key":"k-{}-{}","channel":"http","attempt":{},"reserve_cents":3,"#,
            r#""limits":{{"attempts":{{"used":{},"limit":1000000}},"spend_cents":{{"used":{},"limit":100000000}}}}}}"#
        ),
        client,
        n % 64,
        client,
        n,
        n,
        n,
        client,
        n,
        n + 1,
        n + 1,
        3 * (n + 1)
    )
}

/// One call: through the gate (check, then outcome), or the same two decisions appended.
/// The call's latency is until its outcome is recorded too. A call that `asks` names the
/// tool `ask.me` and is to be refused `require_approval` (no outcome follows).
pub(crate) async fn call(
    client: &mut Client,
    mode: Mode,
    id: usize,
    n: u64,
    asks: bool,
) -> Result<(), String> {
    let run = format!("gate-bench-{id}-{}", std::process::id());
    let tool = if asks { "ask.me" } else { "http.post" };
    let (first, second) = match mode {
        Mode::Check => (
            (
                "/v1/check",
                format!(
                    r#"{{"run":"{run}","worker":"w{id}","tool":"{tool}","operation":"export.create:{n:x}","args":{{"url":"https://api.example.com/v1/export","body":{{"n":{n}}}}},"effect":"idempotent_write","idempotency_key":"k-{id}-{n}","channel":"http","reserve_cents":3}}"#
                ),
            ),
            None,
        ),
        _ => (
            ("/v1/decisions", decision(id, n)),
            Some(format!(
                r#"{{"run":"bench-{id}-{}","kind":"outcome","attempt":{},"status":"ok","settled_cents":2}}"#,
                n % 64,
                n + 1
            )),
        ),
    };
    let reply = client
        .request(Method::POST, first.0, Some("application/json"), first.1)
        .await
        .map_err(|e| e.to_string())?;
    if reply.status.as_u16() != 200 {
        return Err(format!(
            "{}: {}",
            first.0,
            String::from_utf8_lossy(&reply.body)
        ));
    }
    let outcome = match (mode, second) {
        (Mode::Check, _) => {
            let a: CheckAnswer = serde_json::from_slice(&reply.body).map_err(|e| e.to_string())?;
            let attempt = match (a.decision, a.attempt) {
                (Verdict::RequireApproval, _) if asks => return Ok(()),
                (Verdict::Allow, Some(attempt)) if !asks => attempt,
                _ => {
                    return Err(format!(
                        "the gate refused a benchmark call: {}",
                        String::from_utf8_lossy(&reply.body)
                    ))
                }
            };
            // The outcome as the benchmark has always sent it (the fields it sets only).
            (
                "/v1/outcome",
                format!(r#"{{"run":"{run}","attempt":{attempt},"status":"ok","settled_cents":2}}"#),
            )
        }
        (_, Some(o)) => ("/v1/decisions", o),
        (_, None) => return Ok(()),
    };
    let reply = client
        .request(Method::POST, outcome.0, Some("application/json"), outcome.1)
        .await
        .map_err(|e| e.to_string())?;
    if reply.status.as_u16() != 200 {
        return Err(format!(
            "{}: {}",
            outcome.0,
            String::from_utf8_lossy(&reply.body)
        ));
    }
    Ok(())
}

/// `batch` decisions from number `first` on, as NDJSON.
pub(crate) fn body(client: usize, first: u64, batch: usize) -> String {
    let mut b = String::with_capacity(400 * batch);
    for k in 0..batch as u64 {
        b.push_str(&decision(client, first + k));
        b.push('\n');
    }
    b
}

//! Refusals the proxy makes itself, before the budget rules: the request as sent is
//! outside the upstream's policy (a method, path, upstream or unpriced model:
//! `scope_violation`) or cannot be read or priced exactly (`request_refused`). Each is a
//! `deny` in the run's ledger before it is answered, like any refusal of the gate. Also
//! what every refusal of a request is made from: the run its token named ([`Caught`]),
//! the call's preview, and the answer when the gate cannot record (`unavailable`).

use hyper::StatusCode;
use tally_gate::{Caller, CheckRequest, GateError, Standing};
use tally_policy::Verdict;
use tally_record::decision::Channel;
use tally_record::{Effect, Reason};

use crate::dialect::Refusal;
use crate::proxy::Proxy;

/// What the proxy knows of a request once its token is read.
pub(crate) struct Caught {
    pub run: String,
    pub standing: Standing,
    /// The key the call presented in place of a run token, if it did.
    pub key: Option<KeyCall>,
}

/// A call with a key: the key, and the time its run was named at (the run's UTC day is
/// the one its call holds on, `tally_policy::key_call_day`).
pub(crate) struct KeyCall {
    pub info: tally_wire::KeyInfo,
    pub named_ms: u64,
}

/// The gate cannot record decisions: the call is refused as unavailable (fail closed).
pub(crate) fn unavailable() -> Refusal {
    let mut r = Refusal::reason(
        Reason::GateUnavailable,
        Some(1000),
        "the gate cannot record decisions, so the call must not proceed (fail closed)".into(),
    );
    r.status = StatusCode::SERVICE_UNAVAILABLE;
    r
}

/// The call's preview: at most 256 bytes, cut at a character.
pub(crate) fn preview(text: &str) -> String {
    let mut end = text.len().min(tally_record::decision::MAX_PREVIEW_BYTES);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}

/// A refusal of the request as sent, not yet recorded.
#[derive(Debug)]
pub(crate) struct Pre {
    pub reason: Reason,
    /// The answer's status (413 for a body too large, 408 for one too slow, 400 for
    /// one that cannot be read, 404 for an unknown upstream, 403 otherwise).
    pub status: StatusCode,
    pub message: String,
    /// What the record keeps of the request (bounded): its method and path, or its
    /// model.
    pub preview: Option<String>,
    /// The body was not read to its end: the connection is closed after the answer.
    pub close: bool,
}

impl Pre {
    pub fn new(reason: Reason, status: StatusCode, message: impl Into<String>) -> Pre {
        Pre {
            reason,
            status,
            message: message.into(),
            preview: None,
            close: false,
        }
    }

    pub fn closing(mut self) -> Pre {
        self.close = true;
        self
    }

    pub fn preview(mut self, preview: String) -> Pre {
        self.preview = Some(preview);
        self
    }
}

/// What the refused call is, as the record names it.
pub(crate) struct Refused {
    /// The upstream's name (the tool of its calls).
    pub tool: String,
    /// The upstream's host.
    pub target: Option<String>,
    pub channel: Channel,
    pub effect: Effect,
}

impl Proxy {
    /// Records `pre` as the run's decision (a `deny`), then gives the answer. If it
    /// cannot be recorded, the answer is `gate_unavailable` (fail closed, as any
    /// refusal the gate cannot make durable).
    pub(crate) async fn refuse(&self, caught: &Caught, call: Refused, pre: Pre) -> Refusal {
        let close = pre.close;
        let mut r = self.record(caught, call, pre).await;
        r.close = close;
        r
    }

    /// [`Proxy::refuse`], the connection's fate aside.
    async fn record(&self, caught: &Caught, call: Refused, pre: Pre) -> Refusal {
        let check = CheckRequest {
            run: caught.run.clone(),
            worker: None,
            tool: call.tool,
            operation: None,
            args: None,
            args_preview: pre.preview.as_deref().map(preview),
            effect: call.effect,
            idempotency_key: None,
            target: call.target,
            channel: Some(call.channel),
            depth: None,
            reserve_cents: None,
            reserve_nanos: None,
            remote_ref: None,
            credential: None,
            timeout_ms: None,
            trace_id: None,
            refused: Some(pre.reason),
        };
        let caller = Caller {
            uid: caught.standing.owner_uid,
            operator: false,
            proxied: true,
        };
        match self
            .gate(move |gate, done| gate.check(caller, check, done))
            .await
        {
            Ok(a) if a.decision != Verdict::Allow => {
                let mut r = Refusal::reason(a.reason.unwrap_or(pre.reason), None, pre.message);
                r.status = pre.status;
                r.cause = a.cause;
                r.recorded = a.seq.map(|seq| (caught.run.clone(), seq));
                r
            }
            // The core never allows a request refused as sent; were it to, nothing is
            // forwarded all the same.
            Ok(_) => unavailable(),
            Err(GateError::Unavailable(_)) => unavailable(),
            Err(GateError::RunStopped { reason, .. }) => Refusal::ended(
                reason,
                format!("the run of this token has stopped ({})", reason.as_str()),
            ),
            Err(GateError::Stopped(a)) => {
                let reason = a.reason.unwrap_or(Reason::Completed);
                Refusal::ended(
                    reason,
                    format!("the run of this token has stopped ({})", reason.as_str()),
                )
            }
            Err(GateError::RunNotFound(_)) => {
                Refusal::token("the run of this token is not known to the gate")
            }
            Err(e) => Refusal::own(
                StatusCode::FORBIDDEN,
                tally_wire::ErrorCode::Refused,
                format!("the gate refused the call: {e}"),
            ),
        }
    }
}

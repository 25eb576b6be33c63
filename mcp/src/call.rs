//! One gate path for a `tools/call`, whoever carries it (`tally mcp` on stdio, the HTTP
//! gateway of `tally serve --mcp-listen`): the gate's question for a call, its answer
//! read into a call to make or a tool result to answer in its place, and the outcome an
//! answer from the server is recorded as.

use std::time::Duration;

use serde_json::{Map, Value};
use tally_api::ErrorCode;
use tally_record::decision::{Args, Channel};
use tally_record::{Action, Effect, Reason, Status};
use tally_wire::{CheckAnswer, CheckRequest, OutcomeRequest, Verdict};

use crate::gate::{Gate, GateFailure, Trace};
use crate::reply;

/// A call the gate gave no `timeout_ms` ends after this.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// Who asks: the run's worker and credential names, recorded with each decision.
#[derive(Clone, Debug, Default)]
pub struct Asker {
    /// The worker name.
    pub worker: Option<String>,
    /// The credential name.
    pub credential: Option<String>,
}

/// What to do with a call once the gate has answered.
#[derive(Debug)]
pub enum Gated {
    /// Make it: its outcome goes under `attempt`, and it ends after `timeout`.
    Allowed {
        /// The attempt the gate gave.
        attempt: u64,
        /// How long the server has to answer.
        timeout: Duration,
    },
    /// Do not make it: answer the client with this tool result (`isError`).
    NotMade(Value),
}

/// What a gate answer says about the session's last refusal (what the run's stop says
/// at the end of a session).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Last {
    /// An allow: no refusal stands.
    Cleared,
    /// A refusal, its reason and action.
    Refused(Reason, Action),
    /// No answer that says (the gate could not answer).
    Unchanged,
}

/// The arguments as the gate takes them (only their digest is kept), and the arguments
/// back (read in place, not copied); or why they cannot be digested: then the call is
/// refused as bad params, never made.
pub fn args(arguments: Map<String, Value>) -> Result<(Args, Map<String, Value>), String> {
    let value = Value::Object(arguments);
    let args = Args::from_value(&value).map_err(|e| e.to_string())?;
    match value {
        Value::Object(arguments) => Ok((args, arguments)),
        _ => Err("the arguments are not an object".to_owned()),
    }
}

/// The gate's question for a call of `tool` (`server/tool`) in `run`.
pub fn check_request(
    run: &str,
    asker: &Asker,
    tool: String,
    args: Args,
    effect: Effect,
) -> CheckRequest {
    CheckRequest {
        run: run.to_owned(),
        worker: asker.worker.clone(),
        tool,
        operation: None,
        args: Some(args),
        args_preview: None,
        effect,
        idempotency_key: None,
        target: None,
        channel: Some(Channel::Tool),
        depth: None,
        reserve_cents: None,
        reserve_nanos: None,
        remote_ref: None,
        credential: asker.credential.clone(),
        timeout_ms: None,
        trace_id: None,
        refused: None,
    }
}

/// Ask the gate about a call of `tool`: make it, or the tool result answering it.
pub async fn ask(
    gate: &Gate,
    request: CheckRequest,
    trace: Option<Trace>,
    tool: &str,
) -> (Gated, Last) {
    let answer = gate.check(request, trace).await;
    let last = match &answer {
        Ok(a) => match (a.decision, a.reason, a.action) {
            (Verdict::Allow, _, _) => Last::Cleared,
            (_, Some(reason), Some(action)) => Last::Refused(reason, action),
            _ => Last::Unchanged,
        },
        Err(_) => Last::Unchanged,
    };
    (read_answer(answer, tool), last)
}

fn read_answer(answer: Result<CheckAnswer, GateFailure>, tool: &str) -> Gated {
    match answer {
        Ok(answer) if answer.decision == Verdict::Allow => match answer.attempt {
            Some(attempt) => Gated::Allowed {
                attempt,
                timeout: answer
                    .timeout_ms
                    .map(Duration::from_millis)
                    .unwrap_or(DEFAULT_CALL_TIMEOUT),
            },
            None => Gated::NotMade(reply::tool_error(
                "tally's gate allowed the call without an attempt number to record its outcome under: the call was not made.".into(),
                Some(&answer),
            )),
        },
        Ok(answer) => {
            let text = reply::refusal_text(tool, &answer);
            Gated::NotMade(reply::tool_error(text, Some(&answer)))
        }
        Err(GateFailure::Refused {
            code: ErrorCode::RunStopped,
            message,
            ..
        }) => Gated::NotMade(reply::tool_error(
            format!(
                "tally did not make this call to {tool}: {message}. Action: ask: a human must decide how this task goes on; say so and wait."
            ),
            None,
        )),
        Err(failure) => Gated::NotMade(reply::tool_error(
            format!(
                "tally could not check this call to {tool} with its gate, so the call was not made (fail closed): {failure}. Action: retry later; if it keeps failing, a human must check that `tally serve` runs on that socket{}.",
                match failure.code() {
                    Some(ErrorCode::RunNotFound | ErrorCode::NotOwner) =>
                        " and that the run is this user's",
                    _ => "",
                }
            ),
            None,
        )),
    }
}

/// The outcome of an allowed call, `status`, under its attempt.
pub fn outcome(run: &str, asker: &Asker, attempt: u64, status: Status) -> OutcomeRequest {
    OutcomeRequest {
        run: run.to_owned(),
        attempt,
        status,
        settled_cents: None,
        settled_nanos: None,
        remote_ref: None,
        observed: None,
        retry_after_ms: None,
        result_digest: None,
        worker: asker.worker.clone(),
        usage_refused: None,
        usage: None,
    }
}

/// The outcome of a call the server answered: `error` for a JSON-RPC error or a result
/// with `isError: true`, else `ok`; with a digest of what it returned (never the
/// result itself: the same call with a changed result is progress, not a loop).
pub fn answered(
    run: &str,
    asker: &Asker,
    attempt: u64,
    result: Option<&Value>,
    error: Option<&Value>,
) -> OutcomeRequest {
    let failed = error.is_some()
        || result
            .and_then(|r| r.get("isError"))
            .and_then(Value::as_bool)
            .unwrap_or(false);
    let status = if failed { Status::Error } else { Status::Ok };
    let mut o = outcome(run, asker, attempt, status);
    o.result_digest = result.or(error).map(tally_record::decision::args_digest);
    o
}

/// How the run a session started ends with it (docs/MCP.md, "The run, and the end of a
/// session"): `outcome_unknown_non_idempotent` if a non-idempotent write was left
/// unanswered; else the reason of a last refusal whose action is `stop`; left open
/// (`None`) if the last refusal waits for a human (`ask`); else `completed`.
pub fn end_reason(unknown_write: bool, last_refusal: Option<(Reason, Action)>) -> Option<Reason> {
    match last_refusal {
        _ if unknown_write => Some(Reason::OutcomeUnknownNonIdempotent),
        // The run cannot go on: the stop says why, not that the task was completed.
        Some((reason, Action::Stop)) => Some(reason),
        // A human may grant more: the run stays open for the approval.
        Some((_, Action::Ask)) => None,
        _ => Some(Reason::Completed),
    }
}

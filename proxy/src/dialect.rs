//! Answers in the upstream's own error dialect, so an official SDK raises its usual
//! error and shows tally's reason, and so the client retries only what tally says may be
//! retried (docs/PROXY.md, "Refusals in the upstream's own dialect").

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Response, StatusCode};
use serde_json::json;
use tally_policy::UpstreamKind;
use tally_record::{Action, Reason};
use tally_wire::{ErrorCode, RefusalCode};

use crate::Body;

/// A refusal or error the proxy answers itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The HTTP status (in the Anthropic dialect a 403 is answered 402: see
    /// [`Refusal::response`]).
    pub status: StatusCode,
    /// The code: a reason code of the gate (recorded), or the proxy's own for what is
    /// not a decision of a run (`invalid_token`, `upstream_unreachable`,
    /// `upstream_timeout`, `upstream_error` for a url_file upstream's error answer
    /// withheld, `invalid_request` for a request the upstream cannot be sent).
    pub code: RefusalCode,
    /// What the agent must do (`stop`, `retry`, `ask`).
    pub action: Action,
    /// Words for a human.
    pub message: String,
    /// For `retry`: back off this long, ms.
    pub retry_after_ms: Option<u64>,
    /// What a refusal asking a human (`approval_required`) was caused by
    /// (`reservation_insufficient`, `side_effect_limit_exceeded`, ...), answered in the
    /// body's `tally` field.
    pub cause: Option<Reason>,
    /// The run and the seq of the recorded refusal, answered as `x-tally-run` and
    /// `x-tally-seq` (none for a refusal nothing records: a bad token, a gate down).
    pub recorded: Option<(String, u64)>,
    /// Close the connection after this answer (`Connection: close`): its request's
    /// body was not read to its end (RFC 9110 15.5.9 for a 408).
    pub close: bool,
    /// For a call refused by its key's limits per day: the key and the amounts, in the
    /// body (`tally.key`, OpenAI: `error.key`).
    pub key: Option<Box<tally_wire::KeyDayRefused>>,
}

impl Refusal {
    /// A refusal with a reason code of the gate: 429 and Retry-After for `retry`, 403
    /// (Anthropic: 402) otherwise.
    pub fn reason(reason: Reason, retry_after_ms: Option<u64>, message: String) -> Refusal {
        let action = reason.action();
        Refusal {
            status: if action == Action::Retry {
                StatusCode::TOO_MANY_REQUESTS
            } else {
                StatusCode::FORBIDDEN
            },
            code: RefusalCode::Reason(reason),
            action,
            message,
            retry_after_ms: if action == Action::Retry {
                Some(retry_after_ms.unwrap_or(1000))
            } else {
                None
            },
            cause: None,
            recorded: None,
            close: false,
            key: None,
        }
    }

    /// The proxy's own error: `status` and `code`, action `stop`.
    pub fn own(status: StatusCode, code: ErrorCode, message: impl Into<String>) -> Refusal {
        Refusal {
            status,
            code: RefusalCode::Error(code),
            action: Action::Stop,
            message: message.into(),
            retry_after_ms: None,
            cause: None,
            recorded: None,
            close: false,
            key: None,
        }
    }

    /// A 403 (Anthropic: 402) for a real token whose run may spend no more (stopped, or
    /// past its deadline): `reason`, action `stop`, whatever the reason's own action,
    /// since nothing this run does can make the call go through.
    pub fn ended(reason: Reason, message: String) -> Refusal {
        Refusal {
            status: StatusCode::FORBIDDEN,
            code: RefusalCode::Reason(reason),
            action: Action::Stop,
            message,
            retry_after_ms: None,
            recorded: None,
            cause: None,
            close: false,
            key: None,
        }
    }

    /// A 401 for a token that is unknown or forged.
    pub fn token(message: impl Into<String>) -> Refusal {
        Refusal::own(StatusCode::UNAUTHORIZED, ErrorCode::InvalidToken, message)
    }

    /// The status in `kind`'s dialect. Anthropic's for a call this run may not make
    /// (403 elsewhere) is 402, its `billing_error`: Claude Code answers a 401 or 403
    /// by running its `apiKeyHelper` again and retrying, up to ten times over minutes,
    /// whatever `x-should-retry` says, and shows "Failed to authenticate" otherwise; a
    /// 402 it reports once, with the message (the official SDK raises
    /// `PaymentRequiredError`).
    pub fn status_in(&self, kind: UpstreamKind) -> StatusCode {
        match (kind, self.status) {
            (UpstreamKind::Anthropic, StatusCode::FORBIDDEN) => StatusCode::PAYMENT_REQUIRED,
            (_, status) => status,
        }
    }

    /// The `x-should-retry` the answer carries, which the official OpenAI and Anthropic
    /// SDKs (and Claude Code, and the OpenAI Agents SDK) obey over their own choice:
    /// `true` for action `retry` (with `Retry-After`), `false` for `stop` and `ask`, so
    /// that no client sends again a call that is refused again. None for the proxy's
    /// 502 and 504 (`upstream_unreachable`, `upstream_timeout`): the upstream failed,
    /// not the run, and a client retries them as it retries the upstream's own 5xx (each
    /// retry a new call the gate decides).
    pub fn should_retry(&self) -> Option<&'static str> {
        match self.action {
            Action::Retry => Some("true"),
            _ if self.status.is_server_error() => None,
            _ => Some("false"),
        }
    }

    /// The answer in `kind`'s dialect.
    pub fn response(&self, kind: UpstreamKind) -> Response<Body> {
        let action = self.action.as_str();
        let cause = self.cause.map(|c| c.as_str());
        let message = format!("tally: {} ({}, action {action})", self.message, self.code);
        let status = self.status_in(kind);
        let body = match kind {
            UpstreamKind::Anthropic => {
                let kind = match status {
                    StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
                    StatusCode::UNAUTHORIZED => "authentication_error",
                    StatusCode::PAYMENT_REQUIRED => "billing_error",
                    StatusCode::FORBIDDEN => "permission_error",
                    StatusCode::PAYLOAD_TOO_LARGE => "request_too_large",
                    StatusCode::NOT_FOUND => "not_found_error",
                    s if s.is_server_error() => "api_error",
                    _ => "invalid_request_error",
                };
                let mut b = json!({"type": "error", "error": {"type": kind, "message": message},
                       "tally": {"reason": self.code.as_str(), "action": action, "cause": cause}});
                if let Some(k) = &self.key {
                    b["tally"]["key"] = json!(k);
                }
                b
            }
            UpstreamKind::Gemini => {
                let mut b = gemini_error(status, &message, self.code.as_str(), action, cause);
                if let Some(k) = &self.key {
                    b["error"]["key"] = json!(k);
                }
                b
            }
            UpstreamKind::Bedrock => {
                let mut b = json!({"message": message,
                       "tally": {"reason": self.code.as_str(), "action": action, "cause": cause}});
                if let Some(k) = &self.key {
                    b["tally"]["key"] = json!(k);
                }
                b
            }
            UpstreamKind::Openai | UpstreamKind::AzureOpenai | UpstreamKind::Http => {
                let mut b = json!({"error": {
                "message": message, "type": "tally_refused", "code": self.code.as_str(),
                "param": null, "action": action, "cause": cause}});
                if let Some(k) = &self.key {
                    b["error"]["key"] = json!(k);
                }
                b
            }
        };
        let mut r = Response::builder()
            .status(status)
            .header("content-type", "application/json");
        if kind == UpstreamKind::Bedrock {
            r = r.header("x-amzn-errortype", bedrock_error_type(status));
        }
        if let Some(retry) = self.should_retry() {
            r = r.header("x-should-retry", retry);
        }
        if let Some(ms) = self.retry_after_ms {
            r = r.header("retry-after", ms.div_ceil(1000).max(1).to_string());
        }
        if let Some((run, seq)) = &self.recorded {
            if let Ok(v) = hyper::header::HeaderValue::from_str(run) {
                r = r.header("x-tally-run", v);
            }
            r = r.header("x-tally-seq", seq.to_string());
        }
        if self.close {
            r = r.header("connection", "close");
        }
        r.body(
            Full::new(Bytes::from(body.to_string()))
                .map_err(|e| match e {})
                .boxed(),
        )
        .unwrap_or_else(|_| Response::new(crate::empty()))
    }
}

/// The exception Bedrock names for `status` (its `x-amzn-ErrorType`), which boto3
/// raises as a `ClientError` with that code and the body's `message`.
fn bedrock_error_type(status: StatusCode) -> &'static str {
    match status {
        StatusCode::BAD_REQUEST | StatusCode::PAYLOAD_TOO_LARGE => "ValidationException",
        StatusCode::UNAUTHORIZED => "UnrecognizedClientException",
        StatusCode::FORBIDDEN => "AccessDeniedException",
        StatusCode::NOT_FOUND => "ResourceNotFoundException",
        StatusCode::REQUEST_TIMEOUT => "ModelTimeoutException",
        StatusCode::TOO_MANY_REQUESTS => "ThrottlingException",
        StatusCode::SERVICE_UNAVAILABLE => "ServiceUnavailableException",
        s if s.is_server_error() => "InternalServerException",
        _ => "ValidationException",
    }
}

/// Google's error shape (`google.rpc.Status` as JSON), which the `google-genai` SDK
/// raises as its `ClientError` or `ServerError` with the code, status and message:
/// tally's reason, action and cause in an `ErrorInfo` detail (domain `tally`).
fn gemini_error(
    status: StatusCode,
    message: &str,
    reason: &str,
    action: &str,
    cause: Option<&str>,
) -> serde_json::Value {
    let rpc = match status {
        StatusCode::BAD_REQUEST | StatusCode::PAYLOAD_TOO_LARGE => "INVALID_ARGUMENT",
        StatusCode::UNAUTHORIZED => "UNAUTHENTICATED",
        StatusCode::FORBIDDEN => "PERMISSION_DENIED",
        StatusCode::NOT_FOUND => "NOT_FOUND",
        StatusCode::TOO_MANY_REQUESTS => "RESOURCE_EXHAUSTED",
        StatusCode::REQUEST_TIMEOUT | StatusCode::GATEWAY_TIMEOUT => "DEADLINE_EXCEEDED",
        StatusCode::BAD_GATEWAY | StatusCode::SERVICE_UNAVAILABLE => "UNAVAILABLE",
        s if s.is_server_error() => "INTERNAL",
        _ => "FAILED_PRECONDITION",
    };
    let mut metadata = json!({"action": action});
    if let Some(c) = cause {
        metadata["cause"] = json!(c);
    }
    json!({"error": {
        "code": status.as_u16(),
        "message": message,
        "status": rpc,
        "details": [{
            "@type": "type.googleapis.com/google.rpc.ErrorInfo",
            "reason": reason,
            "domain": "tally",
            "metadata": metadata,
        }],
    }})
}

//! Every error reply of the daemon's sockets: `{"error": {"code", "message", "field"?,
//! "line"?, "column"?}}`, its code one of [`ErrorCode`] (docs/DAEMON.md lists them).

use std::fmt;

use serde::{Deserialize, Serialize};

/// A typed error's stable, machine-readable code, as the daemon and the proxy send it
/// (`"unknown_field"`, `"run_not_found"`, ...). One enum for every code, so no crate
/// spells one by hand, and a client matches on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ErrorCode {
    /// An answer to an approval request whose run is past its deadline.
    ApprovalExpired,
    /// An approval whose signature, approver or scope the policy refuses.
    ApprovalRefused,
    /// A start that needs an approver's grant first (`cause` says why).
    ApprovalRequired,
    /// An outcome (or a settle) for an attempt already settled.
    AttemptSettled,
    /// More decisions in one request than `max_batch`.
    BatchTooLarge,
    /// A request with a body on the metrics listener.
    BodyNotAllowed,
    /// Reading the request body failed.
    BodyReadFailed,
    /// A body over `max_body_bytes`.
    BodyTooLarge,
    /// An empty body where one is needed.
    EmptyBody,
    /// A field on a kind it does not belong to.
    FieldNotAllowed,
    /// Text over its bound.
    FieldTooLong,
    /// A request the listener or route does not serve to this peer.
    Forbidden,
    /// The gate cannot record decisions: it refuses every call (fail closed).
    GateUnavailable,
    /// A raw decision for a run the gate governs.
    GovernedRun,
    /// A record its run's own history does not allow.
    Inconsistent,
    /// A fault of the daemon's own.
    Internal,
    /// A decision the ledger refuses for another reason.
    InvalidDecision,
    /// A malformed value.
    InvalidField,
    /// Not JSON, truncated, or trailing data.
    InvalidJson,
    /// A query string the route does not read.
    InvalidQuery,
    /// The proxy's: a request the upstream cannot be sent.
    InvalidRequest,
    /// A run name in the path that is not UTF-8 once percent-decoded.
    InvalidRun,
    /// The proxy's: a run token that is unknown or forged.
    InvalidToken,
    /// The proxy's: a key (docs/KEYS.md) the operator revoked.
    KeyRevoked,
    /// A field of the wrong type.
    InvalidType,
    /// A value out of range or not one of the allowed names.
    InvalidValue,
    /// The ledger cannot write; nothing in the request is acknowledged.
    LedgerUnavailable,
    /// A method the route does not serve.
    MethodNotAllowed,
    /// A required field is absent.
    MissingField,
    /// An outcome (or a settle) for an attempt the run never allowed.
    NoSuchAttempt,
    /// An operator's route asked on the agent socket, or a credential not the caller's.
    NotAuthorized,
    /// No such route.
    NotFound,
    /// A run another uid started.
    NotOwner,
    /// A body that is not UTF-8.
    NotUtf8,
    /// An outcome for an attempt tally's proxy made (the proxy reports it).
    OutcomeOwnedByProxy,
    /// The starting uid used its principal budget for the period.
    PrincipalBudgetExceeded,
    /// Over this peer's decisions/s; `Retry-After` says when to come back.
    RateLimited,
    /// A start the gate refuses with a reason code (in the message).
    Refused,
    /// No approval request of that id.
    RequestNotFound,
    /// The body did not arrive within the read timeout.
    RequestTimeout,
    /// A start for a run that exists.
    RunExists,
    /// No such run.
    RunNotFound,
    /// A continuation of a run that is not stopped.
    RunNotStopped,
    /// The run is stopped: nothing more is decided for it.
    RunStopped,
    /// This peer holds as many connections as it may (or the listener serves as many as it may).
    TooManyConnections,
    /// More new names at once than the gate holds; `Retry-After: 1`.
    TooManyNames,
    /// The uid has as many open runs as it may.
    TooManyRuns,
    /// As many live event streams as may be open are.
    TooManyStreams,
    /// A field the body's type does not have.
    UnknownField,
    /// A content type the route does not read.
    UnsupportedMediaType,
    /// The proxy's: an upstream whose URL is given by `url_file` answered an error
    /// status; its body and headers are withheld (they may echo the URL's secret).
    UpstreamError,
    /// The proxy's: the upstream did not answer in time.
    UpstreamTimeout,
    /// The proxy's: the upstream could not be reached.
    UpstreamUnreachable,
    /// A code this build does not know (a newer daemon's); never sent.
    #[serde(other)]
    Other,
}

impl ErrorCode {
    /// Every code a daemon or proxy of this build sends.
    pub const ALL: [ErrorCode; 53] = [
        ErrorCode::ApprovalExpired,
        ErrorCode::ApprovalRefused,
        ErrorCode::ApprovalRequired,
        ErrorCode::AttemptSettled,
        ErrorCode::BatchTooLarge,
        ErrorCode::BodyNotAllowed,
        ErrorCode::BodyReadFailed,
        ErrorCode::BodyTooLarge,
        ErrorCode::EmptyBody,
        ErrorCode::FieldNotAllowed,
        ErrorCode::FieldTooLong,
        ErrorCode::Forbidden,
        ErrorCode::GateUnavailable,
        ErrorCode::GovernedRun,
        ErrorCode::Inconsistent,
        ErrorCode::Internal,
        ErrorCode::InvalidDecision,
        ErrorCode::InvalidField,
        ErrorCode::InvalidJson,
        ErrorCode::InvalidQuery,
        ErrorCode::InvalidRequest,
        ErrorCode::InvalidRun,
        ErrorCode::InvalidToken,
        ErrorCode::KeyRevoked,
        ErrorCode::InvalidType,
        ErrorCode::InvalidValue,
        ErrorCode::LedgerUnavailable,
        ErrorCode::MethodNotAllowed,
        ErrorCode::MissingField,
        ErrorCode::NoSuchAttempt,
        ErrorCode::NotAuthorized,
        ErrorCode::NotFound,
        ErrorCode::NotOwner,
        ErrorCode::NotUtf8,
        ErrorCode::OutcomeOwnedByProxy,
        ErrorCode::PrincipalBudgetExceeded,
        ErrorCode::RateLimited,
        ErrorCode::Refused,
        ErrorCode::RequestNotFound,
        ErrorCode::RequestTimeout,
        ErrorCode::RunExists,
        ErrorCode::RunNotFound,
        ErrorCode::RunNotStopped,
        ErrorCode::RunStopped,
        ErrorCode::TooManyConnections,
        ErrorCode::TooManyNames,
        ErrorCode::TooManyRuns,
        ErrorCode::TooManyStreams,
        ErrorCode::UnknownField,
        ErrorCode::UnsupportedMediaType,
        ErrorCode::UpstreamError,
        ErrorCode::UpstreamTimeout,
        ErrorCode::UpstreamUnreachable,
    ];

    /// The code as it is on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::ApprovalExpired => "approval_expired",
            ErrorCode::ApprovalRefused => "approval_refused",
            ErrorCode::ApprovalRequired => "approval_required",
            ErrorCode::AttemptSettled => "attempt_settled",
            ErrorCode::BatchTooLarge => "batch_too_large",
            ErrorCode::BodyNotAllowed => "body_not_allowed",
            ErrorCode::BodyReadFailed => "body_read_failed",
            ErrorCode::BodyTooLarge => "body_too_large",
            ErrorCode::EmptyBody => "empty_body",
            ErrorCode::FieldNotAllowed => "field_not_allowed",
            ErrorCode::FieldTooLong => "field_too_long",
            ErrorCode::Forbidden => "forbidden",
            ErrorCode::GateUnavailable => "gate_unavailable",
            ErrorCode::GovernedRun => "governed_run",
            ErrorCode::Inconsistent => "inconsistent",
            ErrorCode::Internal => "internal",
            ErrorCode::InvalidDecision => "invalid_decision",
            ErrorCode::InvalidField => "invalid_field",
            ErrorCode::InvalidJson => "invalid_json",
            ErrorCode::InvalidQuery => "invalid_query",
            ErrorCode::InvalidRequest => "invalid_request",
            ErrorCode::InvalidRun => "invalid_run",
            ErrorCode::InvalidToken => "invalid_token",
            ErrorCode::KeyRevoked => "key_revoked",
            ErrorCode::InvalidType => "invalid_type",
            ErrorCode::InvalidValue => "invalid_value",
            ErrorCode::LedgerUnavailable => "ledger_unavailable",
            ErrorCode::MethodNotAllowed => "method_not_allowed",
            ErrorCode::MissingField => "missing_field",
            ErrorCode::NoSuchAttempt => "no_such_attempt",
            ErrorCode::NotAuthorized => "not_authorized",
            ErrorCode::NotFound => "not_found",
            ErrorCode::NotOwner => "not_owner",
            ErrorCode::NotUtf8 => "not_utf8",
            ErrorCode::OutcomeOwnedByProxy => "outcome_owned_by_proxy",
            ErrorCode::PrincipalBudgetExceeded => "principal_budget_exceeded",
            ErrorCode::RateLimited => "rate_limited",
            ErrorCode::Refused => "refused",
            ErrorCode::RequestTimeout => "request_timeout",
            ErrorCode::RequestNotFound => "request_not_found",
            ErrorCode::RunExists => "run_exists",
            ErrorCode::RunNotFound => "run_not_found",
            ErrorCode::RunNotStopped => "run_not_stopped",
            ErrorCode::RunStopped => "run_stopped",
            ErrorCode::TooManyConnections => "too_many_connections",
            ErrorCode::TooManyNames => "too_many_names",
            ErrorCode::TooManyRuns => "too_many_runs",
            ErrorCode::TooManyStreams => "too_many_streams",
            ErrorCode::UnknownField => "unknown_field",
            ErrorCode::UnsupportedMediaType => "unsupported_media_type",
            ErrorCode::UpstreamError => "upstream_error",
            ErrorCode::UpstreamTimeout => "upstream_timeout",
            ErrorCode::UpstreamUnreachable => "upstream_unreachable",
            ErrorCode::Other => "other",
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A code equals its wire name (what a test of the JSON reads).
impl PartialEq<str> for ErrorCode {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for ErrorCode {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

/// Every error reply: `{"error": {...}}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ErrorReply {
    /// What went wrong.
    pub error: ErrorDetail,
}

/// One typed error.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ErrorDetail {
    /// Stable machine-readable code, e.g. `unknown_field`, `body_too_large`,
    /// `rate_limited`, `ledger_unavailable` (docs/DAEMON.md lists them all).
    pub code: ErrorCode,
    /// What a person should read.
    pub message: String,
    /// The field path at fault (`budget.attempts`, `kind`), when one is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// 1-based line of the request body at fault (NDJSON batches, JSON syntax errors).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub line: Option<usize>,
    /// 1-based column within that line, for JSON syntax and type errors.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub column: Option<usize>,
    /// For `approval_required`: the reason a human must decide
    /// (`refill_without_approval`); for `refused`: the reason typed (its action is the
    /// reason's, section "Reason codes" of docs/GATE.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<tally_record::Reason>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_code_is_its_wire_name_and_reads_back() {
        for code in ErrorCode::ALL {
            let json = serde_json::to_string(&code).unwrap();
            assert_eq!(json, format!("\"{}\"", code.as_str()));
            assert_eq!(serde_json::from_str::<ErrorCode>(&json).unwrap(), code);
            assert_eq!(code, code.as_str());
        }
        let mut names: Vec<&str> = ErrorCode::ALL.iter().map(|c| c.as_str()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), ErrorCode::ALL.len());
    }

    #[test]
    fn an_unknown_code_reads_as_other() {
        let reply: ErrorReply =
            serde_json::from_str(r#"{"error":{"code":"made_up","message":"m"}}"#).unwrap();
        assert_eq!(reply.error.code, ErrorCode::Other);
        let reply: ErrorReply =
            serde_json::from_str(r#"{"error":{"code":"run_stopped","message":"m"}}"#).unwrap();
        assert_eq!(reply.error.code, ErrorCode::RunStopped);
    }
}

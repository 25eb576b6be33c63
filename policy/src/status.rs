//! What an outcome's status means to the rules, asked by the gate's fold, the proxy and
//! the reports alike: whether it ends its attempt, whether it is a failure (the breaker
//! and the reports count those), whether the call may have happened unseen. Only this
//! crate matches on a [`Status`].

use tally_record::{Effect, Status};

/// Whether an outcome with `status` ends its attempt (no further outcome for it).
pub fn is_final(status: Status) -> bool {
    matches!(status, Status::Ok | Status::Error | Status::Rejected)
}

/// Whether an outcome with `status` is a failure: `error` or `timeout`. A tool's breaker
/// opens on them, and the reports count a loop's failures by them.
pub fn is_failure(status: Status) -> bool {
    matches!(status, Status::Error | Status::Timeout)
}

/// Whether an outcome with `status` is a success (`ok`): it clears its operation's
/// retries and closes a breaker.
pub fn is_success(status: Status) -> bool {
    status == Status::Ok
}

/// Whether an outcome with `status` says nothing happened (`rejected`): its attempt is
/// refunded, and it settles nothing.
pub fn is_rejection(status: Status) -> bool {
    status == Status::Rejected
}

/// Whether an outcome with `status` says the call is still under way (`running`).
pub fn is_running(status: Status) -> bool {
    status == Status::Running
}

/// Whether an outcome with `status` says the call timed out (`timeout`).
pub fn timed_out(status: Status) -> bool {
    status == Status::Timeout
}

/// Whether an outcome with `status` leaves open whether the call happened (`unknown`,
/// `timeout`): a non-idempotent write is not repeated until a human reconciles it.
pub fn may_have_happened(status: Status) -> bool {
    matches!(status, Status::Unknown | Status::Timeout)
}

/// The status to record when a call with `effect` ends with `status` on the caller's
/// side: a timeout of a non-idempotent write is `unknown` (it may have happened).
pub fn recorded_status(status: Status, effect: Effect) -> Status {
    if timed_out(status) && effect == Effect::NonIdempotentWrite {
        Status::Unknown
    } else {
        status
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_and_a_timeout_are_failures_and_nothing_else_is() {
        let failures: Vec<Status> = [
            Status::Ok,
            Status::Error,
            Status::Timeout,
            Status::Rejected,
            Status::Running,
            Status::Unknown,
        ]
        .into_iter()
        .filter(|&s| is_failure(s))
        .collect();
        assert_eq!(failures, [Status::Error, Status::Timeout]);
    }

    #[test]
    fn only_a_non_idempotent_writes_timeout_is_recorded_unknown() {
        use Effect::{IdempotentWrite, NonIdempotentWrite, Read};
        assert_eq!(
            recorded_status(Status::Timeout, NonIdempotentWrite),
            Status::Unknown
        );
        assert_eq!(
            recorded_status(Status::Timeout, IdempotentWrite),
            Status::Timeout
        );
        assert_eq!(recorded_status(Status::Timeout, Read), Status::Timeout);
        assert_eq!(
            recorded_status(Status::Error, NonIdempotentWrite),
            Status::Error
        );
    }
}

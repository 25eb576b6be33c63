//! The gate's decision thread ([`Stage`]) and the calls that go through it, and the
//! typed error an agent gets for a gate error: what both sockets' handlers share.

use axum::http::StatusCode;
use tally_gate::GateError;
use tally_wire::ErrorCode;
use tokio::sync::oneshot;

use crate::error::ApiError;

/// A line for the operator's log. A log that cannot be written (a full disk) must not
/// take the answer down with it: the agent still gets its typed refusal.
pub(crate) fn log(line: &str) {
    crate::observe::log_line("error", line);
}

/// The typed error an agent gets for a gate error.
pub(crate) fn gate_error(e: GateError) -> ApiError {
    use StatusCode as S;
    let msg = e.to_string();
    match e {
        GateError::RunNotFound(_) => ApiError::new(S::NOT_FOUND, ErrorCode::RunNotFound, msg),
        GateError::RunExists(_) => ApiError::new(S::CONFLICT, ErrorCode::RunExists, msg),
        GateError::NotOwner { .. } => ApiError::new(S::FORBIDDEN, ErrorCode::NotOwner, msg),
        GateError::NotAuthorized(_) => ApiError::new(S::FORBIDDEN, ErrorCode::NotAuthorized, msg),
        GateError::TooManyRuns { .. } => {
            ApiError::new(S::TOO_MANY_REQUESTS, ErrorCode::TooManyRuns, msg)
        }
        GateError::RunStopped { .. } | GateError::Stopped(_) => {
            ApiError::new(S::CONFLICT, ErrorCode::RunStopped, msg)
        }
        GateError::NotStopped(_) => ApiError::new(S::CONFLICT, ErrorCode::RunNotStopped, msg),
        // A uid past its budget across its runs: the code is the reason's, so an agent
        // tells it by the code alone (action ask: a new run does not help).
        GateError::Refused(r @ tally_ledger::Reason::PrincipalBudgetExceeded) => ApiError::new(
            S::FORBIDDEN,
            ErrorCode::PrincipalBudgetExceeded,
            format!("{msg} (action {}): {}", r.action(), r.meaning()),
        ),
        // Refused outright (a start's depth, a leased scope with no room left): the
        // reason typed beside the code, with its action.
        GateError::Refused(r) => {
            let said = format!("{msg} (action {}): {}", r.action(), r.meaning());
            let mut e = ApiError::new(S::FORBIDDEN, ErrorCode::Refused, said);
            e.detail.cause = Some(r);
            e
        }
        // A start a human must grant: the code is the verdict's, the cause typed beside it.
        GateError::ApprovalRequired { cause, .. } => {
            let mut e = ApiError::new(
                S::FORBIDDEN,
                ErrorCode::ApprovalRequired,
                format!("{msg} (action {}): {}", cause.action(), cause.meaning()),
            )
            .field("continues");
            e.detail.cause = Some(cause);
            e
        }
        GateError::OutcomeOwnedByProxy { .. } => {
            ApiError::new(S::FORBIDDEN, ErrorCode::OutcomeOwnedByProxy, msg)
        }
        GateError::NoSuchAttempt { .. } => {
            ApiError::new(S::NOT_FOUND, ErrorCode::NoSuchAttempt, msg)
        }
        GateError::AttemptSettled { .. } => {
            ApiError::new(S::CONFLICT, ErrorCode::AttemptSettled, msg)
        }
        GateError::ApprovalRefused(_) => {
            ApiError::new(S::FORBIDDEN, ErrorCode::ApprovalRefused, msg)
        }
        GateError::RequestNotFound(_) => {
            ApiError::new(S::NOT_FOUND, ErrorCode::RequestNotFound, msg)
        }
        GateError::RequestExpired(_) => ApiError::new(S::CONFLICT, ErrorCode::ApprovalExpired, msg),
        GateError::Inconsistent { .. } => ApiError::new(S::CONFLICT, ErrorCode::Inconsistent, msg),
        GateError::TooManyNames { .. } => {
            let mut e = ApiError::new(S::TOO_MANY_REQUESTS, ErrorCode::TooManyNames, msg);
            e.retry_after_secs = Some(1);
            e
        }
        GateError::Invalid(d) => ApiError::decision(&d),
        GateError::Unavailable(why) => {
            log(&format!(
                "tally serve: the gate cannot decide durably: {why}"
            ));
            ApiError::new(
                S::SERVICE_UNAVAILABLE,
                ErrorCode::GateUnavailable,
                "the gate cannot record decisions, so it refuses every call (fail closed); retry later (the daemon's log has the cause)",
            )
        }
        _ => ApiError::new(S::INTERNAL_SERVER_ERROR, ErrorCode::Internal, msg),
    }
}

/// Run a gate operation that answers through a callback, and await its answer.
/// The one thread that makes the gate's decisions, in the order they arrive.
///
/// A decision holds the gate's state while it is made and queued for the ledger (that
/// is what keeps each scope's order in the ledger the order its state changed). Made on
/// the runtime's workers, every concurrent request contended for that lock, and the
/// workers spent their time in futex waits; made here, one after another with no
/// contention, the workers only parse, hand over and answer. Replies still come from the
/// ledger's commit thread once durable.
///
/// With a networked state backend, a call that waited longer than the backend's bound
/// for its turn here is refused as unavailable without being made: the backend's own
/// deadline on queued decisions cannot act on calls made one after another by this one
/// thread, and on a database that stopped answering (a network partition: no reset, no
/// refusal) each call would otherwise spend up to the bound in turn, so the k-th queued
/// check waited k bounds (docs/FLEET.md, "What each failure does").
pub(crate) struct Stage {
    jobs: std::sync::mpsc::Sender<(std::time::Instant, Job)>,
}

/// A gate call: run with `false`, or with `true` to refuse it as unavailable.
type Job = Box<dyn FnOnce(bool) + Send>;

impl Stage {
    /// Start the decision thread. It ends when the last sender is dropped. `bound`: the
    /// longest a call may wait for its turn (`None`: no limit).
    pub fn start(bound: Option<std::time::Duration>) -> std::io::Result<Stage> {
        let (jobs, queue) = std::sync::mpsc::channel::<(std::time::Instant, Job)>();
        std::thread::Builder::new()
            .name("tally-gate".into())
            .spawn(move || {
                while let Ok((queued, job)) = queue.recv() {
                    job(bound.is_some_and(|b| queued.elapsed() > b));
                }
            })?;
        Ok(Stage { jobs })
    }

    /// The proxy's way onto this thread: each job runs here in turn, told whether it
    /// waited past the bound.
    pub fn submitter(&self) -> tally_proxy::Stage {
        let jobs = std::sync::Mutex::new(self.jobs.clone());
        std::sync::Arc::new(move |job: Box<dyn FnOnce(bool) + Send>| {
            let sent = jobs
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .send((std::time::Instant::now(), job));
            // The thread is gone: the job is dropped, and its caller hears `Unavailable`.
            drop(sent);
        })
    }
}

/// Run `f` on the decision thread; its answer once `f` calls back (after the decision
/// is durable), or `Unavailable` if the thread is gone.
pub(crate) async fn answered<T: Send + 'static>(
    stage: &Stage,
    f: impl FnOnce(Box<dyn FnOnce(Result<T, GateError>) + Send>) + Send + 'static,
) -> Result<T, GateError> {
    let (tx, rx) = oneshot::channel();
    let job: Job = Box::new(move |late| {
        if late {
            let _ = tx.send(Err(GateError::Unavailable(
                "this gate's earlier decisions held the database past its bound; the gate refuses until the database answers (retry)".into(),
            )));
            return;
        }
        f(Box::new(move |r| {
            let _ = tx.send(r);
        }))
    });
    if stage.jobs.send((std::time::Instant::now(), job)).is_err() {
        return Err(GateError::Unavailable(
            "the gate's decision thread has stopped".into(),
        ));
    }
    rx.await
        .unwrap_or_else(|_| Err(GateError::Unavailable("the gate dropped a request".into())))
}

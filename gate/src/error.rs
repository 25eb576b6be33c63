//! The gate's typed errors. Each says what was wrong and what to do next.

use tally_ledger::Reason;

/// Why the gate did not decide. Nothing was recorded and no state changed, except for
/// [`GateError::Unavailable`] raised after queueing (then the gate refuses everything).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GateError {
    /// The run was never started through the gate (or by this uid).
    #[error("run `{0}` is not known to the gate: start it with POST /v1/runs first")]
    RunNotFound(String),
    /// A run of that name exists (a new task is a new run).
    #[error("run `{0}` already exists; a new task is a new run: choose another name")]
    RunExists(String),
    /// The run belongs to another uid.
    #[error(
        "run `{run}` was started by another user; only its owner (or the operator) may act on it"
    )]
    NotOwner {
        /// The run.
        run: String,
    },
    /// The caller may not do this.
    #[error("not allowed: {0}")]
    NotAuthorized(String),
    /// The uid holds as many open runs as the policy allows.
    #[error("{} already holds {max} open runs (the policy's max_open_runs_per_uid); stop finished runs first", uid.map_or("loopback TCP".to_owned(), |u| format!("uid {u}")))]
    TooManyRuns {
        /// The uid (`None`: loopback TCP peers).
        uid: Option<u32>,
        /// The bound.
        max: u64,
    },
    /// The run is over: the answer says why (nothing was recorded).
    #[error("the run is stopped")]
    Stopped(Box<crate::CheckAnswer>),
    /// The run has stopped: nothing more can be decided for it.
    #[error("run `{run}` has stopped ({reason}); a new task is a new run")]
    RunStopped {
        /// The run.
        run: String,
        /// Why it stopped.
        reason: Reason,
    },
    /// The continued run has not stopped.
    #[error("run `{0}` has not stopped: a run continues only a stopped one")]
    NotStopped(String),
    /// A start refused outright (its depth).
    #[error("refused: {0}")]
    Refused(Reason),
    /// An outcome for an attempt the gate never allowed.
    #[error("run `{run}` has no allowed attempt {attempt}: report the attempt the check answered")]
    NoSuchAttempt {
        /// The run.
        run: String,
        /// The attempt named.
        attempt: u64,
    },
    /// An outcome for an attempt that already had its final outcome, or a second
    /// settlement of one.
    #[error("attempt {attempt} of run `{run}` is already settled: it had its final outcome, or an outcome with settled_nanos or settled_cents (an attempt settles once); report later news without them")]
    AttemptSettled {
        /// The run.
        run: String,
        /// The attempt.
        attempt: u64,
    },
    /// An outcome for an attempt the proxy made, from a caller that is not the proxy: the
    /// proxy observes it (the daemon answers 403 `outcome_owned_by_proxy`).
    #[error("attempt {attempt} of run `{run}` was made through tally's proxy, which observes its outcome: the agent cannot report it")]
    OutcomeOwnedByProxy {
        /// The run.
        run: String,
        /// The attempt.
        attempt: u64,
    },
    /// What the record would do is inconsistent with the run's history (the policy
    /// core's judgement): refused, never recorded.
    #[error("refused: {} (run `{run}`)", found.as_str())]
    Inconsistent {
        /// The run.
        run: String,
        /// What the core found.
        found: tally_policy::Inconsistency,
    },
    /// The approval does not check out, or arrived too late.
    #[error("approval refused: {0}")]
    ApprovalRefused(String),
    /// A start the core refuses until an approver grants it (`cause` says why).
    #[error("approval required ({cause}): {why}")]
    ApprovalRequired {
        /// The reason a human must decide.
        cause: Reason,
        /// What was found, in words.
        why: String,
    },
    /// No approval request of that id is held (`tally approvals` lists them).
    #[error("no approval request `{0}`: `tally approvals --operator-socket PATH` lists the requests the gate holds")]
    RequestNotFound(String),
    /// An answer to a request whose run is past its deadline.
    #[error("approval request `{0}` expired with its run's deadline; the run cannot be revived: start a new run")]
    RequestExpired(String),
    /// Too many distinct tools or credentials are tracked (an agent inventing names).
    #[error("the gate tracks {max} {what} already; retry when some are idle")]
    TooManyNames {
        /// "tools" or "credentials".
        what: &'static str,
        /// The bound.
        max: usize,
    },
    /// The request is not a valid decision (a field too long, a bad digest...).
    #[error(transparent)]
    Invalid(#[from] tally_ledger::DecisionError),
    /// The gate cannot decide durably: fail closed, retry later.
    #[error("gate unavailable: {0}")]
    Unavailable(String),
}

impl From<tally_ledger::Error> for GateError {
    fn from(e: tally_ledger::Error) -> GateError {
        match e {
            tally_ledger::Error::Decision(d) => GateError::Invalid(d),
            tally_ledger::Error::InBatch { source, .. } => GateError::Invalid(source),
            other => GateError::Unavailable(other.to_string()),
        }
    }
}

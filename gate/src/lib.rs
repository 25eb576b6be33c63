//! tally's live gate: agents ask before every external call; the gate decides from the
//! run's budget with the policy core (`tally-policy`), appends the decision through the
//! ledger, and answers only once the decision is durable (docs/GATE.md).
//!
//! * One core: [`tally_policy::decide`] then [`tally_policy::apply`], the same functions
//!   `tally verify` replays.
//! * Ordering: state changes when a call is decided (not when its record is durable), and
//!   the decision is queued for its commit group while the state lock is held, so the
//!   ledger's order is the order state changed and two checks can never both take the
//!   last slot.
//! * Durability: the state each decision leaves is written in the same atomic store batch
//!   as the decision itself ([`Ledger::submit_with_state`]): after a crash the store holds
//!   both or neither, so state is never behind the ledger.
//! * Fail closed: when a decision cannot be made durable, the answer is an error (the
//!   daemon says `gate_unavailable`), never an allow; the gate then refuses everything
//!   until restarted.
//! * Authority (SECURITY.md 5.7): a run is bound to the uid that started it; only the gate
//!   writes allow, deny, refund and override for the runs it governs; a run the gate
//!   holds no state for is refused, never given a fresh budget.
#![forbid(unsafe_code)]

pub mod backend;
mod calls;
pub mod clock;
mod commit;
mod continuation;
mod denials;
mod error;
mod gatekeeper;
mod messages;
mod requests;
mod runs;
mod scopes;
mod snapshot;
mod start;
mod tables;
mod work;

use std::sync::{Arc, Mutex};

use tally_ledger::{Decision, Kind, Ledger, Reason};
use tally_policy::{Now, Recorded, RunState};

use backend::{Embedded, Scopes, StateBackend, StateTxn};
pub use clock::{Clock, ManualClock, SystemClock};
pub use error::GateError;
pub use gatekeeper::Gatekeeper;
pub use messages::Caller;
pub use tally_wire::{
    Approval, ApprovalRequest, CheckAnswer, CheckRequest, Denial, Logged, OutcomeRequest,
    RequestState, SettleRequest, Standing, StartRequest, Started, StopRequest,
};
use work::Work;

type Done<T> = Box<dyn FnOnce(Result<T, GateError>) + Send>;

/// Whether a credential has state to keep: a spend backstop in the policy, or a bucket.
fn tracks_credential(policy: &tally_policy::Policy, credential: &str) -> bool {
    policy.rate.credential_per_sec > 0
        || policy
            .credentials
            .get(credential)
            .is_some_and(|c| c.spend_nanos_per_period.is_some())
}

/// The principal scope of `uid`: its name (the uid in decimal), if the policy gives the
/// uid a principal budget. A caller without a uid (in-process, loopback TCP) has none.
fn principal_scope(policy: &tally_policy::Policy, uid: Option<u32>) -> Option<String> {
    uid.filter(|u| policy.principal(*u).is_some())
        .map(|u| u.to_string())
}

/// Longest tool name the gate takes, in bytes.
pub const MAX_TOOL_BYTES: usize = 256;

/// The state entry that marks a run name as taken by raw decisions (appended by the
/// operator for a run the gate does not govern): the gate never starts a run of that
/// name, so raw and gated histories are never merged under one name.
pub fn raw_run_entry(run: &str) -> (Vec<u8>, Vec<u8>) {
    tables::raw_run_entry(run)
}

/// The live gate over one ledger, with its state in a [`StateBackend`] (by default
/// [`Embedded`]: the ledger's own store).
pub struct Gate<B: StateBackend = Embedded> {
    ledger: Arc<Ledger>,
    policy: Recorded,
    /// The policy record's stored bytes (checked when the gate opens).
    policy_record: Arc<Vec<u8>>,
    backend: B,
    failure: Arc<Mutex<Option<String>>>,
    /// Whether the ledger already holds this policy as its last policy record. If not,
    /// the first decision made under it carries the policy record in its own commit, just
    /// before it: no gate decision is ever recorded before the policy it was made under.
    policy_recorded: Arc<std::sync::atomic::AtomicBool>,
    /// Where the time is read.
    time: Arc<dyn Clock>,
    /// The approval requests recorded, with their answers.
    requests: Arc<requests::Book>,
}

/// The scopes a decision touched, to commit with it.
struct Touched {
    run: String,
    tool: Option<String>,
    credential: Option<String>,
    principal: Option<String>,
}

impl Touched {
    fn run(run: &str) -> Touched {
        Touched {
            run: run.to_owned(),
            tool: None,
            credential: None,
            principal: None,
        }
    }

    fn scopes(&self) -> Scopes<'_> {
        Scopes {
            run: &self.run,
            tool: self.tool.as_deref(),
            credential: self.credential.as_deref(),
            principal: self.principal.as_deref(),
        }
    }
}

/// A run the gate governs, if `caller` may act on it: exactly the uid that started it
/// (loopback TCP peers, uid unknown, are one identity of their own), or the operator.
/// The gate's authority check, one for every backend.
fn held<'t, T: StateTxn>(
    t: &'t mut Work<T>,
    run: &str,
    caller: Caller,
) -> Result<&'t RunState, GateError> {
    let state = t.run(run)?;
    if caller.operator || state.owner_uid == caller.uid {
        Ok(state)
    } else {
        Err(GateError::NotOwner {
            run: run.to_owned(),
        })
    }
}

/// A run in the transaction that has not stopped, if `caller` may act on it.
fn live<'t, T: StateTxn>(
    t: &'t mut Work<T>,
    run: &str,
    caller: Caller,
) -> Result<&'t RunState, GateError> {
    let state = held(t, run, caller)?;
    match state.stop {
        Some(reason) => Err(GateError::RunStopped {
            run: run.to_owned(),
            reason,
        }),
        None => Ok(state),
    }
}

/// The open runs below `run` (children, their children, ...), nearest first.
fn open_descendants<T: StateTxn>(t: &mut Work<T>, run: &str) -> Result<Vec<String>, GateError> {
    let mut found: Vec<String> = Vec::new();
    let mut next = 0;
    let mut parent = run.to_owned();
    loop {
        for child in t.open_children(&parent)? {
            // A run's parent is fixed when it starts, so the tree has no cycle; the
            // check keeps a corrupt state from looping.
            if child != run && !found.contains(&child) {
                found.push(child);
            }
        }
        match found.get(next) {
            Some(p) => parent = p.clone(),
            None => return Ok(found),
        }
        next += 1;
    }
}

impl Gate<Embedded> {
    /// Open the gate over `ledger` under `policy`, its state in the ledger's own store.
    pub fn open(ledger: Arc<Ledger>, policy: Recorded) -> Result<Gate<Embedded>, GateError> {
        let backend = Embedded::open(Arc::clone(&ledger))?;
        Gate::with_backend(ledger, backend, policy)
    }
}

impl<B: StateBackend> Gate<B> {
    /// Open the gate over `ledger` under `policy`, its state in `backend`. The policy is
    /// recorded in the ledger (if it is not the one last recorded) in the commit of the
    /// first decision made under it.
    pub fn with_backend(
        ledger: Arc<Ledger>,
        backend: B,
        policy: Recorded,
    ) -> Result<Gate<B>, GateError> {
        // A policy whose record cannot be stored is refused now, not at the first call.
        let policy_record = encode(&Decision {
            kind: Some(Kind::Policy),
            policy: Some(policy.digest.clone()),
            policy_text: Some(policy.text.clone()),
            ..Decision::default()
        })?;
        let gate = Gate {
            ledger,
            policy,
            policy_record: Arc::new(policy_record),
            backend,
            failure: Arc::new(Mutex::new(None)),
            policy_recorded: Arc::new(std::sync::atomic::AtomicBool::new(false)),
            time: Arc::new(SystemClock),
            requests: Arc::default(),
        };
        let last = gate.ledger.state_get(tables::POLICY_KEY)?;
        let recorded = last.as_deref() == Some(gate.policy.digest.as_bytes());
        gate.policy_recorded
            .store(recorded, std::sync::atomic::Ordering::SeqCst);
        // The requests the ledger's current key epoch holds, with their answers, before
        // the first decision (docs/APPROVALS.md, "After a restart").
        if !cfg!(feature = "bench-no-requests") {
            gate.requests.recall(&gate.ledger)?;
        }
        Ok(gate)
    }

    /// The gate, reading the time from `clock` (tests move a clock of their own).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Gate<B> {
        self.time = clock;
        self
    }

    /// A run's clock now.
    fn clock(&self, run: &RunState) -> Now {
        clock::run_clock(self.time.now_ms(), run)
    }

    /// Where a run stands now.
    fn standing(&self, run: &RunState) -> Standing {
        standing(run, self.clock(run))
    }

    /// The policy in force.
    pub fn policy(&self) -> &Recorded {
        &self.policy
    }

    /// The ledger.
    pub fn ledger(&self) -> &Arc<Ledger> {
        &self.ledger
    }

    /// The state backend (its own counters and views), for tests only: its
    /// transactions begin and commit state with no ledger record, so it is behind the
    /// `testing` feature, which only dev-dependencies enable.
    #[cfg(feature = "testing")]
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// Round trips to a networked state backend so far (None for the embedded store).
    pub fn backend_round_trips(&self) -> Option<u64> {
        self.backend.round_trips()
    }

    /// Why the gate refuses everything, if it does.
    pub fn failure(&self) -> Option<String> {
        self.failure
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// A transaction on the backend, with nothing loaded yet.
    fn begin(&self) -> Result<Work<B::Txn<'_>>, GateError> {
        if let Some(why) = self.failure() {
            return Err(GateError::Unavailable(why));
        }
        self.backend.begin().map(Work::new)
    }
}

/// The gate's error for a start the core refuses.
fn start_refused(
    refusal: tally_policy::StartRefusal,
    req: &StartRequest,
    parent: Option<&RunState>,
    caller: Caller,
) -> GateError {
    use tally_policy::StartRefusal as R;
    let parent_name = || req.parent.clone().unwrap_or_default();
    match refusal {
        R::TooManyRuns { max } => GateError::TooManyRuns {
            uid: caller.uid,
            max,
        },
        R::ParentStopped => GateError::RunStopped {
            run: parent_name(),
            reason: parent.and_then(|p| p.stop).unwrap_or(Reason::Completed),
        },
        // A paused run is held from every worker, its children's too.
        R::ParentPaused => GateError::Refused(Reason::RunPaused),
        R::ParentNotStarted => GateError::RunNotFound(parent_name()),
        R::ContinuedNotStopped => GateError::NotStopped(req.continues.clone().unwrap_or_default()),
        R::CredentialNotAllowed => {
            let c = req.credential.as_deref().unwrap_or_default();
            GateError::NotAuthorized(format!(
                "credential `{c}` is not this uid's to start runs under (the policy's credentials.{c}.uids)"
            ))
        }
        R::DepthExceeded { .. } => GateError::Refused(Reason::ChainDepthExceeded),
        R::PrincipalBudgetExceeded => GateError::Refused(Reason::PrincipalBudgetExceeded),
        r @ R::RefillWithoutApproval { .. } => GateError::ApprovalRequired {
            cause: Reason::RefillWithoutApproval,
            why: r.to_string(),
        },
        other => GateError::NotAuthorized(other.to_string()),
    }
}

/// The gate's error for what the core finds inconsistent about a record an agent or the
/// operator sent: refused, never recorded (so what the gate records always verifies).
fn inconsistent(run: &str, found: tally_policy::Inconsistency) -> GateError {
    use tally_policy::Inconsistency as I;
    match found {
        I::OutcomeWithoutAllow { attempt } => GateError::NoSuchAttempt {
            run: run.to_owned(),
            attempt,
        },
        I::DuplicateOutcome { attempt } => GateError::AttemptSettled {
            run: run.to_owned(),
            attempt,
        },
        I::OutcomeOwnedByProxy { attempt } => GateError::OutcomeOwnedByProxy {
            run: run.to_owned(),
            attempt,
        },
        I::AfterStop { stop, .. } => GateError::RunStopped {
            run: run.to_owned(),
            reason: stop,
        },
        I::InvalidApproval { why } => GateError::ApprovalRefused(why),
        I::Overflow { field } => GateError::Invalid(tally_ledger::DecisionError::Invalid {
            field,
            why: "the run's total would overflow",
        }),
        other => GateError::Inconsistent {
            run: run.to_owned(),
            found: other,
        },
    }
}

/// The stored bytes of a record the gate built (no raw arguments in it): validated, in
/// canonical form, within the size a decision may take.
/// Whether `record` encodes once the gate gives it its state version (checked before the
/// state changes; [`encode`] then cannot fail).
fn encodable(record: &mut Decision) -> Result<(), GateError> {
    record.state_version = Some(u64::MAX);
    let checked = encode(record).map(drop);
    record.state_version = None;
    checked
}

fn encode(record: &Decision) -> Result<Vec<u8>, GateError> {
    record.validate()?;
    let bytes = record.to_canonical_json();
    if bytes.len() > tally_ledger::decision::MAX_DECISION_BYTES {
        return Err(GateError::Invalid(tally_ledger::DecisionError::TooLong {
            field: "decision",
            len: bytes.len(),
            max: tally_ledger::decision::MAX_DECISION_BYTES,
        }));
    }
    Ok(bytes)
}

fn standing(run: &RunState, now: Now) -> Standing {
    Standing {
        run: run.run.clone(),
        state: if run.stop.is_some() {
            tally_wire::RunState::Stopped
        } else if run.paused {
            tally_wire::RunState::Paused
        } else {
            tally_wire::RunState::Running
        },
        stop_reason: run.stop,
        goal: run.goal.clone(),
        budget: run.budget.clone(),
        limits: tally_policy::limits_now(run, now),
        held_nanos: run.held_nanos,
        settled_nanos: run.settled_nanos,
        calls_allowed: run.last_attempt,
        at_ms: now.at_ms.unwrap_or(0),
        grants_unused: run.grants.iter().filter(|g| !g.used).count(),
        owner_uid: run.owner_uid,
    }
}

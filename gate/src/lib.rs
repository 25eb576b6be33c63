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
pub mod clock;
mod error;
mod tables;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use tally_ledger::decision::{Budget, Limit, Scope};
use tally_ledger::{Action, Decision, Kind, Ledger, Reason, Receipt, Status};
use tally_policy::{apply, decide, judge, Call, Now, Recorded, RunState, Verdict, ViewMut};

use backend::{Embedded, Scopes, StateBackend, StateTxn};
pub use clock::{Clock, SystemClock};
pub use error::GateError;

/// Who is asking: the peer's uid as the socket reports it (`None` in-process).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Caller {
    /// The peer's Unix uid.
    pub uid: Option<u32>,
    /// Whether this is the operator (the operator socket, or an in-process owner).
    pub operator: bool,
}

/// `POST /v1/runs`: start a run.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StartRequest {
    /// The run's name (a new task is a new run).
    pub run: String,
    /// The task.
    #[serde(default)]
    pub goal: Option<String>,
    /// What the agent asks for; it gets no more than the policy's ceiling.
    #[serde(default)]
    pub budget: Option<Budget>,
    /// The parent run (its remaining budget bounds this one's).
    #[serde(default)]
    pub parent: Option<String>,
    /// The stopped run this one continues.
    #[serde(default)]
    pub continues: Option<String>,
    /// Agent chain depth.
    #[serde(default)]
    pub depth: Option<u64>,
    /// The worker starting it.
    #[serde(default)]
    pub worker: Option<String>,
    /// The credential it runs under.
    #[serde(default)]
    pub credential: Option<String>,
}

/// `POST /v1/check`: one intended call.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckRequest {
    /// The run.
    pub run: String,
    /// The worker asking.
    #[serde(default)]
    pub worker: Option<String>,
    /// The tool.
    pub tool: String,
    /// The logical operation (e.g. `export.status:ea91`).
    #[serde(default)]
    pub operation: Option<String>,
    /// The call's arguments, exactly as sent (a duplicate key is refused): only their
    /// digest is kept.
    #[serde(default)]
    pub args: Option<tally_ledger::decision::Args>,
    /// A bounded preview of the arguments to keep.
    #[serde(default)]
    pub args_preview: Option<String>,
    /// `read`, `idempotent_write` or `non_idempotent_write`.
    pub effect: tally_ledger::Effect,
    /// The caller's idempotency key.
    #[serde(default)]
    pub idempotency_key: Option<String>,
    /// Destination host.
    #[serde(default)]
    pub target: Option<String>,
    /// `http`, `ssh`, `tool` or `model`.
    #[serde(default)]
    pub channel: Option<tally_ledger::decision::Channel>,
    /// Agent chain depth.
    #[serde(default)]
    pub depth: Option<u64>,
    /// Cents to reserve.
    #[serde(default)]
    pub reserve_cents: Option<u64>,
    /// The remote operation a status read polls.
    #[serde(default)]
    pub remote_ref: Option<String>,
    /// The credential.
    #[serde(default)]
    pub credential: Option<String>,
    /// The call's own time limit, ms.
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// The trace the check belongs to (a W3C trace-id), recorded on the decision. Never
    /// read from the body: the daemon takes it from the span it makes for the check (or
    /// the agent's valid `traceparent` header); an invalid one is dropped, never an error.
    #[serde(skip)]
    pub trace_id: Option<String>,
}

/// `POST /v1/outcome`: what an allowed call did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutcomeRequest {
    /// The run.
    pub run: String,
    /// The attempt the gate gave the call.
    pub attempt: u64,
    /// `ok`, `error`, `rejected`, `timeout`, `running` or `unknown`.
    pub status: Status,
    /// Actual spend, cents.
    #[serde(default)]
    pub settled_cents: Option<u64>,
    /// Remote operation id.
    #[serde(default)]
    pub remote_ref: Option<String>,
    /// Last observed remote state.
    #[serde(default)]
    pub observed: Option<String>,
    /// Upstream Retry-After, ms.
    #[serde(default)]
    pub retry_after_ms: Option<u64>,
    /// A digest of the call's result (64 lowercase hex: BLAKE3, SHA-256, any 32-byte
    /// digest the reporter computes the same way each time): identical calls whose results
    /// differ are progress, not a loop. The result itself is never sent.
    #[serde(default)]
    pub result_digest: Option<String>,
    /// The worker reporting.
    #[serde(default)]
    pub worker: Option<String>,
}

/// `POST /v1/runs/{run}/stop`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StopRequest {
    /// Why (default `completed`).
    #[serde(default)]
    pub reason: Option<Reason>,
    /// The worker stopping it.
    #[serde(default)]
    pub worker: Option<String>,
}

/// An approval, signed by an approver the policy lists (`tally approve` makes one).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Approval {
    /// The run.
    pub run: String,
    /// The approver's name in the policy.
    pub approver: String,
    /// What is granted.
    pub scope: Scope,
    /// Run time after which it is void, ms.
    pub expires_ms: u64,
    /// `tally_policy::approval::digest` of the above.
    pub digest: String,
    /// The approver's Ed25519 signature over the digest, hex.
    pub signature: String,
    /// Free text.
    #[serde(default)]
    pub note: Option<String>,
}

/// The gate's answer to a check.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckAnswer {
    /// `allow`, `deny` or `require_approval`.
    pub decision: Verdict,
    /// The reason code (not for an allow).
    pub reason: Option<Reason>,
    /// What the caller must do: `stop`, `retry` or `ask` (not for an allow).
    pub action: Option<Action>,
    /// For `require_approval`: the limit that was reached.
    pub cause: Option<Reason>,
    /// Back off this long before asking again.
    pub retry_after_ms: Option<u64>,
    /// For an allow: the call must end within this many ms.
    pub timeout_ms: Option<u64>,
    /// For an allow: the attempt number to report the outcome under.
    pub attempt: Option<u64>,
    /// Every dimension, used and limit.
    pub limits: BTreeMap<String, Limit>,
    /// The decision's seq in the ledger (`None`: nothing was recorded, the run is over).
    pub seq: Option<u64>,
    /// Its chain hash.
    pub hash: Option<String>,
}

/// The answer to a start.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Started {
    /// The run.
    pub run: String,
    /// The budget granted.
    pub budget: Budget,
    /// The policy's digest.
    pub policy: String,
    /// The start record's seq.
    pub seq: u64,
    /// Its hash.
    pub hash: String,
}

/// A recorded decision's receipt.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Logged {
    /// Its seq.
    pub seq: u64,
    /// Its hash.
    pub hash: String,
    /// The run's limits after it.
    pub limits: BTreeMap<String, Limit>,
}

/// Where a run stands (`GET /v1/runs/{run}`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Standing {
    /// The run.
    pub run: String,
    /// `running`, `paused` or `stopped`.
    pub state: &'static str,
    /// Why it stopped.
    pub stop_reason: Option<Reason>,
    /// Its goal.
    pub goal: Option<String>,
    /// The budget granted.
    pub budget: Budget,
    /// Every dimension, used and limit.
    pub limits: BTreeMap<String, Limit>,
    /// Cents held by calls not yet settled.
    pub held_cents: u64,
    /// Cents settled.
    pub settled_cents: u64,
    /// Attempts allowed (numbers issued), including exempt calls and polls.
    pub calls_allowed: u64,
    /// The run's clock now, ms since its start.
    pub at_ms: u64,
    /// Approvals recorded and not yet used.
    pub grants_unused: usize,
    /// The uid that started it.
    pub owner_uid: Option<u32>,
}

type Done<T> = Box<dyn FnOnce(Result<T, GateError>) + Send>;

/// Whether a credential has state to keep: a spend backstop in the policy, or a bucket.
fn tracks_credential(policy: &tally_policy::Policy, credential: &str) -> bool {
    policy.rate.credential_per_sec > 0
        || policy
            .credentials
            .get(credential)
            .is_some_and(|c| c.spend_cents_per_period.is_some())
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
    policy_record: Vec<u8>,
    backend: B,
    failure: Arc<Mutex<Option<String>>>,
    /// Whether the ledger already holds this policy as its last policy record. If not,
    /// the first decision made under it carries the policy record in its own commit, just
    /// before it: no gate decision is ever recorded before the policy it was made under.
    policy_recorded: std::sync::atomic::AtomicBool,
    /// Where the time is read.
    time: Arc<dyn Clock>,
}

/// The scopes a decision touched, to commit with it.
struct Touched {
    run: String,
    tool: Option<String>,
    credential: Option<String>,
}

impl Touched {
    fn run(run: &str) -> Touched {
        Touched {
            run: run.to_owned(),
            tool: None,
            credential: None,
        }
    }

    fn scopes(&self) -> Scopes<'_> {
        Scopes {
            run: &self.run,
            tool: self.tool.as_deref(),
            credential: self.credential.as_deref(),
        }
    }
}

/// A run in the transaction that has not stopped.
fn live<'t, T: StateTxn>(
    t: &'t mut T,
    run: &str,
    caller: Caller,
) -> Result<&'t RunState, GateError> {
    let state = t.run(run, caller)?;
    match state.stop {
        Some(reason) => Err(GateError::RunStopped {
            run: run.to_owned(),
            reason,
        }),
        None => Ok(state),
    }
}

/// The open runs below `run` (children, their children, ...), nearest first.
fn open_descendants<T: StateTxn>(t: &mut T, run: &str) -> Result<Vec<String>, GateError> {
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
            policy_record,
            backend,
            failure: Arc::new(Mutex::new(None)),
            policy_recorded: std::sync::atomic::AtomicBool::new(false),
            time: Arc::new(SystemClock),
        };
        let last = gate.ledger.state_get(tables::POLICY_KEY)?;
        let recorded = last.as_deref() == Some(gate.policy.digest.as_bytes());
        gate.policy_recorded
            .store(recorded, std::sync::atomic::Ordering::SeqCst);
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

    /// Why the gate refuses everything, if it does.
    pub fn failure(&self) -> Option<String> {
        self.failure
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn begin(&self) -> Result<B::Txn<'_>, GateError> {
        if let Some(why) = self.failure() {
            return Err(GateError::Unavailable(why));
        }
        self.backend.begin()
    }

    /// Commit `records` with the state of the scopes they touched; `answer` turns the
    /// receipt of the last into the reply.
    fn submit<T: Send + 'static>(
        &self,
        t: B::Txn<'_>,
        records: Vec<Decision>,
        touched: &[Touched],
        answer: impl FnOnce(Receipt) -> T + Send + 'static,
        done: Done<T>,
    ) {
        let last = records.len().saturating_sub(1);
        self.submit_answering(t, records, touched, last, answer, done)
    }

    /// [`Gate::submit`], answering with the receipt of `records[answering]`.
    fn submit_answering<T: Send + 'static>(
        &self,
        mut t: B::Txn<'_>,
        mut records: Vec<Decision>,
        touched: &[Touched],
        answering: usize,
        answer: impl FnOnce(Receipt) -> T + Send + 'static,
        done: Done<T>,
    ) {
        // Counted from the end: a policy record may come first.
        let from_end = records.len().saturating_sub(answering + 1);
        let scopes: Vec<Scopes<'_>> = touched.iter().map(Touched::scopes).collect();
        // A networked backend's state is durable before the decision is queued; if it
        // cannot be, nothing was queued and the gate stays up (the caller retries).
        let version = match t.persist(&scopes) {
            Ok(v) => v,
            Err(e) => return done(Err(e)),
        };
        let mut encoded = Vec::with_capacity(records.len());
        for r in &mut records {
            r.state_version = Some(version);
            match encode(r) {
                Ok(bytes) => encoded.push(bytes),
                Err(e) => {
                    // Checked with the largest version before the state changed
                    // (`encodable`): a state ahead of its record must not go on.
                    let why = format!("a checked decision no longer encodes: {e}");
                    self.failure
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .get_or_insert(why.clone());
                    return done(Err(GateError::Unavailable(why)));
                }
            }
        }
        let records = encoded;
        let failure = Arc::clone(&self.failure);
        let mut plaintexts = Vec::with_capacity(records.len() + 1);
        let mut ledger_state = Vec::new();
        // Called inside the transaction, so exactly one decision carries the policy.
        if !self
            .policy_recorded
            .swap(true, std::sync::atomic::Ordering::SeqCst)
        {
            plaintexts.push(self.policy_record.clone());
            ledger_state.push((
                tables::POLICY_KEY.to_vec(),
                self.policy.digest.as_bytes().to_vec(),
            ));
        }
        // The answer is the last record's: the one the caller asked for.
        plaintexts.extend(records);
        t.commit(
            plaintexts,
            &scopes,
            ledger_state,
            Box::new(move |result| match result {
                Ok(receipts) => match receipts.iter().rev().nth(from_end) {
                    Some(r) => done(Ok(answer(*r))),
                    None => done(Err(GateError::Unavailable(
                        "the ledger returned no receipt".into(),
                    ))),
                },
                Err(e) => {
                    let why = format!("the ledger could not record a decision: {e}");
                    failure
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .get_or_insert(why.clone());
                    done(Err(GateError::Unavailable(why)));
                }
            }),
        );
    }

    /// Start a run. `done` gets the granted budget once the start record is durable.
    ///
    /// The caller's runs past their deadline are stopped first (`run_deadline_exhausted`,
    /// in the same commit, before the start; recorded even if the start is refused), so
    /// they no longer count toward its open runs (docs/GATE.md, "Deadlines").
    pub fn start(&self, caller: Caller, req: StartRequest, done: Done<Started>) {
        let result = (|| {
            let mut t = self.begin()?;
            if !t.is_new(&req.run)? {
                return Err(GateError::RunExists(req.run.clone()));
            }
            // The operator in-process is not counted; everyone else is, TCP peers as one.
            // (Read first: a networked backend holds the uid's count from here.)
            let (open_runs_of_uid, stops, writes) = if caller.operator {
                (None, Vec::new(), Vec::new())
            } else {
                let open = t.open_runs_of(caller.uid)?;
                let (stops, writes) = self.stop_expired(&mut t, caller)?;
                let open = open.saturating_sub(stops.len() as u64);
                (Some(open), stops, writes)
            };
            let granted = self.grant(&mut t, caller, &req, open_runs_of_uid);
            Ok((t, stops, writes, granted))
        })();
        match result {
            Err(e) => done(Err(e)),
            Ok((t, stops, _, Err(e))) if stops.is_empty() => {
                drop(t);
                done(Err(e))
            }
            // The stops stand whether or not the run starts.
            Ok((t, stops, writes, Err(e))) => self.submit(
                t,
                stops,
                &writes,
                |_| (),
                Box::new(move |r: Result<(), GateError>| done(Err(r.err().unwrap_or(e)))),
            ),
            Ok((t, mut records, mut writes, Ok((record, touched, budget)))) => {
                records.push(record);
                writes.extend(touched);
                let digest = self.policy.digest.clone();
                let run = req.run;
                let answer = move |r: Receipt| Started {
                    run,
                    budget,
                    policy: digest,
                    seq: r.seq,
                    hash: r.hash.to_string(),
                };
                // Queued inside the transaction: the ledger's order is the state's order.
                self.submit(t, records, &writes, answer, done)
            }
        }
    }

    /// Stop the caller's open runs that are past their deadline: their stop records
    /// (`run_deadline_exhausted`), folded into the transaction, and the runs to write.
    fn stop_expired(
        &self,
        t: &mut B::Txn<'_>,
        caller: Caller,
    ) -> Result<(Vec<Decision>, Vec<Touched>), GateError> {
        let wall = self.time.now_ms();
        let expired = t.expired_runs_of(caller.uid, &|r| past_deadline(r, wall))?;
        let mut stops = Vec::with_capacity(expired.len());
        let mut writes = Vec::with_capacity(expired.len());
        for name in expired {
            let state = t.run(&name, caller)?.clone();
            stops.push(self.stop_one(
                t,
                &name,
                &state,
                Reason::RunDeadlineExhausted,
                None,
                caller,
            )?);
            writes.push(Touched::run(&name));
        }
        Ok((stops, writes))
    }

    /// What a start is granted, once the core allows it: its record, folded into the
    /// transaction (the run inserted, its parent's budget carved), the scopes it touched,
    /// and the budget.
    fn grant(
        &self,
        t: &mut B::Txn<'_>,
        caller: Caller,
        req: &StartRequest,
        open_runs_of_uid: Option<u64>,
    ) -> Result<(Decision, Vec<Touched>, Budget), GateError> {
        let policy = &self.policy.policy;
        let parent = match &req.parent {
            Some(p) => Some(t.run(p, caller)?.clone()),
            None => None,
        };
        let continued = match &req.continues {
            Some(c) => Some(t.run(c, caller)?.clone()),
            None => None,
        };
        // One rule for what a run is granted and whether it may start: the core's, the
        // one replay holds every recorded start to.
        let ask = tally_policy::Ask {
            budget: req.budget.as_ref(),
            credential: req.credential.as_deref(),
            depth: req.depth,
            uid: caller.uid,
            operator: caller.operator,
        };
        let family = tally_policy::Family {
            parent: parent.as_ref(),
            continued: continued.as_ref(),
            open_runs_of_uid,
        };
        let budget = tally_policy::start(policy, &ask, &family)
            .map_err(|r| start_refused(r, req, parent.as_ref(), caller))?;
        let mut record = Decision {
            run: req.run.clone(),
            kind: Some(Kind::Start),
            worker: req.worker.clone(),
            at_ms: Some(0),
            goal: req.goal.clone(),
            budget: Some(budget.clone()),
            parent: req.parent.clone(),
            policy: Some(self.policy.digest.clone()),
            uid: caller.uid,
            credential: req.credential.clone(),
            continues: req.continues.clone(),
            ..Decision::default()
        };
        encodable(&mut record)?;
        let now = Now {
            wall_ms: self.time.now_ms(),
            at_ms: Some(0),
        };
        let mut run = RunState::new(&req.run);
        let mut writes = vec![Touched::run(&req.run)];
        if let Some(p) = &req.parent {
            writes.push(Touched::run(p));
        }
        let found = apply(
            policy,
            ViewMut {
                run: &mut run,
                tool: None,
                credential: None,
                parent: match &req.parent {
                    Some(p) => Some(
                        t.run_mut(p)
                            .ok_or_else(|| GateError::RunNotFound(p.clone()))?,
                    ),
                    None => None,
                },
                continued: continued.as_ref(),
            },
            &record,
            now,
        );
        debug_assert!(found.is_empty(), "a start the core granted: {found:?}");
        t.insert_run(run);
        Ok((record, writes, budget))
    }

    /// Decide one intended call. `done` gets the answer once the decision is durable.
    pub fn check(&self, caller: Caller, req: CheckRequest, done: Done<CheckAnswer>) {
        // Hashing the arguments needs no state: done before the lock.
        let args_digest = req.args.as_ref().map(tally_ledger::decision::Args::digest);
        let trace_id = req
            .trace_id
            .clone()
            .filter(|t| tally_ledger::decision::is_trace_id(t));
        let result = (|| {
            let mut t = self.begin()?;
            let policy = &self.policy.policy;
            let (stopped, run_credential, now) = {
                let run = t.run(&req.run, caller)?;
                (run.stop.is_some(), run.credential.clone(), self.clock(run))
            };
            if req.tool.len() > MAX_TOOL_BYTES {
                // Tool names are identifiers, and every open call keeps its tool's name.
                return Err(GateError::Invalid(tally_ledger::DecisionError::TooLong {
                    field: "tool",
                    len: req.tool.len(),
                    max: MAX_TOOL_BYTES,
                }));
            }
            if req.credential.is_some() && req.credential != run_credential {
                // A run's credential is the one it started under: naming another would
                // escape that credential's backstop and bucket.
                return Err(GateError::NotAuthorized(
                    "a check names the credential its run was started under, or none".into(),
                ));
            }
            let call = Call {
                run: req.run.clone(),
                worker: req.worker,
                tool: req.tool,
                operation: req.operation,
                args_digest,
                args_preview: req.args_preview,
                effect: Some(req.effect),
                idempotency_key: req.idempotency_key,
                target: req.target,
                channel: req.channel,
                depth: req.depth,
                reserve_cents: req.reserve_cents.unwrap_or(0),
                remote_ref: req.remote_ref,
                credential: run_credential,
                timeout_ms: req.timeout_ms,
                uid: caller.uid,
            };
            if stopped {
                let run = t.run(&req.run, caller)?.clone();
                // Bad input is refused the same whether or not the run is over.
                let view = tally_policy::View::of(&run);
                encodable(&mut decide(policy, &self.policy.digest, view, &call, now).record)?;
                // The run is over: nothing to decide, nothing recorded.
                return Err(GateError::Stopped(Box::new(CheckAnswer {
                    decision: Verdict::Deny,
                    reason: run.stop,
                    action: Some(Action::Stop),
                    cause: None,
                    retry_after_ms: None,
                    timeout_ms: None,
                    attempt: None,
                    limits: tally_policy::apply::standing(&run, now),
                    seq: None,
                    hash: None,
                })));
            }
            t.ensure_tool(&call.tool, now.wall_ms, policy)?;
            // A credential has state only if the policy gives it a backstop or a bucket.
            let cred_scope = call
                .credential
                .clone()
                .filter(|c| tracks_credential(policy, c));
            if let Some(c) = &cred_scope {
                t.ensure_credential(c, now.wall_ms, policy)?;
            }
            let mut decided = {
                let scopes = Scopes {
                    run: &call.run,
                    tool: Some(&call.tool),
                    credential: cred_scope.as_deref(),
                };
                decide(policy, &self.policy.digest, t.view(&scopes), &call, now)
            };
            decided.record.trace_id = trace_id;
            encodable(&mut decided.record)?;
            let writes = {
                let scopes = Scopes {
                    run: &call.run,
                    tool: Some(&call.tool),
                    credential: cred_scope.as_deref(),
                };
                apply(policy, t.view_mut(&scopes), &decided.record, now);
                if decided.verdict == Verdict::Allow {
                    vec![Touched {
                        run: call.run.clone(),
                        tool: Some(call.tool.clone()),
                        credential: cred_scope.clone(),
                    }]
                } else {
                    // A refusal changes no state worth keeping (the run's clock only): a
                    // stream of refusals rewrites nothing.
                    Vec::new()
                }
            };
            let record = decided.record;
            let cause = decided.cause;
            let verdict = decided.verdict;
            let mut records = vec![record.clone()];
            let mut writes = writes;
            if record.reason == Some(Reason::RunDeadlineExhausted)
                || cause == Some(Reason::RunDeadlineExhausted)
            {
                // Past its deadline the run can only be refused: it is stopped with the
                // refusal, in the same commit, and no longer counts as open.
                let state = t.run(&call.run, caller)?.clone();
                let reason = Reason::RunDeadlineExhausted;
                records.push(self.stop_one(&mut t, &call.run, &state, reason, None, caller)?);
                writes = vec![Touched::run(&call.run)];
            }
            Ok((
                records,
                writes,
                move |r: Receipt| CheckAnswer {
                    decision: verdict,
                    reason: record.reason,
                    action: record.reason.map(Reason::action),
                    cause,
                    retry_after_ms: record.retry_after_ms,
                    timeout_ms: record.timeout_ms,
                    attempt: record.attempt,
                    limits: record.limits.unwrap_or_default(),
                    seq: Some(r.seq),
                    hash: Some(r.hash.to_string()),
                },
                t,
            ))
        })();
        match result {
            // The answer is the decision's, before any stop that follows it.
            Ok((records, writes, answer, t)) => {
                self.submit_answering(t, records, &writes, 0, answer, done)
            }
            Err(e) => done(Err(e)),
        }
    }

    /// Record what an allowed call did.
    pub fn outcome(&self, caller: Caller, req: OutcomeRequest, done: Done<Logged>) {
        let result = (|| {
            let mut t = self.begin()?;
            let policy = &self.policy.policy;
            let run = t.run(&req.run, caller)?;
            let now = self.clock(run);
            let tool = run.tool_of(req.attempt).map(str::to_owned);
            let credential = run
                .credential
                .clone()
                .filter(|c| tracks_credential(policy, c));
            if let Some(tool) = &tool {
                t.ensure_tool(tool, now.wall_ms, policy)?;
            }
            if let Some(c) = &credential {
                t.ensure_credential(c, now.wall_ms, policy)?;
            }
            let mut record = Decision {
                run: req.run.clone(),
                kind: Some(Kind::Outcome),
                worker: req.worker,
                at_ms: now.at_ms,
                attempt: Some(req.attempt),
                status: Some(req.status),
                settled_cents: req.settled_cents,
                remote_ref: req.remote_ref,
                observed: req.observed,
                retry_after_ms: req.retry_after_ms,
                result_digest: req.result_digest,
                uid: caller.uid,
                policy: Some(self.policy.digest.clone()),
                ..Decision::default()
            };
            encodable(&mut record)?;
            let touched = Touched {
                run: req.run.clone(),
                tool,
                credential,
            };
            // What the core would call inconsistent is refused and never recorded.
            if let Some(found) = judge(policy, t.view(&touched.scopes()), &record, now)
                .into_iter()
                .next()
            {
                return Err(inconsistent(&req.run, found));
            }
            apply(policy, t.view_mut(&touched.scopes()), &record, now);
            let limits = t
                .run_mut(&req.run)
                .map(|r| tally_policy::apply::standing(r, now))
                .unwrap_or_default();
            let writes = vec![touched];
            Ok((
                record,
                writes,
                move |r: Receipt| Logged {
                    seq: r.seq,
                    hash: r.hash.to_string(),
                    limits,
                },
                t,
            ))
        })();
        match result {
            Ok((record, writes, answer, t)) => self.submit(t, vec![record], &writes, answer, done),
            Err(e) => done(Err(e)),
        }
    }

    /// Stop a run: by its owner (any reason, usually `completed`), or by the operator
    /// (a kill: `killed_by_operator`). A kill stops the run's open descendants too, in
    /// the same commit, before the run itself: a child's budget was carved from the
    /// killed run's, and it must not go on spending it.
    pub fn stop(&self, caller: Caller, run: &str, req: StopRequest, done: Done<Logged>) {
        let result = (|| {
            let mut t = self.begin()?;
            let state = live(&mut t, run, caller)?.clone();
            let reason = match (caller.operator, req.reason) {
                (true, r) => r.unwrap_or(Reason::KilledByOperator),
                (false, Some(Reason::KilledByOperator)) => {
                    return Err(GateError::NotAuthorized(
                        "only the operator kills a run; stop it with another reason".into(),
                    ))
                }
                (false, r) => r.unwrap_or(Reason::Completed),
            };
            let descendants = if reason == Reason::KilledByOperator {
                open_descendants(&mut t, run)?
            } else {
                Vec::new()
            };
            let mut records = Vec::with_capacity(descendants.len() + 1);
            let mut writes = Vec::with_capacity(descendants.len() + 1);
            for child in descendants.iter().rev() {
                let child_state = t.run(child, caller)?.clone();
                records.push(self.stop_one(&mut t, child, &child_state, reason, None, caller)?);
                writes.push(Touched::run(child));
            }
            records.push(self.stop_one(&mut t, run, &state, reason, req.worker, caller)?);
            writes.push(Touched::run(run));
            let limits = tally_policy::apply::standing(&state, self.clock(&state));
            Ok((
                records,
                writes,
                move |r: Receipt| Logged {
                    seq: r.seq,
                    hash: r.hash.to_string(),
                    limits,
                },
                t,
            ))
        })();
        match result {
            Ok((records, writes, answer, t)) => self.submit(t, records, &writes, answer, done),
            Err(e) => done(Err(e)),
        }
    }

    /// The stop record of one open run, folded into the transaction: the run is marked
    /// stopped and its calls give back their tools' in-flight slots.
    fn stop_one(
        &self,
        t: &mut B::Txn<'_>,
        run: &str,
        state: &RunState,
        reason: Reason,
        worker: Option<String>,
        caller: Caller,
    ) -> Result<Decision, GateError> {
        let policy = &self.policy.policy;
        let now = self.clock(state);
        let mut record = Decision {
            run: run.to_owned(),
            kind: Some(Kind::Stop),
            worker,
            at_ms: now.at_ms,
            reason: Some(reason),
            uid: caller.uid,
            policy: Some(self.policy.digest.clone()),
            limits: Some(tally_policy::apply::standing(state, now)),
            ..Decision::default()
        };
        encodable(&mut record)?;
        apply(policy, t.view_mut(&Scopes::run(run)), &record, now);
        // The stopped run's calls no longer hold their tools' in-flight slots (the
        // slots are not durable state: nothing more to write).
        let open: Vec<(String, u64)> = state
            .open
            .iter()
            .filter_map(|(a, o)| o.tool.clone().map(|tool| (tool, *a)))
            .collect();
        for (tool, attempt) in open {
            t.ensure_tool(&tool, now.wall_ms, policy)?;
            let scopes = Scopes {
                run,
                tool: Some(&tool),
                credential: None,
            };
            if let Some(ts) = t.view_mut(&scopes).tool {
                ts.in_flight
                    .remove(&tally_policy::state::call_id(run, attempt));
            }
        }
        t.mark_stopped(run);
        Ok(record)
    }

    /// Pause (`true`) or resume a run, and every open run below it (a child's budget was
    /// carved from its parent's, so it is held, and let go, with it): a `pause` or
    /// `resume` record for each run whose state changes, descendants first, in one
    /// commit, with the state they leave (so an index rebuilt from the log gives the
    /// pause back). A paused run's next check, from any worker, is refused `run_paused`.
    /// `done` gets where the run stands once the records are durable (at once if
    /// nothing changed).
    pub fn pause(&self, caller: Caller, run: &str, paused: bool, done: Done<Standing>) {
        let result = (|| {
            if !caller.operator {
                return Err(GateError::NotAuthorized(
                    "pause and resume are the operator's".into(),
                ));
            }
            let mut t = self.begin()?;
            let policy = &self.policy.policy;
            let _ = live(&mut t, run, caller)?;
            let mut family = open_descendants(&mut t, run)?;
            family.reverse();
            family.push(run.to_owned());
            let kind = if paused { Kind::Pause } else { Kind::Resume };
            let mut records = Vec::new();
            let mut writes = Vec::new();
            for name in &family {
                let state = t.run(name, caller)?;
                if state.paused == paused {
                    continue;
                }
                let now = self.clock(state);
                let mut record = Decision {
                    run: name.clone(),
                    kind: Some(kind),
                    at_ms: now.at_ms,
                    uid: caller.uid,
                    policy: Some(self.policy.digest.clone()),
                    ..Decision::default()
                };
                encodable(&mut record)?;
                t.pause_changed(name, paused)?;
                apply(policy, t.view_mut(&Scopes::run(name)), &record, now);
                records.push(record);
                writes.push(Touched::run(name));
            }
            let answer = self.standing(t.run(run, caller)?);
            Ok((records, writes, answer, t))
        })();
        match result {
            Ok((records, _, answer, t)) if records.is_empty() => {
                drop(t);
                done(Ok(answer))
            }
            Ok((records, writes, answer, t)) => {
                self.submit(t, records, &writes, move |_| answer, done)
            }
            Err(e) => done(Err(e)),
        }
    }

    /// Record a human's approval for a run, once its signature, approver and digest
    /// check out. An approval for a stopped run or after the run's deadline is refused:
    /// it never revives a run.
    pub fn approve(&self, caller: Caller, a: Approval, done: Done<Logged>) {
        let result = (|| {
            if !caller.operator {
                return Err(GateError::NotAuthorized(
                    "approvals arrive on the operator socket".into(),
                ));
            }
            let mut t = self.begin()?;
            let policy = &self.policy.policy;
            let state = live(&mut t, &a.run, caller)?.clone();
            let now = self.clock(&state);
            let at = now.at_ms.unwrap_or(0);
            if state.budget.deadline_ms.is_some_and(|d| at >= d) {
                return Err(GateError::ApprovalRefused(
                    "the run is past its deadline; an approval does not revive it".into(),
                ));
            }
            if a.expires_ms <= at {
                return Err(GateError::ApprovalRefused(format!(
                    "the approval expired at run time {} ms; the run is at {at} ms",
                    a.expires_ms
                )));
            }
            if a.expires_ms - at > policy.approvals.max_expiry_ms {
                return Err(GateError::ApprovalRefused(format!(
                    "the approval is valid for {} ms; the policy allows at most {} ms",
                    a.expires_ms - at,
                    policy.approvals.max_expiry_ms
                )));
            }
            let mut record = Decision {
                run: a.run.clone(),
                kind: Some(Kind::Override),
                at_ms: now.at_ms,
                approver: Some(a.approver),
                scope: Some(a.scope),
                digest: Some(a.digest),
                expires_ms: Some(a.expires_ms),
                signature: Some(a.signature),
                note: a.note,
                uid: caller.uid,
                policy: Some(self.policy.digest.clone()),
                ..Decision::default()
            };
            encodable(&mut record)?;
            if let Some(found) = judge(policy, t.view(&Scopes::run(&a.run)), &record, now)
                .into_iter()
                .next()
            {
                return Err(inconsistent(&a.run, found));
            }
            apply(policy, t.view_mut(&Scopes::run(&a.run)), &record, now);
            let writes = vec![Touched::run(&a.run)];
            let limits = tally_policy::apply::standing(&state, now);
            Ok((
                record,
                writes,
                move |r: Receipt| Logged {
                    seq: r.seq,
                    hash: r.hash.to_string(),
                    limits,
                },
                t,
            ))
        })();
        match result {
            Ok((record, writes, answer, t)) => self.submit(t, vec![record], &writes, answer, done),
            Err(e) => done(Err(e)),
        }
    }

    /// Where a run stands.
    pub fn run(&self, caller: Caller, run: &str) -> Result<Standing, GateError> {
        let mut t = self.begin()?;
        Ok(self.standing(t.run(run, caller)?))
    }

    /// The runs the gate holds in memory (open runs, and recently stopped ones): every
    /// one for the operator, the caller's own for an agent.
    pub fn runs(&self, caller: Caller) -> Result<Vec<Standing>, GateError> {
        let mut t = self.begin()?;
        Ok(t.runs()?
            .into_iter()
            .filter(|r| caller.operator || r.owner_uid == caller.uid)
            .map(|r| self.standing(r))
            .collect())
    }

    /// Every downstream tool the gate holds state for, with its breaker as it stands now
    /// (time-based transitions taken: an open breaker past its expiry is half-open), by
    /// name. Read only.
    pub fn breakers(&self) -> Result<Vec<(String, tally_policy::Breaker)>, GateError> {
        let mut t = self.begin()?;
        let now = self.time.now_ms();
        let open_ms = self.policy.policy.breaker.open_ms;
        Ok(t.breakers()?
            .into_iter()
            .map(|(tool, b)| (tool, b.at(now, open_ms)))
            .collect())
    }

    /// Whether the gate governs `run` (it started through the gate): raw appends for it
    /// are refused.
    pub fn governs(&self, run: &str) -> Result<bool, GateError> {
        let mut t = self.begin()?;
        t.governs(run)
    }

    /// Blocking forms, for an in-process gate.
    pub fn start_blocking(&self, caller: Caller, req: StartRequest) -> Result<Started, GateError> {
        blocking(|done| self.start(caller, req, done))
    }

    /// Blocking [`Gate::check`].
    pub fn check_blocking(
        &self,
        caller: Caller,
        req: CheckRequest,
    ) -> Result<CheckAnswer, GateError> {
        blocking(|done| self.check(caller, req, done))
    }

    /// Blocking [`Gate::outcome`].
    pub fn outcome_blocking(
        &self,
        caller: Caller,
        req: OutcomeRequest,
    ) -> Result<Logged, GateError> {
        blocking(|done| self.outcome(caller, req, done))
    }

    /// Blocking [`Gate::stop`].
    pub fn stop_blocking(
        &self,
        caller: Caller,
        run: &str,
        req: StopRequest,
    ) -> Result<Logged, GateError> {
        blocking(|done| self.stop(caller, run, req, done))
    }

    /// Blocking [`Gate::pause`].
    pub fn pause_blocking(
        &self,
        caller: Caller,
        run: &str,
        paused: bool,
    ) -> Result<Standing, GateError> {
        blocking(|done| self.pause(caller, run, paused, done))
    }

    /// Blocking [`Gate::approve`].
    pub fn approve_blocking(&self, caller: Caller, a: Approval) -> Result<Logged, GateError> {
        blocking(|done| self.approve(caller, a, done))
    }
}

/// Whether `run` is past its deadline at wall time `wall` (its next check would be
/// refused `run_deadline_exhausted`).
fn past_deadline(run: &RunState, wall: u64) -> bool {
    let at = clock::run_clock(wall, run).at_ms.unwrap_or(0);
    run.budget.deadline_ms.is_some_and(|d| at >= d)
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

fn blocking<T: Send + 'static>(f: impl FnOnce(Done<T>)) -> Result<T, GateError> {
    let (tx, rx) = std::sync::mpsc::channel();
    f(Box::new(move |r| {
        let _ = tx.send(r);
    }));
    rx.recv()
        .unwrap_or_else(|_| Err(GateError::Unavailable("the gate dropped a request".into())))
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
            "stopped"
        } else if run.paused {
            "paused"
        } else {
            "running"
        },
        stop_reason: run.stop,
        goal: run.goal.clone(),
        budget: run.budget.clone(),
        limits: tally_policy::limits_now(run, now),
        held_cents: run.held_cents,
        settled_cents: run.settled_cents,
        calls_allowed: run.last_attempt,
        at_ms: now.at_ms.unwrap_or(0),
        grants_unused: run.grants.iter().filter(|g| !g.used).count(),
        owner_uid: run.owner_uid,
    }
}

/// A gate over any backend, as one object: what the daemon holds, so that one binary
/// serves the embedded store or a networked one. Each method is [`Gate`]'s own. A
/// networked backend blocks its caller for a round trip, so the daemon calls every one
/// of them from its decision thread, never from an async worker.
pub trait Gatekeeper: Send + Sync {
    /// [`Gate::start`].
    fn start(&self, caller: Caller, req: StartRequest, done: Done<Started>);
    /// [`Gate::check`].
    fn check(&self, caller: Caller, req: CheckRequest, done: Done<CheckAnswer>);
    /// [`Gate::outcome`].
    fn outcome(&self, caller: Caller, req: OutcomeRequest, done: Done<Logged>);
    /// [`Gate::stop`].
    fn stop(&self, caller: Caller, run: &str, req: StopRequest, done: Done<Logged>);
    /// [`Gate::pause`].
    fn pause(&self, caller: Caller, run: &str, paused: bool, done: Done<Standing>);
    /// [`Gate::approve`].
    fn approve(&self, caller: Caller, a: Approval, done: Done<Logged>);
    /// [`Gate::run`].
    fn run(&self, caller: Caller, run: &str) -> Result<Standing, GateError>;
    /// [`Gate::runs`].
    fn runs(&self, caller: Caller) -> Result<Vec<Standing>, GateError>;
    /// [`Gate::governs`].
    fn governs(&self, run: &str) -> Result<bool, GateError>;
    /// [`Gate::breakers`].
    fn breakers(&self) -> Result<Vec<(String, tally_policy::Breaker)>, GateError>;
    /// [`Gate::failure`].
    fn failure(&self) -> Option<String>;
    /// [`Gate::policy`].
    fn policy(&self) -> &Recorded;
    /// Whether the backend blocks its caller on the network ([`StateBackend::networked`]).
    fn networked(&self) -> bool;
}

impl<B: StateBackend + 'static> Gatekeeper for Gate<B> {
    fn start(&self, caller: Caller, req: StartRequest, done: Done<Started>) {
        Gate::start(self, caller, req, done)
    }
    fn check(&self, caller: Caller, req: CheckRequest, done: Done<CheckAnswer>) {
        Gate::check(self, caller, req, done)
    }
    fn outcome(&self, caller: Caller, req: OutcomeRequest, done: Done<Logged>) {
        Gate::outcome(self, caller, req, done)
    }
    fn stop(&self, caller: Caller, run: &str, req: StopRequest, done: Done<Logged>) {
        Gate::stop(self, caller, run, req, done)
    }
    fn pause(&self, caller: Caller, run: &str, paused: bool, done: Done<Standing>) {
        Gate::pause(self, caller, run, paused, done)
    }
    fn approve(&self, caller: Caller, a: Approval, done: Done<Logged>) {
        Gate::approve(self, caller, a, done)
    }
    fn run(&self, caller: Caller, run: &str) -> Result<Standing, GateError> {
        Gate::run(self, caller, run)
    }
    fn runs(&self, caller: Caller) -> Result<Vec<Standing>, GateError> {
        Gate::runs(self, caller)
    }
    fn governs(&self, run: &str) -> Result<bool, GateError> {
        Gate::governs(self, run)
    }
    fn breakers(&self) -> Result<Vec<(String, tally_policy::Breaker)>, GateError> {
        Gate::breakers(self)
    }
    fn failure(&self) -> Option<String> {
        Gate::failure(self)
    }
    fn policy(&self) -> &Recorded {
        Gate::policy(self)
    }
    fn networked(&self) -> bool {
        self.backend.networked()
    }
}

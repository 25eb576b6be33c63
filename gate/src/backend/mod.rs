//! The seam between the gate and where its state lives (DESIGN: the backend owns the
//! atomicity; the policy core is pure and knows nothing of it).
//!
//! A backend does two things for a decision: it **loads** the scopes the gate names
//! ([`StateTxn::load`]: read and, where it locks, locked, in one fixed order: runs,
//! tools, credentials, principals) into a [`Snapshot`], a plain value the gate owns;
//! and it **commits** ([`StateTxn::commit`]) the snapshot the decision left with the
//! decision's records, in one step. Everything between is the gate's (its one
//! `transact` path): who may act on a run, what the core decides and folds into the
//! snapshot, which runs a kill stops with it, what is recorded and answered. The
//! listings (the runs, the breakers, a run's open children, a uid's open runs) are a
//! read interface of their own ([`StateReads`]). What a backend keeps in memory, and
//! when it lets it go, it decides from the snapshots it is given, not from calls of the
//! gate. A backend guarantees:
//!
//! * isolation: no other transaction sees or changes the scopes loaded between the
//!   load and the commit (the embedded backend holds one lock; a networked one locks
//!   rows in the fixed order);
//! * order: the decision is queued for the ledger before the scopes are released, so a
//!   scope's order in the ledger is the order its state changed;
//! * durability never behind the ledger: the state a decision leaves is durable no later
//!   than the decision (the embedded backend writes both in one store batch; a networked
//!   one commits the state first, which can only leave it ahead, the conservative side).

use tally_ledger::Receipt;
use tally_policy::RunState;

pub use crate::scopes::Scopes;
use crate::GateError;

mod embedded;
pub use crate::snapshot::{Idle, Keys, Snapshot};
pub use embedded::{Embedded, EmbeddedTxn};

/// Called once the decisions of a commit are durable (their receipts), or with the error
/// that refused them.
pub type Committed = Box<dyn FnOnce(tally_ledger::Result<Vec<Receipt>>) + Send>;

/// Answers a decision with a refusal instead of its receipts: for a backend whose
/// [`StateTxn::commit`] returned before its state was durable (a group commit) and
/// whose state then did not commit. Nothing of the decision was queued for the ledger;
/// the gate is not failed (the caller retries).
pub type Refuse = Box<dyn FnOnce(GateError) + Send>;

/// Where the gate's state lives.
pub trait StateBackend: Send + Sync {
    /// One open transaction.
    type Txn<'a>: StateTxn
    where
        Self: 'a;

    /// Begin a transaction.
    fn begin(&self) -> Result<Self::Txn<'_>, GateError>;

    /// Round trips to a networked backend so far (None where there is no network).
    fn round_trips(&self) -> Option<u64> {
        None
    }

    /// Whether a transaction waits on the network (round trips to a database): its
    /// caller must then be a thread that may block, not an async worker.
    fn networked(&self) -> bool {
        false
    }

    /// The runs held (as [`StateReads::runs`]) and every tool's breaker (as
    /// [`StateReads::breakers`]), for the operator's views, read **apart from the
    /// decisions**: a networked backend reads them on a connection of its own, in one
    /// read-only transaction, without the turn decisions take, so a slow read never
    /// delays a decision. `None` (the default): the backend has no such path, and the
    /// gate reads them in ordinary transactions.
    fn overview(&self) -> Option<Result<Overview, GateError>> {
        None
    }

    /// Whether [`StateBackend::overview`] reads apart from the decisions (`Some`).
    fn overview_apart(&self) -> bool {
        false
    }

    /// Whether the backend wants the outcomes a commit folds into tools' breakers
    /// ([`Write::observed`]); the gate leaves them out otherwise (a copy per outcome
    /// spent for nothing). The default: no.
    fn observes(&self) -> bool {
        false
    }

    /// What happened to this holder's leased slices so far, by event (`granted`,
    /// `renewed`, `returned`, `reclaimed`, `lost`, `refused`, `adopted`), and to its
    /// views of the tools' breakers (`breaker_flushed`, `breaker_flush_failed`, ...), for
    /// the daemon's metrics. `None` (the default): the backend leases nothing.
    fn lease_counts(&self) -> Option<Vec<(&'static str, u64)>> {
        None
    }

    /// Outcomes a leased backend folded into its own views of the tools' breakers and
    /// has not folded into the shared rows yet, for the daemon's metrics. `None` (the
    /// default): the backend keeps none.
    fn breaker_outcomes_unflushed(&self) -> Option<u64> {
        None
    }

    /// Serving ends: give back what the backend holds of the shared state (a leased
    /// backend's slices). Called once no decision is in flight, from a thread that may
    /// block. The default holds nothing.
    fn close(&self) {}
}

/// The runs and breakers as [`StateBackend::overview`] reads them: each run's state, and
/// each tool's breaker as stored, by name.
pub type Overview = (Vec<RunState>, Vec<(String, tally_policy::Breaker)>);

/// The records of a commit as stored, and the ledger's own state to write with them.
pub struct Batch {
    /// The records' stored bytes, in order.
    pub plaintexts: Vec<Vec<u8>>,
    /// State kept with the ledger itself (the last policy recorded).
    pub ledger_state: Vec<(Vec<u8>, Vec<u8>)>,
}

/// The records of a commit, given the state version they are recorded at: called once,
/// after the version is taken and before the records are queued (by a backend that
/// commits decisions in groups, on its own thread, once their group committed).
pub type Records = Box<dyn FnOnce(u64) -> Result<Batch, GateError> + Send>;

/// What one commit makes durable.
pub struct Write<'a> {
    /// Every scope the transaction loaded or added, as the decision left it.
    pub snapshot: Snapshot,
    /// The scopes whose state the records follow from: made durable with them. (What
    /// else the snapshot changed is not durable state: a refusal's run clock, a
    /// stopped run's tool slots in flight.)
    pub durable: &'a [Scopes<'a>],
    /// The records, once the state version is taken (after every scope is held).
    pub records: Records,
    /// Queued with [`tally_ledger::Ledger::submit_deferred`] (it rides the next
    /// decision's fsync), else with [`tally_ledger::Ledger::submit_with_state`].
    pub deferred: bool,
    /// The outcomes this commit folded into a tool's breaker, in order, where the
    /// backend [`StateBackend::observes`] them: for a backend that keeps a tool's
    /// breaker apart from its row and folds them there later (the leased backend's
    /// view of a breaker). Already folded into `snapshot`.
    pub observed: Vec<Observed>,
    /// Called instead of `done` by a backend that answered [`StateTxn::commit`] before
    /// its state was durable, if that state then did not commit ([`Refuse`]).
    pub refuse: Refuse,
}

/// An outcome as a tool's breaker folds it ([`tally_policy::breaker_outcome`]): its
/// tool, its call (run and attempt: [`tally_policy::state::call_id`]), what it said and
/// when it was decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observed {
    /// The attempt's tool.
    pub tool: String,
    /// The run.
    pub run: String,
    /// The attempt.
    pub attempt: u64,
    /// What the outcome said of the call.
    pub status: tally_ledger::Status,
    /// When it was decided.
    pub now: tally_policy::Now,
}

/// The listing reads, in the transaction: no scope is loaded by them (a run to act on
/// is loaded by name). Each answers from the state as committed: changes of the
/// transaction's snapshot are the gate's to lay over them.
pub trait StateReads {
    /// Whether the gate started a run of this name (raw decisions' names are not).
    fn governs(&mut self, run: &str) -> Result<bool, GateError>;
    /// Open runs started by `uid` (`None`: loopback TCP peers, one identity). A
    /// networked backend also holds that uid's count until the transaction ends, so two
    /// hosts cannot both start its last allowed run.
    fn open_runs_of(&mut self, uid: Option<u32>) -> Result<u64, GateError>;
    /// The open runs started by `uid`, in name order. Read after
    /// [`StateReads::open_runs_of`], which holds the uid's count; a run to act on is
    /// then loaded (and locked) by name.
    fn open_runs_listed(&mut self, uid: Option<u32>) -> Result<Vec<RunState>, GateError>;
    /// The runs held (open ones, and recently stopped ones where the backend keeps them).
    fn runs(&mut self) -> Result<Vec<RunState>, GateError>;
    /// Every run whose name begins with `prefix`, open or stopped, from the durable
    /// state too: none is lost to a stopped run let go from memory.
    fn runs_named(&mut self, prefix: &str) -> Result<Vec<RunState>, GateError>;
    /// The open runs whose parent is `run`, by name, in name order.
    fn open_children(&mut self, run: &str) -> Result<Vec<String>, GateError>;
    /// Every tool's breaker, as stored, by name.
    fn breakers(&mut self) -> Result<Vec<(String, tally_policy::Breaker)>, GateError>;
}

/// One transaction over the gate's state. Dropped without [`StateTxn::commit`], it
/// keeps nothing the gate changed: the snapshots it gave out are the gate's, and are let
/// go (a backend may keep in memory what it read, and the fresh scopes it created).
pub trait StateTxn: StateReads {
    /// Claim a new run's name: false if a run of this name was ever started or the name
    /// is taken by raw decisions (a run name is never reused). A networked backend
    /// holds the claim until the transaction ends.
    fn claim(&mut self, run: &str) -> Result<bool, GateError>;
    /// Read (and, where the backend locks, lock) the scopes `keys` names, in the fixed
    /// order [`Keys`] gives: the state each holds now. A scope already loaded in this
    /// transaction is not named again (the gate's snapshot holds it, maybe changed).
    fn load(&mut self, keys: &Keys<'_>) -> Result<Snapshot, GateError>;
    /// Make `write` durable and queue its records, then release the transaction, in one
    /// step: the state version is taken once every scope is held (so of two decisions
    /// that touched a common scope the later one has the larger version, and ordered by
    /// version the decisions of every ledger written on this state replay as they were
    /// decided); the records are queued while the scopes are still held. A networked
    /// backend commits the state (the runs of `write.durable` and, with them, every
    /// tool, credential and principal it locked) before anything is queued: state
    /// ahead of the ledger on a crash, never behind. The embedded backend writes the
    /// state of `write.durable` in the ledger's batch, and keeps the whole snapshot in
    /// memory. `done` gets the receipts once the records are durable.
    ///
    /// A backend may instead take the decision into a group commit and return before
    /// its state is durable (the leased backend, for decisions at home that lock no
    /// shared row): it then queues the records only once the state committed, in the
    /// order the commits were made, and if the state does not commit it answers
    /// `write.refuse` and never `done`. Until then it decides later operations on the
    /// state this one left, and fails them too if this one does not commit.
    ///
    /// An error means nothing was queued (and, for a networked backend, nothing made
    /// durable, unless the records themselves failed after the state committed, which
    /// leaves it ahead): the decision is refused and `done` is never called.
    fn commit(self, write: Write<'_>, done: Committed) -> Result<(), GateError>;
}

//! The seam between the gate and where its state lives (DESIGN: the backend owns the
//! atomicity; the policy core is pure and knows nothing of it).
//!
//! A decision is one transaction, driven by the gate's one `transact` path:
//! [`StateBackend::begin`], read the scopes it touches (the run, its tool, its
//! credential) in that fixed order, decide and apply with the core, then
//! [`StateTxn::persist`] and [`StateTxn::commit`] with the decision's bytes. Who may act
//! on a run, and what is recorded and answered, are the gate's; a backend reads, locks
//! and writes state. It guarantees:
//!
//! * isolation: no other transaction sees or changes those scopes between the read and
//!   the commit (the embedded backend holds one lock; a networked one locks rows in the
//!   fixed order);
//! * order: the decision is queued for the ledger before the scopes are released, so a
//!   scope's order in the ledger is the order its state changed;
//! * durability never behind the ledger: the state a decision leaves is durable no later
//!   than the decision (the embedded backend writes both in one store batch; a networked
//!   one commits the state first, which can only leave it ahead, the conservative side).

use tally_ledger::Receipt;
use tally_policy::{Policy, RunState, View, ViewMut};

pub use crate::scopes::Scopes;
use crate::GateError;

mod embedded;
pub use embedded::{Embedded, EmbeddedTxn};

/// Called once the decisions of a commit are durable (their receipts), or with the error
/// that refused them.
pub type Committed = Box<dyn FnOnce(tally_ledger::Result<Vec<Receipt>>) + Send>;

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

    /// The runs held (as [`StateTxn::runs`]) and every tool's breaker (as
    /// [`StateTxn::breakers`]), for the operator's views, read **apart from the
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
}

/// The runs and breakers as [`StateBackend::overview`] reads them: each run's state, and
/// each tool's breaker as stored, by name.
pub type Overview = (Vec<RunState>, Vec<(String, tally_policy::Breaker)>);

/// One transaction over the gate's state. Dropped without [`StateTxn::commit`], it
/// keeps nothing durable (what it changed in memory is ahead of the ledger: conservative).
pub trait StateTxn {
    /// Whether no run of this name was ever started (a run name is never reused).
    fn is_new(&mut self, run: &str) -> Result<bool, GateError>;
    /// Whether the gate started a run of this name (raw decisions' names are not).
    fn governs(&mut self, run: &str) -> Result<bool, GateError>;
    /// A run the gate governs (`RunNotFound` if none), read into the transaction and,
    /// where the backend locks, locked. Whether the caller may act on it is the gate's
    /// check, the same over every backend.
    fn run(&mut self, run: &str) -> Result<&RunState, GateError>;
    /// A run already read in this transaction, to change.
    fn run_mut(&mut self, run: &str) -> Option<&mut RunState>;
    /// A new run.
    fn insert_run(&mut self, run: RunState);
    /// Open runs started by `uid` (`None`: loopback TCP peers, one identity). A
    /// networked backend also holds that uid's count until the transaction ends, so two
    /// hosts cannot both start its last allowed run.
    fn open_runs_of(&mut self, uid: Option<u32>) -> Result<u64, GateError>;
    /// The open runs started by `uid` for which `expired` holds (past their deadline),
    /// by name, in name order. Read after [`StateTxn::open_runs_of`], which holds the
    /// uid's count; the runs themselves are read (and locked) with [`StateTxn::run`].
    fn expired_runs_of(
        &mut self,
        uid: Option<u32>,
        expired: &dyn Fn(&RunState) -> bool,
    ) -> Result<Vec<String>, GateError>;
    /// The runs held (open ones, and recently stopped ones).
    fn runs(&mut self) -> Result<Vec<&RunState>, GateError>;
    /// Every run whose name begins with `prefix`, open or stopped, from the durable
    /// state too: none is lost to a stopped run let go from memory (read only).
    fn runs_named(&mut self, prefix: &str) -> Result<Vec<RunState>, GateError>;
    /// The open runs whose parent is `run`, by name (a kill stops them with it).
    fn open_children(&mut self, run: &str) -> Result<Vec<String>, GateError>;
    /// Every tool's breaker, as stored, by name (read only).
    fn breakers(&mut self) -> Result<Vec<(String, tally_policy::Breaker)>, GateError>;
    /// Read (or create) a tool's state.
    fn ensure_tool(&mut self, tool: &str, now_ms: u64, policy: &Policy) -> Result<(), GateError>;
    /// Read (or create) a credential's state.
    fn ensure_credential(
        &mut self,
        credential: &str,
        now_ms: u64,
        policy: &Policy,
    ) -> Result<(), GateError>;
    /// Read (or create) a principal's state (`principal`: a uid in decimal).
    fn ensure_principal(&mut self, principal: &str) -> Result<(), GateError>;
    /// The scopes, to decide from.
    fn view(&self, scopes: &Scopes<'_>) -> View<'_>;
    /// The scopes, to apply a decision to.
    fn view_mut(&mut self, scopes: &Scopes<'_>) -> ViewMut<'_>;
    /// The run stopped.
    fn mark_stopped(&mut self, run: &str);
    /// A `pause` or `resume` record of this transaction changes the run's pause to
    /// `paused` (already applied to its state, which the commit writes): keep in step
    /// whatever else the backend holds of it. The embedded backend rewrites the pause
    /// an older build kept outside the log (`p/` + run), if the run has one, before the
    /// record is queued, so the two never disagree after a restart.
    fn pause_changed(&mut self, run: &str, paused: bool) -> Result<(), GateError>;
    /// Make the state of `scopes` durable before anything is queued for the ledger (a
    /// networked backend commits its own transaction here: state ahead of the ledger on
    /// a crash, never behind), and give the state version the decision is recorded at.
    /// An error leaves nothing durable and nothing queued: the decision is refused and
    /// the gate stays up. The embedded backend writes its state with the ledger's batch
    /// instead, in [`StateTxn::commit`].
    ///
    /// The version is taken once every scope the decision touches is held, so of two
    /// decisions that touched a common scope the later one has the larger version:
    /// ordered by version, the decisions of every ledger written on this state replay
    /// as they were decided. No scope may be read after it.
    fn persist(&mut self, scopes: &[Scopes<'_>]) -> Result<u64, GateError>;
    /// Queue `plaintexts` with the state of `scopes` (and `ledger_state`, kept with the
    /// ledger itself), then release the transaction. Called only after
    /// [`StateTxn::persist`] succeeded for the same scopes. `deferred`: queued with
    /// [`tally_ledger::Ledger::submit_deferred`] (it rides the next decision's fsync),
    /// else with [`tally_ledger::Ledger::submit_with_state`].
    fn commit(
        self,
        plaintexts: Vec<Vec<u8>>,
        scopes: &[Scopes<'_>],
        ledger_state: Vec<(Vec<u8>, Vec<u8>)>,
        deferred: bool,
        done: Committed,
    );
}

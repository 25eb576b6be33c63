//! tally's policy core: the one place where a run's budget is counted and a call is
//! decided (docs/GATE.md, how a budget is counted and 8). The live gate, `tally verify`'s replay and every report call
//! these functions; none of them counts on its own.
//!
//! * [`Policy`]: the TOML policy with documented defaults; [`Recorded`] keeps its exact
//!   text and digest, which name it in the ledger.
//! * [`RunState`], [`ToolState`], [`CredentialState`]: what decisions are made from.
//! * [`decide`]: never mutates; returns the exact record to append.
//! * [`judge`]: what a record does that the state before it does not allow; never
//!   mutates. The gate refuses what it finds; replay and the reports only describe it.
//! * [`apply`]: the only fold; returns what [`judge`] found.
//! * [`start`]: what a run is granted, and whether it may start.
//! * [`headroom`]: how close a run is to each limit, and the order runs are shown in.
//! * [`loop_rule`], [`retry_rule`], [`poll_rule`]: what repetition is, for the gate and
//!   for `tally loops`.
//!
//! Pure: no I/O and no clock (the caller passes [`Now`]), ordered maps wherever order
//! can reach output, checked arithmetic.
#![forbid(unsafe_code)]

pub mod apply;
pub mod approval;
pub mod config;
pub mod decide;
pub mod error;
pub mod headroom;
pub mod judge;
pub mod rules;
pub mod start;
pub mod state;

pub use apply::{apply, breaker_outcome, count_unrecorded, ViewMut};
pub use config::{Policy, Recorded};
pub use decide::{decide, Call, Decided, Verdict, View};
pub use error::{ApprovalError, PolicyError};
pub use headroom::{closeness, limits_now, Closeness, Headroom};
pub use judge::{judge, Dimension, Inconsistency};
pub use rules::{loop_rule, poll_rule, retry_rule, LoopRule, PollRule};
pub use start::{carry_over, delegate, grant_budget, start, Ask, Family, StartRefusal};
pub use state::{Breaker, CredentialState, RunState, ToolState};

use serde::{Deserialize, Serialize};

/// The time of a decision, passed in: the core reads no clock.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Now {
    /// Wall time, ms since the Unix epoch (breakers, buckets).
    pub wall_ms: u64,
    /// The run's own clock, ms since its start, where the record gives it.
    pub at_ms: Option<u64>,
}

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
//! * [`start`]: what a run is granted, and whether it may start; [`refill`]: when a
//!   continuation of a run a refusal stopped needs an approver.
//! * [`headroom`]: how close a run is to each limit, and the order runs are shown in.
//! * [`loop_rule`], [`retry_rule`], [`poll_rule`]: what repetition is, for the gate and
//!   for `tally loops`.
//! * [`RULES`]: the refusal order, named rules `decide` checks in turn; the reports read
//!   the order and replay which rules it cannot judge offline from it.
//! * [`past_deadline`], [`call_timeout`], [`spend_left`], [`is_failure`], ...: the
//!   questions the gate, the proxy and verify ask of a run's limits and an outcome's
//!   status, answered here only (ARCHITECTURE.md, where the rules live).
//!
//! Pure: no I/O and no clock (the caller passes [`Now`]), ordered maps wherever order
//! can reach output, checked arithmetic.
//!
//! Modules depend on each other one way, each only on those before it here (checked by
//! `tests/layers`): `error`, `prices` (money in the policy), `fields` (price tables read from the text), `tiers` (billing tiers' rates), `dates` (a price's `as_of`), `upstreams` (the proxy's upstreams and prices), `price_age` (prices older than the policy's bound), `price_import` (a published price table read into prices), `principals` (principal budgets), `key_day` (a key's own budget per UTC day), `config`, `approval`, `state` (with [`Now`]),
//! `limits` (what a run's limits answer at a moment), `status` (what an outcome's status means), `inconsistency` (what judging finds), `overrun` (settlements above their reservation), `refill` (continuations of runs a refusal stopped), `start`, `call` (a call, the view a decision
//! reads, and what a grant covers), `rules`, `refusals` (the refusal order: named rules, checked in one order), `request` (the approval request a `require_approval` is), `decide`, `judge`, `apply`, `headroom` (how
//! close a run is to its limits), `leased` (what counts against a slice), `slices` (how big a leased slice of a budget is, and whether a use fits in one). Items moved down
//! are re-exported where they were (`decide::Call`, `judge::Inconsistency`,
//! `apply::standing`, ...).
#![forbid(unsafe_code)]

pub mod apply;
pub mod approval;
pub mod call;
pub mod config;
pub mod dates;
pub mod decide;
pub mod error;
pub mod fields;
pub mod headroom;
pub mod inconsistency;
pub mod judge;
pub mod key_day;
pub mod leased;
pub mod limits;
pub mod mcp_servers;
pub mod overrun;
pub mod price_age;
pub mod price_import;
pub mod prices;
pub mod principals;
pub mod refill;
pub mod refusals;
pub mod request;
pub mod rules;
pub mod slices;
pub mod start;
pub mod state;
pub mod status;
pub mod tiers;
pub mod upstreams;

pub use apply::{apply, apply_keyed, breaker_outcome, count_unrecorded, ViewMut};
pub use call::{Keyed, NameKeys, PROXY_REFUSALS};
pub use config::{Policy, Recorded};
pub use decide::{decide, Call, Decided, Verdict, View};
pub use error::{ApprovalError, PolicyError};
pub use headroom::{closeness, limits_now, Closeness, Headroom};
pub use inconsistency::OutsideLease;
pub use judge::{judge, Dimension, Inconsistency};
pub use key_day::{
    key_call_day, key_call_fits, key_run_fits, KeyDayExceeded, KeyDayLimits, KeyDayUse,
};
pub use leased::{
    gives_back_on, in_scope, incurred, principal_cap, principal_use, raised_limit, run_cap,
    run_limit, slice_use, slices_past_cap, Past, RunCount, SliceUse,
};
pub use limits::{
    call_timeout, deadline_left, deadline_stop, left, over_limit, past_deadline, spend_left,
};
pub use overrun::{overrun, Overrun};
pub use refusals::{
    breaker_wait, outcome_unknown, taken_as_recorded, tools_counted_per_call, Rule, RULES,
};
pub use request::request_id;
pub use rules::{loop_rule, poll_rule, retries_used, retry_rule, LoopRule, PollRule};
pub use slices::{fits_in_slice, slice_for, slice_size, SliceSize};
pub use start::{
    above_ceiling, carry_over, delegate, grant_budget, start, Ask, Family, StartRefusal,
};
pub use state::{
    principal_limits, Breaker, CredentialState, Denied, Now, PrincipalState, RunState, ToolState,
};
pub use status::{
    is_failure, is_final, is_rejection, is_running, is_success, may_have_happened, recorded_status,
    timed_out,
};
pub use tiers::TierPrice;
pub use upstreams::{
    CacheMark, MaxTokensField, ModelPrice, Prices, RoutePrice, Upstream, UpstreamKind,
};

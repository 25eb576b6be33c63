//! tally's policy core: the one place where a run's budget is counted and a call is
//! decided (docs/GATE.md, how a budget is counted and 8). The live gate, `tally verify`'s replay and every report call
//! these functions; none of them counts on its own.
//!
//! * [`Policy`]: the TOML policy with documented defaults; [`Recorded`] keeps its exact
//!   text and digest, which name it in the ledger.
//! * [`RunState`], [`ToolState`], [`CredentialState`]: what decisions are made from.
//! * [`decide`]: never mutates; returns the exact record to append.
//! * [`apply`]: the only fold; reports what it finds inconsistent.
//!
//! Pure: no I/O and no clock (the caller passes [`Now`]), ordered maps wherever order
//! can reach output, checked arithmetic.
#![forbid(unsafe_code)]

pub mod apply;
pub mod approval;
pub mod config;
pub mod decide;
pub mod error;
pub mod state;

pub use apply::{apply, Dimension, Inconsistency, ViewMut};
pub use config::{Policy, Recorded};
pub use decide::{decide, loop_rule, Call, Decided, LoopRule, Verdict, View};
pub use error::{ApprovalError, PolicyError};
pub use state::{Breaker, CredentialState, RunState, ToolState};

use serde::{Deserialize, Serialize};
use tally_record::decision::Budget;

/// The time of a decision, passed in: the core reads no clock.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Now {
    /// Wall time, ms since the Unix epoch (breakers, buckets).
    pub wall_ms: u64,
    /// The run's own clock, ms since its start, where the record gives it.
    pub at_ms: Option<u64>,
}

/// The budget a run is granted: what it asked for, never more than the policy's ceiling
/// for its credential, and for a child run never more than its parent has left.
pub fn grant_budget(
    policy: &Policy,
    asked: Option<&Budget>,
    credential: Option<&str>,
    parent: Option<&RunState>,
) -> Budget {
    let ceiling = policy.ceiling_for(credential);
    let pick = |asked: Option<u64>, ceiling: Option<u64>| match (asked, ceiling) {
        (Some(a), Some(c)) => Some(a.min(c)),
        (a, c) => c.or(a),
    };
    let a = asked.cloned().unwrap_or_default();
    let mut b = Budget {
        attempts: pick(a.attempts, ceiling.attempts),
        deadline_ms: pick(a.deadline_ms, ceiling.deadline_ms),
        spend_cents: pick(a.spend_cents, ceiling.spend_cents),
        side_effects: pick(a.side_effects, ceiling.side_effects),
        polls: pick(a.polls, ceiling.polls),
        depth: pick(a.depth, ceiling.depth),
    };
    if let Some(p) = parent {
        let left = |limit: Option<u64>, used: u64| limit.map(|l| l.saturating_sub(used));
        b.attempts = pick(b.attempts, left(p.attempts_limit(), p.attempts_used));
        b.spend_cents = pick(b.spend_cents, left(p.spend_limit(), p.spent_cents()));
        b.side_effects = pick(
            b.side_effects,
            left(p.side_effects_limit(), p.side_effects_used),
        );
        let parent_left = p.budget.deadline_ms.map(|d| d.saturating_sub(p.last_ms));
        b.deadline_ms = pick(b.deadline_ms, parent_left);
    }
    b
}

/// A child run's allocation is carved out of its parent's: the parent can no longer
/// spend what it handed down.
pub fn delegate(parent: &mut RunState, child: &Budget) {
    parent.delegated_attempts = parent
        .delegated_attempts
        .saturating_add(child.attempts.unwrap_or(0));
    parent.delegated_cents = parent
        .delegated_cents
        .saturating_add(child.spend_cents.unwrap_or(0));
    parent.delegated_side_effects = parent
        .delegated_side_effects
        .saturating_add(child.side_effects.unwrap_or(0));
}

//! The operator socket's live view (`GET /v1/live?page=N`): one page of runs, nearest to a
//! limit first, with their trajectories, the breakers not closed, recent refusals and the
//! calls waiting for a human. What the live page and `tally top` draw.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use tally_record::decision::Limit;
use tally_record::{Closeness, LimitKey, Reason};

use crate::{LastRefusal, RunState};

/// One page of the live view.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LiveSnapshot {
    /// When it was taken, ms since the Unix epoch.
    pub at_ms: u64,
    /// The page (0-based).
    pub page: u64,
    /// Runs a page holds.
    pub per_page: u64,
    /// Runs the gate holds.
    pub total_runs: u64,
    /// Of them, runs not stopped.
    pub open_runs: u64,
    /// The page's runs, open first, then nearest to a limit.
    pub runs: Vec<LiveRun>,
    /// The breakers not closed.
    pub breakers: Vec<LiveBreaker>,
    /// Refusals per minute and reason, the last minutes.
    pub refusals: Vec<LiveRefusals>,
    /// Calls waiting for a human's approval.
    pub pending: Vec<LivePending>,
}

/// A run of the live view: where it stands, how close it is to each limit, its
/// trajectory and its last refusal.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LiveRun {
    /// The run.
    pub run: String,
    /// `running`, `paused` or `stopped`.
    pub state: RunState,
    /// Why it stopped.
    pub stop_reason: Option<Reason>,
    /// How close it is to each limit, nearest first.
    pub closeness: Closeness,
    /// Per dimension the view tracks, the used values in time order.
    pub spark: BTreeMap<LimitKey, Spark>,
    /// The last refusal it was given since the daemon started.
    pub last_refusal: Option<LastRefusal>,
    /// The depth limit as its last check saw it (depth belongs to a call).
    pub depth: Option<Limit>,
    /// Nanodollars held by calls not yet settled.
    pub held_nanos: u64,
    /// Nanodollars settled.
    pub settled_nanos: u64,
    /// Held, as people read it (`$0.15`).
    pub held_usd: String,
    /// Settled, as people read it.
    pub settled_usd: String,
    /// The run's clock: ms since it started.
    pub at_ms: u64,
}

/// A dimension's trajectory.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Spark {
    /// The used values, oldest first.
    pub used: Vec<u64>,
    /// The limit last seen.
    pub limit: u64,
    /// The last point as people read it: `used/limit`, spend in dollars (`$0.15/$10.00`).
    pub shown: String,
}

/// A breaker that is not closed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LiveBreaker {
    /// The tool.
    pub tool: String,
    /// Open, or half open (one trial call let through).
    pub state: BreakerState,
    /// When an open breaker half-opens, ms since the Unix epoch.
    pub half_opens_at_ms: Option<u64>,
}

/// A breaker's state in the live view.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum BreakerState {
    /// Calls of the tool are refused until it half-opens.
    Open,
    /// One trial call is let through.
    HalfOpen,
}

impl BreakerState {
    /// The state as the wire spells it.
    pub const fn as_str(self) -> &'static str {
        match self {
            BreakerState::Open => "open",
            BreakerState::HalfOpen => "half_open",
        }
    }
}

/// Refusals of one reason in one minute.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LiveRefusals {
    /// The minute, ms since the Unix epoch.
    pub minute_ms: u64,
    /// The reason code.
    pub reason: String,
    /// How many.
    pub count: u64,
}

/// A call waiting for a human's approval: exactly the call an approval would allow.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LivePending {
    /// The run.
    pub run: String,
    /// The tool.
    pub tool: String,
    /// The BLAKE3 digest of the call's arguments (never the arguments).
    pub args_digest: Option<String>,
    /// The refusal's seq in the ledger.
    pub seq: Option<u64>,
    /// When, ms since the Unix epoch.
    pub at_ms: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A page the daemon served (`curl --unix-socket op.sock .../v1/live?page=0`: three
    /// runs, one stopped, one refused, a breaker open and a call waiting), read and
    /// written back byte for byte.
    #[test]
    fn a_recorded_live_page_reads_and_writes_back_byte_for_byte() {
        let recorded = include_str!("../tests/live_answer.json").trim_end();
        let page: LiveSnapshot = serde_json::from_str(recorded).expect("the daemon's page");
        assert_eq!(page.runs.len(), 3);
        assert_eq!(page.breakers[0].state, BreakerState::Open);
        assert_eq!(page.pending.len(), 1);
        assert_eq!(serde_json::to_string(&page).expect("JSON"), recorded);
    }
}

//! The state runs share: each downstream tool's breaker, bucket and calls in flight, and
//! each credential's bucket and spend backstop; each principal's usage in its period.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use tally_record::decision::Limit;
use tally_record::LimitKey;

use crate::config::PrincipalLimits;

/// A token bucket in integer milli-tokens, so replay computes exactly what the gate did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bucket {
    /// Milli-tokens spent below a full bucket as of `at_ms` (0: full).
    pub deficit: u64,
    /// Wall time of the last update, ms.
    pub at_ms: u64,
}

impl Bucket {
    /// The ms until one token is there, or `None` if one is there now. A rate of 0 is
    /// no limit.
    pub fn wait(&self, per_sec: u64, burst: u64, now_ms: u64) -> Option<u64> {
        if per_sec == 0 {
            return None;
        }
        let deficit = self.deficit_at(per_sec, now_ms);
        let cap = burst.max(1).saturating_mul(1000);
        let have = cap.saturating_sub(deficit);
        if have >= 1000 {
            None
        } else {
            // `per_sec` milli-tokens come back per ms.
            Some((1000 - have).div_ceil(per_sec))
        }
    }

    /// Whether the bucket is full at `now_ms` (as a fresh one is).
    pub fn is_full(&self, per_sec: u64, now_ms: u64) -> bool {
        per_sec == 0 || self.deficit_at(per_sec, now_ms) == 0
    }

    /// Spend one token at `now_ms`.
    pub fn take(&mut self, per_sec: u64, now_ms: u64) {
        if per_sec == 0 {
            return;
        }
        self.deficit = self.deficit_at(per_sec, now_ms).saturating_add(1000);
        self.at_ms = self.at_ms.max(now_ms);
    }

    fn deficit_at(&self, per_sec: u64, now_ms: u64) -> u64 {
        let elapsed = now_ms.saturating_sub(self.at_ms);
        self.deficit.saturating_sub(elapsed.saturating_mul(per_sec))
    }
}

/// A downstream tool's breaker.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Breaker {
    /// Calls pass; consecutive failures are counted.
    Closed {
        /// Consecutive failed outcomes.
        failures: u64,
    },
    /// Calls are refused until `until_ms` (wall time).
    Open {
        /// When it half-opens.
        until_ms: u64,
    },
    /// One probe is admitted; its outcome closes or reopens the breaker.
    HalfOpen {
        /// The probe in flight, if one was admitted.
        probe: Option<Probe>,
    },
}

impl Default for Breaker {
    fn default() -> Breaker {
        Breaker::Closed { failures: 0 }
    }
}

/// The half-open breaker's one probe.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Probe {
    /// Its run and attempt, as [`call_id`].
    pub call: u64,
    /// If no outcome has come by this wall time, ms, the probe failed.
    pub deadline_ms: u64,
}

impl Breaker {
    /// The breaker as it stands at `now_ms`, time-based transitions taken: an open
    /// breaker past its expiry is half-open; a probe past its deadline failed (open
    /// again from its deadline), so a stuck probe can never wedge the breaker.
    pub fn at(&self, now_ms: u64, open_ms: u64) -> Breaker {
        let mut b = self.clone();
        loop {
            b = match b {
                Breaker::Open { until_ms } if now_ms >= until_ms => {
                    Breaker::HalfOpen { probe: None }
                }
                Breaker::HalfOpen { probe: Some(p) } if now_ms >= p.deadline_ms => Breaker::Open {
                    until_ms: p.deadline_ms.saturating_add(open_ms),
                },
                settled => return settled,
            };
        }
    }
}

/// A downstream tool's state, shared by every run and worker.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolState {
    /// Its breaker.
    pub breaker: Breaker,
    /// Calls in flight: [`call_id`] -> wall time after which it no longer counts. Not
    /// kept across a restart (a bound on concurrency, not a budget: the calls of the
    /// process before are its callers' to account for, and their outcomes still settle
    /// the runs' own state).
    #[serde(skip)]
    pub in_flight: BTreeMap<u64, u64>,
    /// Its rate bucket.
    pub bucket: Bucket,
}

impl ToolState {
    /// Calls in flight at `now_ms`.
    pub fn in_flight_at(&self, now_ms: u64) -> u64 {
        self.in_flight.values().filter(|&&t| t > now_ms).count() as u64
    }
}

/// A credential's state, shared by its runs.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CredentialState {
    /// Its rate bucket.
    pub bucket: Bucket,
    /// Wall time the current spend period began, ms.
    pub period_start_ms: u64,
    /// Nanodollars reserved or settled in the period.
    pub spent_nanos: u64,
}

impl CredentialState {
    /// A credential state kept when money was counted in cents (gate state format 2),
    /// its amounts read exactly as nanodollars; `None` if one does not fit.
    pub fn into_nanos(mut self) -> Option<CredentialState> {
        self.spent_nanos = tally_record::money::Nanos::from_cents(self.spent_nanos)?.0;
        Some(self)
    }
}

/// A principal's (one uid's) use of its budget in the current period, across all its
/// runs (docs/GATE.md, "Principals").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PrincipalState {
    /// Wall time the current period began, ms.
    pub period_start_ms: u64,
    /// Runs started in the period.
    pub runs: u64,
    /// Attempts used in the period.
    pub attempts: u64,
    /// Nanodollars reserved or settled in the period.
    pub spent_nanos: u64,
}

impl PrincipalState {
    /// The state as it stands at `now_ms`: a fresh period if the current one, `period_ms`
    /// long, has ended.
    pub fn at(&self, now_ms: u64, period_ms: u64) -> PrincipalState {
        if now_ms >= self.period_start_ms.saturating_add(period_ms.max(1)) {
            PrincipalState {
                period_start_ms: now_ms,
                ..PrincipalState::default()
            }
        } else {
            *self
        }
    }
}

/// A principal's usage against its budget at wall time `wall_ms`, as a
/// `{dimension: {used, limit}}` snapshot adds it: `principal_runs`, `principal_attempts`
/// and `principal_spend_nanos`, each only where the policy gives that limit. The period
/// rolls as the gate's decisions roll it (a period that ended counts nothing); no state
/// yet is nothing used. The one count of a principal's standing: decisions, the run
/// standings and every report print it, none counts it.
pub fn principal_limits(
    limits: &PrincipalLimits,
    state: Option<&PrincipalState>,
    wall_ms: u64,
) -> BTreeMap<LimitKey, Limit> {
    let now = state
        .map(|p| p.at(wall_ms, limits.period_ms))
        .unwrap_or_default();
    [
        (LimitKey::PrincipalRuns, limits.runs, now.runs),
        (LimitKey::PrincipalAttempts, limits.attempts, now.attempts),
        (
            LimitKey::PrincipalSpendNanos,
            limits.spend_nanos,
            now.spent_nanos,
        ),
    ]
    .into_iter()
    .filter_map(|(d, limit, used)| limit.map(|limit| (d, Limit { used, limit })))
    .collect()
}

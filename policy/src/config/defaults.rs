//! What a policy says where its text is silent: each section's defaults (docs/GATE.md,
//! the policy file, lists them).

use std::collections::BTreeMap;

use tally_record::decision::Budget;
use tally_record::Reason;

use super::{
    Approvals, Breaker, Credential, Loops, Policy, Polls, Principals, Rate, Retries, ScopeRules,
};
impl Default for Policy {
    fn default() -> Policy {
        Policy {
            ceiling: Budget {
                attempts: Some(50),
                deadline_ms: Some(3_600_000),
                spend_cents: None,
                spend_nanos: Some(10 * tally_record::money::NANOS_PER_DOLLAR),
                side_effects: Some(20),
                polls: Some(30),
                depth: Some(3),
            },
            retries: Retries::default(),
            loops: Loops::default(),
            polls: Polls::default(),
            breaker: Breaker::default(),
            rate: Rate::default(),
            scope: ScopeRules::default(),
            approvals: Approvals::default(),
            credentials: BTreeMap::new(),
            max_open_runs_per_uid: 1_000,
            tool_prices: BTreeMap::new(),
            principals: Principals::default(),
            upstreams: BTreeMap::new(),
            prices: crate::upstreams::Prices::default(),
            max_price_age_days: None,
            mcp: BTreeMap::new(),
        }
    }
}

impl Default for Credential {
    fn default() -> Credential {
        Credential {
            ceiling: Budget::default(),
            spend_nanos_per_period: None,
            period_ms: 86_400_000,
            uids: Vec::new(),
        }
    }
}

impl Default for Retries {
    fn default() -> Retries {
        Retries {
            read: 3,
            idempotent_write: 2,
            non_idempotent_write: 1,
        }
    }
}

impl Default for Loops {
    fn default() -> Loops {
        Loops {
            identical_consecutive: 3,
            identical_in_window: 5,
            identical_window: 20,
            tool_calls: 60,
            tool_window_ms: 60_000,
            alternating: 4,
        }
    }
}

impl Default for Polls {
    fn default() -> Polls {
        Polls {
            interval_ms: 1_000,
            tolerance_ms: 1_000,
            tolerance_percent: 10,
            stall_polls: 0,
        }
    }
}

impl Default for Breaker {
    fn default() -> Breaker {
        Breaker {
            failures: 5,
            open_ms: 30_000,
            probe_timeout_ms: 10_000,
            tools: BTreeMap::new(),
        }
    }
}

impl Default for Rate {
    fn default() -> Rate {
        Rate {
            run_per_sec: 50,
            run_burst: 100,
            credential_per_sec: 0,
            credential_burst: 0,
            tool_per_sec: 200,
            tool_burst: 400,
            tool_in_flight: 64,
            call_timeout_ms: 60_000,
        }
    }
}

impl Default for Approvals {
    fn default() -> Approvals {
        Approvals {
            approvers: BTreeMap::new(),
            ask_on: vec![
                Reason::AttemptsExhausted,
                Reason::ReservationInsufficient,
                Reason::BudgetExceeded,
                Reason::SideEffectLimitExceeded,
                Reason::ToolBlocked,
                Reason::OutcomeUnknownNonIdempotent,
            ],
            max_expiry_ms: 86_400_000,
            max_unapproved_continuations: 1,
        }
    }
}

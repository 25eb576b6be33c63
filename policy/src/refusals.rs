//! The refusal order: every rule a call is checked against, by name, in the one order
//! [`decide`](crate::decide) applies them; the first that refuses names the refusal. The
//! reports read the order from here ([`Rule::precedes`]) rather than copying it, and
//! replay reads which rules need state that the records do not hold
//! ([`Rule::outside_the_records`], [`taken_as_recorded`], [`offline`]).

use tally_record::{Effect, Reason};

use crate::call::{counts, Call, View};
use crate::config::{matches, target_matches, Policy};
use crate::limits::past_deadline;
use crate::rules::{loop_rule, poll_rule, retry_rule, PollRule};
use crate::state::{Breaker, Bucket, Now, RunState, ToolState};

/// A refusal: its reason, and when to try again where waiting helps.
pub(crate) struct Refusal {
    pub reason: Reason,
    pub retry_after_ms: Option<u64>,
}

/// Refused, and waiting does not help.
pub(crate) fn refuse(reason: Reason) -> Refusal {
    Refusal {
        reason,
        retry_after_ms: None,
    }
}

/// Refused for now: try again after `after_ms` (at least 1).
pub(crate) fn retry(reason: Reason, after_ms: u64) -> Refusal {
    Refusal {
        reason,
        retry_after_ms: Some(after_ms.max(1)),
    }
}

/// One rule of the refusal order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Rule {
    /// The run is paused (`run_paused`).
    Paused,
    /// The run holds the most calls without an outcome a run may (`rate_limit_exceeded`).
    RunInFlight,
    /// The run is past its deadline (`run_deadline_exhausted`).
    Deadline,
    /// An approver denied exactly this call (`denied_by_approver`).
    Denied,
    /// The call is deeper than the run's chain depth (`chain_depth_exceeded`).
    Depth,
    /// The tool or target is outside the policy's scope (`scope_violation`).
    Scope,
    /// The tool is blocked and not unblocked for the run (`tool_blocked`).
    Blocked,
    /// The tool's shared breaker is open or probing (`circuit_open`).
    Breaker,
    /// A non-idempotent write repeated while its outcome is unknown
    /// (`outcome_unknown_non_idempotent`).
    OutcomeUnknown,
    /// A poll past its allowance, stalled or early ([`poll_rule`]).
    Poll,
    /// A failing operation retried past its class ([`retry_rule`], `retries_exhausted`).
    Retries,
    /// A call that repeats ([`loop_rule`], `loop_repeated_call`).
    Loop,
    /// No attempt number is left to give (`attempts_exhausted`).
    AttemptNumbers,
    /// The reservation would overflow the run's spend (`reservation_insufficient`).
    SpendOverflow,
    /// The run's attempts are used (`attempts_exhausted`).
    Attempts,
    /// The run's side effects are used (`side_effect_limit_exceeded`).
    SideEffects,
    /// The run's spend is used, or the reservation does not fit in it.
    Spend,
    /// The run's call rate (`rate_limit_exceeded`).
    RunRate,
    /// The credential's call rate (`rate_limit_exceeded`).
    CredentialRate,
    /// The tool's call rate (`rate_limit_exceeded`).
    ToolRate,
    /// The tool's calls in flight across runs (`rate_limit_exceeded`).
    ToolInFlight,
    /// The credential's spend per period (`budget_exceeded`).
    CredentialSpend,
    /// The run's owner's budget across its runs (`principal_budget_exceeded`).
    Principal,
}

/// The refusal order: a call is refused by the first of these that refuses it.
pub const RULES: [Rule; 23] = [
    Rule::Paused,
    Rule::RunInFlight,
    Rule::Deadline,
    Rule::Denied,
    Rule::Depth,
    Rule::Scope,
    Rule::Blocked,
    Rule::Breaker,
    Rule::OutcomeUnknown,
    Rule::Poll,
    Rule::Retries,
    Rule::Loop,
    Rule::AttemptNumbers,
    Rule::SpendOverflow,
    Rule::Attempts,
    Rule::SideEffects,
    Rule::Spend,
    Rule::RunRate,
    Rule::CredentialRate,
    Rule::ToolRate,
    Rule::ToolInFlight,
    Rule::CredentialSpend,
    Rule::Principal,
];

impl Rule {
    /// Its place in [`RULES`].
    pub fn rank(self) -> usize {
        RULES.iter().position(|r| *r == self).unwrap_or(RULES.len())
    }

    /// Whether this rule is checked before `other`: where both refuse, this one names
    /// the refusal.
    pub fn precedes(self, other: Rule) -> bool {
        self.rank() < other.rank()
    }

    /// Whether the rule reads state the run's records do not hold (rate buckets and
    /// in-flight counts across runs, a tool's shared breaker) or that ledgers written
    /// before it was recorded lack (a pause): replay cannot judge it offline, and takes
    /// its refusals as recorded.
    pub fn outside_the_records(self) -> bool {
        matches!(
            self,
            Rule::Paused
                | Rule::Breaker
                | Rule::RunRate
                | Rule::CredentialRate
                | Rule::ToolRate
                | Rule::ToolInFlight
        )
    }

    /// The reasons the rule refuses with.
    pub fn reasons(self) -> &'static [Reason] {
        match self {
            Rule::Paused => &[Reason::RunPaused],
            Rule::RunInFlight
            | Rule::RunRate
            | Rule::CredentialRate
            | Rule::ToolRate
            | Rule::ToolInFlight => &[Reason::RateLimitExceeded],
            Rule::Deadline => &[Reason::RunDeadlineExhausted],
            Rule::Denied => &[Reason::DeniedByApprover],
            Rule::Depth => &[Reason::ChainDepthExceeded],
            Rule::Scope => &[Reason::ScopeViolation],
            Rule::Blocked => &[Reason::ToolBlocked],
            Rule::Breaker => &[Reason::CircuitOpen],
            Rule::OutcomeUnknown => &[Reason::OutcomeUnknownNonIdempotent],
            Rule::Poll => &[Reason::PollAllowanceExhausted, Reason::UpstreamBackoff],
            Rule::Retries => &[Reason::RetriesExhausted],
            Rule::Loop => &[Reason::LoopRepeatedCall],
            Rule::AttemptNumbers | Rule::Attempts => &[Reason::AttemptsExhausted],
            Rule::SpendOverflow => &[Reason::ReservationInsufficient],
            Rule::SideEffects => &[Reason::SideEffectLimitExceeded],
            Rule::Spend => &[Reason::BudgetExceeded, Reason::ReservationInsufficient],
            Rule::CredentialSpend => &[Reason::BudgetExceeded],
            Rule::Principal => &[Reason::PrincipalBudgetExceeded],
        }
    }
}

/// Whether replay takes a recorded refusal with `reason` as recorded: a rule outside
/// the records refuses with it, or no rule does (the gate could not record).
pub fn taken_as_recorded(reason: Reason) -> bool {
    reason == Reason::GateUnavailable
        || RULES
            .iter()
            .any(|r| r.outside_the_records() && r.reasons().contains(&reason))
}

/// The policy as replay applies it offline: the rate rules read every run's wall times
/// and calls outside the records, so they are off (their refusals are taken as
/// recorded).
pub fn offline(policy: &Policy) -> Policy {
    let mut offline = policy.clone();
    offline.rate.run_per_sec = 0;
    offline.rate.credential_per_sec = 0;
    offline.rate.tool_per_sec = 0;
    offline.rate.tool_in_flight = 0;
    offline
}

/// Whether the core keeps a count per call for each tool under `policy`, shared by every
/// gate of a fleet: a rate bucket ([`Rule::ToolRate`]) or a limit on calls in flight
/// ([`Rule::ToolInFlight`]). Without either, a tool's state that any decision reads is
/// its breaker alone (a leased gate may then read it from its own view).
pub fn tools_counted_per_call(policy: &Policy) -> bool {
    policy.rate.tool_per_sec != 0 || policy.rate.tool_in_flight != 0
}

/// How long a tool's shared breaker refuses calls at `wall_ms`, if it does: open, or
/// half-open with its probe out.
pub fn breaker_wait(policy: &Policy, tool: &ToolState, wall_ms: u64) -> Option<u64> {
    match tool.breaker.at(wall_ms, policy.breaker.open_ms) {
        Breaker::Open { until_ms } => Some(until_ms - wall_ms),
        Breaker::HalfOpen { probe: Some(p) } => Some(p.deadline_ms - wall_ms),
        Breaker::HalfOpen { probe: None } | Breaker::Closed { .. } => None,
    }
}

/// Whether a call with `effect` to logical operation `op` ([`Call::op`]) repeats a
/// non-idempotent write whose outcome the run does not know.
pub fn outcome_unknown(run: &RunState, effect: Option<Effect>, op: u64) -> bool {
    effect == Some(Effect::NonIdempotentWrite) && run.unknown.contains_key(&op)
}

/// What one check reads.
struct Check<'a> {
    policy: &'a Policy,
    state: View<'a>,
    call: &'a Call,
    now: Now,
    run_ms: u64,
    /// The call's reservation, at least its tool's price.
    reserve: u64,
    /// The remote operation it polls, if it is a poll.
    poll: Option<u64>,
}

/// The first rule of [`RULES`] that refuses `call`, and its refusal.
pub(crate) fn first_refusal(
    policy: &Policy,
    state: View<'_>,
    call: &Call,
    now: Now,
    run_ms: u64,
) -> Option<Refusal> {
    let run = state.run;
    let c = Check {
        policy,
        state,
        call,
        now,
        run_ms,
        reserve: policy.reservation(&call.tool, call.reserve_nanos),
        poll: run.poll_of(
            call.effect,
            call.remote_ref.as_deref(),
            call.operation.as_deref(),
        ),
    };
    RULES.iter().find_map(|rule| check(*rule, &c))
}

/// Whether `rule` refuses the call `c` describes.
fn check(rule: Rule, c: &Check<'_>) -> Option<Refusal> {
    let run = c.state.run;
    let call = c.call;
    match rule {
        Rule::Paused => run.paused.then(|| refuse(Reason::RunPaused)),
        // Calls without a reported outcome: the run must report (or time out) some
        // before it may make more; its state stays bounded.
        Rule::RunInFlight => (run.open.len() >= crate::state::MAX_IN_FLIGHT_PER_RUN)
            .then(|| retry(Reason::RateLimitExceeded, 1000)),
        Rule::Deadline => {
            past_deadline(&run.budget, c.run_ms).then(|| refuse(Reason::RunDeadlineExhausted))
        }
        Rule::Denied => denied(run, call),
        Rule::Depth => match (call.depth, run.budget.depth) {
            (Some(depth), Some(limit)) if depth > limit => Some(refuse(Reason::ChainDepthExceeded)),
            _ => None,
        },
        Rule::Scope => scope(c.policy, call),
        Rule::Blocked => blocked(c.policy, run, call),
        Rule::Breaker => c
            .state
            .tool
            .and_then(|t| breaker_wait(c.policy, t, c.now.wall_ms))
            .map(|wait| retry(Reason::CircuitOpen, wait)),
        Rule::OutcomeUnknown => outcome_unknown(run, call.effect, call.op())
            .then(|| refuse(Reason::OutcomeUnknownNonIdempotent)),
        Rule::Poll => match poll_rule(c.policy, run, c.poll?, c.run_ms)? {
            PollRule::Allowance | PollRule::Stalled => Some(refuse(Reason::PollAllowanceExhausted)),
            PollRule::Early { wait_ms } => Some(retry(Reason::UpstreamBackoff, wait_ms)),
        },
        // A failing operation retried past its class is told so before it is told it
        // loops: the more specific of the two. Neither applies to a poll.
        Rule::Retries => (c.poll.is_none() && retry_rule(c.policy, run, call))
            .then(|| refuse(Reason::RetriesExhausted)),
        Rule::Loop => (c.poll.is_none() && loop_rule(c.policy, run, call, c.run_ms).is_some())
            .then(|| refuse(Reason::LoopRepeatedCall)),
        // No attempt number is left to give: never reuse one.
        Rule::AttemptNumbers => {
            (run.last_attempt == u64::MAX).then(|| refuse(Reason::AttemptsExhausted))
        }
        Rule::SpendOverflow => spend_overflow(run, c.reserve),
        Rule::Attempts => attempts(c),
        Rule::SideEffects => side_effects(run, call),
        Rule::Spend => spend(run, c.reserve),
        Rule::RunRate => {
            let rate = &c.policy.rate;
            rate_limit(&run.bucket, rate.run_per_sec, rate.run_burst, c.now)
        }
        Rule::CredentialRate => {
            let rate = &c.policy.rate;
            let bucket = &c.state.credential?.bucket;
            rate_limit(
                bucket,
                rate.credential_per_sec,
                rate.credential_burst,
                c.now,
            )
        }
        Rule::ToolRate => {
            let rate = &c.policy.rate;
            rate_limit(
                &c.state.tool?.bucket,
                rate.tool_per_sec,
                rate.tool_burst,
                c.now,
            )
        }
        Rule::ToolInFlight => tool_in_flight(c.policy, c.state.tool?, c.now.wall_ms),
        Rule::CredentialSpend => credential_spend(c),
        Rule::Principal => principal(c),
    }
}

/// [`Rule::Denied`]: a human said no to exactly this call: no grant, no retry makes it
/// a call.
fn denied(run: &RunState, call: &Call) -> Option<Refusal> {
    run.denial_of(
        &call.tool,
        call.operation.as_deref(),
        call.args_digest.as_deref(),
    )
    .map(|_| refuse(Reason::DeniedByApprover))
}

/// [`Rule::SpendOverflow`]: the reservation would overflow the run's spend: it never
/// fits.
fn spend_overflow(run: &RunState, reserve: u64) -> Option<Refusal> {
    run.held_nanos
        .checked_add(run.settled_nanos)
        .and_then(|n| n.checked_add(reserve))
        .is_none()
        .then(|| refuse(Reason::ReservationInsufficient))
}

/// [`Rule::Blocked`]: the tool is one the policy blocks, and no human unblocked it for
/// the run.
fn blocked(policy: &Policy, run: &RunState, call: &Call) -> Option<Refusal> {
    (policy.scope.blocked.iter().any(|p| matches(p, &call.tool))
        && !run.unblocked.iter().any(|t| t == &call.tool))
    .then(|| refuse(Reason::ToolBlocked))
}

/// [`Rule::Attempts`]: a call that uses an attempt, with none left.
fn attempts(c: &Check<'_>) -> Option<Refusal> {
    let run = c.state.run;
    (counts(c.policy, &c.call.tool, c.poll.is_some())
        && run
            .attempts_limit()
            .is_some_and(|limit| run.attempts_used >= limit))
    .then(|| refuse(Reason::AttemptsExhausted))
}

/// [`Rule::SideEffects`]: a write, with no side effect left.
fn side_effects(run: &RunState, call: &Call) -> Option<Refusal> {
    (call.is_write()
        && run
            .side_effects_limit()
            .is_some_and(|limit| run.side_effects_used >= limit))
    .then(|| refuse(Reason::SideEffectLimitExceeded))
}

/// [`Rule::RunRate`], [`Rule::CredentialRate`], [`Rule::ToolRate`]: the bucket of
/// `per_sec` calls (bursts of `burst`) has no call left at `now`: try again once it has.
fn rate_limit(bucket: &Bucket, per_sec: u64, burst: u64, now: Now) -> Option<Refusal> {
    bucket
        .wait(per_sec, burst, now.wall_ms)
        .map(|wait| retry(Reason::RateLimitExceeded, wait))
}

/// [`Rule::Scope`]: the tool, then the target, within the policy's scope.
fn scope(policy: &Policy, call: &Call) -> Option<Refusal> {
    let scope = &policy.scope;
    if !scope.tools.is_empty() && !scope.tools.iter().any(|p| matches(p, &call.tool)) {
        return Some(refuse(Reason::ScopeViolation));
    }
    if let Some(target) = &call.target {
        if !scope.targets.is_empty() && !scope.targets.iter().any(|p| target_matches(p, target)) {
            return Some(refuse(Reason::ScopeViolation));
        }
    }
    None
}

/// [`Rule::Spend`]: the run's spend limit in force.
fn spend(run: &RunState, reserve: u64) -> Option<Refusal> {
    let limit = run.spend_limit()?;
    // After an overrun the run's outcomes settle more than its calls reserve, so no
    // call is free: a zero-reserve call could settle any amount. Until a human grants
    // more, every counted call is refused; otherwise a spent budget refuses spend.
    if run.overrun || (reserve > 0 && run.settled_nanos >= limit) {
        return Some(refuse(Reason::BudgetExceeded));
    }
    let total = run.spent_nanos().checked_add(reserve);
    if total.is_none_or(|t| t > limit) {
        return Some(refuse(Reason::ReservationInsufficient));
    }
    None
}

/// [`Rule::ToolInFlight`]: the tool's calls in flight across runs.
fn tool_in_flight(policy: &Policy, tool: &ToolState, wall_ms: u64) -> Option<Refusal> {
    let limit = policy.rate.tool_in_flight;
    if limit == 0 || tool.in_flight_at(wall_ms) < limit {
        return None;
    }
    let next = tool
        .in_flight
        .values()
        .filter(|&&t| t > wall_ms)
        .min()
        .map_or(1, |t| t - wall_ms);
    Some(retry(Reason::RateLimitExceeded, next))
}

/// [`Rule::CredentialSpend`]: the credential's spend per period, its backstop.
fn credential_spend(c: &Check<'_>) -> Option<Refusal> {
    let (cap, period) = c
        .call
        .credential
        .as_deref()
        .or(c.state.run.credential.as_deref())
        .and_then(|name| c.policy.credentials.get(name))
        .and_then(|p| p.spend_nanos_per_period.map(|s| (s, p.period_ms.max(1))))?;
    let cred = c.state.credential?;
    let spent = if c.now.wall_ms >= cred.period_start_ms.saturating_add(period) {
        0
    } else {
        cred.spent_nanos
    };
    (spent.saturating_add(c.reserve) > cap).then(|| refuse(Reason::BudgetExceeded))
}

/// [`Rule::Principal`]: the run's owner's budget across all its runs in the period.
fn principal(c: &Check<'_>) -> Option<Refusal> {
    let l = c.state.run.owner_uid.and_then(|u| c.policy.principal(u))?;
    let p = c.state.principal?.at(c.now.wall_ms, l.period_ms);
    let counted = counts(c.policy, &c.call.tool, c.poll.is_some());
    if counted && l.attempts.is_some_and(|m| p.attempts >= m) {
        return Some(refuse(Reason::PrincipalBudgetExceeded));
    }
    l.spend_nanos
        .is_some_and(|m| p.spent_nanos.saturating_add(c.reserve) > m)
        .then(|| refuse(Reason::PrincipalBudgetExceeded))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_rule_is_in_the_order_once() {
        for (i, r) in RULES.iter().enumerate() {
            assert_eq!(r.rank(), i, "{r:?}");
        }
        assert!(Rule::OutcomeUnknown.precedes(Rule::Retries));
        assert!(Rule::Retries.precedes(Rule::Loop));
        assert!(!Rule::Loop.precedes(Rule::Retries));
    }

    #[test]
    fn replay_takes_as_recorded_what_the_records_cannot_show() {
        let taken: Vec<Reason> = [
            Reason::RateLimitExceeded,
            Reason::CircuitOpen,
            Reason::RunPaused,
            Reason::GateUnavailable,
            Reason::RunDeadlineExhausted,
            Reason::AttemptsExhausted,
            Reason::RetriesExhausted,
            Reason::BudgetExceeded,
            Reason::PrincipalBudgetExceeded,
        ]
        .into_iter()
        .filter(|&r| taken_as_recorded(r))
        .collect();
        assert_eq!(
            taken,
            [
                Reason::RateLimitExceeded,
                Reason::CircuitOpen,
                Reason::RunPaused,
                Reason::GateUnavailable
            ]
        );
    }
}

//! The rules of repetition: identical calls, alternation, the per-tool bar, retries of
//! one logical operation, and polling. Each is one public function over the run's state
//! before a call; [`crate::decide`] refuses by them, and `tally loops` reports a loop
//! exactly where one of them refuses (or would have refused) a call. Nothing else
//! decides what a loop is.

use serde::{Deserialize, Serialize};
use tally_record::Effect;

use crate::call::{Call, Keyed};
use crate::config::Policy;
use crate::state::{tool_key, Recent, RunState};

/// Which of the policy's loop breakers a call trips (`loop_repeated_call`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum LoopRule {
    /// More identical calls in a row than `identical_consecutive`, with no change of
    /// result between them.
    Consecutive,
    /// More identical calls among the run's last `identical_window` than
    /// `identical_in_window`, with no change of result between them.
    InWindow,
    /// Two calls alternating (A, B, A, B, ...) `alternating` times with no progress in
    /// between.
    Alternating,
    /// More calls of one tool within `tool_window_ms` than `tool_calls`.
    ToolBar,
}

/// Identical earlier calls of `key` that are "the same call again", newest first: the
/// walk back over `recent` stops at the first call of `key` whose result is known and
/// differs from a later known one (the result changed: progress). Calls without a known
/// result (no `result_digest`, or no outcome yet) never break it, so a recorder that
/// gives no digests gets the plain rule.
fn same_again<'a>(
    recent: impl Iterator<Item = &'a Recent>,
    key: u64,
) -> impl Iterator<Item = &'a Recent> {
    let mut known: Option<u64> = None;
    recent.filter(move |r| r.key == key).take_while(move |r| {
        match (known, r.result) {
            (Some(k), Some(res)) if k != res => return false,
            (None, Some(res)) => known = Some(res),
            _ => {}
        }
        true
    })
}

/// What a loop is: the one rule the gate refuses by (`loop_repeated_call`) and `tally
/// loops` reports by. `Some` when `call`, made at run time `run_ms`, would be one call
/// beyond the policy's loop limits given the run's recent allowed calls. Polls are not
/// judged here: their rule is [`poll_rule`], so polling is never this kind of loop.
pub fn loop_rule(policy: &Policy, run: &RunState, call: &Call, run_ms: u64) -> Option<LoopRule> {
    loop_rule_by(policy, run, tool_key(&call.tool), call.key(), run_ms)
}

/// [`loop_rule`] for a call to the tool whose window is kept under `tool` ([`tool_key`])
/// and whose key ([`Call::key`]) is `key`.
fn loop_rule_by(
    policy: &Policy,
    run: &RunState,
    tool: u64,
    key: u64,
    run_ms: u64,
) -> Option<LoopRule> {
    let l = &policy.loops;
    let recent = &run.recent;
    // Consecutive: the tail of the history is calls of this key, none of which changed
    // its result.
    let tail = recent.iter().rev().take_while(|r| r.key == key);
    let consecutive = same_again(tail, key).count() as u64;
    if consecutive >= l.identical_consecutive {
        return Some(LoopRule::Consecutive);
    }
    let window = recent.iter().rev().take(l.identical_window as usize);
    let in_window = same_again(window, key).count() as u64;
    if in_window >= l.identical_in_window {
        return Some(LoopRule::InWindow);
    }
    let k = l.alternating as usize;
    if recent.len() >= k && k >= 2 {
        let tail: Vec<&Recent> = recent.iter().skip(recent.len() - k).collect();
        let (a, b) = (tail[k - 2].key, tail[k - 1].key);
        let alternates = a != b
            && tail
                .iter()
                .rev()
                .enumerate()
                .all(|(i, r)| r.key == if i % 2 == 0 { b } else { a });
        let stalled = tail.iter().all(|r| r.progress == run.progress);
        if alternates && stalled && key == a {
            return Some(LoopRule::Alternating);
        }
    }
    if let Some(w) = run.tools.get(&tool) {
        let open = run_ms.saturating_sub(w.start_ms) < l.tool_window_ms;
        if open && w.count >= l.tool_calls {
            return Some(LoopRule::ToolBar);
        }
    }
    None
}

/// Whether `call` retries its logical operation past its effect class's retries
/// (`retries_exhausted`): attempts of the operation since its last `ok` and since the
/// run last made progress ([`retries_used`]) reach the class's (`read` 3,
/// `idempotent_write` 2 and the second only with an idempotency key,
/// `non_idempotent_write` 1 by default). Polls are not retries.
pub fn retry_rule(policy: &Policy, run: &RunState, call: &Call) -> bool {
    retry_rule_by(policy, run, call, call.op(), call.key())
}

/// The attempts of logical operation `op` that a call of key `key` ([`Call::op`],
/// [`Call::key`]) would retry: those since its last `ok`, or none when the run made
/// progress since this call was last made (a write completed, a result or an observed
/// state changed, its own last result included). Edit, then re-run the failing test, is
/// progress; the same failing command with nothing changed in between is a retry. A
/// call no longer in the run's recent history keeps its count. The gate judges by it and
/// the state's fold counts by it, so the two never differ.
pub fn retries_used(run: &RunState, op: u64, key: u64) -> u64 {
    let progressed = run
        .recent
        .iter()
        .rev()
        .find(|r| r.key == key)
        .is_some_and(|r| r.progress != run.progress);
    if progressed {
        0
    } else {
        run.ops.get(&op).copied().unwrap_or(0)
    }
}

/// [`retry_rule`] for `call` whose operation key ([`Call::op`]) is `op` and key
/// ([`Call::key`]) is `key`.
fn retry_rule_by(policy: &Policy, run: &RunState, call: &Call, op: u64, key: u64) -> bool {
    let Some(effect) = call.effect else {
        return false;
    };
    let used = retries_used(run, op, key);
    let keyless_retry =
        effect == Effect::IdempotentWrite && used >= 1 && call.idempotency_key.is_none();
    used >= policy.retries_for(effect) || keyless_retry
}

impl Keyed {
    /// [`loop_rule`] of the call, by its key hashed once.
    pub fn loop_rule(&self, policy: &Policy, run: &RunState, run_ms: u64) -> Option<LoopRule> {
        loop_rule_by(policy, run, self.tool, self.key, run_ms)
    }

    /// [`retry_rule`] of the call, by its operation key hashed once.
    pub fn retry_rule(&self, policy: &Policy, run: &RunState) -> bool {
        retry_rule_by(policy, run, &self.call, self.op, self.key)
    }
}

/// Why the poll rule refuses a poll.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "rule", rename_all = "snake_case")]
#[non_exhaustive]
pub enum PollRule {
    /// Polls of this remote operation reached `budget.polls` (`poll_allowance_exhausted`).
    Allowance,
    /// Polls with no change of observed state reached the policy's `polls.stall_polls`
    /// (`poll_allowance_exhausted`).
    Stalled,
    /// Before the upstream's Retry-After (else the policy's interval) less the tolerance
    /// (`upstream_backoff`): wait this many ms.
    Early {
        /// How long until the poll is on time, ms.
        wait_ms: u64,
    },
}

/// The poll rule: `Some` when a poll of remote operation `remote` (a key from
/// [`RunState::poll_of`]) at run time `run_ms` would be refused.
pub fn poll_rule(policy: &Policy, run: &RunState, remote: u64, run_ms: u64) -> Option<PollRule> {
    let r = run.refs.get(&remote)?;
    if run.budget.polls.is_some_and(|limit| r.polls >= limit) {
        return Some(PollRule::Allowance);
    }
    let stall = policy.polls.stall_polls;
    if stall > 0 && r.unchanged >= stall {
        return Some(PollRule::Stalled);
    }
    let interval = r.retry_after_ms.unwrap_or(policy.polls.interval_ms);
    let tolerance = policy
        .polls
        .tolerance_ms
        .max(interval.saturating_mul(policy.polls.tolerance_percent) / 100);
    let earliest = r.last_ms.saturating_add(interval).saturating_sub(tolerance);
    (run_ms < earliest).then(|| PollRule::Early {
        wait_ms: earliest - run_ms,
    })
}

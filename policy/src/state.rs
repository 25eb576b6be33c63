//! The state the gate decides from: one [`RunState`] per run, one [`ToolState`] per
//! downstream tool (shared by every run), one [`CredentialState`] per credential.
//!
//! State is a fold of the decisions ([`crate::apply`]), the operator's pauses and resumes
//! included (they are records). It is serializable, so a backend
//! can keep it durable beside the decisions, and bounded: maps are capped, and evicting
//! an entry never returns budget (see each cap).

use std::cell::RefCell;
use std::collections::{BTreeMap, VecDeque};

use serde::{Deserialize, Serialize};
use tally_record::decision::{Budget, Scope};
use tally_record::money::Nanos;
use tally_record::{Effect, LimitKey, Reason, Status};

mod frame;
mod memo;
mod shared;

pub use frame::{decode as decode_frame, encode as encode_frame, Stored, STATE_FORMAT};

pub use shared::{
    principal_limits, Breaker, Bucket, CredentialState, PrincipalState, Probe, ToolState,
};

/// Attempt numbers as sorted, disjoint, non-adjacent inclusive ranges: attempts are
/// numbered in order, so this stays a handful of ranges however long the run.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ranges(Vec<(u64, u64)>);

impl Ranges {
    /// Whether `x` is in the set.
    pub fn contains(&self, x: u64) -> bool {
        let i = self.0.partition_point(|r| r.1 < x);
        i < self.0.len() && self.0[i].0 <= x
    }

    /// Add `x`.
    pub fn insert(&mut self, x: u64) {
        if self.contains(x) {
            return;
        }
        let i = self.0.partition_point(|r| r.1 < x);
        let joins_prev = i > 0 && self.0[i - 1].1 + 1 == x;
        let joins_next = i < self.0.len() && x.checked_add(1) == Some(self.0[i].0);
        match (joins_prev, joins_next) {
            (true, true) => {
                self.0[i - 1].1 = self.0[i].1;
                self.0.remove(i);
            }
            (true, false) => self.0[i - 1].1 = x,
            (false, true) => self.0[i].0 = x,
            (false, false) => self.0.insert(i, (x, x)),
        }
    }
}

/// Most attempts a run keeps open (allowed, no final outcome). Beyond it the oldest open
/// attempt is forgotten: its held nanodollars stay counted as held (it may have been charged),
/// and its later outcome is counted without being matched. The gate never gets there
/// (a run holds at most [`MAX_IN_FLIGHT_PER_RUN`] open calls); a raw ledger with
/// thousands of calls and no outcomes does, and stays bounded.
pub const MAX_OPEN: usize = 4096;
/// Most calls of one run without a final outcome (`ok`, `error`, `rejected`) the gate
/// allows: the next is refused with `rate_limit_exceeded` until outcomes come in, so a
/// run's state stays bounded. `timeout` and `unknown` are not final (the call may still
/// have happened): a run that loses that many outcomes reconciles them or continues in
/// a new run.
pub const MAX_IN_FLIGHT_PER_RUN: usize = 256;
/// Most logical operations whose retry count a run keeps; beyond it the one retried
/// longest ago is forgotten (the run's attempt budget still counts every attempt).
pub const MAX_OPS: usize = 256;
/// Most remote operations a run remembers for its poll rules; beyond it the one polled
/// longest ago is forgotten (a later read of it is then an ordinary call, which uses an
/// attempt: forgetting never gives polls back).
pub const MAX_REFS: usize = 256;
/// Most tools a run keeps a per-tool window for; beyond it the oldest window goes.
pub const MAX_TOOL_WINDOWS: usize = 64;
/// Most denied calls a run remembers; beyond it the oldest denial is forgotten (that
/// call is then decided as any other, and may ask again).
pub const MAX_DENIED: usize = 64;

/// An allowed attempt awaiting its final outcome.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attempt {
    /// The tool called.
    pub tool: Option<String>,
    /// The logical operation (see [`op_key`]).
    pub op: u64,
    /// Its effect class.
    pub effect: Option<Effect>,
    /// Nanodollars reserved.
    pub reserved: u64,
    /// Nanodollars still held (reserved, not settled or released).
    pub held: u64,
    /// Whether it used an attempt (exempt tools and polls do not).
    pub counted: bool,
    /// Whether it used a side effect.
    pub write: bool,
    /// The remote operation it polls, if it is a poll.
    pub poll: Option<u64>,
    /// Whether an outcome has settled it.
    pub settled: bool,
    /// The latest outcome status reported for it.
    pub status: Option<Status>,
    /// The remote operation its outcome registered (each call registers at most one).
    pub registered: Option<u64>,
}

/// A remote operation the run has seen, whose status reads are polls.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteRef {
    /// Polls allowed so far.
    pub polls: u64,
    /// Polls allowed since its observed state last changed (the stall rule's count).
    pub unchanged: u64,
    /// Run time of its last poll or outcome, ms.
    pub last_ms: u64,
    /// The upstream's Retry-After on its last outcome, ms.
    pub retry_after_ms: Option<u64>,
    /// Its last observed state, hashed ([`observed_key`]).
    pub observed: Option<u64>,
}

/// One of the run's recent allowed calls, for the loop breakers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Recent {
    /// Tool and argument digest (else operation), hashed ([`call_key`]): the history
    /// stays a few bytes per call however long agent-chosen names are.
    pub key: u64,
    /// Its attempt number (its outcome's `result_digest` is kept here).
    pub attempt: u64,
    /// The run's progress counter when it was made.
    pub progress: u64,
    /// Its result, hashed ([`result_key`]), once an outcome reported a `result_digest`:
    /// identical calls whose results differ are progress, not a loop.
    pub result: Option<u64>,
}

/// A per-tool call window.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Window {
    /// Run time the window opened, ms.
    pub start_ms: u64,
    /// Calls in it.
    pub count: u64,
}

/// A human's approval, recorded in an override.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    /// The approval digest.
    pub digest: String,
    /// Who approved.
    pub approver: String,
    /// What was approved.
    #[serde(with = "scope_fields")]
    pub scope: Scope,
    /// Run time after which it is void, ms.
    pub expires_ms: u64,
    /// Whether a call used it (each approval is used once).
    pub used: bool,
}

/// A continuation grant recorded on a run: an approver's yes to a new run continuing
/// it, with a fresh allocation (an `override` whose scope names `new_run`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Continuation {
    /// The new run the grant is for.
    pub new_run: String,
    /// The approval digest.
    pub digest: String,
    /// Who approved.
    pub approver: String,
}

/// A call an approver denied on this run (an `override` with reason
/// `denied_by_approver`): the same tool, operation and argument digest is refused.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Denied {
    /// The denied call's tool.
    pub tool: String,
    /// Its logical operation.
    pub operation: Option<String>,
    /// The digest of its arguments.
    pub args_digest: Option<String>,
    /// The request the denial answered.
    pub request: String,
    /// Who denied it.
    pub approver: String,
    /// Why (at most `approval::MAX_DENIAL_NOTE` bytes).
    pub note: String,
}

impl Denied {
    /// Whether this is the denial of exactly the call `tool` `operation` with
    /// arguments `args_digest`.
    pub fn covers(&self, tool: &str, operation: Option<&str>, args_digest: Option<&str>) -> bool {
        self.tool == tool
            && self.operation.as_deref() == operation
            && self.args_digest.as_deref() == args_digest
    }
}

/// A run's state.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunState {
    /// The run's name.
    pub run: String,
    /// Whether its start was seen.
    pub started: bool,
    /// Its goal.
    pub goal: Option<String>,
    /// Its parent run.
    pub parent: Option<String>,
    /// The stopped run it continues.
    pub continues: Option<String>,
    /// The credential it runs under.
    pub credential: Option<String>,
    /// The uid that started it (only it may act on the run).
    pub owner_uid: Option<u32>,
    /// The budget granted at start, its spend in nanodollars (`spend_nanos`; never
    /// `spend_cents`: [`RunState`] keeps money in one unit).
    #[serde(with = "budget_fields")]
    pub budget: Budget,
    /// Wall time of run time 0, ms.
    pub start_wall_ms: u64,
    /// The latest run time seen, ms.
    pub last_ms: u64,
    /// Why it stopped (the first stop wins).
    pub stop: Option<Reason>,
    /// Paused by the operator (its last `pause` record has no `resume` after it).
    pub paused: bool,
    /// The highest attempt number allowed.
    pub last_attempt: u64,
    /// Attempts used (docs/GATE.md, how a budget is counted).
    pub attempts_used: u64,
    /// Attempt slots given back (refunds, and `rejected` outcomes).
    pub attempts_refunded: u64,
    /// Side effects used.
    pub side_effects_used: u64,
    /// Nanodollars settled.
    pub settled_nanos: u64,
    /// Nanodollars held by allowed, unsettled attempts.
    pub held_nanos: u64,
    /// Some attempt settled above its reservation, and no human has granted spend
    /// since: no further call is allowed.
    pub overrun: bool,
    /// Nanodollars settled above their attempts' reservations, in all (the upstream billed
    /// more than was reserved: a fact the reports show, not an inconsistency).
    pub overrun_nanos: u64,
    /// Started by the gate (its start record names the policy it was granted under):
    /// the gate numbers its attempts one by one, so a gap is attempts it issued that no
    /// record given shows.
    pub governed: bool,
    /// The highest attempt number forgotten from `open` (beyond [`MAX_OPEN`]); an
    /// outcome for an attempt at or below it that is not open is counted, not judged.
    pub forgotten_to: u64,
    /// Attempts (and side effects) granted by approvals used so far.
    pub extra_attempts: u64,
    /// Nanodollars granted by approvals used so far.
    pub extra_nanos: u64,
    /// Tools unblocked by approvals.
    pub unblocked: Vec<String>,
    /// Attempts carved out for child runs.
    pub delegated_attempts: u64,
    /// Nanodollars carved out for child runs.
    pub delegated_nanos: u64,
    /// Side effects carved out for child runs.
    pub delegated_side_effects: u64,
    /// Every attempt number allowed.
    pub allowed: Ranges,
    /// Every attempt number refunded.
    pub refunded: Ranges,
    /// Allowed attempts without a final outcome.
    pub open: BTreeMap<u64, Attempt>,
    /// Attempts per logical operation since its last `ok`.
    pub ops: BTreeMap<u64, u64>,
    /// Non-idempotent writes whose outcome is unknown: logical operation -> attempt.
    pub unknown: BTreeMap<u64, u64>,
    /// Remote operations seen.
    pub refs: BTreeMap<u64, RemoteRef>,
    /// Recent allowed calls (not polls), oldest first.
    pub recent: VecDeque<Recent>,
    /// Per-tool windows.
    pub tools: BTreeMap<u64, Window>,
    /// Bumped by every change of observed state and every completed write.
    pub progress: u64,
    /// The last observed state any outcome reported, hashed ([`observed_key`]): only
    /// whether it changed matters here.
    pub observed: Option<u64>,
    /// Approvals recorded for the run.
    pub grants: Vec<Grant>,
    /// The run's own rate bucket.
    pub bucket: Bucket,
    /// Attempts the proxy made (their allow says `proxied`): only the proxy reports
    /// their outcome. The last field, so that state written before it existed (format 2)
    /// reads as format 3 with an empty set appended ([`frame`]).
    pub proxied: Ranges,
    /// Continuation grants an approver signed on this run: each names the new run,
    /// continuing this one, that its allocation was for (docs/GATE.md, "Refill chains").
    /// The last field but one: a run without one (and without a denial) is written in
    /// format 3, as before ([`frame`]).
    pub continuations: Vec<Continuation>,
    /// The calls an approver denied, oldest first, at most [`MAX_DENIED`] (the oldest
    /// goes first). The last field: a run without one is written in format 4 or 3, as
    /// before ([`frame`]).
    pub denied: Vec<Denied>,
}

/// `Budget` and `Scope` omit absent fields in JSON; state is also kept in formats that
/// need every field in order, so state writes them as plain tuples.
mod budget_fields {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use tally_record::decision::Budget;

    type Fields = (
        Option<u64>,
        Option<u64>,
        Option<u64>,
        Option<u64>,
        Option<u64>,
        Option<u64>,
    );

    pub fn serialize<S: Serializer>(b: &Budget, s: S) -> Result<S::Ok, S::Error> {
        (
            b.attempts,
            b.deadline_ms,
            b.spend().map(|n| n.0),
            b.side_effects,
            b.polls,
            b.depth,
        )
            .serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Budget, D::Error> {
        let (attempts, deadline_ms, spend_nanos, side_effects, polls, depth) =
            Fields::deserialize(d)?;
        Ok(Budget {
            attempts,
            deadline_ms,
            spend_cents: None,
            spend_nanos,
            side_effects,
            polls,
            depth,
        })
    }
}

mod scope_fields {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use tally_record::decision::Scope;

    type Fields = (Option<u64>, Option<u64>, Option<String>, Option<String>);

    pub fn serialize<S: Serializer>(sc: &Scope, s: S) -> Result<S::Ok, S::Error> {
        (
            sc.attempts,
            sc.spend().map(|n| n.0),
            &sc.tool,
            &sc.operation,
        )
            .serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Scope, D::Error> {
        let (attempts, nanos, tool, operation) = Fields::deserialize(d)?;
        Ok(Scope {
            attempts,
            cents: None,
            nanos,
            tool,
            operation,
            new_run: None,
        })
    }
}

/// A stable id of one call (run and attempt) for tool state, which must not grow with
/// the length of agent-chosen run names.
pub fn call_id(run: &str, attempt: u64) -> u64 {
    let mut h = blake3::Hasher::new();
    h.update(run.as_bytes());
    h.update(&[0]);
    h.update(&attempt.to_be_bytes());
    let mut out = [0u8; 8];
    out.copy_from_slice(&h.finalize().as_bytes()[..8]);
    u64::from_be_bytes(out)
}

/// The logical operation a call belongs to: its `operation`, else its tool and argument
/// digest, else its tool.
pub fn op_key(tool: Option<&str>, operation: Option<&str>, args_digest: Option<&str>) -> u64 {
    match (operation, args_digest) {
        (Some(op), _) => h64(&["op", op]),
        (None, Some(d)) => h64(&["call", tool.unwrap_or(""), d]),
        (None, None) => h64(&["tool", tool.unwrap_or("")]),
    }
}

/// An observed state as state keeps it: only a change of it is progress.
pub fn observed_key(observed: &str) -> u64 {
    thread_local!(static LAST: RefCell<memo::Memo> = const { RefCell::new(memo::Memo::new()) });
    memo::keyed(&LAST, observed, |o| h64(&["observed", o]))
}

/// The key a tool's per-run window is kept under.
pub fn tool_key(tool: &str) -> u64 {
    h64(&["tool", tool])
}

/// A result digest as state keeps it: only whether two results are equal matters.
pub fn result_key(result_digest: &str) -> u64 {
    h64(&["result", result_digest])
}

/// The key a remote operation (`remote_ref`) is kept under.
pub fn ref_key(remote_ref: &str) -> u64 {
    thread_local!(static LAST: RefCell<memo::Memo> = const { RefCell::new(memo::Memo::new()) });
    memo::keyed(&LAST, remote_ref, |r| h64(&["ref", r]))
}

/// The first 64 bits of BLAKE3 over the parts, each ended by a NUL: state keys stay a
/// few bytes however long agent-chosen names are (a collision is a 2^-64 event, and
/// would only merge two counters of one run).
fn h64(parts: &[&str]) -> u64 {
    // Short names (nearly all) are laid out in one buffer and hashed in one call: the
    // same bytes, so the same hash, without a streaming hasher's work per part.
    let mut buf = [0u8; SHORT];
    let mut len = 0;
    for p in parts {
        let Some(part) = buf.get_mut(len..len + p.len() + 1) else {
            return h64_streamed(parts);
        };
        part[..p.len()].copy_from_slice(p.as_bytes());
        len += p.len() + 1;
    }
    first_64(&blake3::hash(&buf[..len]))
}

/// Longest concatenation of parts [`h64`] hashes from one buffer.
const SHORT: usize = 192;

/// [`h64`] by the streaming hasher, for parts of any length.
fn h64_streamed(parts: &[&str]) -> u64 {
    let mut h = blake3::Hasher::new();
    for p in parts {
        h.update(p.as_bytes());
        h.update(&[0]);
    }
    first_64(&h.finalize())
}

/// The first 64 bits of a hash, big-endian.
fn first_64(hash: &blake3::Hash) -> u64 {
    let mut out = [0u8; 8];
    out.copy_from_slice(&hash.as_bytes()[..8]);
    u64::from_be_bytes(out)
}

/// The key identical calls share: tool and argument digest (else operation), as the
/// first 64 bits of their BLAKE3 hash.
pub fn call_key(tool: Option<&str>, operation: Option<&str>, args_digest: Option<&str>) -> u64 {
    let (tool, named) = (tool.unwrap_or(""), args_digest.or(operation).unwrap_or(""));
    // As `h64`: one buffer for short names (tool, NUL, name: no NUL after the name).
    let mut buf = [0u8; SHORT];
    let len = tool.len() + 1 + named.len();
    match buf.get_mut(..len) {
        Some(b) => {
            b[..tool.len()].copy_from_slice(tool.as_bytes());
            b[tool.len() + 1..].copy_from_slice(named.as_bytes());
            first_64(&blake3::hash(b))
        }
        None => {
            let mut h = blake3::Hasher::new();
            h.update(tool.as_bytes());
            h.update(&[0]);
            h.update(named.as_bytes());
            first_64(&h.finalize())
        }
    }
}

impl RunState {
    /// A run the gate has not seen start.
    pub fn new(run: &str) -> RunState {
        RunState {
            run: run.to_owned(),
            ..RunState::default()
        }
    }

    /// The denial of exactly the call `tool` `operation` with arguments `args_digest`, the
    /// latest if there are several.
    pub fn denial_of(
        &self,
        tool: &str,
        operation: Option<&str>,
        args_digest: Option<&str>,
    ) -> Option<&Denied> {
        self.denied
            .iter()
            .rev()
            .find(|d| d.covers(tool, operation, args_digest))
    }

    /// The run's clock at `now`: the writer's `at_ms` where given, else wall time since
    /// the run's start.
    pub fn run_ms(&self, now: Now) -> u64 {
        now.at_ms
            .unwrap_or_else(|| now.wall_ms.saturating_sub(self.start_wall_ms))
    }

    /// The attempts limit in force: the budget plus approved extras, less what was
    /// carved out for children. `None` is no limit.
    pub fn attempts_limit(&self) -> Option<u64> {
        self.budget.attempts.map(|a| {
            a.saturating_add(self.extra_attempts)
                .saturating_sub(self.delegated_attempts)
        })
    }

    /// The spend limit in force, nanodollars.
    pub fn spend_limit(&self) -> Option<u64> {
        self.budget.spend().map(|Nanos(c)| {
            c.saturating_add(self.extra_nanos)
                .saturating_sub(self.delegated_nanos)
        })
    }

    /// The side-effect limit in force.
    pub fn side_effects_limit(&self) -> Option<u64> {
        self.budget.side_effects.map(|s| {
            s.saturating_add(self.extra_attempts)
                .saturating_sub(self.delegated_side_effects)
        })
    }

    /// Nanodollars committed: settled plus held.
    pub fn spent_nanos(&self) -> u64 {
        self.settled_nanos.saturating_add(self.held_nanos)
    }

    /// A run state kept when money was counted in cents (gate state format 2: the same
    /// fields, every amount in cents), its amounts read exactly as nanodollars; `None`
    /// if one does not fit.
    pub fn into_nanos(mut self) -> Option<RunState> {
        let n = |c: u64| Nanos::from_cents(c).map(|n| n.0);
        for v in [
            &mut self.settled_nanos,
            &mut self.held_nanos,
            &mut self.overrun_nanos,
            &mut self.extra_nanos,
            &mut self.delegated_nanos,
        ] {
            *v = n(*v)?;
        }
        if let Some(spend) = self.budget.spend_nanos {
            self.budget.spend_nanos = Some(n(spend)?);
        }
        for a in self.open.values_mut() {
            a.reserved = n(a.reserved)?;
            a.held = n(a.held)?;
        }
        for g in &mut self.grants {
            if let Some(extra) = g.scope.nanos {
                g.scope.nanos = Some(n(extra)?);
            }
        }
        Some(self)
    }

    /// The tool an open attempt called.
    pub fn tool_of(&self, attempt: u64) -> Option<&str> {
        self.open.get(&attempt).and_then(|a| a.tool.as_deref())
    }

    /// The remote operation a read polls, if it is a poll (docs/GATE.md, how a budget is counted): its `remote_ref`,
    /// or its operation's `:REF` suffix, names a remote operation the run has seen.
    /// Writes are never polls.
    pub fn poll_of(
        &self,
        effect: Option<Effect>,
        remote_ref: Option<&str>,
        operation: Option<&str>,
    ) -> Option<u64> {
        if effect != Some(Effect::Read) {
            return None;
        }
        self.poll_by(
            remote_ref.map(ref_key),
            operation
                .and_then(|o| o.rsplit_once(':'))
                .map(|(_, t)| ref_key(t)),
        )
    }

    /// [`RunState::poll_of`] for a read whose `remote_ref` and operation's `:REF` suffix
    /// are already hashed ([`ref_key`]).
    pub(crate) fn poll_by(&self, by_ref: Option<u64>, by_tail: Option<u64>) -> Option<u64> {
        // Any tool may read it (a status endpoint is often another tool than the one that
        // started the job); each call that used an attempt registers at most one.
        let known = |r: &u64| self.refs.contains_key(r);
        by_ref.filter(known).or(by_tail.filter(known))
    }

    /// What the run knows of a remote operation, by its id.
    pub fn remote(&self, remote_ref: &str) -> Option<&RemoteRef> {
        self.refs.get(&ref_key(remote_ref))
    }
}

/// The time of a decision, passed in: the core reads no clock.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Now {
    /// Wall time, ms since the Unix epoch (breakers, buckets).
    pub wall_ms: u64,
    /// The run's own clock, ms since its start, where the record gives it.
    pub at_ms: Option<u64>,
}

/// The limits snapshot of a run as it stands (every decision's `limits` starts from it,
/// and `GET /v1/runs/{run}` shows it).
pub fn standing(
    run: &RunState,
    now: Now,
) -> std::collections::BTreeMap<LimitKey, tally_record::decision::Limit> {
    let mut out = std::collections::BTreeMap::new();
    let mut put = |name: LimitKey, used: u64, limit: Option<u64>| {
        if let Some(limit) = limit {
            out.insert(name, tally_record::decision::Limit { used, limit });
        }
    };
    put(LimitKey::Attempts, run.attempts_used, run.attempts_limit());
    put(LimitKey::SpendNanos, run.spent_nanos(), run.spend_limit());
    put(
        LimitKey::SideEffects,
        run.side_effects_used,
        run.side_effects_limit(),
    );
    put(
        LimitKey::DeadlineMs,
        run.run_ms(now),
        run.budget.deadline_ms,
    );
    out
}

#[cfg(test)]
mod key_tests {
    use super::*;

    /// The keys as the streaming hasher gave them before the one-buffer path.
    fn streamed(parts: &[&[u8]]) -> u64 {
        let mut h = blake3::Hasher::new();
        for p in parts {
            h.update(p);
        }
        first_64(&h.finalize())
    }

    #[test]
    fn keys_are_the_streamed_hashes_at_every_length() {
        // Around the one-buffer bound and far beyond it.
        for n in [
            0, 1, 7, 60, 63, 64, 65, 180, 185, 186, 187, 188, 190, 191, 192, 193, 400, 3000,
        ] {
            let name = "x".repeat(n);
            assert_eq!(
                tool_key(&name),
                streamed(&[b"tool\0", name.as_bytes(), b"\0"]),
                "{n}"
            );
            assert_eq!(
                ref_key(&name),
                streamed(&[b"ref\0", name.as_bytes(), b"\0"]),
                "{n}"
            );
            assert_eq!(
                op_key(Some("t"), None, Some(&name)),
                streamed(&[b"call\0t\0", name.as_bytes(), b"\0"]),
                "{n}"
            );
            assert_eq!(
                call_key(Some(&name), Some("op"), None),
                streamed(&[name.as_bytes(), b"\0op"]),
                "{n}"
            );
            assert_eq!(
                call_key(Some("http.get"), None, Some(&name)),
                streamed(&[b"http.get\0", name.as_bytes()]),
                "{n}"
            );
            assert_eq!(h64_streamed(&["tool", &name]), tool_key(&name), "{n}");
        }
        // No names at all.
        assert_eq!(call_key(None, None, None), streamed(&[b"\0"]));
    }

    #[test]
    fn remembered_keys_are_the_names_hashes() {
        // Repeated, alternating, a prefix of the last, empty, at and beyond the longest
        // name remembered: each key is its own name's hash.
        let long = "r".repeat(65);
        let names = [
            "running",
            "running",
            "done",
            "running",
            "run",
            "",
            "",
            "r",
            &long,
            &long,
            "running",
            &long[..64],
            &long[..64],
            &long[..63],
        ];
        for name in names {
            let observed = streamed(&[b"observed\0", name.as_bytes(), b"\0"]);
            assert_eq!(observed_key(name), observed, "{name:?}");
            let remote = streamed(&[b"ref\0", name.as_bytes(), b"\0"]);
            assert_eq!(ref_key(name), remote, "{name:?}");
            // The two memos are apart: asking one does not answer for the other.
            assert_ne!(observed_key(name), ref_key(name), "{name:?}");
        }
    }
}

//! One intended call ([`Call`]) and the state a decision about it reads ([`View`]), with
//! the rules about a call that `decide`, `judge` and `apply` share: whether it uses an
//! attempt, whether a grant covers it, and what a grant in force changes.

use serde::{Deserialize, Serialize};
use tally_record::decision::Channel;
use tally_record::{Decision, Effect, Kind, Reason};

use crate::config::{matches, Policy};
use crate::start::Family;
use crate::state::{
    call_key, op_key, ref_key, tool_key, CredentialState, Grant, PrincipalState, RunState,
    ToolState,
};

/// The reasons the proxy refuses a request with before any budget rule
/// ([`Call::refused`]).
pub const PROXY_REFUSALS: &[Reason] = &[Reason::RequestRefused, Reason::ScopeViolation];

/// One intended call, as the agent asked for it (its arguments already digested).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Call {
    /// The run.
    pub run: String,
    /// The worker asking.
    pub worker: Option<String>,
    /// The tool.
    pub tool: String,
    /// The logical operation.
    pub operation: Option<String>,
    /// BLAKE3 of the canonical JSON of the arguments.
    pub args_digest: Option<String>,
    /// A bounded preview of the arguments.
    pub args_preview: Option<String>,
    /// Effect class (the gate requires one).
    pub effect: Option<Effect>,
    /// The caller's idempotency key.
    pub idempotency_key: Option<String>,
    /// Destination host.
    pub target: Option<String>,
    /// How the call travels.
    pub channel: Option<Channel>,
    /// Agent chain depth.
    pub depth: Option<u64>,
    /// Nanodollars the caller asks to reserve (the decision reserves at least the
    /// policy's price for the tool, [`crate::Policy::reservation`]).
    pub reserve_nanos: u64,
    /// The remote operation it reads, for a poll.
    pub remote_ref: Option<String>,
    /// The credential it is made under.
    pub credential: Option<String>,
    /// The call's own time limit, ms.
    pub timeout_ms: Option<u64>,
    /// The asking process's uid.
    pub uid: Option<u32>,
    /// Whether tally's proxy makes the call (and so observes its outcome).
    pub proxied: bool,
    /// The proxy refused the request as sent, before any budget rule, with this reason
    /// (`request_refused`, or `scope_violation` for a method, path, upstream or model
    /// outside the policy): the decision is that refusal, whatever the state. Only the
    /// proxy sets it (the gate ignores it for any other caller); replay reads it back
    /// from a proxied `deny` ([`Call::from_record`]).
    #[serde(default)]
    pub refused: Option<Reason>,
}

impl Call {
    /// The call an allow or deny record describes (for replay).
    pub fn from_record(d: &Decision) -> Call {
        Call {
            run: d.run.clone(),
            worker: d.worker.clone(),
            tool: d.tool.clone().unwrap_or_default(),
            operation: d.operation.clone(),
            args_digest: d.args_digest.clone(),
            args_preview: d.args_preview.clone(),
            effect: d.effect,
            idempotency_key: d.idempotency_key.clone(),
            target: d.target.clone(),
            channel: d.channel,
            depth: d.depth,
            reserve_nanos: d.reserve().map_or(0, |n| n.0),
            remote_ref: d.remote_ref.clone(),
            credential: d.credential.clone(),
            timeout_ms: d.timeout_ms,
            uid: d.uid,
            proxied: d.proxied == Some(true),
            refused: d.reason.filter(|r| {
                d.kind == Some(Kind::Deny) && d.proxied == Some(true) && PROXY_REFUSALS.contains(r)
            }),
        }
    }

    /// The key identical calls share (tool and argument digest, else operation).
    pub fn key(&self) -> u64 {
        call_key(
            Some(&self.tool),
            self.operation.as_deref(),
            self.args_digest.as_deref(),
        )
    }

    /// The logical operation it belongs to (its retries are counted per operation).
    pub fn op(&self) -> u64 {
        op_key(
            Some(&self.tool),
            self.operation.as_deref(),
            self.args_digest.as_deref(),
        )
    }

    pub(crate) fn is_write(&self) -> bool {
        matches!(
            self.effect,
            Some(Effect::IdempotentWrite | Effect::NonIdempotentWrite)
        )
    }
}

/// A recorded call with the keys the rules read, hashed once: the judgement, the fold
/// and the reports of one record share them instead of hashing the same names again.
#[derive(Clone, Debug)]
pub struct Keyed {
    /// The call.
    pub call: Call,
    /// [`Call::key`].
    pub key: u64,
    /// [`Call::op`].
    pub op: u64,
    /// [`tool_key`] of its tool: the key of its per-run tool window.
    pub tool: u64,
    /// [`ref_key`] of its `remote_ref` and of its operation's `:REF` suffix.
    refs: (Option<u64>, Option<u64>),
}

impl Keyed {
    /// The call an allow or deny record describes, with its keys.
    pub fn from_record(d: &Decision) -> Keyed {
        Keyed::of(Call::from_record(d))
    }

    /// `call` with its keys.
    pub fn of(call: Call) -> Keyed {
        // Only a read can be a poll (`poll`): a write's references are never looked up.
        let refs = if call.effect == Some(Effect::Read) {
            (
                call.remote_ref.as_deref().map(ref_key),
                call.operation
                    .as_deref()
                    .and_then(|o| o.rsplit_once(':'))
                    .map(|(_, t)| ref_key(t)),
            )
        } else {
            (None, None)
        };
        Keyed {
            key: call.key(),
            op: call.op(),
            tool: tool_key(&call.tool),
            refs,
            call,
        }
    }

    /// The remote operation it polls in `run`, if it is a poll ([`RunState::poll_of`]).
    pub fn poll(&self, run: &RunState) -> Option<u64> {
        if self.call.effect != Some(Effect::Read) {
            return None;
        }
        run.poll_by(self.refs.0, self.refs.1)
    }
}

/// The state a decision reads: the run's, and (where the call has them) its tool's and
/// its credential's; for a start, the runs it names.
#[derive(Clone, Copy, Debug)]
pub struct View<'a> {
    /// The run.
    pub run: &'a RunState,
    /// The downstream tool.
    pub tool: Option<&'a ToolState>,
    /// The credential.
    pub credential: Option<&'a CredentialState>,
    /// The principal: the run's owner uid's budget across its runs (for a start, the
    /// starting uid's), where the policy gives it one.
    pub principal: Option<&'a PrincipalState>,
    /// For a start: its parent, the run it continues, the uid's open runs.
    pub family: Family<'a>,
}

impl<'a> View<'a> {
    /// The run's own state alone.
    pub fn of(run: &'a RunState) -> View<'a> {
        View {
            run,
            tool: None,
            credential: None,
            principal: None,
            family: Family::default(),
        }
    }
}

/// Whether `call` uses an attempt: exempt tools and polls do not.
pub(crate) fn counts(policy: &Policy, call_tool: &str, poll: bool) -> bool {
    !poll && !policy.scope.exempt.iter().any(|p| matches(p, call_tool))
}

/// Whether a grant is for this call: its tool and operation, where it names them.
pub(crate) fn grant_fits(g: &Grant, call: &Call) -> bool {
    let s = &g.scope;
    let tool_ok = s.tool.as_ref().is_none_or(|t| t == &call.tool);
    let op_ok = s
        .operation
        .as_ref()
        .is_none_or(|o| call.operation.as_ref() == Some(o));
    tool_ok && op_ok
}

/// Whether a grant is still valid at run time `run_ms`.
pub(crate) fn grant_live(g: &Grant, run_ms: u64) -> bool {
    run_ms < g.expires_ms
}

/// Put a grant in force for `call`: extra attempts (and side effects), extra spend, the
/// tool unblocked, an unknown write the human reconciled; the grant is used up.
pub(crate) fn use_grant(run: &mut RunState, grant: &Grant, call: &Call) {
    use_grant_op(run, grant, call.op());
}

/// [`use_grant`] for a call whose operation key ([`Call::op`]) is `op`.
pub(crate) fn use_grant_op(run: &mut RunState, grant: &Grant, op: u64) {
    if let Some(g) = run.grants.iter_mut().find(|g| g.digest == grant.digest) {
        g.used = true;
    }
    let s = &grant.scope;
    if s.spend().is_some_and(|c| c.0 > 0) {
        // A human granted more spend: spend may go on after an overrun (a new one stops
        // it again).
        run.overrun = false;
    }
    run.extra_attempts = run.extra_attempts.saturating_add(s.attempts.unwrap_or(0));
    run.extra_nanos = run.extra_nanos.saturating_add(s.spend().map_or(0, |n| n.0));
    if let Some(t) = &s.tool {
        if !run.unblocked.contains(t) {
            run.unblocked.push(t.clone());
        }
    }
    if s.operation.is_some() || s.tool.is_some() {
        run.unknown.remove(&op);
        run.ops.remove(&op);
    }
    if s.attempts.is_some_and(|a| a > 0) {
        // More attempts for the operation too, not only for the run.
        run.ops.remove(&op);
    }
}

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
        Keyed::with_keys(call, None)
    }

    /// [`Keyed::from_record`], the keys of the call's names taken from `names` where it
    /// has them (the same keys, hashed once per name rather than once per record).
    pub fn from_record_named(d: &Decision, names: &mut NameKeys) -> Keyed {
        Keyed::with_keys(Call::from_record(d), Some(names))
    }

    /// `call` with its keys; those of its names alone (its tool, its operation, the
    /// remote operations it reads) through `names` when given.
    fn with_keys(call: Call, mut names: Option<&mut NameKeys>) -> Keyed {
        let mut named = |map: Name, name: &str, hash: fn(&str) -> u64| match names.as_mut() {
            Some(names) => names.key(map, name, hash),
            None => hash(name),
        };
        // Only a read can be a poll (`poll`): a write's references are never looked up.
        let refs = if call.effect == Some(Effect::Read) {
            (
                call.remote_ref
                    .as_deref()
                    .map(|r| named(Name::Ref, r, ref_key)),
                call.operation
                    .as_deref()
                    .and_then(|o| o.rsplit_once(':'))
                    .map(|(_, t)| named(Name::Ref, t, ref_key)),
            )
        } else {
            (None, None)
        };
        // A call's operation key is its operation's alone when it names one (`op_key`).
        let op = match call.operation.as_deref() {
            Some(o) => named(Name::Op, o, |o| op_key(None, Some(o), None)),
            None => call.op(),
        };
        Keyed {
            key: call.key(),
            op,
            tool: named(Name::Tool, &call.tool, tool_key),
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

/// Which of a call's names a key is of ([`NameKeys`]).
#[derive(Clone, Copy, Debug)]
enum Name {
    Tool,
    Op,
    Ref,
}

/// The keys of the names calls carry (tools, operations, remote operations), each
/// hashed once: a reader of many records (the verifier's fold) meets the same few names
/// on most of them. The keys are [`tool_key`], [`op_key`] and [`ref_key`]'s, unchanged.
/// Bounded: a map that reaches [`NameKeys::MAX`] names is emptied and starts again, so
/// a ledger of ever new names costs what it did without the cache, never more memory.
#[derive(Debug, Default)]
pub struct NameKeys {
    maps: [std::collections::HashMap<Box<str>, u64>; 3],
}

impl NameKeys {
    /// Names kept per kind of name.
    pub const MAX: usize = 4096;

    /// The key of `name` (a name of kind `map`), hashed by `hash` the first time.
    fn key(&mut self, map: Name, name: &str, hash: fn(&str) -> u64) -> u64 {
        let map = &mut self.maps[map as usize];
        if let Some(&k) = map.get(name) {
            return k;
        }
        if map.len() >= NameKeys::MAX {
            map.clear();
        }
        let k = hash(name);
        map.insert(name.into(), k);
        k
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

#[cfg(test)]
mod tests {
    use super::*;

    fn allow(tool: &str, operation: Option<&str>, remote_ref: Option<&str>) -> Decision {
        Decision {
            run: "r".into(),
            kind: Some(Kind::Allow),
            tool: Some(tool.into()),
            operation: operation.map(Into::into),
            args_digest: Some("ab".repeat(32)),
            remote_ref: remote_ref.map(Into::into),
            effect: Some(Effect::Read),
            ..Decision::default()
        }
    }

    fn same(a: &Keyed, b: &Keyed) {
        assert_eq!((a.key, a.op, a.tool, a.refs), (b.key, b.op, b.tool, b.refs));
        assert_eq!(a.call, b.call);
    }

    #[test]
    fn named_keys_are_the_keys_hashed_per_record() {
        let mut names = NameKeys::default();
        let records = [
            allow("http.get", Some("export.status:ea91"), Some("ea91")),
            allow("http.get", Some("export.status:ea91"), None),
            allow("http.get", None, Some("ea91")),
            allow("http.post", Some("export.start"), None),
            allow("http.get", Some("export.status:ea91"), Some("ea91")),
        ];
        // Twice over: the second time every name is known.
        for d in records.iter().chain(&records) {
            same(
                &Keyed::from_record_named(d, &mut names),
                &Keyed::from_record(d),
            );
        }
    }

    #[test]
    fn named_keys_stay_bounded_and_right_past_the_bound() {
        let mut names = NameKeys::default();
        for i in 0..NameKeys::MAX + 10 {
            let (tool, op) = (format!("t{i}"), format!("op{i}:r{i}"));
            let d = allow(&tool, Some(&op), Some(&op));
            same(
                &Keyed::from_record_named(&d, &mut names),
                &Keyed::from_record(&d),
            );
            assert!(names.maps.iter().all(|m| m.len() <= NameKeys::MAX));
        }
        let d = allow("t1", Some("op1:r1"), None);
        same(
            &Keyed::from_record_named(&d, &mut names),
            &Keyed::from_record(&d),
        );
    }
}

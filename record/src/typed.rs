//! The typed record: one variant per [`Kind`], each holding exactly the fields its kind
//! may carry (`kinds`). [`Decision::typed`] is the validation: a decision that has a
//! typed form is valid (docs/FORMAT.md), and one that does not is refused with the field
//! that is wrong. The JSON is the flat [`Decision`]'s, unchanged; the typed form borrows
//! from it, and [`Decision::from`] gives the flat form back.
//!
//! The checks run in steps: the kind and the run, each text within its bound, only
//! fields the kind carries (`fields`), then the kind's own constructor (required
//! fields, amounts in one unit, digests, the rules between its fields; `build`).

mod back;
mod build;
mod fields;
mod kinds;
#[cfg(test)]
mod oracle;
#[cfg(test)]
mod tests;

use crate::codes::Kind;
use crate::decision::{Decision, MAX_POLICY_BYTES, MAX_PREVIEW_BYTES, MAX_TEXT_BYTES};
use crate::error::DecisionError;

pub use kinds::{
    Allow, Amount, Call, Deny, Head, Lease, Mark, Observer, Outcome, Override, Policy, Refund,
    Start, Stop,
};

/// A valid decision, by kind: what each kind may carry and nothing else.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Record<'a> {
    /// A run begins.
    Start(Start<'a>),
    /// The gate allowed a call.
    Allow(Allow<'a>),
    /// The gate refused a call.
    Deny(Deny<'a>),
    /// What happened to an allowed call.
    Outcome(Outcome<'a>),
    /// Attempt slots or a reservation given back.
    Refund(Refund<'a>),
    /// A human approved going beyond the budget.
    Override(Override<'a>),
    /// The run ended.
    Stop(Stop<'a>),
    /// The policy in force from here on.
    Policy(Policy<'a>),
    /// The operator paused the run.
    Pause(Mark<'a>),
    /// The operator resumed the run.
    Resume(Mark<'a>),
    /// An event of a leased budget slice.
    Lease(Lease<'a>),
}

impl Record<'_> {
    /// The record's kind.
    pub fn kind(&self) -> Kind {
        match self {
            Record::Start(_) => Kind::Start,
            Record::Allow(_) => Kind::Allow,
            Record::Deny(_) => Kind::Deny,
            Record::Outcome(_) => Kind::Outcome,
            Record::Refund(_) => Kind::Refund,
            Record::Override(_) => Kind::Override,
            Record::Stop(_) => Kind::Stop,
            Record::Policy(_) => Kind::Policy,
            Record::Pause(_) => Kind::Pause,
            Record::Resume(_) => Kind::Resume,
            Record::Lease(_) => Kind::Lease,
        }
    }
}

impl Decision {
    /// The decision as its kind's typed record, or the first thing that makes it invalid
    /// (docs/FORMAT.md): required fields per kind, fields only on the kinds they belong
    /// to, bounded text, amounts in one unit, well-formed digests.
    pub fn typed(&self) -> Result<Record<'_>, DecisionError> {
        self.typed_bounded(true)
    }

    /// [`Decision::typed`], the bounds on texts checked only if `bounded` (a caller that
    /// knows no text exceeds the shortest bound skips them: they cannot fail).
    fn typed_bounded(&self, bounded: bool) -> Result<Record<'_>, DecisionError> {
        let kind = self.kind.ok_or(DecisionError::Missing { field: "kind" })?;
        run(self, kind)?;
        if bounded {
            bounds(self)?;
        }
        fields::only(self, kind)?;
        Ok(match kind {
            Kind::Start => Record::Start(build::start(self)?),
            Kind::Allow => Record::Allow(build::allow(self)?),
            Kind::Deny => Record::Deny(build::deny(self)?),
            Kind::Outcome => Record::Outcome(build::outcome(self)?),
            Kind::Refund => Record::Refund(build::refund(self)?),
            Kind::Override => Record::Override(build::grant(self)?),
            Kind::Stop => Record::Stop(build::stop(self)?),
            Kind::Policy => Record::Policy(build::policy(self)?),
            Kind::Pause => Record::Pause(build::mark(self)?),
            Kind::Resume => Record::Resume(build::mark(self)?),
            Kind::Lease => Record::Lease(build::lease(self)?),
        })
    }

    /// Check the decision against docs/FORMAT.md: whether it has a typed form
    /// ([`Decision::typed`]).
    pub fn validate(&self) -> Result<(), DecisionError> {
        self.typed().map(drop)
    }

    /// [`Decision::validate`] for a decision read by the canonical reader, whose longest
    /// text is `longest` bytes: when that is within the shortest bound on a text
    /// (`args_preview`'s), no bound can be exceeded and they are not checked again. The
    /// same result as `validate` either way.
    pub(crate) fn validate_read(&self, longest: usize) -> Result<(), DecisionError> {
        self.typed_bounded(longest > SHORTEST_BOUND).map(drop)
    }
}

/// The shortest bound [`bounds`] puts on a text.
const SHORTEST_BOUND: usize = {
    let b = if MAX_PREVIEW_BYTES < MAX_TEXT_BYTES {
        MAX_PREVIEW_BYTES
    } else {
        MAX_TEXT_BYTES
    };
    if b < MAX_POLICY_BYTES {
        b
    } else {
        MAX_POLICY_BYTES
    }
};

/// A policy or lease record belongs to no run; every other record to one.
fn run(d: &Decision, kind: Kind) -> Result<(), DecisionError> {
    if let Some(why) = runless(kind) {
        if !d.run.is_empty() {
            return Err(DecisionError::Invalid { field: "run", why });
        }
    } else if d.run.is_empty() {
        return Err(DecisionError::Missing { field: "run" });
    }
    Ok(())
}

/// Why a record of `kind` belongs to no run, for the kinds that do not.
pub(crate) fn runless(kind: Kind) -> Option<&'static str> {
    match kind {
        Kind::Policy => Some("a policy record belongs to no run: leave `run` empty"),
        Kind::Lease => {
            Some("a lease record belongs to no run (its slice names its scope): leave `run` empty")
        }
        _ => None,
    }
}

/// Every text within the bound the ledger stores, whatever the kind.
fn bounds(d: &Decision) -> Result<(), DecisionError> {
    let scope = d.scope.as_ref();
    let texts: [(&'static str, Option<&str>); 18] = [
        ("run", Some(d.run.as_str())),
        ("worker", d.worker.as_deref()),
        ("goal", d.goal.as_deref()),
        ("tool", d.tool.as_deref()),
        ("operation", d.operation.as_deref()),
        ("idempotency_key", d.idempotency_key.as_deref()),
        ("target", d.target.as_deref()),
        ("parent", d.parent.as_deref()),
        ("remote_ref", d.remote_ref.as_deref()),
        ("observed", d.observed.as_deref()),
        ("approver", d.approver.as_deref()),
        ("note", d.note.as_deref()),
        ("scope.tool", scope.and_then(|s| s.tool.as_deref())),
        (
            "scope.operation",
            scope.and_then(|s| s.operation.as_deref()),
        ),
        ("scope.new_run", scope.and_then(|s| s.new_run.as_deref())),
        ("digest", d.digest.as_deref()),
        ("credential", d.credential.as_deref()),
        ("continues", d.continues.as_deref()),
    ];
    let bounded = texts
        .into_iter()
        .map(|(field, text)| (field, text, MAX_TEXT_BYTES))
        .chain([
            ("policy_text", d.policy_text.as_deref(), MAX_POLICY_BYTES),
            ("args_preview", d.args_preview.as_deref(), MAX_PREVIEW_BYTES),
        ]);
    for (field, text, max) in bounded {
        if let Some(len) = text.map(str::len).filter(|&len| len > max) {
            return Err(DecisionError::TooLong { field, len, max });
        }
    }
    Ok(())
}

//! Replay (SECURITY.md 5.8): every `allow` and `deny` the gate recorded is decided again, offline,
//! by the same policy core (`tally_policy::decide`) under the policy the ledger says was
//! in force, on the state the ledger's own earlier decisions give (`tally_policy::apply`).
//! Each decision the policy would not have made is reported with its seq.
//!
//! What replay cannot re-derive from the ledger alone it does not judge: refusals that
//! come from state outside the run's records (rate buckets, the shared breaker, an
//! unavailable gate) are taken as recorded, and replay decides with those checks off. A
//! pause is a record now; `run_paused` refusals are still taken as recorded (ledgers
//! written before hold them with no `pause` record), but an allow made while the records
//! say the run is paused is decided again like any other.
//! Runs not started through the gate (their start names no policy) are left to the
//! consistency audit.

use crate::event::Seq;

use serde::Serialize;
use tally_ledger::{Decision, Kind, Reason};
use tally_policy::{decide, Call, Now, RunState, Verdict, View};

/// Most findings listed; the rest are counted.
pub const MAX_LISTED: usize = 1000;

/// What replay found wrong with one recorded decision.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[non_exhaustive]
pub enum ReplayKind {
    /// Recorded `allow`; the policy refuses the call.
    AllowedAgainstPolicy {
        /// What the policy says.
        would: Reason,
    },
    /// Recorded a refusal; the policy allows the call.
    RefusedAgainstPolicy {
        /// The recorded reason.
        recorded: Reason,
    },
    /// Both refuse, for different reasons.
    ReasonDiffers {
        /// The recorded reason.
        recorded: Reason,
        /// What the policy says.
        would: Reason,
    },
    /// An allow or deny in a gate-governed run that names no policy: the gate did not
    /// write it (SECURITY.md 5.7).
    NotFromGate {
        /// The record's kind.
        record: Kind,
    },
    /// A decision names a policy the ledger never recorded before it.
    UnknownPolicy {
        /// The digest named.
        digest: String,
    },
    /// A kind of record the gate never writes in a run it governs (a refund).
    GateNeverWrites {
        /// The record's kind.
        record: Kind,
    },
    /// The run's clock went backwards: the gate's never does.
    ClockBackwards {
        /// The record's run time.
        at_ms: u64,
        /// The latest run time before it.
        before_ms: u64,
    },
    /// A call's decision or outcome recorded under another uid than the run's owner.
    NotOwner {
        /// The uid recorded.
        uid: Option<u32>,
    },
    /// The allow differs from the policy's in a field (its attempt number, or a
    /// timeout past the run's deadline).
    FieldDiffers {
        /// The field.
        field: &'static str,
    },
    /// A policy record whose text is not a valid policy.
    InvalidPolicy {
        /// Why.
        why: String,
    },
}

/// One replay finding.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ReplayFinding {
    /// The record's seq.
    pub seq: Seq,
    /// Its run.
    pub run: String,
    /// What is wrong.
    #[serde(flatten)]
    pub kind: ReplayKind,
}

impl std::fmt::Display for ReplayFinding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let run = crate::text::shown(&self.run);
        match &self.kind {
            ReplayKind::AllowedAgainstPolicy { would } => write!(
                f,
                "seq {}  run {run}  allowed, but the recorded policy refuses it: {would}",
                self.seq
            ),
            ReplayKind::RefusedAgainstPolicy { recorded } => write!(
                f,
                "seq {}  run {run}  refused ({recorded}), but the recorded policy allows it",
                self.seq
            ),
            ReplayKind::ReasonDiffers { recorded, would } => write!(
                f,
                "seq {}  run {run}  refused for {recorded}, but the recorded policy refuses for {would}",
                self.seq
            ),
            ReplayKind::NotFromGate { record } => write!(
                f,
                "seq {}  run {run}  {record} names no policy in a run the gate governs: not written by the gate",
                self.seq
            ),
            ReplayKind::UnknownPolicy { digest } => write!(
                f,
                "seq {}  run {run}  decided under policy {}, which the ledger never recorded",
                self.seq,
                crate::text::shown(digest)
            ),
            ReplayKind::GateNeverWrites { record } => write!(
                f,
                "seq {}  run {run}  a {record} record in a run the gate governs: the gate never writes one",
                self.seq
            ),
            ReplayKind::ClockBackwards { at_ms, before_ms } => write!(
                f,
                "seq {}  run {run}  its time, {}, is before an earlier record's, {}: the gate's clock never goes back",
                self.seq,
                crate::text::after_start(*at_ms),
                crate::text::after_start(*before_ms)
            ),
            ReplayKind::NotOwner { uid } => write!(
                f,
                "seq {}  run {run}  recorded for uid {}, not the run's owner",
                self.seq,
                uid.map_or("none".to_owned(), |u| u.to_string())
            ),
            ReplayKind::FieldDiffers { field } => write!(
                f,
                "seq {}  run {run}  allowed with a `{field}` the recorded policy would not give",
                self.seq
            ),
            ReplayKind::InvalidPolicy { why } => {
                write!(
                    f,
                    "seq {}  policy record is not a valid policy: {}",
                    self.seq,
                    crate::text::shown(why)
                )
            }
        }
    }
}

/// What replay found.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ReplayReport {
    /// Gate decisions (allow or deny) decided again.
    pub replayed: u64,
    /// Refusals taken as recorded (their cause is outside the records).
    pub taken_as_recorded: u64,
    /// Findings, by seq (at most [`MAX_LISTED`]).
    pub findings: Vec<ReplayFinding>,
    /// Findings beyond the listed ones.
    pub omitted: u64,
}

impl ReplayReport {
    /// Add a finding (counted beyond [`MAX_LISTED`]).
    pub fn find(&mut self, seq: Seq, run: &str, kind: ReplayKind) {
        if self.findings.len() < MAX_LISTED {
            self.findings.push(ReplayFinding {
                seq,
                run: run.to_owned(),
                kind,
            });
        } else {
            self.omitted += 1;
        }
    }

    /// The report as text.
    pub fn to_text(&self) -> String {
        use crate::text::plural;
        if self.replayed == 0 && self.findings.is_empty() && self.omitted == 0 {
            return "Replay: the ledger holds no decision of the gate to decide again.\n".into();
        }
        let mut out = format!(
            "Replay: the gate's {}, decided again under the policy each names",
            plural(self.replayed, "decision", "decisions")
        );
        if self.taken_as_recorded > 0 {
            out.push_str(&format!(
                " ({} depended on what the ledger does not hold, a rate limit, an open breaker, a pause or a principal's period ending within seconds, so {} not checked)",
                plural(self.taken_as_recorded, "refusal", "refusals"),
                if self.taken_as_recorded == 1 { "it is" } else { "they are" }
            ));
        }
        out.push_str(": ");
        let n = self.findings.len() as u64 + self.omitted;
        if n == 0 {
            out.push_str("every one is what that policy decides.\n");
        } else {
            out.push_str(&format!("{n} the policy would not have made.\n"));
            for f in &self.findings {
                out.push_str(&format!("  {f}\n"));
            }
            if self.omitted > 0 {
                out.push_str(&format!("  ... and {} more\n", self.omitted));
            }
        }
        out
    }
}

/// The policy as replay applies it offline: the core's rules whose state is outside the
/// records are off (their refusals are taken as recorded).
pub use tally_policy::refusals::offline;

/// How near the end of a principal's period, ms, a decision is taken as recorded when
/// replay disagrees with it about the principal budget: replay times a run from the
/// ledger's wall time of its start, which trails the gate's clock by the time to commit
/// it.
pub const PRINCIPAL_EDGE_MS: u64 = 5_000;

/// Whether `now` is within [`PRINCIPAL_EDGE_MS`] of the end of `p`'s period (or past
/// it by less than that: replay's clock may run ahead of the gate's).
pub fn near_period_end(p: &tally_policy::PrincipalState, period_ms: u64, now: Now) -> bool {
    let end = p.period_start_ms.saturating_add(period_ms.max(1));
    now.wall_ms.abs_diff(end) <= PRINCIPAL_EDGE_MS
}

/// Whether a replay finding is about the principal budget (either side says it).
pub fn about_principal(kind: &ReplayKind) -> bool {
    let p = Reason::PrincipalBudgetExceeded;
    match kind {
        ReplayKind::AllowedAgainstPolicy { would } => *would == p,
        ReplayKind::RefusedAgainstPolicy { recorded } => *recorded == p,
        ReplayKind::ReasonDiffers { recorded, would } => *recorded == p || *would == p,
        _ => false,
    }
}

/// Whether a recorded refusal's cause is outside the records (taken as recorded): the
/// core says which of its rules read state the records do not hold.
pub fn outside_the_records(reason: Reason) -> bool {
    tally_policy::taken_as_recorded(reason)
}

/// Decide the recorded call again on the state before it; what differs, if anything.
/// `call` is the call `d` describes ([`Call::from_record`]).
#[allow(clippy::too_many_arguments)]
pub fn judge(
    policy: &tally_policy::Policy,
    digest: &str,
    run: &RunState,
    (credential, principal): (
        Option<&tally_policy::CredentialState>,
        Option<&tally_policy::PrincipalState>,
    ),
    d: &Decision,
    call: &Call,
    recorded: Option<Reason>,
    now: Now,
) -> Option<ReplayKind> {
    let view = View {
        run,
        tool: None,
        credential,
        principal,
        family: Default::default(),
    };
    let again = decide(policy, digest, view, call, now);
    let would = match again.verdict {
        Verdict::Allow => None,
        Verdict::Deny | Verdict::RequireApproval => again.reason(),
    };
    if recorded.is_none() && would.is_none() {
        if again.record.attempt != d.attempt {
            return Some(ReplayKind::FieldDiffers { field: "attempt" });
        }
        if again.record.timeout_ms != d.timeout_ms {
            return Some(ReplayKind::FieldDiffers {
                field: "timeout_ms",
            });
        }
    }
    // An approval request's context is the core's: a recorded one must be what it
    // computes (ledgers from before requests carry none).
    if d.request.is_some() && recorded == would && again.record.request != d.request {
        return Some(ReplayKind::FieldDiffers { field: "request" });
    }
    match (recorded, would) {
        (None, None) => None,
        (None, Some(would)) => Some(ReplayKind::AllowedAgainstPolicy { would }),
        (Some(recorded), None) => Some(ReplayKind::RefusedAgainstPolicy { recorded }),
        (Some(r), Some(w)) if r != w => Some(ReplayKind::ReasonDiffers {
            recorded: r,
            would: w,
        }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_principal_disagreements_near_a_period_end_are_taken_as_recorded() {
        let p = tally_policy::PrincipalState {
            period_start_ms: 1_000_000,
            ..Default::default()
        };
        let at = |wall_ms| Now {
            wall_ms,
            at_ms: None,
        };
        let end = 1_000_000 + 60_000;
        assert!(near_period_end(&p, 60_000, at(end - PRINCIPAL_EDGE_MS)));
        assert!(near_period_end(&p, 60_000, at(end + PRINCIPAL_EDGE_MS)));
        assert!(!near_period_end(
            &p,
            60_000,
            at(end - PRINCIPAL_EDGE_MS - 1)
        ));
        assert!(!near_period_end(
            &p,
            60_000,
            at(end + PRINCIPAL_EDGE_MS + 1)
        ));
        let principal = Reason::PrincipalBudgetExceeded;
        assert!(about_principal(&ReplayKind::AllowedAgainstPolicy {
            would: principal
        }));
        assert!(about_principal(&ReplayKind::RefusedAgainstPolicy {
            recorded: principal
        }));
        assert!(!about_principal(&ReplayKind::AllowedAgainstPolicy {
            would: Reason::AttemptsExhausted
        }));
        assert!(!about_principal(&ReplayKind::FieldDiffers {
            field: "attempt"
        }));
    }
}

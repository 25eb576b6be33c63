//! The approval request a `require_approval` is (docs/APPROVALS.md): its id, what
//! granting exactly the refused call would cost, and where the run stands. Computed
//! here only, with the decision; the gate records it and `tally verify`'s replay
//! computes it again.

use serde_json::json;
use tally_record::decision::{canonical_json, Request, Scope};
use tally_record::Reason;

use crate::call::Call;
use crate::config::Policy;
use crate::state::RunState;

const DOMAIN: &[u8] = b"tally request v1\n";

/// The request for `call`, refused at run time `at_ms` for `cause` (the refusal a grant
/// would lift), from the run as it stood.
pub fn request(policy: &Policy, run: &RunState, call: &Call, cause: Reason, at_ms: u64) -> Request {
    let calls = run.last_attempt;
    Request {
        id: request_id(&call.run, call, at_ms, calls),
        cause,
        cost: cost(policy, call, cause),
        calls,
        left_ms: crate::limits::deadline_left(&run.budget, at_ms),
    }
}

/// A request's id: the first 16 hex characters of BLAKE3 over `tally request v1\n` and
/// the canonical JSON of `{args_digest, at_ms, calls, operation, run, tool}` (absent
/// values as `null`). The same call refused at the same moment of the same run is the
/// same request.
pub fn request_id(run: &str, call: &Call, at_ms: u64, calls: u64) -> String {
    let value = json!({
        "args_digest": call.args_digest,
        "at_ms": at_ms,
        "calls": calls,
        "operation": call.operation,
        "run": run,
        "tool": call.tool,
    });
    let mut bytes = DOMAIN.to_vec();
    canonical_json(&value, &mut bytes);
    let mut id = blake3::hash(&bytes).to_hex().to_string();
    id.truncate(16);
    id
}

/// The scope that lets exactly this call through a refusal for `cause`: narrowed to its
/// tool and operation, with one attempt, or its reservation, or the tool or the unknown
/// write itself.
fn cost(policy: &Policy, call: &Call, cause: Reason) -> Scope {
    let mut scope = Scope {
        tool: Some(call.tool.clone()),
        operation: call.operation.clone(),
        ..Scope::default()
    };
    match cause {
        Reason::ReservationInsufficient | Reason::BudgetExceeded => {
            let reserve = policy.reservation(&call.tool, call.reserve_nanos);
            scope.nanos = Some(reserve.max(1));
        }
        // The tool or the operation named is the grant.
        Reason::ToolBlocked | Reason::OutcomeUnknownNonIdempotent => {}
        _ => scope.attempts = Some(1),
    }
    scope
}

#[cfg(test)]
mod tests {
    use super::*;

    /// docs/FORMAT.md, "Approval requests": the id vector.
    #[test]
    fn the_request_id_is_the_documented_vector() {
        let call = Call {
            run: "r1".into(),
            tool: "email.send".into(),
            operation: Some("send:42".into()),
            args_digest: Some(tally_record::decision::args_digest(
                &json!({"to": "x@example.com"}),
            )),
            ..Call::default()
        };
        let id = request_id("r1", &call, 1500, 1);
        let doc = include_str!("../../docs/FORMAT.md");
        assert!(
            doc.contains(&format!("is `{id}`")),
            "FORMAT.md lacks the id {id}"
        );
        // Any input changes it.
        assert_ne!(request_id("r1", &call, 1501, 1), id);
        assert_ne!(request_id("r1", &call, 1500, 2), id);
        assert_ne!(request_id("r2", &call, 1500, 1), id);
    }
}

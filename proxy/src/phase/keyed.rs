//! A key in place of a run token (docs/KEYS.md): the run it names for this call (the
//! task `x-tally-task` names, else the key's current run), started under the key's
//! principal if it is new, within the key's runs per day. A key that is not one is a 401
//! `invalid_token`, a revoked key a 403 `key_revoked`, at once; a start the gate refuses
//! is answered with the gate's reason. Nothing else is recorded here: the start is the
//! run's own record. Every refusal of a key call is counted by reason (the metric
//! `tally_key_refusals_total`).

use std::sync::Arc;

use hyper::header::HeaderMap;
use hyper::StatusCode;
use tally_gate::{Caller, GateError, Gatekeeper, StartRequest};
use tally_policy::KeyDayExceeded;
use tally_record::Reason;
use tally_wire::{ErrorCode, KeyDayRefused, KeyInfo};

use crate::dialect::Refusal;
use crate::key_run::{self, Asked, Done, KeyGate, KeyRunError};
use crate::key_spend::KeyRefusal;
use crate::keys::{self, KeyRefused, KeyRing};
use crate::proxy::Proxy;
use crate::refuse::{unavailable, KeyCall};

/// The header that names the task a call with a key belongs to.
pub(crate) const TASK_HEADER: &str = "x-tally-task";

/// The run a call with `key` is in, started if it is new, and the key with the time
/// the run was named at (its day is the one the call holds on).
pub(super) async fn run_of_key(
    proxy: &Proxy,
    headers: &HeaderMap,
    key: &str,
) -> Result<(String, KeyCall), Refusal> {
    let ring = proxy
        .keys
        .as_ref()
        .ok_or_else(|| Refusal::token("this tally serves no keys: use a run token"))?;
    let spend = ring.spend();
    let info = ring.check(key).map_err(|r| match r {
        KeyRefused::Revoked { id } => {
            spend.refused(KeyRefusal::KeyRevoked);
            Refusal::own(
                StatusCode::FORBIDDEN,
                ErrorCode::KeyRevoked,
                format!("key {id} was revoked by the operator: ask them for another key"),
            )
        }
        _ => {
            spend.refused(KeyRefusal::InvalidKey);
            Refusal::token("this is not a key of this tally")
        }
    })?;
    if !proxy.gate.policy().policy.principal_bounded(info.principal) {
        spend.refused(KeyRefusal::PrincipalUnbounded);
        return Err(Refusal::own(
            StatusCode::FORBIDDEN,
            ErrorCode::Refused,
            format!(
                "key {}'s principal {} has no budget in the policy ([principals] with \
                 spend or runs): the operator gives it one before the key is served",
                info.id, info.principal
            ),
        ));
    }
    let task = match headers.get(TASK_HEADER) {
        None => None,
        Some(v) => Some(v.to_str().ok().and_then(keys::task_name).ok_or_else(|| {
            spend.refused(KeyRefusal::InvalidTask);
            Refusal::own(
                StatusCode::BAD_REQUEST,
                ErrorCode::InvalidRequest,
                format!(
                    "{TASK_HEADER} must be 1 to {} letters, digits, `.`, `_` or `-`, and \
                     not `w` and digits (the key's window runs are named so)",
                    keys::MAX_TASK_BYTES
                ),
            )
        })?),
    };
    let now = ring.now_ms();
    key_run::seed(proxy, ring, &info, now)
        .await
        .map_err(|_| unavailable())?;
    let run = keys::run_of(&info, task, now);
    let goal = match task {
        Some(t) => format!("task {t} of key {}", info.id),
        None => format!("the current run of key {}", info.id),
    };
    start(proxy, ring, &info, (&run, now), goal).await?;
    Ok((
        run,
        KeyCall {
            info,
            named_ms: now,
        },
    ))
}

impl KeyGate for Proxy {
    fn ask<T: Send + 'static>(
        &self,
        f: impl FnOnce(Arc<dyn Gatekeeper>, Done<T>) + Send + 'static,
    ) -> Asked<'_, T> {
        Box::pin(self.gate(f))
    }
}

/// The refusal of a call or start that does not fit the key's day, and the reason it is
/// counted under (by the caller, once the refusal is what the client is answered: a
/// refusal the gate could not record is answered `gate_unavailable`, not counted).
pub(super) fn exceeded(id: &str, e: KeyDayExceeded) -> (Refusal, KeyRefusal) {
    let mut body = KeyDayRefused {
        id: id.to_owned(),
        budget_per_day_nanos: None,
        settled_today_nanos: None,
        held_today_nanos: None,
        needed_nanos: None,
        runs_per_day: None,
        runs_today: None,
    };
    let why = match e {
        KeyDayExceeded::Spend {
            limit_nanos,
            settled_nanos,
            held_nanos,
            needed_nanos,
        } => {
            body.budget_per_day_nanos = Some(limit_nanos);
            body.settled_today_nanos = Some(settled_nanos);
            body.held_today_nanos = Some(held_nanos);
            body.needed_nanos = Some(needed_nanos);
            KeyRefusal::BudgetExceeded
        }
        KeyDayExceeded::Runs { limit, started } => {
            body.runs_per_day = Some(limit);
            body.runs_today = Some(started);
            KeyRefusal::RunsExceeded
        }
        _ => KeyRefusal::BudgetExceeded,
    };
    let mut r = Refusal::ended(
        Reason::BudgetExceeded,
        format!("key {id}: {e}; its day ends at 00:00 UTC"),
    );
    r.key = Some(Box::new(body));
    (r, why)
}

/// Start `run` (named at `named_ms`) for the key's principal, unless it exists (then it
/// continues), within the key's runs per day of the run's day ([`key_run`]).
async fn start(
    proxy: &Proxy,
    ring: &KeyRing,
    info: &KeyInfo,
    (run, named_ms): (&str, u64),
    goal: String,
) -> Result<(), Refusal> {
    // The principal is the run's owner: its budget, open runs and ownership are the
    // uid's, as if it had started the run on the agent socket.
    let caller = Caller {
        uid: Some(info.principal),
        operator: false,
        proxied: false,
    };
    let req = StartRequest {
        run: run.to_owned(),
        goal: Some(goal),
        budget: None,
        parent: None,
        continues: None,
        depth: None,
        worker: Some("tally-proxy".to_owned()),
        credential: None,
    };
    match key_run::run_for_key(proxy, ring, info, (caller, named_ms), req).await {
        Ok(_) => Ok(()),
        Err(KeyRunError::Day(e)) => {
            let (refusal, why) = exceeded(&info.id, e);
            ring.spend().refused(why);
            Err(refusal)
        }
        Err(KeyRunError::Read(GateError::Unavailable(_)))
        | Err(KeyRunError::Start(GateError::Unavailable(_))) => Err(unavailable()),
        Err(KeyRunError::Read(e)) => Err(not_the_keys(run, &e.to_string())),
        Err(KeyRunError::Forgotten) => Err(not_the_keys(run, "it was started and then forgotten")),
        Err(KeyRunError::Start(GateError::Refused(reason))) => Err(Refusal::reason(
            reason,
            None,
            format!("the key's run `{run}` cannot start: {}", reason.as_str()),
        )),
        Err(KeyRunError::Start(GateError::TooManyRuns { max, .. })) => Err(Refusal::own(
            StatusCode::TOO_MANY_REQUESTS,
            ErrorCode::TooManyRuns,
            format!("the key's principal holds {max} open runs (the policy's max_open_runs_per_uid): stop finished ones"),
        )),
        Err(e) => Err(Refusal::own(
            StatusCode::FORBIDDEN,
            ErrorCode::Refused,
            format!("the key's run `{run}` cannot start: {e}"),
        )),
    }
}

fn not_the_keys(run: &str, why: &str) -> Refusal {
    Refusal::own(
        StatusCode::FORBIDDEN,
        ErrorCode::NotOwner,
        format!("the key's run `{run}` cannot be used: {why}"),
    )
}

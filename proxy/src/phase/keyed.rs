//! A key in place of a run token (docs/KEYS.md): the run it names for this call (the
//! task `x-tally-task` names, else the key's current run), started under the key's
//! principal if it is new. A key that is not one is a 401 `invalid_token`, a revoked
//! key a 403 `key_revoked`, at once; a start the gate refuses is answered with the
//! gate's reason. Nothing else is recorded here: the start is the run's own record.

use hyper::header::HeaderMap;
use hyper::StatusCode;
use tally_gate::{Caller, GateError, StartRequest};
use tally_wire::ErrorCode;

use crate::dialect::Refusal;
use crate::keys::{self, KeyRefused};
use crate::proxy::Proxy;
use crate::refuse::unavailable;

/// The header that names the task a call with a key belongs to.
pub(crate) const TASK_HEADER: &str = "x-tally-task";

/// The run a call with `key` is in, started if it is new.
pub(super) async fn run_of_key(
    proxy: &Proxy,
    headers: &HeaderMap,
    key: &str,
) -> Result<String, Refusal> {
    let ring = proxy
        .keys
        .as_ref()
        .ok_or_else(|| Refusal::token("this tally serves no keys: use a run token"))?;
    let info = ring.check(key).map_err(|r| match r {
        KeyRefused::Revoked { id } => Refusal::own(
            StatusCode::FORBIDDEN,
            ErrorCode::KeyRevoked,
            format!("key {id} was revoked by the operator: ask them for another key"),
        ),
        _ => Refusal::token("this is not a key of this tally"),
    })?;
    if !proxy.gate.policy().policy.principal_bounded(info.principal) {
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
    let run = keys::run_of(&info, task, ring.now_ms());
    let goal = match task {
        Some(t) => format!("task {t} of key {}", info.id),
        None => format!("the current run of key {}", info.id),
    };
    start(proxy, info.principal, &run, goal).await?;
    Ok(run)
}

/// Start `run` for the key's principal `uid`, unless it exists (then it continues).
async fn start(proxy: &Proxy, uid: u32, run: &str, goal: String) -> Result<(), Refusal> {
    // The principal is the run's owner: its budget, open runs and ownership are the
    // uid's, as if it had started the run on the agent socket.
    let caller = Caller {
        uid: Some(uid),
        operator: false,
        proxied: false,
    };
    // Most calls continue a run: a read, not a start's transaction.
    if owned(proxy, caller, run).await? {
        return Ok(());
    }
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
    let started = proxy
        .gate(move |gate, done| gate.start(caller, req, done))
        .await;
    match started {
        Ok(_) => Ok(()),
        // Started between the read and the start: by this key's other call, or by
        // someone else, whose run the key must not use. Read again, as its owner.
        Err(GateError::RunExists(_)) => match owned(proxy, caller, run).await? {
            true => Ok(()),
            false => Err(not_the_keys(run, "it was started and then forgotten")),
        },
        Err(GateError::Unavailable(_)) => Err(unavailable()),
        Err(GateError::Refused(reason)) => Err(Refusal::reason(
            reason,
            None,
            format!("the key's run `{run}` cannot start: {}", reason.as_str()),
        )),
        Err(GateError::TooManyRuns { max, .. }) => Err(Refusal::own(
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

/// Whether `run` exists and is `caller`'s (`false`: not known). A run of that name
/// another uid started is not the key's (its owner's budget would pay): refused.
async fn owned(proxy: &Proxy, caller: Caller, run: &str) -> Result<bool, Refusal> {
    let name = run.to_owned();
    match proxy
        .gate(move |gate, done| done(gate.run(caller, &name)))
        .await
    {
        Ok(_) => Ok(true),
        Err(GateError::RunNotFound(_)) => Ok(false),
        Err(GateError::Unavailable(_)) => Err(unavailable()),
        Err(e) => Err(not_the_keys(run, &e.to_string())),
    }
}

fn not_the_keys(run: &str, why: &str) -> Refusal {
    Refusal::own(
        StatusCode::FORBIDDEN,
        ErrorCode::NotOwner,
        format!("the key's run `{run}` cannot be used: {why}"),
    )
}

//! A key in place of a run token (docs/KEYS.md): the run it names for this call (the
//! task `x-tally-task` names, else the key's current run), started under the key's
//! principal if it is new, within the key's runs per day. A key that is not one is a 401
//! `invalid_token`, a revoked key a 403 `key_revoked`, at once; a start the gate refuses
//! is answered with the gate's reason. Nothing else is recorded here: the start is the
//! run's own record. Every refusal of a key call is counted by reason (the metric
//! `tally_key_refusals_total`).

use hyper::header::HeaderMap;
use hyper::StatusCode;
use tally_gate::{Caller, GateError, StartRequest};
use tally_policy::KeyDayExceeded;
use tally_record::Reason;
use tally_wire::{ErrorCode, KeyDayRefused, KeyInfo};

use crate::dialect::Refusal;
use crate::key_spend::{KeyRefusal, RunSlot};
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
    seed(proxy, ring, &info, now).await?;
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

/// The key's counts of the day read from the gate's runs of the day (open or stopped,
/// its principal's), the first time the key is used since the daemon started.
async fn seed(proxy: &Proxy, ring: &KeyRing, info: &KeyInfo, now: u64) -> Result<(), Refusal> {
    let spend = ring.spend();
    if spend.seeded(&info.id) {
        return Ok(());
    }
    let prefix = keys::runs_today(&info.id, now);
    let runs = proxy
        .gate(move |gate, done| done(gate.runs_named(&prefix)))
        .await
        .map_err(|_| unavailable())?;
    spend.seed(&info.id, keys::day_use(&runs, info.principal, now));
    Ok(())
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
/// continues), within the key's runs per day of the run's day.
async fn start(
    proxy: &Proxy,
    ring: &KeyRing,
    info: &KeyInfo,
    (run, named_ms): (&str, u64),
    goal: String,
) -> Result<(), Refusal> {
    let uid = info.principal;
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
    let spend = ring.spend();
    let slot = match spend.start_run(&info.id, &keys::day_limits(info), named_ms) {
        Ok(slot) => slot,
        // The key's last run of the day may be the one its other call of this task is
        // starting right now: read once more before refusing.
        Err(_) if owned(proxy, caller, run).await? => return Ok(()),
        Err(e) => {
            let (refusal, why) = exceeded(&info.id, e);
            spend.refused(why);
            return Err(refusal);
        }
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
    match counted_start(proxy, caller, req, slot).await {
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

/// The gate's start of a key's run, its `slot` on the key's day going with the gate's
/// answer: kept if the run started, else given back (dropped), there and once, even if
/// this call's client has gone away by then.
async fn counted_start(
    proxy: &Proxy,
    caller: Caller,
    req: StartRequest,
    slot: RunSlot,
) -> Result<tally_wire::Started, GateError> {
    proxy
        .gate(move |gate, done| {
            gate.start(
                caller,
                req,
                Box::new(move |r| {
                    // Kept or given back before the answer goes: a request the answer
                    // lets through next reads the day as it is.
                    if r.is_ok() {
                        slot.started();
                    } else {
                        drop(slot);
                    }
                    done(r)
                }),
            )
        })
        .await
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

//! A key's run, read and started one way for every front that takes keys (the model
//! proxy and the MCP gateway): its day's counts read once from the gate's runs of the
//! day ([`seed`]); the run read as the key's principal, continued if it exists and is
//! the principal's; else started within the key's runs per day, the count going with
//! the gate's answer ([`run_for_key`]). The starts of one run take their turns, so that
//! the second reads the run the first started rather than the key's day with the first's
//! start counted and not made. Each front answers the outcome in its own words.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use tally_gate::{Caller, GateError, Gatekeeper, StartRequest};
use tally_policy::KeyDayExceeded;
use tally_wire::{KeyInfo, RunState};

use crate::keys::{self, KeyRing};

/// The gate's answer, handed to a callback.
pub type Done<T> = Box<dyn FnOnce(Result<T, GateError>) + Send>;

/// The gate's answer to come.
pub type Asked<'a, T> = Pin<Box<dyn Future<Output = Result<T, GateError>> + Send + 'a>>;

/// How a front asks its gate: `f` run with the gate and a callback for its answer, on
/// the front's own stage.
pub trait KeyGate: Sync {
    /// `f`'s answer.
    fn ask<T: Send + 'static>(
        &self,
        f: impl FnOnce(Arc<dyn Gatekeeper>, Done<T>) + Send + 'static,
    ) -> Asked<'_, T>;
}

/// The key's run, as found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyRun {
    /// It exists and is the principal's: in this state.
    Continued(RunState),
    /// It was started now (it counts against the key's day).
    Started,
}

/// Why the key's run is neither continued nor started.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KeyRunError {
    /// The key's runs per day are used up (the count is not taken).
    #[error("{0}")]
    Day(KeyDayExceeded),
    /// The run could not be read as the principal's (another uid's, or the gate's
    /// error).
    #[error("{0}")]
    Read(GateError),
    /// The gate refused the start (the count given back).
    #[error("{0}")]
    Start(GateError),
    /// A run of its name exists and is not the principal's.
    #[error("it was started and then forgotten")]
    Forgotten,
}

/// The key's counts of the day read from the gate's runs of the day (open or stopped,
/// its principal's), the first time the key is used since the daemon started.
pub async fn seed(
    gate: &impl KeyGate,
    ring: &KeyRing,
    info: &KeyInfo,
    now: u64,
) -> Result<(), GateError> {
    let spend = ring.spend();
    if spend.seeded(&info.id) {
        return Ok(());
    }
    let prefix = keys::runs_today(&info.id, now);
    let runs = gate
        .ask(move |gate, done| done(gate.runs_named(&prefix)))
        .await?;
    spend.seed(&info.id, keys::day_use(&runs, info.principal, now));
    Ok(())
}

/// `run`'s state if it exists and is `caller`'s (`None`: not known). A run of that name
/// another uid started is not the key's (its owner's budget would pay): an error.
pub async fn owned(
    gate: &impl KeyGate,
    caller: Caller,
    run: &str,
) -> Result<Option<RunState>, GateError> {
    let name = run.to_owned();
    match gate
        .ask(move |gate, done| done(gate.run(caller, &name)))
        .await
    {
        Ok(standing) => Ok(Some(standing.state)),
        Err(GateError::RunNotFound(_)) => Ok(None),
        Err(e) => Err(e),
    }
}

/// The key's run `req.run` (named at `named_ms`) for `caller`, the key's principal:
/// continued if it is the principal's already, else started within the key's runs per
/// day of the run's day.
pub async fn run_for_key(
    gate: &impl KeyGate,
    ring: &KeyRing,
    info: &KeyInfo,
    (caller, named_ms): (Caller, u64),
    req: StartRequest,
) -> Result<KeyRun, KeyRunError> {
    let run = req.run.clone();
    // Most uses continue a run: a read, not a start's transaction.
    if let Some(state) = owned(gate, caller, &run).await.map_err(KeyRunError::Read)? {
        return Ok(KeyRun::Continued(state));
    }
    // A start of this run under way finishes first: read again in turn. The turn is
    // let go when the gate answers the start (below), not when this future ends: a
    // caller that hangs up mid-start does not let the next one read before the run
    // exists and be refused for the day's slot the start still holds.
    let turn = ring.starts().turn(&run).await;
    if let Some(state) = owned(gate, caller, &run).await.map_err(KeyRunError::Read)? {
        return Ok(KeyRun::Continued(state));
    }
    let slot = ring
        .spend()
        .start_run(&info.id, &keys::day_limits(info), named_ms)
        .map_err(KeyRunError::Day)?;
    let started = gate
        .ask(move |gate, done| {
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
                    drop(turn);
                    done(r)
                }),
            )
        })
        .await;
    match started {
        Ok(_) => Ok(KeyRun::Started),
        // Started between the read and the start (by another front, or someone else,
        // whose run the key must not use): read again, as its owner.
        Err(GateError::RunExists(_)) => {
            match owned(gate, caller, &run).await.map_err(KeyRunError::Read)? {
                Some(state) => Ok(KeyRun::Continued(state)),
                None => Err(KeyRunError::Forgotten),
            }
        }
        Err(e) => Err(KeyRunError::Start(e)),
    }
}

//! Whom a request to the MCP gateway acts for: the `Authorization: Bearer` credential
//! read as the model proxy reads it. A run token of this tally names its run; a key
//! (`tlk_`, docs/KEYS.md) names the run of its task (`x-tally-task`) or its current run.
//! Every request's credential is only read ([`Credentials::holder`]); an `initialize`
//! alone opens a session ([`Credentials::open`]): then, and only then, a key's run is
//! started under the key's principal, within the key's runs per day (the gateway stops
//! it when the last session on it ends), or continued. Anything else is refused (401),
//! nothing contacted.
//!
//! The session's checks and outcomes go through the agent socket's own handlers, on an
//! in-process connection whose peer is the run's owner ([`dialer`]): the path
//! `tally mcp`'s take, acting as the uid that holds the run.

use std::collections::HashMap;
use std::sync::{Arc, Weak};

use axum::extract::Request;
use axum::Router;
use hyper::body::Incoming;
use hyper::header::{HeaderMap, AUTHORIZATION};
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tally_gate::{Caller, GateError, StartRequest};
use tally_mcp::gateway::{Authorized, Credentials, NoCredential, NotOpened, Pending};
use tally_proxy::key_spend::KeyRefusal;
use tally_proxy::keys::{self, KeyRefused};
use tally_wire::KeyInfo;
use tower::ServiceExt;

use crate::app::App;
use crate::limit::Peer;

/// The header that names the task a key's session belongs to (the proxy's).
const TASK_HEADER: &str = "x-tally-task";

/// The gateway's credentials, over the daemon's gate; `agent` is the agent socket's
/// router its checks go through.
pub(crate) struct Auth {
    app: Arc<App>,
    agent: Router,
    starting: Arc<Starting>,
}

impl Auth {
    pub(crate) fn new(app: Arc<App>, agent: Router) -> Auth {
        Auth {
            app,
            agent,
            starting: Arc::default(),
        }
    }
}

/// The key runs being read or started, by name: the `initialize`s of one run take
/// their turns, so that the second reads the run the first started (rather than the
/// key's day with the first's start still counted and not yet made).
#[derive(Default)]
struct Starting(std::sync::Mutex<HashMap<String, Weak<tokio::sync::Mutex<()>>>>);

impl Starting {
    /// `run`'s turn: held until the run is read and, if new, started.
    async fn turn(&self, run: &str) -> tokio::sync::OwnedMutexGuard<()> {
        let lock = {
            let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
            map.retain(|_, w| w.strong_count() > 0);
            match map.get(run).and_then(Weak::upgrade) {
                Some(lock) => lock,
                None => {
                    let lock = Arc::new(tokio::sync::Mutex::new(()));
                    map.insert(run.to_owned(), Arc::downgrade(&lock));
                    lock
                }
            }
        };
        lock.lock_owned().await
    }
}

/// What a credential is.
enum Held {
    Run(String),
    Key(KeyInfo),
}

impl Credentials for Auth {
    fn holder(&self, headers: &HeaderMap) -> Result<String, NoCredential> {
        Ok(match held(&self.app, headers)? {
            Held::Run(run) => format!("run {run}"),
            Held::Key(info) => format!("key {}", info.id),
        })
    }

    fn open(&self, headers: HeaderMap) -> Pending<Result<Authorized, NotOpened>> {
        let app = Arc::clone(&self.app);
        let agent = self.agent.clone();
        let starting = Arc::clone(&self.starting);
        Box::pin(async move {
            // A key's run is its principal's (read as such when it was continued, or
            // started as such): its owner is not read again, so a run the key started
            // is never left unstopped by a failed second read.
            let (run, started, owner) = match held(&app, &headers)? {
                Held::Run(run) => {
                    let owner = owner(&app, &run).await?;
                    (run, false, owner)
                }
                Held::Key(info) => {
                    let principal = info.principal;
                    let (run, started) = key_run(&app, &starting, &headers, info).await?;
                    (run, started, Some(principal))
                }
            };
            let peer = owner.map_or(Peer::Tcp, Peer::Uid);
            let dialer = dialer(agent, peer);
            Ok(Authorized {
                run,
                started,
                gate: Arc::new(move || {
                    tally_api::GateClient::dialed("tally serve (in-process)", Arc::clone(&dialer))
                }),
            })
        })
    }
}

/// The credential of `Authorization: Bearer TOKEN`: a run token's run, or a key.
fn held(app: &App, headers: &HeaderMap) -> Result<Held, NoCredential> {
    let token = bearer(headers)?;
    if keys::looks_like_key(&token) {
        let ring = app.keys.as_ref().ok_or(NoCredential::NoKeys)?;
        return ring.check(&token).map(Held::Key).map_err(|r| match r {
            KeyRefused::Revoked { id } => {
                ring.spend().refused(KeyRefusal::KeyRevoked);
                NoCredential::Revoked { id }
            }
            _ => {
                ring.spend().refused(KeyRefusal::InvalidKey);
                NoCredential::NotAKey
            }
        });
    }
    let key = app.token_key.as_ref().ok_or(NoCredential::NoTokens)?;
    key.run_of(&token)
        .map(Held::Run)
        .ok_or(NoCredential::NotAToken)
}

/// The token of `Authorization: Bearer TOKEN`.
fn bearer(headers: &HeaderMap) -> Result<String, NoCredential> {
    let value = headers
        .get(AUTHORIZATION)
        .ok_or(NoCredential::Missing)?
        .to_str()
        .map_err(|_| NoCredential::NotText)?;
    tally_proxy::token::bearer(value.trim_matches([' ', '\t']))
        .map(str::to_owned)
        .ok_or(NoCredential::NotBearer)
}

/// The uid that holds a run token's `run` (`None`: a loopback TCP client's): a gate
/// that cannot answer is a 503, a run it does not know a 403.
async fn owner(app: &App, run: &str) -> Result<Option<u32>, NotOpened> {
    let operator = Caller {
        uid: None,
        operator: true,
        proxied: false,
    };
    let gate = Arc::clone(&app.gate);
    let name = run.to_owned();
    match app.at_once(move || gate.run(operator, &name)).await {
        Ok(standing) => Ok(standing.owner_uid),
        Err(GateError::RunNotFound(_)) => Err(NotOpened::Forbidden(format!(
            "the run {run} is not known to the gate"
        ))),
        Err(e @ GateError::Unavailable(_)) => Err(NotOpened::Unavailable(format!(
            "the gate cannot read the run {run}: {e}"
        ))),
        Err(e) => Err(NotOpened::Forbidden(format!(
            "the gate cannot read the run {run}: {e}"
        ))),
    }
}

/// The run a key's new session acts in, and whether opening it started the run: the
/// key's run of its task or window, continued if it is the principal's already, else
/// started within the key's runs per day.
async fn key_run(
    app: &App,
    starting: &Starting,
    headers: &HeaderMap,
    info: KeyInfo,
) -> Result<(String, bool), NotOpened> {
    let ring = app.keys.as_ref().ok_or(NoCredential::NoKeys)?;
    let spend = ring.spend();
    if !app.gate.policy().policy.principal_bounded(info.principal) {
        spend.refused(KeyRefusal::PrincipalUnbounded);
        return Err(NotOpened::Forbidden(format!(
            "key {}'s principal {} has no budget in the policy ([principals] with spend or runs)",
            info.id, info.principal
        )));
    }
    let task = match headers.get(TASK_HEADER) {
        None => None,
        Some(v) => Some(v.to_str().ok().and_then(keys::task_name).ok_or_else(|| {
            spend.refused(KeyRefusal::InvalidTask);
            NotOpened::BadHeader(format!(
                "{TASK_HEADER} must be 1 to {} letters, digits, `.`, `_` or `-`, and not `w` and digits",
                keys::MAX_TASK_BYTES
            ))
        })?),
    };
    let now = ring.now_ms();
    seed(app, ring, &info, now).await?;
    let run = keys::run_of(&info, task, now);
    let _turn = starting.turn(&run).await;
    // The principal is the run's owner: its budget, open runs and ownership are the
    // uid's, as if it had started the run on the agent socket.
    let caller = Caller {
        uid: Some(info.principal),
        operator: false,
        proxied: false,
    };
    match owned(app, caller, &run).await? {
        Some(tally_wire::RunState::Stopped) => {
            return Err(NotOpened::Stopped(
                format!(
                    "key {}'s run {run} is stopped (a session on it ended, or the operator stopped it): nothing more is decided in it; send {TASK_HEADER}: NAME with a new task name to start another run",
                    info.id
                ),
            ))
        }
        Some(_) => return Ok((run, false)),
        None => {}
    }
    let goal = match task {
        Some(t) => format!("task {t} of key {}", info.id),
        None => format!("the current run of key {}", info.id),
    };
    start(app, ring, &info, caller, (run, now), goal).await
}

/// The key's counts of the day read from the gate's runs of the day, the first time the
/// key is used since the daemon started (as the proxy reads them).
async fn seed(
    app: &App,
    ring: &tally_proxy::KeyRing,
    info: &KeyInfo,
    now: u64,
) -> Result<(), NotOpened> {
    if ring.spend().seeded(&info.id) {
        return Ok(());
    }
    let prefix = keys::runs_today(&info.id, now);
    let gate = Arc::clone(&app.gate);
    let runs = app
        .at_once(move || gate.runs_named(&prefix))
        .await
        .map_err(|e| {
            NotOpened::Unavailable(format!(
                "the gate cannot read the key's runs of the day: {e}"
            ))
        })?;
    ring.spend()
        .seed(&info.id, keys::day_use(&runs, info.principal, now));
    Ok(())
}

/// Whether `run` exists and is `caller`'s, and its state; a run of that name another
/// uid holds is not the key's.
async fn owned(
    app: &App,
    caller: Caller,
    run: &str,
) -> Result<Option<tally_wire::RunState>, NotOpened> {
    let gate = Arc::clone(&app.gate);
    let name = run.to_owned();
    match app.at_once(move || gate.run(caller, &name)).await {
        Ok(standing) => Ok(Some(standing.state)),
        Err(GateError::RunNotFound(_)) => Ok(None),
        Err(e @ GateError::Unavailable(_)) => Err(NotOpened::Unavailable(format!(
            "the key's run {run} cannot be read: {e}"
        ))),
        Err(e) => Err(NotOpened::Forbidden(format!(
            "the key's run {run} cannot be used: {e}"
        ))),
    }
}

/// Start the key's `run` (named at `named_ms`), counted against the key's runs per day:
/// the count goes with the gate's answer, kept if the run started, given back (once)
/// if not, even if the client has gone away by then.
async fn start(
    app: &App,
    ring: &tally_proxy::KeyRing,
    info: &KeyInfo,
    caller: Caller,
    (run, named_ms): (String, u64),
    goal: String,
) -> Result<(String, bool), NotOpened> {
    let spend = ring.spend();
    let slot = match spend.start_run(&info.id, &keys::day_limits(info), named_ms) {
        Ok(slot) => slot,
        // The key's last run of the day may be the one its other session of this task
        // is starting right now: read once more before refusing.
        Err(_) if owned(app, caller, &run).await?.is_some() => return Ok((run, false)),
        Err(e) => {
            spend.refused(KeyRefusal::RunsExceeded);
            return Err(NotOpened::Limit(format!(
                "key {}: {e}; its day ends at 00:00 UTC",
                info.id
            )));
        }
    };
    let req = StartRequest {
        run: run.clone(),
        goal: Some(goal),
        worker: Some("tally-mcp-gateway".to_owned()),
        ..StartRequest::default()
    };
    let gate = Arc::clone(&app.gate);
    let started = crate::stage::answered(&app.stage, move |done| {
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
    .await;
    match started {
        Ok(_) => Ok((run, true)),
        // Started between the read and the start, by this key's other session.
        Err(GateError::RunExists(_)) if owned(app, caller, &run).await?.is_some() => {
            Ok((run, false))
        }
        Err(e @ GateError::Unavailable(_)) => Err(NotOpened::Unavailable(format!(
            "the key's run {run} cannot start: {e}"
        ))),
        Err(e @ GateError::TooManyRuns { .. }) => Err(NotOpened::Limit(format!(
            "the key's run {run} cannot start: {e}"
        ))),
        Err(e) => Err(NotOpened::Forbidden(format!(
            "the key's run {run} cannot start: {e}"
        ))),
    }
}

/// An in-process connection to the agent socket's handlers, served as `peer`.
pub(crate) fn dialer(agent: Router, peer: Peer) -> tally_api::Dialer {
    Arc::new(move || {
        let agent = agent.clone();
        Box::pin(async move {
            let (ours, theirs) = tokio::io::duplex(64 * 1024);
            let service = agent.map_request(move |mut request: Request<Incoming>| {
                request.extensions_mut().insert(peer);
                request
            });
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(theirs), TowerToHyperService::new(service))
                    .await;
            });
            Ok(ours)
        })
    })
}

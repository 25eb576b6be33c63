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

use std::sync::Arc;

use axum::extract::Request;
use axum::Router;
use hyper::body::Incoming;
use hyper::header::{HeaderMap, AUTHORIZATION};
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tally_gate::{Caller, GateError, Gatekeeper, StartRequest};
use tally_mcp::gateway::{Authorized, Credentials, NoCredential, NotOpened, Pending};
use tally_proxy::key_run::{self, Asked, Done, KeyGate, KeyRun, KeyRunError};
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
}

impl Auth {
    pub(crate) fn new(app: Arc<App>, agent: Router) -> Auth {
        Auth { app, agent }
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
                    let (run, started) = key_run(&app, &headers, info).await?;
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
    key_run::seed(app, ring, &info, now).await.map_err(|e| {
        NotOpened::Unavailable(format!(
            "the gate cannot read the key's runs of the day: {e}"
        ))
    })?;
    let run = keys::run_of(&info, task, now);
    // The principal is the run's owner: its budget, open runs and ownership are the
    // uid's, as if it had started the run on the agent socket.
    let caller = Caller {
        uid: Some(info.principal),
        operator: false,
        proxied: false,
    };
    let goal = match task {
        Some(t) => format!("task {t} of key {}", info.id),
        None => format!("the current run of key {}", info.id),
    };
    let req = StartRequest {
        run: run.clone(),
        goal: Some(goal),
        worker: Some("tally-mcp-gateway".to_owned()),
        ..StartRequest::default()
    };
    match key_run::run_for_key(app, ring, &info, (caller, now), req).await {
        Ok(KeyRun::Started) => Ok((run, true)),
        Ok(KeyRun::Continued(tally_wire::RunState::Stopped)) => Err(NotOpened::Stopped(format!(
            "key {}'s run {run} is stopped (a session on it ended, or the operator stopped it): nothing more is decided in it; send {TASK_HEADER}: NAME with a new task name to start another run",
            info.id
        ))),
        Ok(_) => Ok((run, false)),
        Err(e) => Err(not_started(ring, &info, &run, e)),
    }
}

/// Why the key's `run` is neither continued nor started, as the gateway answers it.
fn not_started(
    ring: &tally_proxy::KeyRing,
    info: &KeyInfo,
    run: &str,
    e: KeyRunError,
) -> NotOpened {
    match e {
        KeyRunError::Day(e) => {
            ring.spend().refused(KeyRefusal::RunsExceeded);
            NotOpened::Limit(format!("key {}: {e}; its day ends at 00:00 UTC", info.id))
        }
        KeyRunError::Read(e @ GateError::Unavailable(_)) => {
            NotOpened::Unavailable(format!("the key's run {run} cannot be read: {e}"))
        }
        KeyRunError::Read(e) => {
            NotOpened::Forbidden(format!("the key's run {run} cannot be used: {e}"))
        }
        KeyRunError::Start(e @ GateError::Unavailable(_)) => {
            NotOpened::Unavailable(format!("the key's run {run} cannot start: {e}"))
        }
        KeyRunError::Start(e @ GateError::TooManyRuns { .. }) => {
            NotOpened::Limit(format!("the key's run {run} cannot start: {e}"))
        }
        e => NotOpened::Forbidden(format!("the key's run {run} cannot start: {e}")),
    }
}

impl KeyGate for App {
    fn ask<T: Send + 'static>(
        &self,
        f: impl FnOnce(Arc<dyn Gatekeeper>, Done<T>) + Send + 'static,
    ) -> Asked<'_, T> {
        let gate = Arc::clone(&self.gate);
        Box::pin(crate::stage::answered(&self.stage, move |done| {
            f(gate, done)
        }))
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

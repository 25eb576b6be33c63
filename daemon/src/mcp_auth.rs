//! Whom a request to the MCP gateway acts for: the `Authorization: Bearer` credential
//! read as the model proxy reads it. A run token of this tally names its run; a key
//! (`tlk_`, docs/KEYS.md) names the run of its task (`x-tally-task`) or its current run,
//! started under the key's principal if it is new (then the session that started it
//! stops it when it ends). Anything else is refused (401), nothing contacted.
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
use tally_gate::{Caller, GateError, StartRequest};
use tally_mcp::gateway::{Authorize, Authorized};
use tally_proxy::keys::{self, KeyRefused};
use tower::ServiceExt;

use crate::app::App;
use crate::limit::Peer;

/// The header that names the task a key's session belongs to (the proxy's).
const TASK_HEADER: &str = "x-tally-task";

/// The gateway's credential check, over the daemon's gate; `agent` is the agent
/// socket's router its checks go through.
pub(crate) fn authorize(app: Arc<App>, agent: Router) -> Authorize {
    Arc::new(move |headers: HeaderMap| {
        let app = Arc::clone(&app);
        let agent = agent.clone();
        Box::pin(async move {
            let token = bearer(&headers)?;
            let (run, started) = if keys::looks_like_key(&token) {
                key_run(&app, &headers, &token).await?
            } else {
                let key = app
                    .token_key
                    .as_ref()
                    .ok_or("this tally mints no run tokens")?;
                let run = key
                    .run_of(&token)
                    .ok_or("this is not a run token of this tally")?;
                (run, false)
            };
            let owner = owner(&app, &run).await?;
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
    })
}

/// The token of `Authorization: Bearer TOKEN`.
fn bearer(headers: &HeaderMap) -> Result<String, String> {
    let value = headers
        .get(AUTHORIZATION)
        .ok_or("no credential: send `Authorization: Bearer` with a run token (the `token` of POST /v1/runs) or a key")?
        .to_str()
        .map_err(|_| "the Authorization header is not text")?;
    tally_proxy::token::bearer(value.trim_matches([' ', '\t']))
        .map(str::to_owned)
        .ok_or_else(|| "the Authorization header is not `Bearer TOKEN`".to_owned())
}

/// The uid that holds `run` (`None`: a loopback TCP client's).
async fn owner(app: &App, run: &str) -> Result<Option<u32>, String> {
    let operator = Caller {
        uid: None,
        operator: true,
        proxied: false,
    };
    let gate = Arc::clone(&app.gate);
    let name = run.to_owned();
    match app.at_once(move || gate.run(operator, &name)).await {
        Ok(standing) => Ok(standing.owner_uid),
        Err(GateError::RunNotFound(_)) => Err(format!("the run {run} is not known to the gate")),
        Err(e) => Err(format!("the gate cannot read the run {run}: {e}")),
    }
}

/// The run a key's session acts in, and whether this started it.
async fn key_run(app: &App, headers: &HeaderMap, key: &str) -> Result<(String, bool), String> {
    let ring = app.keys.as_ref().ok_or("this tally serves no keys")?;
    let info = ring.check(key).map_err(|r| match r {
        KeyRefused::Revoked { id } => {
            format!("key {id} was revoked by the operator: ask them for another key")
        }
        _ => "this is not a key of this tally".to_owned(),
    })?;
    if !app.gate.policy().policy.principal_bounded(info.principal) {
        return Err(format!(
            "key {}'s principal {} has no budget in the policy ([principals] with spend or runs)",
            info.id, info.principal
        ));
    }
    let task = match headers.get(TASK_HEADER) {
        None => None,
        Some(v) => Some(v.to_str().ok().and_then(keys::task_name).ok_or_else(|| {
            format!(
                "{TASK_HEADER} must be 1 to {} letters, digits, `.`, `_` or `-`, and not `w` and digits",
                keys::MAX_TASK_BYTES
            )
        })?),
    };
    let run = keys::run_of(&info, task, ring.now_ms());
    // The principal is the run's owner: its budget, open runs and ownership are the
    // uid's, as if it had started the run on the agent socket.
    let caller = Caller {
        uid: Some(info.principal),
        operator: false,
        proxied: false,
    };
    let gate = Arc::clone(&app.gate);
    let name = run.clone();
    match app.at_once(move || gate.run(caller, &name)).await {
        Ok(_) => return Ok((run, false)),
        Err(GateError::RunNotFound(_)) => {}
        Err(e) => return Err(format!("the key's run {run} cannot be used: {e}")),
    }
    let req = StartRequest {
        run: run.clone(),
        goal: Some(match task {
            Some(t) => format!("task {t} of key {}", info.id),
            None => format!("the current run of key {}", info.id),
        }),
        worker: Some("tally-mcp-gateway".to_owned()),
        ..StartRequest::default()
    };
    let gate = Arc::clone(&app.gate);
    match crate::stage::answered(&app.stage, move |done| gate.start(caller, req, done)).await {
        Ok(_) => Ok((run, true)),
        // Started between the read and the start, by this key's other session.
        Err(GateError::RunExists(_)) => Ok((run, false)),
        Err(e) => Err(format!("the key's run {run} cannot start: {e}")),
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

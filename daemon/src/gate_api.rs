//! The gate's HTTP API (docs/GATE.md): the agent socket's start, check, outcome, stop and
//! where-a-run-stands; the operator socket's run list, pause, resume, kill, settle and
//! approvals.
//! Each answer goes out only once its decision is durable.

use std::sync::Arc;
use tally_wire::ErrorCode;

use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tally_gate::{
    Approval, Caller, CheckRequest, Denial, GateError, OutcomeRequest, SettleRequest, StartRequest,
    StopRequest,
};
use tally_ledger::Reason;

use crate::app::{read_body, App, Role};
use crate::error::ApiError;
use crate::limit::Peer;
use crate::stage::{answered, gate_error, log};

type AppState = State<Arc<App>>;

/// The agent socket's gate routes, added to `common`.
pub(crate) fn agent_routes(common: Router<Arc<App>>) -> Router<Arc<App>> {
    common
        .route("/v1/runs", post(start).get(runs))
        .route("/v1/check", post(check))
        .route("/v1/outcome", post(outcome))
        .route("/v1/runs/{run}/stop", post(stop))
        .route("/v1/runs/{run}", get(run))
}

/// The operator socket's routes, added to `common`.
pub(crate) fn operator_routes(common: Router<Arc<App>>) -> Router<Arc<App>> {
    common
        .route("/v1/runs", get(runs))
        .route("/v1/runs/{run}", get(run))
        .route("/v1/runs/{run}/pause", post(pause))
        .route("/v1/runs/{run}/resume", post(resume))
        .route("/v1/runs/{run}/kill", post(kill))
        .route("/v1/runs/{run}/settle", post(settle))
        .route("/v1/approvals", post(approve).get(approval_requests))
        .route("/v1/approvals/{id}", get(approval_request))
        .route("/v1/approvals/continuations", post(continuation))
        .route("/v1/approvals/denials", post(deny))
}

fn caller(peer: Peer, role: Role) -> Caller {
    Caller {
        uid: match peer {
            Peer::Uid(uid) => Some(uid),
            _ => None,
        },
        operator: role == Role::Operator,
        // The agent and operator sockets never speak for the proxy: only the proxy, in
        // process, makes a proxied caller.
        proxied: false,
    }
}

/// Read a JSON body strictly into `T`, naming the field at fault.
pub(crate) async fn body<T: DeserializeOwned>(
    app: &App,
    headers: &HeaderMap,
    body: Body,
) -> Result<T, ApiError> {
    json_only(headers)?;
    let bytes = read_body(app, headers, body).await?;
    parse_body(&bytes, false)
}

/// A gate body is one JSON object: `Content-Type: application/json`, or none. Anything
/// else (a form, which `curl -d` sends; NDJSON) is `415`, before the body is read.
fn json_only(headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(value) = headers.get(axum::http::header::CONTENT_TYPE) else {
        return Ok(());
    };
    let text = value.to_str().unwrap_or("");
    let mime = text.split(';').next().unwrap_or("").trim();
    if mime.eq_ignore_ascii_case("application/json") {
        return Ok(());
    }
    Err(ApiError::new(
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        ErrorCode::UnsupportedMediaType,
        format!(
            "content type `{text}` is not accepted here: the gate takes one JSON object; send \
             `Content-Type: application/json` (curl: `--json BODY`, or `-H 'content-type: \
             application/json' -d BODY`)"
        ),
    )
    .close())
}

/// Parse a body strictly into `T`: one JSON object (serde would also take an array, by
/// position; that second encoding is refused), with its nested `budget` and `scope`
/// objects too; unknown fields refused with the field named. Errors carry the codes of
/// docs/DAEMON.md (`invalid_type`, `unknown_field`, `invalid_value`, `missing_field`,
/// `invalid_json`) and the field at fault. `empty_ok`: an empty body reads as `{}`.
pub(crate) fn parse_body<T: DeserializeOwned>(bytes: &[u8], empty_ok: bool) -> Result<T, ApiError> {
    let bad = StatusCode::BAD_REQUEST;
    let text = std::str::from_utf8(bytes)
        .map_err(|_| ApiError::new(bad, ErrorCode::NotUtf8, "the request body is not UTF-8"))?;
    let text = if empty_ok && text.trim().is_empty() {
        "{}"
    } else {
        text
    };
    match serde_json::from_str::<serde_json::Value>(text) {
        Ok(serde_json::Value::Object(map)) => {
            for field in ["budget", "scope"] {
                if map
                    .get(field)
                    .is_some_and(|v| !v.is_object() && !v.is_null())
                {
                    return Err(ApiError::new(
                        bad,
                        ErrorCode::InvalidType,
                        format!("`{field}` must be a JSON object"),
                    )
                    .field(field));
                }
            }
            if map.get("run").and_then(|v| v.as_str()) == Some("") {
                return Err(ApiError::new(
                    bad,
                    ErrorCode::InvalidValue,
                    "`run` is empty: name the run (the same name on every call of the run)",
                )
                .field("run"));
            }
        }
        Ok(_) => {
            return Err(ApiError::new(
                bad,
                ErrorCode::InvalidType,
                "the body must be one JSON object",
            ))
        }
        // Malformed JSON: the typed parse below says where.
        Err(_) => {}
    }
    let mut de = serde_json::Deserializer::from_str(text);
    let value: T = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        crate::parse::body_error(e.into_inner(), &path)
    })?;
    de.end().map_err(|e| crate::parse::body_error(e, "."))?;
    Ok(value)
}

pub(crate) fn json<T: Serialize>(status: StatusCode, value: &T) -> Response {
    (status, Json(value)).into_response()
}

pub(crate) fn path_run(run: Result<Path<String>, PathRejection>) -> Result<String, ApiError> {
    run.map(|Path(r)| r).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            ErrorCode::InvalidRun,
            format!("the run name in the path is not valid: {}", e.body_text()),
        )
    })
}

/// A gate call with a JSON body: read it strictly, hand it to `call`, answer `status`
/// with what the gate answers once durable.
async fn posted<Req, Ans>(
    app: &App,
    request: Request,
    status: StatusCode,
    call: impl FnOnce(Req, Box<dyn FnOnce(Result<Ans, GateError>) + Send>) + Send + 'static,
) -> Result<Response, ApiError>
where
    Req: DeserializeOwned + Send + 'static,
    Ans: Serialize + Send + 'static,
{
    let (parts, b) = request.into_parts();
    let req: Req = body(app, &parts.headers, b).await?;
    let answer = answered(&app.stage, move |done| call(req, done))
        .await
        .map_err(gate_error)?;
    Ok(json(status, &answer))
}

async fn start(
    State(app): AppState,
    Extension(peer): Extension<Peer>,
    Extension(role): Extension<Role>,
    request: Request,
) -> Result<Response, ApiError> {
    let gate = Arc::clone(&app.gate);
    let key = app.token_key.clone();
    posted(
        &app,
        request,
        StatusCode::CREATED,
        move |req: StartRequest, done| {
            if role == Role::Agent && req.run.starts_with(tally_wire::KEY_RUN_PREFIX) {
                return done(Err(GateError::NotAuthorized(format!(
                    "run names beginning `{}` are the runs keys start (docs/KEYS.md): \
                     choose another name",
                    tally_wire::KEY_RUN_PREFIX
                ))));
            }
            gate.start(
                caller(peer, role),
                req,
                Box::new(move |r: Result<tally_gate::Started, GateError>| {
                    // With the proxy on, the run's token: its agent's API key.
                    done(r.map(|mut s| {
                        s.token = key.as_ref().map(|k| k.mint(&s.run));
                        s
                    }))
                }),
            )
        },
    )
    .await
}

async fn check(
    State(app): AppState,
    Extension(peer): Extension<Peer>,
    Extension(role): Extension<Role>,
    request: Request,
) -> Result<Response, ApiError> {
    let (parts, b) = request.into_parts();
    let mut req: CheckRequest = body(&app, &parts.headers, b).await?;
    // The agent's trace, when it sent a valid `traceparent`, else the check's own span's
    // (with an OTLP endpoint): recorded on the decision.
    let parent = crate::observe::trace::incoming(&parts.headers);
    let span = app
        .observer
        .tracer
        .as_ref()
        .map(|t| t.check(&req.tool, &req.run, parent.as_ref()));
    // Recorded where the trace exists: the agent's (sampled or not: the agent knows its
    // id), or the check's own span when it is exported. A root span that is not sampled
    // names a trace nobody holds (docs/OPERATOR.md, "Traces").
    req.trace_id = match (parent, &span) {
        (Some((p, _)), _) => Some(p.trace_id),
        (None, Some(s)) => s.exported_trace_id(),
        (None, None) => None,
    };
    let end = |answer: Option<&tally_gate::CheckAnswer>| {
        if let Some(s) = span {
            match answer {
                Some(a) => s.end(
                    crate::observe::verdict(a.decision),
                    a.reason.map(|r| r.as_str()),
                    a.seq,
                ),
                None => s.end("error", Some(Reason::GateUnavailable.as_str()), None),
            }
        }
    };
    let gate = Arc::clone(&app.gate);
    match answered(&app.stage, move |done| {
        gate.check(caller(peer, role), req, done)
    })
    .await
    {
        // Observed by the gate's seam (observe/gated.rs), as every decision is.
        Ok(answer) => {
            end(Some(&answer));
            Ok(json(StatusCode::OK, &answer))
        }
        // The run is over: a decision-shaped answer, so a client needs one code path.
        Err(GateError::Stopped(answer)) => {
            end(Some(&answer));
            Ok(json(StatusCode::OK, &answer))
        }
        Err(GateError::Unavailable(why)) => {
            end(None);
            log(&format!(
                "tally serve: the gate cannot decide durably: {why}"
            ));
            let reply = tally_wire::CheckUnavailable::new(
                "the gate cannot record decisions, so the call must not proceed (fail closed); retry later",
            );
            Ok(json(StatusCode::SERVICE_UNAVAILABLE, &reply))
        }
        Err(e) => {
            end(None);
            Err(gate_error(e))
        }
    }
}

async fn outcome(
    State(app): AppState,
    Extension(peer): Extension<Peer>,
    Extension(role): Extension<Role>,
    request: Request,
) -> Result<Response, ApiError> {
    let gate = Arc::clone(&app.gate);
    posted(
        &app,
        request,
        StatusCode::OK,
        move |req: OutcomeRequest, done| gate.outcome(caller(peer, role), req, done),
    )
    .await
}

async fn stop(
    State(app): AppState,
    Extension(peer): Extension<Peer>,
    Extension(role): Extension<Role>,
    run: Result<Path<String>, PathRejection>,
    request: Request,
) -> Result<Response, ApiError> {
    let run = path_run(run)?;
    let (parts, b) = request.into_parts();
    json_only(&parts.headers)?;
    let bytes = read_body(&app, &parts.headers, b).await?;
    let req: StopRequest = parse_body(&bytes, true)?;
    let gate = Arc::clone(&app.gate);
    let logged = answered(&app.stage, move |done| {
        gate.stop(caller(peer, role), &run, req, done)
    })
    .await
    .map_err(gate_error)?;
    Ok(json(StatusCode::OK, &logged))
}

/// The operator settles what an attempt holds (`tally settle`): its outcome, recorded
/// with the operator's uid, from the upstream's own figure.
async fn settle(
    State(app): AppState,
    Extension(peer): Extension<Peer>,
    run: Result<Path<String>, PathRejection>,
    request: Request,
) -> Result<Response, ApiError> {
    let run = path_run(run)?;
    let gate = Arc::clone(&app.gate);
    posted(
        &app,
        request,
        StatusCode::OK,
        move |req: SettleRequest, done| gate.settle(caller(peer, Role::Operator), &run, req, done),
    )
    .await
}

async fn kill(
    State(app): AppState,
    Extension(peer): Extension<Peer>,
    run: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let run = path_run(run)?;
    let gate = Arc::clone(&app.gate);
    let req = StopRequest {
        reason: Some(Reason::KilledByOperator),
        worker: None,
    };
    let logged = answered(&app.stage, move |done| {
        gate.stop(caller(peer, Role::Operator), &run, req, done)
    })
    .await
    .map_err(gate_error)?;
    Ok(json(StatusCode::OK, &logged))
}

async fn lifecycle(
    app: Arc<App>,
    peer: Peer,
    run: String,
    paused: bool,
) -> Result<Response, ApiError> {
    let gate = Arc::clone(&app.gate);
    let standing = answered(&app.stage, move |done| {
        gate.pause(caller(peer, Role::Operator), &run, paused, done)
    })
    .await
    .map_err(gate_error)?;
    Ok(json(StatusCode::OK, &standing))
}

async fn pause(
    State(app): AppState,
    Extension(peer): Extension<Peer>,
    run: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    lifecycle(app, peer, path_run(run)?, true).await
}

async fn resume(
    State(app): AppState,
    Extension(peer): Extension<Peer>,
    run: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    lifecycle(app, peer, path_run(run)?, false).await
}

async fn approve(
    State(app): AppState,
    Extension(peer): Extension<Peer>,
    request: Request,
) -> Result<Response, ApiError> {
    let gate = Arc::clone(&app.gate);
    posted(&app, request, StatusCode::OK, move |a: Approval, done| {
        gate.approve(caller(peer, Role::Operator), a, done)
    })
    .await
}

/// A denial of an approval request (docs/APPROVALS.md).
async fn deny(
    State(app): AppState,
    Extension(peer): Extension<Peer>,
    request: Request,
) -> Result<Response, ApiError> {
    let gate = Arc::clone(&app.gate);
    posted(&app, request, StatusCode::OK, move |d: Denial, done| {
        gate.deny(caller(peer, Role::Operator), d, done)
    })
    .await
}

/// A continuation grant: recorded with the new run it starts, whose token (with the
/// proxy on) is given once, here, as a start gives it.
async fn continuation(
    State(app): AppState,
    Extension(peer): Extension<Peer>,
    request: Request,
) -> Result<Response, ApiError> {
    let gate = Arc::clone(&app.gate);
    let key = app.token_key.clone();
    posted(
        &app,
        request,
        StatusCode::CREATED,
        move |a: Approval, done| {
            gate.continue_run(
                caller(peer, Role::Operator),
                a,
                Box::new(move |r: Result<tally_gate::Started, GateError>| {
                    done(r.map(|mut s| {
                        s.token = key.as_ref().map(|k| k.mint(&s.run));
                        s
                    }))
                }),
            )
        },
    )
    .await
}

async fn run(
    State(app): AppState,
    Extension(peer): Extension<Peer>,
    Extension(role): Extension<Role>,
    run: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let run = path_run(run)?;
    let gate = Arc::clone(&app.gate);
    let standing = app
        .at_once(move || gate.run(caller(peer, role), &run))
        .await
        .map_err(gate_error)?;
    Ok(json(StatusCode::OK, &standing))
}

async fn runs(
    State(app): AppState,
    Extension(peer): Extension<Peer>,
    Extension(role): Extension<Role>,
) -> Result<Response, ApiError> {
    let gate = Arc::clone(&app.gate);
    let all = app
        .at_once(move || gate.runs(caller(peer, role)))
        .await
        .map_err(gate_error)?;
    // The order of the live page: nearest to a limit first (docs/OPERATOR.md).
    Ok(json(
        StatusCode::OK,
        &crate::observe::listed(&app.observer, all),
    ))
}

/// `GET /v1/approvals`: the approval requests, pending first (docs/APPROVALS.md).
async fn approval_requests(State(app): AppState) -> Result<Response, ApiError> {
    let gate = Arc::clone(&app.gate);
    let list = app
        .at_once(move || gate.approval_requests())
        .await
        .map_err(gate_error)?;
    Ok(json(StatusCode::OK, &list))
}

/// `GET /v1/approvals/{id}`: one approval request.
async fn approval_request(
    State(app): AppState,
    id: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let id = id.map(|Path(i)| i).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            ErrorCode::InvalidValue,
            format!("the request id in the path is not valid: {}", e.body_text()),
        )
    })?;
    let gate = Arc::clone(&app.gate);
    let one = app
        .at_once(move || gate.approval_request(&id))
        .await
        .map_err(gate_error)?;
    Ok(json(StatusCode::OK, &one))
}

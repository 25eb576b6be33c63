//! The operator socket's keys (docs/KEYS.md): make one (`POST /v1/keys`, the key shown
//! in this answer alone), list them with what each one's runs spent this UTC day
//! (`GET /v1/keys`), revoke one (`POST /v1/keys/{id}/revoke`); and a run's token again
//! (`GET /v1/runs/{run}/token`). With the proxy off there are no keys and no tokens:
//! `404 not_found`, saying so.

use std::sync::Arc;

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, Request, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::{get, post};
use axum::Router;
use tally_gate::{Caller, GateError};
use tally_proxy::keys::{KeyRingError, NewKey, DEFAULT_RUN_WINDOW_MS};
use tally_wire::{ErrorCode, KeyCreate, KeyCreated, KeyInfo, RunToken};

use crate::app::App;
use crate::error::ApiError;
use crate::gate_api::{body, json, path_run};
use crate::stage::gate_error;

type AppState = State<Arc<App>>;

/// The operator's keys and run tokens, added to `routes`.
pub(crate) fn routes(routes: Router<Arc<App>>) -> Router<Arc<App>> {
    routes
        .route("/v1/keys", post(create).get(list))
        .route("/v1/keys/{id}/revoke", post(revoke))
        .route("/v1/runs/{run}/token", get(token))
}

/// The operator, in process: it may read every run.
const OPERATOR: Caller = Caller {
    uid: None,
    operator: true,
    proxied: false,
};

fn no_proxy(what: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        ErrorCode::NotFound,
        format!("this daemon has no {what}: they come with the proxy (`tally serve --proxy-listen` or `--proxy-socket`)"),
    )
}

fn ring(app: &App) -> Result<&Arc<tally_proxy::KeyRing>, ApiError> {
    app.keys.as_ref().ok_or_else(|| no_proxy("keys"))
}

fn ring_error(e: KeyRingError) -> ApiError {
    match e {
        KeyRingError::Unknown(_) => {
            ApiError::new(StatusCode::NOT_FOUND, ErrorCode::NotFound, e.to_string())
        }
        KeyRingError::Label(_) => ApiError::new(
            StatusCode::BAD_REQUEST,
            ErrorCode::FieldTooLong,
            e.to_string(),
        )
        .field("label"),
        KeyRingError::Window => ApiError::new(
            StatusCode::BAD_REQUEST,
            ErrorCode::InvalidValue,
            e.to_string(),
        )
        .field("run_window_ms"),
        KeyRingError::DayLimitZero(field) => ApiError::new(
            StatusCode::BAD_REQUEST,
            ErrorCode::InvalidValue,
            e.to_string(),
        )
        .field(field),
        e => ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            ErrorCode::Internal,
            e.to_string(),
        ),
    }
}

/// `POST /v1/keys`: a new key, in this answer alone.
async fn create(State(app): AppState, request: Request) -> Result<Response, ApiError> {
    let ring = Arc::clone(ring(&app)?);
    let (parts, b) = request.into_parts();
    let asked: KeyCreate = body(&app, &parts.headers, b).await?;
    if !app.gate.policy().policy.principal_bounded(asked.principal) {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            ErrorCode::InvalidValue,
            format!(
                "uid {} has no principal budget in the policy: a key starts a run per task, \
                 so its uid needs [principals] spend or runs (docs/KEYS.md)",
                asked.principal
            ),
        )
        .field("principal"));
    }
    let mut new = NewKey::new(asked.principal);
    new.label = asked.label;
    new.run_window_ms = asked.run_window_ms.unwrap_or(DEFAULT_RUN_WINDOW_MS);
    new.budget_per_day_nanos = asked.budget_per_day_nanos;
    new.runs_per_day = asked.runs_per_day;
    let (info, key) = tokio::task::spawn_blocking(move || ring.create(new))
        .await
        .map_err(|e| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                ErrorCode::Internal,
                e.to_string(),
            )
        })?
        .map_err(ring_error)?;
    let created = KeyCreated {
        key: key.as_str().to_owned(),
        info,
    };
    Ok(json(StatusCode::CREATED, &created))
}

/// `POST /v1/keys/{id}/revoke`: the key refused from now on.
async fn revoke(
    State(app): AppState,
    id: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let ring = Arc::clone(ring(&app)?);
    let id = path_run(id)?;
    let info = tokio::task::spawn_blocking(move || ring.revoke(&id))
        .await
        .map_err(|e| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                ErrorCode::Internal,
                e.to_string(),
            )
        })?
        .map_err(ring_error)?;
    Ok(json(StatusCode::OK, &info))
}

/// `GET /v1/keys`: every key, with what its runs of this UTC day reserved or settled,
/// stopped runs too (read from the gate's durable state, which never lets one go).
async fn list(State(app): AppState) -> Result<Response, ApiError> {
    let ring = Arc::clone(ring(&app)?);
    let gate = Arc::clone(&app.gate);
    let keys = app
        .at_once(move || {
            let now = ring.now_ms();
            ring.list()
                .into_iter()
                .map(|mut k| {
                    let prefix = tally_proxy::keys::runs_today(&k.id, now);
                    let runs = gate.runs_named(&prefix)?;
                    let used = tally_proxy::keys::day_use(&runs, k.principal, now);
                    k.spend_today_nanos = used.held_nanos.saturating_add(used.settled_nanos);
                    Ok(k)
                })
                .collect::<Result<Vec<KeyInfo>, GateError>>()
        })
        .await
        .map_err(gate_error)?;
    Ok(json(StatusCode::OK, &keys))
}

/// `GET /v1/runs/{run}/token`: the run's token, as its start answered it.
async fn token(
    State(app): AppState,
    run: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let key = app
        .token_key
        .clone()
        .ok_or_else(|| no_proxy("run tokens"))?;
    let run = path_run(run)?;
    let gate = Arc::clone(&app.gate);
    let name = run.clone();
    // The run must be one the gate knows (the same refusal as GET /v1/runs/{run}).
    app.at_once(move || gate.run(OPERATOR, &name).map(|_| ()))
        .await
        .map_err(|e: GateError| gate_error(e))?;
    let token = key.mint(&run);
    Ok(json(StatusCode::OK, &RunToken { run, token }))
}

//! The HTTP API: routes and handlers. There is no route that updates, deletes or
//! rewinds anything.

use std::io::{self, Write};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tally_wire::ErrorCode;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use bytes::Bytes;
use tally_ledger::Error as LedgerError;
use tokio::sync::{mpsc, oneshot};

pub(crate) use crate::app::{
    read_body, App, Limits, Role, EXPORT_CHUNK, INLINE_PARSE_BYTES, MAX_EXPORTS,
};
use crate::error::ApiError;
use crate::limit::Peer;
use crate::parse::{parse_body, Framing};
use tally_api::wire::Health;

/// The router of one socket.
pub(crate) fn router(app: Arc<App>, role: Role) -> Router {
    let common = Router::new()
        .route("/v1/checkpoint", get(get_checkpoint))
        .route("/v1/health", get(get_health));
    let routes = match role {
        Role::Agent => crate::gate_api::agent_routes(common)
            .route("/v1/decisions", post(agents_may_not_append))
            .layer(axum::middleware::from_fn_with_state(
                Arc::clone(&app),
                agent_rate,
            )),
        Role::Operator => crate::page::routes(crate::tiles::log_routes(crate::keys_api::routes(
            crate::gate_api::operator_routes(common),
        )))
        .route("/v1/decisions", post(post_decisions))
        .route("/v1/export", get(get_export)),
    };
    routes
        .layer(Extension(role))
        .fallback(move |method: Method, uri: axum::http::Uri| async move {
            not_found(role, method, uri)
        })
        .method_not_allowed_fallback(move |method: Method, uri: axum::http::Uri| async move {
            method_not_allowed(role, method, uri)
        })
        .layer(axum::middleware::from_fn(tcp_guard))
        .with_state(app)
}

/// The per-peer rate limit on the agent socket: every POST (start, check, outcome,
/// stop: each one an append) pays one decision, before its body is read.
async fn agent_rate(
    State(app): State<Arc<App>>,
    request: Request,
    next: axum::middleware::Next,
) -> Response {
    if let (Some(rate), true) = (&app.rate, request.method() == Method::POST) {
        let peer = request
            .extensions()
            .get::<Peer>()
            .copied()
            .unwrap_or(Peer::Unknown);
        if let Err(secs) = rate.take(peer, 1) {
            app.observer.metrics.rate_limited();
            return rate_limited(secs).into_response();
        }
    }
    next.run(request).await
}

/// Over loopback TCP, any local program can connect, a web page in a local browser
/// included. Refuse what a browser sends: an `Origin` header (cross-site requests), a
/// `Host` that is not loopback (DNS rebinding), and a POST without an explicit JSON or
/// NDJSON content type (a "simple" request needs no preflight). The Unix socket, whose
/// peers are checked by file permissions, is not affected.
async fn tcp_guard(request: Request, next: axum::middleware::Next) -> Response {
    if request.extensions().get::<Peer>() == Some(&Peer::Tcp) {
        let headers = request.headers();
        let refuse = |why: &str| {
            ApiError::new(
                StatusCode::FORBIDDEN,
                ErrorCode::Forbidden,
                format!("{why}; use the Unix socket, or a client that is not a browser"),
            )
            .close()
            .into_response()
        };
        if headers.contains_key(header::ORIGIN) {
            return refuse(
                "requests with an Origin header (from a browser page) are refused over TCP",
            );
        }
        let host = headers
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .unwrap_or("");
        let name = match host.strip_prefix('[') {
            Some(v6) => v6.split(']').next().unwrap_or(""),
            None => host.split(':').next().unwrap_or(""),
        };
        if !matches!(name, "localhost" | "127.0.0.1" | "::1") {
            return refuse("the Host header must name the loopback address");
        }
        // A browser sends text/plain, form and multipart bodies without a preflight:
        // over TCP a POST must say it is JSON. Paths that take no POST go on to their
        // 405 with the methods they allow.
        let json = headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(|v| {
                v.split(';')
                    .next()
                    .unwrap_or("")
                    .trim()
                    .to_ascii_lowercase()
            })
            .is_some_and(|m| {
                matches!(
                    m.as_str(),
                    "application/json" | "application/x-ndjson" | "application/ndjson"
                )
            });
        let takes_post = allowed(Role::Agent, request.uri().path()).contains("POST");
        if request.method() == Method::POST && takes_post && !json {
            return ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                ErrorCode::UnsupportedMediaType,
                "over TCP, send Content-Type application/json or application/x-ndjson",
            )
            .close()
            .into_response();
        }
    }
    next.run(request).await
}

async fn agents_may_not_append() -> ApiError {
    ApiError::new(
        StatusCode::FORBIDDEN,
        ErrorCode::NotAuthorized,
        "agents do not append decisions: ask the gate with POST /v1/check (raw decisions go to the operator socket, for runs the gate does not govern)",
    )
}

/// No route here. A route of the other socket says so, and where it is: the operator's
/// routes on the agent socket are refused as the operator's (`403 not_authorized`, as
/// raw decisions are); the agents' on the operator socket are `404` naming the agent
/// socket.
fn not_found(role: Role, method: Method, uri: axum::http::Uri) -> ApiError {
    let path = uri.path();
    let tail = path.rsplit('/').next().unwrap_or("");
    let run_action = path.starts_with("/v1/runs/") && path.matches('/').count() == 4;
    match role {
        Role::Agent
            if matches!(path, "/v1/approvals" | "/v1/export" | "/v1/keys")
                || path.starts_with("/v1/approvals/")
                || path.starts_with("/v1/keys/")
                || (run_action && tail == "token")
                || crate::observe::operators_view(path)
                || (run_action && matches!(tail, "pause" | "resume" | "kill" | "settle")) =>
        {
            let how = match tail {
                "pause" | "resume" | "kill" | "settle" => {
                    let run = path.split('/').nth(3).unwrap_or("RUN");
                    format!(" (`tally {tail} --operator-socket PATH --run {run}`)")
                }
                "approvals" => " (`tally approve --operator-socket PATH ...`)".to_string(),
                "continuations" => {
                    " (`tally approve --new-run --operator-socket PATH ...`)".to_string()
                }
                "denials" => " (`tally deny --operator-socket PATH ...`)".to_string(),
                _ => String::new(),
            };
            ApiError::new(
                StatusCode::FORBIDDEN,
                ErrorCode::NotAuthorized,
                format!(
                    "{method} {path} is the operator's: it is served on the operator socket \
                     (`tally serve --operator-socket`, mode 0600), not on this agent socket{how}"
                ),
            )
        }
        Role::Operator
            if matches!(path, "/v1/check" | "/v1/outcome") || (run_action && tail == "stop") =>
        {
            ApiError::new(
                StatusCode::NOT_FOUND,
                ErrorCode::NotFound,
                format!(
                    "{method} {path} is the agents': it is served on the agent socket \
                     (`tally serve --socket`), not on this operator socket (the operator \
                     stops a run with POST /v1/runs/RUN/kill)"
                ),
            )
        }
        _ => ApiError::new(
            StatusCode::NOT_FOUND,
            ErrorCode::NotFound,
            format!("no route for {method} {path}; see docs/DAEMON.md"),
        ),
    }
}

/// The methods a path takes on a socket, for `Allow`.
fn allowed(role: Role, path: &str) -> &'static str {
    let tail = path.rsplit('/').next().unwrap_or("");
    let run_action = path.starts_with("/v1/runs/") && path.matches('/').count() == 4;
    match role {
        Role::Agent => match path {
            "/v1/runs" => "GET, HEAD, POST",
            "/v1/check" | "/v1/outcome" | "/v1/decisions" => "POST",
            _ if run_action && tail == "stop" => "POST",
            _ => "GET, HEAD",
        },
        Role::Operator => match path {
            "/v1/decisions" | "/v1/approvals/continuations" | "/v1/approvals/denials" => "POST",
            "/v1/approvals" | "/v1/keys" => "GET, HEAD, POST",
            _ if path.starts_with("/v1/keys/") => "POST",
            _ if run_action && matches!(tail, "pause" | "resume" | "kill" | "settle") => "POST",
            _ => "GET, HEAD",
        },
    }
}

fn method_not_allowed(role: Role, method: Method, uri: axum::http::Uri) -> Response {
    let path = uri.path();
    let allow = allowed(role, path);
    let mut response = ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        ErrorCode::MethodNotAllowed,
        format!(
            "{method} is not allowed on {}; the ledger is append-only (allowed: {allow})",
            uri.path()
        ),
    )
    .into_response();
    response
        .headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static(allow));
    response
}

fn framing(headers: &HeaderMap) -> Result<Framing, ApiError> {
    let Some(value) = headers.get(header::CONTENT_TYPE) else {
        return Ok(Framing::Json);
    };
    let value = value.to_str().unwrap_or("");
    let mime = value
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    match mime.as_str() {
        "application/json" => Ok(Framing::Json),
        "application/x-ndjson" | "application/ndjson" => Ok(Framing::Ndjson),
        _ => Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ErrorCode::UnsupportedMediaType,
            format!("content type `{value}` is not accepted; send application/json (one decision) or application/x-ndjson (one per line)"),
        )
        .close()),
    }
}

fn rate_limited(secs: u64) -> ApiError {
    let mut e = ApiError::new(
        StatusCode::TOO_MANY_REQUESTS,
        ErrorCode::RateLimited,
        format!("this client is over its decisions-per-second limit; retry after {secs} s"),
    );
    e.retry_after_secs = Some(secs);
    e.close()
}

async fn post_decisions(
    State(app): State<Arc<App>>,
    Extension(peer): Extension<Peer>,
    request: Request,
) -> Result<Json<Vec<tally_ledger::Receipt>>, ApiError> {
    let (parts, body) = request.into_parts();
    let framing = framing(&parts.headers)?;
    if let Some(rate) = &app.rate {
        // Refuse an over-limit client before reading its body. Every request pays one
        // token, so requests that fail to parse are not free; the rest is paid below.
        rate.take(peer, 1).map_err(rate_limited)?;
    }
    if let Some(why) = app.state.failure() {
        return Err(ApiError::unavailable(why));
    }
    // Read the whole body first (under the read timeout): a client that stalls holds
    // only its own connection, never one of the in-flight slots every append needs.
    let bytes = read_body(&app, &parts.headers, body).await?;
    // Backpressure: wait for an in-flight slot. It travels with the decisions into the
    // ledger and is released once they are committed or refused.
    let permit = Arc::clone(&app.in_flight)
        .acquire_owned()
        .await
        .map_err(|_| ApiError::unavailable("the daemon is shutting down"))?;
    let (prepared, permit) = prepare_bounded(&app, bytes, framing, permit).await?;
    let (runs, plaintexts) = prepared?;
    refuse_governed(&app, &runs).await?;
    if let Some(rate) = &app.rate {
        // The first decision was paid for above; a batch pays for the rest now.
        if plaintexts.len() > 1 {
            rate.take(peer, plaintexts.len() - 1)
                .map_err(rate_limited)?;
        }
    }
    // The names are taken: the gate will never start a run of one of them.
    let markers = runs.iter().map(|r| tally_gate::raw_run_entry(r)).collect();
    let answer = crate::commit::submit(&app.ledger, &app.state, plaintexts, markers, permit);
    match answer.await {
        Ok(Ok(receipts)) => Ok(Json(receipts)),
        Ok(Err(why)) => Err(ApiError::unavailable(why)),
        // The ledger always answers (an unanswered reply answers itself with an error).
        Err(_) => Err(ApiError::unavailable(
            app.state.fail("the ledger dropped a request unanswered"),
        )),
    }
}

/// [`prepare`] a body: a small one inline, a big one on the bulk pool under a big-parse
/// permit. The in-flight `permit` comes back with the result.
async fn prepare_bounded(
    app: &App,
    bytes: Bytes,
    framing: Framing,
    permit: tokio::sync::OwnedSemaphorePermit,
) -> Result<(Prepared, tokio::sync::OwnedSemaphorePermit), ApiError> {
    let max_batch = app.max_batch;
    if bytes.len() <= INLINE_PARSE_BYTES {
        return Ok((prepare(&bytes, framing, max_batch), permit));
    }
    let parsing = Arc::clone(&app.big_parses)
        .acquire_owned()
        .await
        .map_err(|_| ApiError::unavailable("the daemon is shutting down"))?;
    // The parse owns both permits: if the client hangs up meanwhile, they are
    // released when the parse ends, not before, so the bounds hold.
    app.bulk
        .run(move || {
            let prepared = prepare(&bytes, framing, max_batch);
            drop(parsing);
            (prepared, permit)
        })
        .await
        .map_err(|_| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                ErrorCode::Internal,
                "parsing the request body failed unexpectedly",
            )
        })
}

/// Refuse a batch that names a run the gate governs: those runs take decisions from the
/// gate alone (SECURITY.md 5.7).
async fn refuse_governed(
    app: &App,
    runs: &std::collections::BTreeSet<String>,
) -> Result<(), ApiError> {
    let gate = Arc::clone(&app.gate);
    let names = runs.clone();
    let governed = app
        .at_once(move || {
            for run in names {
                if gate.governs(&run)? {
                    return Ok(Some(run));
                }
            }
            Ok(None)
        })
        .await
        .map_err(crate::stage::gate_error)?;
    if let Some(run) = governed {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            ErrorCode::GovernedRun,
            format!("run `{run}` is governed by the gate: its decisions come from the gate alone (POST /v1/check on the agent socket)"),
        ));
    }
    Ok(())
}

/// A prepared body: the runs it names and the plaintexts, or why it is refused.
type Prepared = Result<(std::collections::BTreeSet<String>, Vec<Vec<u8>>), ApiError>;

/// Parse, validate and encode a body: the runs it names and the plaintexts.
fn prepare(
    bytes: &[u8],
    framing: Framing,
    max_batch: usize,
) -> Result<(std::collections::BTreeSet<String>, Vec<Vec<u8>>), ApiError> {
    let parsed = parse_body(bytes, framing, max_batch)?;
    // The state version orders a fleet's ledgers for the auditor: the gate's alone.
    if let Some(index) = parsed
        .decisions
        .iter()
        .position(|d| d.state_version.is_some())
    {
        let line = parsed.lines.as_ref().and_then(|l| l.get(index).copied());
        let at = line.map(|l| format!("line {l}: ")).unwrap_or_default();
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            ErrorCode::FieldNotAllowed,
            format!("{at}`state_version` is written by the gate alone; leave it out of appended decisions"),
        )
        .field("state_version")
        .line(line));
    }
    let runs = parsed.decisions.iter().map(|d| d.run.clone()).collect();
    let plaintexts = tally_ledger::ledger::prepare(parsed.decisions).map_err(|e| match e {
        LedgerError::Decision(d) => ApiError::decision(&d),
        LedgerError::InBatch { index, source } => {
            let line = parsed.lines.as_ref().and_then(|l| l.get(index).copied());
            let mut error = ApiError::decision(&source).line(line);
            if let Some(line) = line {
                error.detail.message = format!("line {line}: {}", error.detail.message);
            }
            error
        }
        other => ApiError::new(
            StatusCode::BAD_REQUEST,
            ErrorCode::InvalidDecision,
            other.to_string(),
        ),
    })?;
    Ok((runs, plaintexts))
}

async fn get_checkpoint(State(app): State<Arc<App>>) -> Response {
    let text = app.ledger.checkpoint().to_text();
    ([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], text).into_response()
}

async fn get_health(State(app): State<Arc<App>>) -> Result<Json<Health>, ApiError> {
    if let Some(why) = app.state.failure().or_else(|| app.gate.failure()) {
        return Err(ApiError::unavailable(why));
    }
    let checkpoint = app.ledger.checkpoint();
    Ok(Json(Health {
        status: "ok".into(),
        ledger_id: app.ledger.id().to_string(),
        size: checkpoint.size,
        epoch: checkpoint.epoch,
        in_flight: app.max_in_flight - app.in_flight.available_permits(),
    }))
}

async fn get_export(State(app): State<Arc<App>>) -> Result<Response, ApiError> {
    let permit = tokio::time::timeout(app.read_timeout, Arc::clone(&app.exports).acquire_owned())
        .await
        .map_err(|_| ApiError::unavailable("too many exports in progress; retry later"))?
        .map_err(|_| ApiError::unavailable("the daemon is shutting down"))?;
    let stall = app.read_timeout;
    let runtime = tokio::runtime::Handle::current();
    let (tx, rx) = mpsc::channel::<io::Result<Bytes>>(4);
    let (size_tx, size_rx) = oneshot::channel();
    let ledger = Arc::clone(&app.ledger);
    tokio::task::spawn_blocking(move || {
        let (snapshot, root) = ledger.sealed_snapshot();
        let _ = size_tx.send(snapshot.size());
        let chunks = Chunks {
            tx: tx.clone(),
            buf: Vec::with_capacity(EXPORT_CHUNK),
            stall,
            runtime,
        };
        // Signed at its end by the log key, with the latest cosigned checkpoint in it.
        let written = (|| {
            let cosigned = tally_ledger::tlog::read_cosigned_at(ledger.dir(), snapshot.size())
                .map_err(io::Error::other)?;
            let seal = tally_ledger::export::Seal {
                ledger: ledger.id(),
                key: ledger.log_key(),
                root,
                cosigned,
            };
            let (mut out, _) = tally_ledger::export::write_export_to(snapshot, chunks, Some(seal))
                .map_err(io::Error::other)?;
            out.flush()
        })();
        if let Err(e) = written {
            // The body ends in an error: the client sees a torn export, never a short
            // one that looks complete (an export without its end frame is refused).
            // Best effort: a client that stopped reading must not hold this thread.
            let _ = tx.try_send(Err(e));
        }
        // Release the ledger before the slot: shutdown waits on the slots, then the
        // ledger's lock must be free.
        drop(ledger);
        drop(permit);
    });
    let size = size_rx.await.map_err(|_| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            ErrorCode::Internal,
            "export task ended early",
        )
    })?;
    let mut response = Body::new(ExportBody { rx }).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    headers.insert(
        header::CONTENT_DISPOSITION,
        HeaderValue::from_static("attachment; filename=\"ledger.tally\""),
    );
    headers.insert("x-tally-snapshot-size", HeaderValue::from(size));
    Ok(response)
}

/// `Write` into the export body's channel, in chunks.
struct Chunks {
    tx: mpsc::Sender<io::Result<Bytes>>,
    buf: Vec<u8>,
    /// A client that takes no chunk for this long is dropped (its export is torn), so a
    /// reader that stalls cannot hold an export slot, or shutdown, for ever.
    stall: Duration,
    runtime: tokio::runtime::Handle,
}

impl Chunks {
    fn send(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = Bytes::from(std::mem::replace(
            &mut self.buf,
            Vec::with_capacity(EXPORT_CHUNK),
        ));
        match self
            .runtime
            .block_on(tokio::time::timeout(self.stall, self.tx.send(Ok(chunk))))
        {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "export client went away",
            )),
            Err(_) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "export client stopped reading",
            )),
        }
    }
}

impl Write for Chunks {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.buf.extend_from_slice(data);
        if self.buf.len() >= EXPORT_CHUNK {
            self.send()?;
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.send()
    }
}

/// The streamed export body.
struct ExportBody {
    rx: mpsc::Receiver<io::Result<Bytes>>,
}

impl http_body::Body for ExportBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<io::Result<http_body::Frame<Bytes>>>> {
        self.rx
            .poll_recv(cx)
            .map(|chunk| chunk.map(|r| r.map(http_body::Frame::data)))
    }
}

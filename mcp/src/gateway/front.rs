//! The gateway's HTTP front. Every connection takes a place of the connection bound
//! first ([`super::conns`]: one over it is answered 503, unread). Every request: its
//! credential first (401, nothing else done, without one), then its body, bounded (413
//! on its `Content-Length`, before any of it is read), classified by
//! [`crate::classify`] (a refused one is answered with a JSON-RPC error and never
//! passed on). A request without `Mcp-Session-Id` opens a session only if it is an
//! `initialize` (anything else is a 400 and starts nothing), within the bound on open
//! sessions (503 beyond it); a session id the gateway does not hold open is a 404, one
//! another credential opened a 403, one whose `MCP-Protocol-Version` header is not the
//! session's a 400. What passes goes to rmcp's Streamable HTTP service. Sessions idle
//! past the bound are closed, on a timer and before each `initialize`, as a DELETE
//! would close them. At the stop: nothing more opened, the `initialize`s being answered
//! finished, every session closed, every run hold given back and every stop made, then
//! the servers stopped.

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONNECTION, CONTENT_LENGTH, CONTENT_TYPE, WWW_AUTHENTICATE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::session::SessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use serde_json::json;

use super::admit::{Refusal, Unread};
use super::conns::Connections;
use super::ends::EndsAtAnswer;
use super::runs::{Hold, NotHeld, Runs};
use super::servers::Backend;
use super::session::{Classified, Opening, RunOf, Session, Shared};
use super::table::{Found, NoPlace, Place, Table};
use super::{Credentials, GatewayLimits, GatewayOptions, NotOpened};
use crate::call::Asker;
use crate::classify::{self, Message, Why};

/// MCP's session header.
const SESSION: &str = "mcp-session-id";
/// The most request headers read, and the most bytes of them.
const MAX_HEADERS: usize = 64;
const MAX_HEAD_BYTES: usize = 64 * 1024;
/// Request headers must arrive within this.
const HEAD_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// How long the gateway's stop waits for the `initialize`s being answered, then for the
/// runs its sessions held to be given back and stopped.
const SHUTDOWN_BOUND: std::time::Duration = std::time::Duration::from_secs(10);

/// How many times an `initialize` reads its credential's run when the run's stop is under
/// way or a stop was recorded while it was read.
const OPEN_READS: usize = 3;

type Body = BoxBody<Bytes, Infallible>;

struct Front {
    credentials: Arc<dyn Credentials>,
    service: StreamableHttpService<Session, LocalSessionManager>,
    manager: Arc<LocalSessionManager>,
    shared: Arc<Shared>,
    table: Arc<Table>,
    runs: Arc<Runs>,
    limits: GatewayLimits,
    connections: Connections,
    /// Told of each `initialize` refused over a bound on sessions.
    on_session_refused: Arc<dyn Fn(super::SessionBound) + Send + Sync>,
}

pub(super) async fn serve(
    listener: tokio::net::TcpListener,
    options: GatewayOptions,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let hidden_env: Arc<[String]> = options.hidden_env.into();
    let runs = Arc::new(Runs::new(options.worker.clone()));
    let shared = Arc::new(Shared {
        backends: options
            .servers
            .into_iter()
            .map(|s| Backend::new(s, Arc::clone(&hidden_env)))
            .collect(),
        asker: Asker {
            worker: options.worker,
            credential: None,
        },
    });
    let mut manager = LocalSessionManager::default();
    // The front closes idle sessions itself, on its clock.
    manager.session_config.keep_alive = None;
    let manager = Arc::new(manager);
    let cancel = tokio_util::sync::CancellationToken::new();
    let config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(true)
        // The front bounds bodies (413): rmcp's own bound no lower.
        .with_max_request_body_bytes(options.limits.max_body_bytes)
        .with_cancellation_token(cancel.child_token());
    let factory = Arc::clone(&shared);
    let service = StreamableHttpService::new(
        move || Ok(Session::new(Arc::clone(&factory))),
        Arc::clone(&manager),
        config,
    );
    let limits = options.limits;
    let front = Arc::new(Front {
        credentials: options.credentials,
        service,
        manager,
        shared,
        table: Arc::new(Table::new(
            (limits.max_sessions, limits.max_sessions_per_credential),
            limits.idle,
            options.clock,
        )),
        runs,
        limits,
        connections: Connections::new(limits.max_connections, options.on_refused),
        on_session_refused: options.on_session_refused,
    });
    let sweeper = tokio::spawn(Arc::clone(&front).sweep_every());
    front.accept(listener, shutdown).await;
    sweeper.abort();
    front.close().await;
    // What is left of rmcp's sessions ends: their holds on runs are given back.
    cancel.cancel();
    front.settle().await;
    Ok(())
}

fn answer(status: StatusCode, body: String) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(body)).boxed());
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

/// A JSON-RPC error with no id, under an HTTP status (what MCP's clients read).
fn rpc_error(status: StatusCode, code: i64, why: &str) -> Response<Body> {
    answer(
        status,
        crate::reply::error(
            &serde_json::Value::Null,
            code,
            &format!("tally's MCP gateway: {why}"),
            None,
        ),
    )
}

fn refused(r: Refusal) -> Response<Body> {
    rpc_error(r.status, r.code, &r.why)
}

fn unauthorized(why: &str) -> Response<Body> {
    let mut r = answer(
        StatusCode::UNAUTHORIZED,
        json!({"error": format!("tally's MCP gateway: {why}")}).to_string(),
    );
    r.headers_mut()
        .insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    r
}

impl Front {
    /// Accept connections until `shutdown` resolves.
    async fn accept(
        self: &Arc<Self>,
        listener: tokio::net::TcpListener,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) {
        tokio::pin!(shutdown);
        loop {
            let (stream, _) = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        crate::log(&format!("gateway: accept failed: {e}"));
                        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                        continue;
                    }
                },
                () = &mut shutdown => return,
            };
            // An answer is written in several pieces (headers, SSE events): without this,
            // Nagle's algorithm holds the last one for the client's delayed ACK (~40 ms).
            let _ = stream.set_nodelay(true);
            let Some(place) = self.connections.place() else {
                self.connections.refuse(stream);
                continue;
            };
            let front = Arc::clone(self);
            tokio::spawn(async move {
                // Held while the connection is open.
                let _place = place;
                let service = hyper::service::service_fn(move |req| {
                    let front = Arc::clone(&front);
                    async move { Ok::<_, Infallible>(Front::handle(front, req).await) }
                });
                // The header timer also runs while a kept-alive connection waits for its
                // next request (hyper arms it again each time the connection goes idle):
                // an idle connection, or one that never sends anything, is closed after
                // HEAD_TIMEOUT and gives its place back.
                let _ = hyper::server::conn::http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(HEAD_TIMEOUT)
                    .max_headers(MAX_HEADERS)
                    .max_header_size(MAX_HEAD_BYTES)
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    }

    async fn handle(self: Arc<Self>, req: Request<Incoming>) -> Response<Body> {
        let holder = match self.credentials.holder(req.headers()) {
            Ok(h) => h,
            Err(why) => return unauthorized(&why.to_string()),
        };
        let session = req
            .headers()
            .get(SESSION)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        if let Some(r) = super::admit::unsupported_version(req.headers()) {
            return refused(r);
        }
        let (parts, body) = req.into_parts();
        let bytes = match self.body(&parts, body).await {
            Ok(b) => b,
            Err(refused) => return refused,
        };
        match session {
            Some(s) => self.in_session(&s, &holder, parts, bytes).await,
            None if parts.method != Method::POST => no_session(),
            // Its own task: once a key's run may start, the session is opened (and
            // held in the table, where the idle bound closes it and stops the run)
            // even if the client goes away before its answer.
            None => {
                let value = match self.read(None, &bytes) {
                    Ok(v) => v,
                    Err(refused) => return *refused,
                };
                tokio::spawn(async move { self.open(holder, parts, (bytes, value)).await })
                    .await
                    .unwrap_or_else(|e| {
                        rpc_error(
                            StatusCode::INTERNAL_SERVER_ERROR,
                            -32603,
                            &format!("opening the session failed: {e}"),
                        )
                    })
            }
        }
    }

    /// A POST's body read strictly ([`super::admit::read_body`]) in `session` (if the
    /// holder's): its value, or the answer refusing it (one that is not JSON gets the
    /// classifier's verdict, counted in the session).
    fn read(
        &self,
        session: Option<&str>,
        bytes: &Bytes,
    ) -> Result<serde_json::Value, Box<Response<Body>>> {
        match super::admit::read_body(bytes) {
            Ok(v) => Ok(v),
            Err(Unread::Versioned(r)) => Err(Box::new(refused(r))),
            Err(Unread::NotJson(why)) => {
                let verdict = classify::classify(bytes)
                    .err()
                    .unwrap_or(classify::Refused {
                        why,
                        answer: Vec::new(),
                    });
                Err(Box::new(self.refuse(session, verdict)))
            }
        }
    }

    /// A POST's body, at most the bound (a larger `Content-Length` refused unread),
    /// within the time bound (408 past it); nothing for the other methods.
    async fn body(
        &self,
        parts: &hyper::http::request::Parts,
        body: Incoming,
    ) -> Result<Bytes, Response<Body>> {
        if parts.method != Method::POST {
            return Ok(Bytes::new());
        }
        let max = self.limits.max_body_bytes;
        let too_large = || {
            rpc_error(
                StatusCode::PAYLOAD_TOO_LARGE,
                -32600,
                &format!(
                    "a request body is at most {max} bytes (tally serve --mcp-max-body-bytes)"
                ),
            )
        };
        let declared = parts
            .headers
            .get(CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n > max as u64) {
            return Err(too_large());
        }
        let within = self.limits.body_timeout;
        match tokio::time::timeout(within, Limited::new(body, max).collect()).await {
            Ok(Ok(b)) => Ok(b.to_bytes()),
            Ok(Err(_)) => Err(too_large()),
            Err(_) => {
                let mut r = rpc_error(
                    StatusCode::REQUEST_TIMEOUT,
                    -32600,
                    &format!(
                        "the request body did not arrive within {}; the connection is closed",
                        tally_record::words::duration(within.as_millis() as u64)
                    ),
                );
                r.headers_mut()
                    .insert(CONNECTION, HeaderValue::from_static("close"));
                Err(r)
            }
        }
    }

    /// A request in session `id`: the holder's own session only.
    async fn in_session(
        &self,
        id: &str,
        holder: &str,
        mut parts: hyper::http::request::Parts,
        bytes: Bytes,
    ) -> Response<Body> {
        let run = match self.table.find(id, holder) {
            Found::Yours(run, version) => {
                // A version other than the session's is refused here, not by rmcp.
                if let Some(r) = super::admit::session_version(&parts.headers, version.as_deref()) {
                    return refused(r);
                }
                run
            }
            Found::Unknown => {
                return rpc_error(
                    StatusCode::NOT_FOUND,
                    -32001,
                    "no such session (never opened, closed, or idle too long): send initialize without Mcp-Session-Id to open a new one",
                )
            }
            Found::Another => {
                return answer(
                    StatusCode::FORBIDDEN,
                    json!({"error": "tally's MCP gateway: this session belongs to another credential"}).to_string(),
                )
            }
        };
        let mut requests = None;
        if parts.method == Method::POST {
            match self.read(Some(id), &bytes) {
                Ok(body) => requests = super::ends::requests(&body),
                Err(refused) => return *refused,
            }
            if let Some(refused) = self.classified(Some(id), &bytes, &mut parts) {
                return refused;
            }
        }
        parts.extensions.insert(RunOf(run));
        let deleting = parts.method == Method::DELETE;
        let mut response = self
            .service
            .handle(Request::from_parts(parts, Full::new(bytes)))
            .await;
        if deleting && response.status().is_success() {
            // The session is gone: 200, what MCP's clients read as a completed DELETE.
            *response.status_mut() = StatusCode::OK;
            self.table.remove(id);
        }
        if let Some(requests) = requests.filter(|_| is_event_stream(&response)) {
            // A POST's stream answers its requests (one: batches are refused above):
            // ended with their answers, the connection is kept for the client's next
            // request.
            return response.map(|b| EndsAtAnswer::new(b, requests).boxed());
        }
        response
    }

    /// A request without a session: an `initialize` opens one (its credential's run
    /// started or continued then, and only then); anything else is refused, nothing
    /// started.
    async fn open(
        &self,
        holder: String,
        parts: hyper::http::request::Parts,
        (bytes, value): (Bytes, serde_json::Value),
    ) -> Response<Body> {
        if let Some(r) = self.not_an_initialize(&bytes, &parts.headers, &value) {
            return r;
        }
        self.expire().await;
        let place = match self.place(&holder) {
            Ok(place) => place,
            Err(r) => return *r,
        };
        let (run, hold) = match self.held_run(&parts.headers).await {
            Ok(held) => held,
            Err(r) => return *r,
        };
        self.initialized(holder, parts, bytes, (run, hold), place)
            .await
    }

    /// The refusal of a request without a session that is not an `initialize` the
    /// transport takes, or none.
    fn not_an_initialize(
        &self,
        bytes: &Bytes,
        headers: &hyper::HeaderMap,
        value: &serde_json::Value,
    ) -> Option<Response<Body>> {
        match classify::classify(bytes) {
            Ok(c)
                if matches!(
                    c.message,
                    Message::Request {
                        method: "initialize",
                        ..
                    }
                ) => {}
            Ok(_) => return Some(no_session()),
            Err(refused) => return Some(self.refuse(None, refused)),
        }
        super::admit::refusal(headers)
            .or_else(|| super::admit::initialize_refusal(headers, value))
            .map(refused)
    }

    /// A place for `holder`'s new session, within the bounds on sessions (a refusal over
    /// one is told to the gateway's owner).
    fn place(&self, holder: &str) -> Result<Place, Box<Response<Body>>> {
        self.table.reserve(holder).map_err(|e| {
            let (bound, status, why) = match e {
                NoPlace::Gateway => (
                    Some(super::SessionBound::Gateway),
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!(
                        "{} sessions are open, as many as this gateway holds (tally serve --mcp-max-sessions): close one (DELETE) or retry later",
                        self.limits.max_sessions
                    ),
                ),
                NoPlace::Holder => (
                    Some(super::SessionBound::Credential),
                    StatusCode::TOO_MANY_REQUESTS,
                    format!(
                        "this credential holds {} sessions open, as many as one may (tally serve --mcp-max-sessions-per-credential): close one (DELETE) or wait for one to be idle too long",
                        self.limits.max_sessions_per_credential
                    ),
                ),
                NoPlace::Closing => (
                    None,
                    StatusCode::SERVICE_UNAVAILABLE,
                    "this gateway is stopping: nothing is opened".to_owned(),
                ),
            };
            if let Some(bound) = bound {
                (self.on_session_refused)(bound);
            }
            Box::new(rpc_error(status, -32000, &why))
        })
    }

    /// The credential's run, started or continued, and a hold on it. A run whose stop
    /// is under way (its last session just ended) is read again once the stop is
    /// recorded, and so is a run read as running before a stop was recorded: a new
    /// session never acts in a run stopped under it (a stopped key run is a 409).
    async fn held_run(
        &self,
        headers: &hyper::HeaderMap,
    ) -> Result<(super::Authorized, Hold), Box<Response<Body>>> {
        for _ in 0..OPEN_READS {
            let seen = self.runs.stops();
            let run = match self.credentials.open(headers.clone()).await {
                Ok(run) => run,
                Err(NotOpened::Credential(why)) => {
                    return Err(Box::new(unauthorized(&why.to_string())))
                }
                Err(why) => {
                    return Err(Box::new(rpc_error(why.status(), -32000, &why.to_string())))
                }
            };
            match self.runs.hold(run.clone(), seen) {
                Ok(hold) => return Ok((run, hold)),
                Err(NotHeld::Stopping) => {
                    self.runs.stop_recorded(&run.run, SHUTDOWN_BOUND).await;
                }
                Err(NotHeld::Stale) => {}
            }
        }
        Err(Box::new(rpc_error(
            StatusCode::SERVICE_UNAVAILABLE,
            -32000,
            "the credential's run was being stopped while this session opened: retry initialize",
        )))
    }

    /// The `initialize` answered by rmcp with the run held; the session it opened put in
    /// its `place`.
    async fn initialized(
        &self,
        holder: String,
        mut parts: hyper::http::request::Parts,
        bytes: Bytes,
        (run, hold): (super::Authorized, Hold),
        place: Place,
    ) -> Response<Body> {
        // The run is held from here: by the session, once its initialize takes it.
        let opening = Arc::new(Opening::new(hold));
        parts.extensions.insert(RunOf(run.clone()));
        parts.extensions.insert(Arc::clone(&opening));
        let response = self
            .service
            .handle(Request::from_parts(parts, Full::new(bytes)))
            .await;
        // rmcp refused it after all (a weight of 0 in Accept, say), or its session did
        // not take the hold: given back here (the run stopped if it was the last).
        let untaken = opening.take();
        if let Some(id) = response
            .headers()
            .get(SESSION)
            .and_then(|v| v.to_str().ok())
        {
            let bound = (holder, run, opening.negotiated());
            if !self.table.insert(id.to_owned(), bound, place) {
                // The gateway stopped while it was answered: closed at once.
                let _ = self.manager.close_session(&Arc::from(id)).await;
            }
        }
        drop(untaken);
        response
    }

    /// A POST body in a session classified: the answer refusing it, or none (it
    /// passes; a call's reading put in `parts` for the session).
    fn classified(
        &self,
        session: Option<&str>,
        bytes: &Bytes,
        parts: &mut hyper::http::request::Parts,
    ) -> Option<Response<Body>> {
        match classify::classify(bytes) {
            Ok(c) => match c.message {
                Message::Call { call, .. } => {
                    parts.extensions.insert(Classified(call));
                    None
                }
                // The gateway asks clients nothing (no sampling, elicitation or roots):
                // an answer answers no request of its own.
                Message::Response { .. } => {
                    let refused = classify::Refused {
                        why: Why::UnexpectedAnswer,
                        answer: Vec::new(),
                    };
                    Some(self.refuse(session, refused))
                }
                // A session is opened once: its initialize is not run again.
                Message::Request {
                    method: "initialize",
                    ..
                } => Some(rpc_error(
                    StatusCode::BAD_REQUEST,
                    -32600,
                    "Bad Request: this session is initialized already: initialize without Mcp-Session-Id opens a new one",
                )),
                _ => None,
            },
            Err(refused) => Some(self.refuse(session, refused)),
        }
    }

    /// A message the classifier refused: a JSON-RPC error under its id (200, so that a
    /// client reads it as the answer to its request), or 400 when it has no usable id.
    fn refuse(&self, session: Option<&str>, refused: classify::Refused) -> Response<Body> {
        let count = self.table.refused(session);
        crate::log(&format!(
            "gateway: refused a message from a client, not passed on ({count} refused so far in its session): {}",
            refused.why
        ));
        match refused.answer.as_slice() {
            [id] => answer(
                StatusCode::OK,
                crate::reply::refused(id, &refused.why, count),
            ),
            _ => answer(StatusCode::BAD_REQUEST, no_id(&refused.why, count)),
        }
    }

    /// Close the sessions idle past the bound: each as a DELETE would (a run its
    /// `initialize` started is stopped).
    async fn expire(&self) {
        for id in self.table.expired() {
            let _ = self.manager.close_session(&Arc::from(id.as_str())).await;
            crate::log(&format!(
                "gateway: a session was idle for {}, closed",
                tally_record::words::duration(self.limits.idle.as_millis() as u64)
            ));
        }
    }

    /// [`Front::expire`] on a timer: a clock reading every so often (at most a second,
    /// at least every tenth of the idle bound).
    async fn sweep_every(self: Arc<Self>) {
        let every = (self.limits.idle / 10).clamp(
            std::time::Duration::from_millis(10),
            std::time::Duration::from_secs(1),
        );
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            self.expire().await;
        }
    }

    /// The gateway stops: nothing more opened, the `initialize`s being answered
    /// finished (a session one opens from now on is closed at once), every session
    /// closed.
    async fn close(&self) {
        let open = self.table.close();
        let answering = self.table.answered(SHUTDOWN_BOUND).await;
        if answering > 0 {
            crate::log(&format!("gateway: stopping with {answering} initialize(s) still unanswered after {SHUTDOWN_BOUND:?}"));
        }
        for id in open {
            let _ = self.manager.close_session(&Arc::from(id.as_str())).await;
        }
    }

    /// Every hold on a run given back and every stop made (bounded), then every server
    /// let go for good (a stdio one killed and reaped, none started again), then the
    /// holds of the calls that were still in flight (their servers gone, they end at
    /// once; one in its gate check ends at the gate's timeout) waited for once more,
    /// bounded.
    async fn settle(&self) {
        let left = self.runs.settled(SHUTDOWN_BOUND).await;
        futures::future::join_all(self.shared.backends.iter().map(|b| b.shut())).await;
        if left == 0 {
            return;
        }
        let left = self.runs.settled(SHUTDOWN_BOUND).await;
        if left > 0 {
            crate::log(&format!("gateway: stopping with {left} run hold(s) or stop(s) not done after twice {SHUTDOWN_BOUND:?}: their runs are left as they are"));
        }
    }
}

/// Whether a response is an SSE stream.
fn is_event_stream(response: &Response<Body>) -> bool {
    response
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"))
}

/// The answer to a request without a session that is not an `initialize`.
fn no_session() -> Response<Body> {
    rpc_error(
        StatusCode::BAD_REQUEST,
        -32600,
        "Bad Request: no Mcp-Session-Id; a session is opened by initialize, and only initialize is answered without one",
    )
}

/// The error for a refused message with no id to answer under (a notification, an
/// answer, a message with no usable id, a batch).
fn no_id(why: &Why, count: u64) -> String {
    crate::reply::error(
        &serde_json::Value::Null,
        why.rpc_code(),
        &format!("tally's MCP gateway refused this message and did not pass it on: {why}"),
        Some(json!({"tally/refused": {"reason": why.code(), "count": count}})),
    )
}

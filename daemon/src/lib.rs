//! tally's daemon: the one process that owns a ledger, serving an HTTP/1.1 JSON API on
//! an agent socket (and optionally TCP loopback), where agents in any language ask the
//! gate (start, check, outcome, stop) and the gate records each decision, and on an
//! operator socket (mode 0600). Agents never append decisions themselves and never touch
//! the store.
//!
//! * `POST /v1/decisions` (operator socket only; 403 on the agent socket): one JSON
//!   decision, or NDJSON for a batch, for runs the gate does not govern. The reply
//!   `[{"seq", "hash"}]` is sent only after the decisions are durable and sealed by a
//!   signed checkpoint; a batch is atomic.
//! * `GET /v1/runs/{run}`, `GET /v1/checkpoint`, `GET /v1/health`, `GET /v1/export`
//!   (a consistent `tally export v2` snapshot while appends go on).
//! * No route updates, deletes or rewinds anything.
//!
//! Errors are typed JSON ([`tally_api::wire::ErrorReply`]). When the ledger cannot write, every
//! append gets 503 and nothing is acknowledged (fail closed). Concurrent requests share
//! the ledger's group commits; connections and in-flight appends are bounded (excess
//! waits: backpressure), bodies are size-limited, slow clients time out, and an optional
//! per-peer rate limit keeps one client from starving the rest.
//!
//! SIGTERM or SIGINT ([`run`]) stops accepting, drains in-flight requests and removes the
//! socket. Every commit already seals a checkpoint, so the last acknowledged decision is
//! sealed when the daemon exits; no key rotation happens at shutdown. A restart continues
//! the chain. Rust agents use `tally_api::GateClient`. See `docs/DAEMON.md`.
#![forbid(unsafe_code)]

pub mod access;
mod api;
mod app;
mod bulk;
mod commit;
pub mod error;
#[doc(hidden)]
pub mod fuzzing;
mod gate_api;
mod keys_api;
mod limit;
mod mcp_auth;
mod mcp_gateway;
pub use url_files::check_url_files;
mod notify;
mod observe;
mod options;
mod page;
mod parse;
mod peers;
mod secret_file;
mod server;
mod stage;
mod tasks;
mod tiles;
mod url_files;
mod view;
pub mod witness;

use std::future::Future;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tally_ledger::clock::Clock;
use tally_ledger::Ledger;

pub use error::DaemonError;
pub use notify::{
    NotifyOptions, MIN_SECRET as MIN_NOTIFY_SECRET, SIGNATURE_HEADER as NOTIFY_SIGNATURE_HEADER,
};
/// The ratio of root spans sampled when `ServeOptions::otlp_sample` is not set.
pub use observe::trace::DEFAULT_SAMPLE as DEFAULT_OTLP_SAMPLE;
pub use observe::LogFormat;
pub use options::{ObserveOptions, RequestLimits, ServeOptions, WitnessOptions};
/// Builds the gate over the open ledger and the policy: how a caller (the CLI) gives the
/// daemon a gate whose state lives elsewhere, such as a fleet's PostgreSQL database. The
/// daemon links no backend of its own but the ledger's embedded store.
pub type OpenGate = Arc<
    dyn Fn(
            Arc<Ledger>,
            tally_policy::Recorded,
            Arc<dyn Clock>,
        ) -> Result<Arc<dyn tally_gate::Gatekeeper>, String>
        + Send
        + Sync,
>;

/// A gate whose state is shared with other daemons ([`ServeOptions::state`]).
#[derive(Clone)]
pub struct SharedState {
    /// Opens the gate (called once, on a thread of its own: a backend may block).
    pub open: OpenGate,
    /// The longest a decision may wait on the shared state before it is refused (the
    /// backend's own bound): the daemon's queue is bounded by it.
    pub timeout: Duration,
    /// What the start line says of it (never a connection string: it may hold a
    /// password), e.g. `gate state in PostgreSQL, shared`.
    pub label: String,
}

impl std::fmt::Debug for SharedState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedState")
            .field("timeout", &self.timeout)
            .field("label", &self.label)
            .finish_non_exhaustive()
    }
}

/// The proxy's per-peer connection count: its own, apart from the agent socket's.
fn proxy_admit(per_peer: usize) -> tally_proxy::Admit {
    let per_peer = if per_peer == 0 {
        DEFAULT_PROXY_CONNECTIONS_PER_PEER
    } else {
        per_peer
    };
    let peers = peers::PeerConnections::new(per_peer);
    Arc::new(move |peer: tally_proxy::Peer| {
        peers
            .try_open(peer)
            .map(|slot| Box::new(slot) as Box<dyn Send>)
    })
}

/// Where and with which secrets `tally serve` runs the proxy.
#[derive(Clone, Default)]
#[non_exhaustive]
pub struct ProxyServe {
    /// Loopback TCP address (`--proxy-listen`).
    pub listen: Option<SocketAddr>,
    /// Unix socket (`--proxy-socket`), with the agent socket's mode and group.
    pub socket: Option<PathBuf>,
    /// Each upstream credential's secret, by name (`--credential NAME=FILE`).
    pub credentials: std::collections::BTreeMap<String, tally_proxy::Secret>,
    /// Open proxy connections one peer may hold (a uid on the proxy's Unix socket; all
    /// loopback TCP clients together), counted apart from the agent socket's; one more
    /// is answered `429 too_many_connections` and closed. `0` means the default,
    /// [`DEFAULT_PROXY_CONNECTIONS_PER_PEER`].
    pub max_connections_per_peer: usize,
    /// A proxied request's headers, and then its whole body, must each arrive within
    /// this time, or the connection is closed (a body too slow is answered 408 first,
    /// and recorded like a body too large): a client that announces a body and stalls
    /// holds its place no longer. Zero means the default,
    /// [`tally_proxy::DEFAULT_READ_TIMEOUT`] (10 s).
    pub read_timeout: Duration,
}

/// The proxy's default connections per peer: a model call can hold its connection for
/// the length of a stream, so an agent with many calls in flight needs many, but one
/// peer must not hold them all.
pub const DEFAULT_PROXY_CONNECTIONS_PER_PEER: usize = 64;

impl std::fmt::Debug for ProxyServe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the secrets.
        f.debug_struct("ProxyServe")
            .field("listen", &self.listen)
            .field("socket", &self.socket)
            .field("credentials", &self.credentials.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// Open the ledger in `options.ledger`, serve until SIGTERM or SIGINT, drain, and
/// return. Blocking: builds its own tokio runtime. The ledger (and its lock) is
/// released when this returns.
///
/// This is `tally serve`: it writes one line to stderr once it listens (sockets, ledger,
/// policy digest, limits) and one when it has stopped cleanly; an error is returned, for
/// the caller to print (once), and nothing else is logged for it. No line holds a key,
/// a decision or a call's arguments.
pub fn run(options: ServeOptions) -> Result<(), DaemonError> {
    observe::set_log_format(options.observe.log_format);
    check_ledger_dir(&options.ledger)?;
    // Before the ledger is opened: a bad socket path changes nothing.
    server::check_socket_dir(&options.socket)?;
    if let Some(op) = &options.operator_socket {
        server::check_socket_dir(op)?;
    }
    let ledger = Arc::new(Ledger::open_with_clock(
        &options.ledger,
        Arc::clone(&options.clock),
    )?);
    for note in ledger.torn_notes() {
        log(&format!("tally serve: {note}"));
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        // Blocking threads only stream exports (bounded by their semaphore); big bodies
        // have parse threads of their own, and appends never block a thread.
        .max_blocking_threads(api::MAX_EXPORTS + 2)
        .build()
        .map_err(DaemonError::Runtime)?;
    let signalled = Arc::new(std::sync::Mutex::new("SIGTERM"));
    let stopped_by = Arc::clone(&signalled);
    let served = Arc::clone(&ledger);
    let result = runtime.block_on(async move {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate()).map_err(DaemonError::Signal)?;
        let mut int = signal(SignalKind::interrupt()).map_err(DaemonError::Signal)?;
        let shutdown = async move {
            let name = tokio::select! {
                _ = term.recv() => "SIGTERM",
                _ = int.recv() => "SIGINT",
            };
            *stopped_by.lock().unwrap_or_else(|e| e.into_inner()) = name;
        };
        serve_inner(ledger, options, shutdown, true).await
    });
    runtime.shutdown_timeout(Duration::from_secs(5));
    if result.is_ok() {
        let cp = served.checkpoint();
        let by = *signalled.lock().unwrap_or_else(|e| e.into_inner());
        log(&format!(
            "tally serve: stopped cleanly on {by}: every request drained; ledger size {}, sealed by a checkpoint of epoch {}",
            cp.size, cp.epoch
        ));
    }
    result
}

/// One line to stderr (a JSON object under `--log-format json`).
fn log(line: &str) {
    observe::log_line("info", line);
}

/// Refuse a ledger directory that other users can enter: agents must reach only the
/// socket (SECURITY.md 5.5).
fn check_ledger_dir(dir: &Path) -> Result<(), DaemonError> {
    let meta = std::fs::metadata(dir).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => DaemonError::NoLedger {
            path: dir.to_path_buf(),
        },
        _ => DaemonError::io(dir, e),
    })?;
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(DaemonError::LedgerPermissions {
            path: dir.to_path_buf(),
            mode,
        });
    }
    Ok(())
}

/// Serve `ledger` until `shutdown` resolves; then stop accepting, let in-flight requests
/// finish (each acknowledged decision is durable and sealed), wait for every append
/// already handed to the ledger, remove the socket, and return.
///
/// `options.ledger` is not used (the ledger is given open). Returns
/// [`DaemonError::LedgerFailed`] if the ledger stopped accepting writes while serving.
pub async fn serve(
    ledger: Arc<Ledger>,
    options: ServeOptions,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), DaemonError> {
    serve_inner(ledger, options, shutdown, false).await
}

/// Nothing is bound or recorded (the gate records its policy) until every socket path
/// is known to be possible.
fn check_socket_paths(options: &ServeOptions) -> Result<(), DaemonError> {
    server::check_socket_dir(&options.socket)?;
    if let Some(op) = &options.operator_socket {
        server::check_socket_dir(op)?;
    }
    if let Some(p) = options.proxy.as_ref().and_then(|p| p.socket.as_ref()) {
        server::check_socket_dir(p)?;
    }
    Ok(())
}

/// The OTLP exporter, if the options name an endpoint.
fn tracer(options: &ServeOptions) -> Result<Option<observe::trace::Exporter>, DaemonError> {
    let Some(url) = &options.observe.otlp_endpoint else {
        return Ok(None);
    };
    observe::trace::Exporter::new(url, options.observe.otlp_sample)
        .map(Some)
        .map_err(|why| DaemonError::Otlp {
            // Shown redacted: a collector's URL may carry a secret.
            endpoint: tally_record::url::redacted(url),
            why: tally_record::url::scrubbed(&why, url),
        })
}

/// The handlers' shared state: the ledger, the gate (observed where it decides), the
/// request limits and the run token key the proxy signs with.
fn app(
    ledger: Arc<Ledger>,
    state: &Arc<commit::LedgerState>,
    gate: Arc<dyn tally_gate::Gatekeeper>,
    options: &ServeOptions,
    observer: Arc<observe::Observer>,
) -> Result<Arc<api::App>, DaemonError> {
    // The proxy and the MCP gateway both take run tokens: starts answer one if either runs.
    let token_key = match options.proxy.is_some() || options.mcp_listen.is_some() {
        true => Some(Arc::new(
            tally_proxy::TokenKey::open_or_create(ledger.dir())
                .map_err(tally_proxy::ProxyError::from)?,
        )),
        false => None,
    };
    // The keys a proxied call may present in place of a run token (docs/KEYS.md).
    let keys = match &token_key {
        Some(k) => Some(Arc::new(
            tally_proxy::KeyRing::open(ledger.dir(), k, Arc::clone(&options.clock))
                .map_err(tally_proxy::ProxyError::from)?,
        )),
        None => None,
    };
    if let Some(note) = keys.as_ref().and_then(|k| k.torn_note()) {
        log(&format!("tally serve: {note}"));
    }
    // Every decision, the handlers' and the proxy's alike, is observed where it is made.
    let gate: Arc<dyn tally_gate::Gatekeeper> =
        Arc::new(observe::gated::Observed::new(gate, Arc::clone(&observer)));
    let limits = api::Limits {
        max_body_bytes: options.limits.max_body_bytes,
        max_in_flight: options.limits.max_in_flight.max(1),
        max_batch: options.limits.max_batch,
        rate_per_sec: options.limits.rate_per_sec,
        clock: Arc::clone(&options.clock),
        read_timeout: options.limits.read_timeout,
        queue_bound: options.state.as_ref().map(|s| s.timeout),
        token_key,
        keys,
    };
    let app = api::App::new(ledger, Arc::clone(state), gate, limits, observer)
        .map_err(DaemonError::Runtime)?;
    Ok(Arc::new(app))
}

/// After the connections: the appends whose client went away complete (every one), then
/// the exports; the witnesses get their last push; the spans still batched are sent (the
/// exporter's own thread; bounded by its timeout) and the live view's last points
/// written. The permits returned hold every append and export off until dropped.
async fn drain(
    app: &Arc<api::App>,
    max_in_flight: usize,
    pusher: Option<tasks::Pusher>,
) -> (
    Option<tokio::sync::OwnedSemaphorePermit>,
    Option<tokio::sync::OwnedSemaphorePermit>,
) {
    let drained = Arc::clone(&app.in_flight)
        .acquire_many_owned(max_in_flight as u32)
        .await
        .ok();
    let exports = Arc::clone(&app.exports)
        .acquire_many_owned(api::MAX_EXPORTS as u32)
        .await
        .ok();
    if let Some(p) = pusher {
        p.stop().await;
    }
    let flushed = Arc::clone(&app.observer);
    let _ = tokio::task::spawn_blocking(move || {
        if let Some(t) = &flushed.tracer {
            t.shutdown();
        }
        flushed.live.close();
    })
    .await;
    (drained, exports)
}

/// The sockets' bounds on connections, per peer and in all, and on a slow peer.
fn connection_limits(options: &ServeOptions) -> server::ConnectionLimits {
    server::ConnectionLimits {
        max_connections: options.limits.max_connections,
        per_peer: options.limits.max_connections_per_peer,
        read_timeout: options.limits.read_timeout,
        write_timeout: options.limits.write_timeout,
    }
}

/// The operator socket's path as the live page names it in the commands it shows
/// (absolute, so they work from any directory).
fn operator_socket_shown(options: &ServeOptions) -> Option<String> {
    let p = options.operator_socket.as_ref()?;
    Some(
        std::path::absolute(p)
            .unwrap_or_else(|_| p.clone())
            .display()
            .to_string(),
    )
}

/// The operator's view: metrics (with the ledger's syncs timed), the live page, the log,
/// traces and the approval notifications.
fn observer(
    ledger: &Ledger,
    options: &ServeOptions,
    policy: &tally_policy::Policy,
    tracer: Option<observe::trace::Exporter>,
    notify: notify::Notify,
) -> Arc<observe::Observer> {
    // The live page's trajectories from before this start, read back by a thread of
    // their own (observe/journal.rs): nothing waits for them.
    let live = observe::live::Live::open(ledger.dir());
    let observer = Arc::new(
        observe::Observer::new(
            policy,
            options.observe.log_format,
            tracer,
            options.observe.max_live_streams,
            live,
            operator_socket_shown(options),
        )
        .notifying(notify),
    );
    let o = Arc::clone(&observer);
    ledger.on_sync(Box::new(move |took| o.metrics.synced(took.as_secs_f64())));
    observer
}

/// What of `options` is checked before anything is bound: the socket paths, and each
/// witness's URL ([`witness::check_urls`]), so that a URL the pusher would refuse stops
/// the start rather than fails each push.
fn check_options(options: &ServeOptions) -> Result<(), DaemonError> {
    check_socket_paths(options)?;
    if let Some(w) = &options.witness.policy {
        witness::check_urls(w)?;
    }
    Ok(())
}

/// [`serve`], writing the start line to stderr if `log_start`.
async fn serve_inner(
    ledger: Arc<Ledger>,
    options: ServeOptions,
    shutdown: impl Future<Output = ()> + Send,
    log_start: bool,
) -> Result<(), DaemonError> {
    check_options(&options)?;
    let tcp = server::bind_tcp(options.listen).await?;
    let metrics_tcp = server::bind_tcp(options.observe.metrics_listen).await?;
    let proxy_tcp = server::bind_tcp(options.proxy.as_ref().and_then(|p| p.listen)).await?;
    let mcp_tcp = server::bind_tcp(options.mcp_listen).await?;
    let tracer = tracer(&options)?;
    let notify = notify::Notify::open(&options.notify, Arc::clone(&options.clock))
        .map_err(DaemonError::Notify)?;
    let gate = open_gate(&ledger, &options)?;
    let observer = observer(&ledger, &options, &gate.policy().policy, tracer, notify);
    let socket = server::Socket::bind(&options.socket, options.socket_mode, options.socket_gid)?;
    let operator = match &options.operator_socket {
        Some(path) => Some(server::Socket::bind(path, 0o600, None)?),
        None => None,
    };
    let state = Arc::new(commit::LedgerState {
        failure: std::sync::Mutex::new(None),
    });
    let max_in_flight = options.limits.max_in_flight.max(1);
    let app = app(ledger, &state, gate, &options, observer)?;
    let proxies = tasks::Proxies::start(&app, &options, proxy_tcp)?;
    let mcp_servers = mcp_gateway::Gateway::servers(&options, mcp_tcp.as_ref())?;
    if log_start {
        let metrics_at = metrics_tcp.as_ref().and_then(|l| l.local_addr().ok());
        log(&started_line(&options, &app.ledger, metrics_at));
    }
    let pusher = tasks::Pusher::start(&app, &options)?;
    let view = tasks::View::start(&app, &options, metrics_tcp);
    let notifier = tasks::notifier(&app);
    let router = api::router(Arc::clone(&app), api::Role::Agent);
    let mcp_gateway = mcp_gateway::Gateway::start(&app, &options, mcp_servers, &router, mcp_tcp)?;
    let operator_router = api::router(Arc::clone(&app), api::Role::Operator);
    let (graceful, mut connections) = server::accept_loop(
        &socket,
        &tcp,
        router,
        operator.as_ref().map(|s| (s, operator_router)),
        connection_limits(&options),
        shutdown,
    )
    .await;
    // The live page's event streams end (they would never finish on their own).
    let _ = app.observer.closing.send(true);
    // Stop accepting: new clients now fail to connect instead of queueing.
    socket.close();
    if let Some(op) = operator {
        op.close();
    }
    drop(tcp);
    proxies.stop().await;
    if let Some(g) = mcp_gateway {
        g.stop().await;
    }
    if let Some(v) = view {
        v.stop().await;
    }
    // Each open connection finishes the request it is in; idle ones close now.
    graceful.shutdown().await;
    while connections.join_next().await.is_some() {}
    let (drained, exports) = drain(&app, max_in_flight, pusher).await;
    notifier.stop().await;
    // No decision is in flight: the backend gives back what it holds (leased slices).
    let gate = Arc::clone(&app.gate);
    let _ = tokio::task::spawn_blocking(move || gate.close()).await;
    let flushed = flush_lingering(&app.ledger).await;
    let gate_failure = app.gate.failure();
    drop((drained, exports, app));
    match state.failure().or(gate_failure).or(flushed) {
        Some(why) => Err(DaemonError::LedgerFailed(why)),
        None => Ok(()),
    }
}

/// Commits what still lingers in the ledger's queue (a proxied call's outcome rides the
/// next commit group, and none will come once serving ends), so what the ledger holds is
/// sealed when serving returns: why it could not, if it could not.
async fn flush_lingering(ledger: &Arc<Ledger>) -> Option<String> {
    let ledger = Arc::clone(ledger);
    tokio::task::spawn_blocking(move || ledger.flush().err())
        .await
        .unwrap_or(None)
        .map(|e| e.to_string())
}

/// What `tally serve` says once it listens: where, over which ledger, under which policy
/// and limits.
fn started_line(options: &ServeOptions, ledger: &Ledger, metrics_at: Option<SocketAddr>) -> String {
    let cp = ledger.checkpoint();
    let group = match options.socket_gid {
        Some(gid) => format!(", group {gid}"),
        None => String::new(),
    };
    let operator = match &options.operator_socket {
        Some(p) => format!("; operator socket {} (mode 600)", p.display()),
        None => "; no operator socket".to_string(),
    };
    let mut tcp = match options.listen {
        Some(addr) => format!("; loopback TCP {addr}"),
        None => String::new(),
    };
    if let Some(p) = &options.proxy {
        let at: Vec<String> = p
            .listen
            .iter()
            .map(|a| a.to_string())
            .chain(p.socket.iter().map(|s| s.display().to_string()))
            .collect();
        tcp.push_str(&format!(
            "; proxy on {} for {} upstream(s)",
            at.join(" and "),
            options.policy.policy.upstreams.len()
        ));
    }
    if let Some(at) = options.mcp_listen {
        tcp.push_str(&format!(
            "; MCP gateway on http://{at}/mcp for {} server(s)",
            options.policy.policy.mcp.len()
        ));
    }
    if let Some(at) = metrics_at {
        tcp.push_str(&format!(
            "; /metrics and the live page (/live) on http://{at}"
        ));
    }
    if let Some(w) = &options.witness.policy {
        let pushed = w.witnesses.iter().filter(|w| w.url.is_some()).count();
        tcp.push_str(&format!(
            "; checkpoints pushed to {pushed} of the witness policy's {} witness(es) every {} ms",
            w.witnesses.len(),
            options.witness.interval.as_millis()
        ));
    }
    let rate = match options.limits.rate_per_sec {
        Some(r) => format!("{r} decisions/s per peer"),
        None => "no rate limit".to_string(),
    };
    // Never the connection string: it may hold a password.
    let state = match &options.state {
        Some(s) => format!("; {}", s.label),
        None => String::new(),
    };
    format!(
        "tally serve: listening on {} (mode {:04o}{group}){operator}{tcp}; ledger {} (id {}, size {}, epoch {}); policy {}{state}; limits: {} connections, {} per peer, bodies up to {} bytes, {rate}",
        options.socket.display(),
        options.socket_mode,
        options.ledger.display(),
        ledger.id(),
        cp.size,
        cp.epoch,
        if options.policy.text.is_empty() {
            format!("digest {} (the built-in defaults)", options.policy.digest)
        } else {
            format!("digest {}", options.policy.digest)
        },
        options.limits.max_connections,
        options.limits.max_connections_per_peer,
        options.limits.max_body_bytes,
    )
}

/// The gate over the state backend the options name.
fn open_gate(
    ledger: &Arc<Ledger>,
    options: &ServeOptions,
) -> Result<Arc<dyn tally_gate::Gatekeeper>, DaemonError> {
    let gate_error = |e: tally_gate::GateError| DaemonError::Gate(e.to_string());
    let Some(shared) = &options.state else {
        let gate = tally_gate::Gate::open(Arc::clone(ledger), options.policy.clone())
            .map_err(gate_error)?
            .with_clock(Arc::clone(&options.clock));
        return Ok(Arc::new(gate));
    };
    // A backend may run its own runtime and block on it: open it on a thread of its own,
    // outside this one's.
    let (ledger, open, policy) = (
        Arc::clone(ledger),
        Arc::clone(&shared.open),
        options.policy.clone(),
    );
    let clock = Arc::clone(&options.clock);
    std::thread::spawn(move || open(ledger, policy, clock).map_err(DaemonError::Gate))
        .join()
        .map_err(|_| DaemonError::Gate("opening the shared gate state panicked".into()))?
}

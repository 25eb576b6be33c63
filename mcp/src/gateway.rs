//! The HTTP gateway (`tally serve --mcp-listen ADDR`, docs/MCP.md, "The HTTP gateway"):
//! MCP's Streamable HTTP transport in front of several MCP servers at once, each a
//! command the gateway starts (stdio) or a remote Streamable HTTP server.
//!
//! * [`front`]: every request's credential first (401 and no server contacted without
//!   one), then its body (bounded) classified by the same classifier as `tally mcp`'s
//!   ([`crate::classify`]); a refused one is answered with a JSON-RPC error, never
//!   passed on. Only an `initialize` opens a session (and only then a key's run starts
//!   or continues), within a bound on open sessions; a session idle too long is closed.
//!   What passes goes to rmcp's Streamable HTTP service (sessions, `Mcp-Session-Id`,
//!   SSE or JSON answers, GET streams, DELETE).
//! * [`session`]: one MCP server role per session: `tools/list` merges the servers'
//!   tools as `NAME__tool`; each `tools/call` goes the one gate path
//!   ([`crate::call`]) in the run the session's token names, then to its server, and
//!   its outcome is recorded.
//! * [`runs`]: the count of sessions on each run; a run an `initialize` started is
//!   stopped when the last session on it ends, once, and the gateway's stop waits for it.
//! * [`servers`]: one rmcp client per server, shared by the sessions, connected on first
//!   use and again after a transport failure; a stdio server in a process group of its
//!   own, killed whole.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::header::HeaderMap;
use zeroize::Zeroizing;

mod admit;
mod conns;
mod ends;
mod front;
mod keeps;
mod runs;
mod servers;
mod session;
mod table;

/// Tool names are `NAME__tool`: the server's name (no `_` in it), two underscores, the
/// server's own tool name. MCP's tool-name rule (letters, digits, `_`, `-`, `.`) and the
/// stricter one of some clients (`^[a-zA-Z0-9_-]{1,64}$`) both allow it.
pub const SEPARATOR: &str = "__";

/// The run a session acts in, read from the credential of the `initialize` that opened
/// it.
#[derive(Clone)]
pub struct Authorized {
    /// The run it acts in.
    pub run: String,
    /// Whether opening the session started the run (a key's new run): the gateway stops
    /// the run when the last session on it ends (DELETE, the idle bound, its stop).
    pub started: bool,
    /// A client of the gate that acts as the run's owner.
    pub gate: Arc<dyn Fn() -> tally_api::GateClient + Send + Sync>,
}

impl std::fmt::Debug for Authorized {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authorized")
            .field("run", &self.run)
            .field("started", &self.started)
            .finish_non_exhaustive()
    }
}

/// Why a request carries no credential of this tally: answered 401 (with
/// `WWW-Authenticate: Bearer`), nothing else done.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NoCredential {
    /// No `Authorization` header.
    #[error("no credential: send `Authorization: Bearer` with a run token (the `token` of POST /v1/runs) or a key")]
    Missing,
    /// An `Authorization` header that is not text.
    #[error("the Authorization header is not text")]
    NotText,
    /// An `Authorization` header that is not `Bearer TOKEN`.
    #[error("the Authorization header is not `Bearer TOKEN`")]
    NotBearer,
    /// A key, where this tally serves none.
    #[error("this tally serves no keys")]
    NoKeys,
    /// A key the operator revoked.
    #[error("key {id} was revoked by the operator: ask them for another key")]
    Revoked {
        /// The key's id.
        id: String,
    },
    /// The shape of a key, not one of this tally.
    #[error("this is not a key of this tally")]
    NotAKey,
    /// A run token, where this tally mints none.
    #[error("this tally mints no run tokens")]
    NoTokens,
    /// Not a run token of this tally.
    #[error("this is not a run token of this tally")]
    NotAToken,
}

/// Why an `initialize` opened no session, by the kind of refusal (its HTTP status is
/// [`NotOpened::status`]), with what the client reads.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NotOpened {
    /// Not a credential of this tally (401).
    #[error(transparent)]
    Credential(#[from] NoCredential),
    /// A request header is not what it must be (400).
    #[error("{0}")]
    BadHeader(String),
    /// Refused: the key's principal has no budget, the run is another uid's, the gate
    /// refused the start (403).
    #[error("{0}")]
    Forbidden(String),
    /// The key's run is stopped: not continued (409).
    #[error("{0}")]
    Stopped(String),
    /// A limit: the key's runs per day, the principal's open runs (429).
    #[error("{0}")]
    Limit(String),
    /// The gate cannot answer (503).
    #[error("{0}")]
    Unavailable(String),
}

impl NotOpened {
    /// The HTTP status it is answered with.
    pub fn status(&self) -> hyper::StatusCode {
        use hyper::StatusCode as S;
        match self {
            NotOpened::Credential(_) => S::UNAUTHORIZED,
            NotOpened::BadHeader(_) => S::BAD_REQUEST,
            NotOpened::Forbidden(_) => S::FORBIDDEN,
            NotOpened::Stopped(_) => S::CONFLICT,
            NotOpened::Limit(_) => S::TOO_MANY_REQUESTS,
            NotOpened::Unavailable(_) => S::SERVICE_UNAVAILABLE,
        }
    }
}

/// An answer that resolves later.
pub type Pending<T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send>>;

/// How the gateway reads credentials.
pub trait Credentials: Send + Sync {
    /// Who holds the request's credential (a run token's run, a key's id), read without
    /// starting anything; or why it is no credential (answered 401, nothing else done).
    /// A session answers only the holder whose `initialize` opened it.
    fn holder(&self, headers: &HeaderMap) -> Result<String, NoCredential>;

    /// The run a session opened by an `initialize` with this credential acts in: a run
    /// token's run, or a key's run, started (and counted against the key's day) or
    /// continued. Asked for nothing else: no other request starts or spends anything.
    fn open(&self, headers: HeaderMap) -> Pending<Result<Authorized, NotOpened>>;
}

/// A header value the gateway sends a remote server (zeroized, never printed).
pub struct Secret(pub Zeroizing<String>);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

/// Where a server is.
#[non_exhaustive]
pub enum Target {
    /// A command the gateway starts and speaks to on stdio.
    Command(Vec<String>),
    /// A remote Streamable HTTP server, with the header the credential goes in.
    Url {
        /// Its URL: `https://`, or `http://` to a loopback host (the policy's rule).
        url: String,
        /// The credential's header and value.
        credential: Option<(String, Secret)>,
        /// The HTTP client it is reached with, built at start ([`RemoteClient::new`]).
        client: RemoteClient,
    },
}

/// A remote server's URL shows redacted (`tally_record::url::redacted`): it may carry a
/// secret.
impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Command(command) => f.debug_tuple("Command").field(command).finish(),
            Target::Url {
                url, credential, ..
            } => f
                .debug_struct("Url")
                .field("url", &tally_record::url::redacted(url))
                .field("credential", credential)
                .finish_non_exhaustive(),
        }
    }
}

pub use servers::RemoteClient;

/// Why a remote server's HTTP client could not be built (at the gateway's start).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NoClient {
    /// The HTTP client refused its configuration (a TLS configuration of a version it
    /// does not take).
    #[error("its HTTP client: {why}")]
    Build {
        /// What the HTTP client said, with its causes.
        why: String,
    },
}

/// One server behind the gateway.
#[derive(Debug)]
pub struct Server {
    /// Its name: the prefix of its tools.
    pub name: String,
    /// Where it is.
    pub target: Target,
}

/// What the gateway needs.
pub struct GatewayOptions {
    /// The servers, by name.
    pub servers: Vec<Server>,
    /// Reads each request's credential.
    pub credentials: Arc<dyn Credentials>,
    /// The bounds on what clients may hold.
    pub limits: GatewayLimits,
    /// Where the idle bound reads the time (tests pass a `ManualClock`).
    pub clock: Arc<dyn tally_record::Clock>,
    /// The worker name the gateway's checks are recorded with.
    pub worker: Option<String>,
    /// Environment variables every stdio server is started without: the credentials
    /// of the remote servers (`credential_env`).
    pub hidden_env: Vec<String>,
    /// Called once for each connection refused over [`GatewayLimits::max_connections`]
    /// (the daemon counts them in its metrics).
    pub on_refused: Arc<dyn Fn() + Send + Sync>,
    /// Called once for each `initialize` refused over a bound on sessions, with the
    /// bound (the daemon counts them in its metrics).
    pub on_session_refused: Arc<dyn Fn(SessionBound) + Send + Sync>,
}

/// The bound on sessions an `initialize` was refused over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SessionBound {
    /// The gateway's ([`GatewayLimits::max_sessions`]): answered 503.
    Gateway,
    /// One credential's (a run token's run, a key:
    /// [`GatewayLimits::max_sessions_per_credential`]): answered 429.
    Credential,
}

impl SessionBound {
    /// Its name, as a metric's label: `gateway`, `credential`.
    pub fn as_str(self) -> &'static str {
        match self {
            SessionBound::Gateway => "gateway",
            SessionBound::Credential => "credential",
        }
    }
}

/// The bounds on what the gateway's clients may hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct GatewayLimits {
    /// Sessions open at once (default [`DEFAULT_MAX_SESSIONS`]); one more `initialize`
    /// is answered 503 and opens nothing.
    pub max_sessions: usize,
    /// Sessions one credential (a run token's run, a key) holds open at once (default
    /// [`DEFAULT_MAX_SESSIONS_PER_CREDENTIAL`]); one more `initialize` with it is
    /// answered 429 and opens nothing, so one credential cannot take every session.
    pub max_sessions_per_credential: usize,
    /// A session with no request for this long is closed, as a DELETE would (default
    /// [`DEFAULT_IDLE`]).
    pub idle: Duration,
    /// The largest request body (default [`DEFAULT_MAX_BODY`]); a larger one is answered
    /// 413, refused on its `Content-Length` before any of it is read.
    pub max_body_bytes: usize,
    /// How long a request body may take to arrive, whole (default
    /// [`DEFAULT_BODY_TIMEOUT`]); a slower one is answered 408 and its connection closed,
    /// so a client that announces a body and never sends it holds nothing for long.
    pub body_timeout: Duration,
    /// Connections open at once (default [`DEFAULT_MAX_CONNECTIONS`]); one more is
    /// answered 503 with `Retry-After: 1` at once, its request unread, and closed.
    pub max_connections: usize,
}

/// The default idle bound of a session.
pub const DEFAULT_IDLE: Duration = Duration::from_secs(30 * 60);
/// The default bound on open sessions.
pub const DEFAULT_MAX_SESSIONS: usize = 1024;
/// The default bound on the sessions one credential holds open.
pub const DEFAULT_MAX_SESSIONS_PER_CREDENTIAL: usize = 64;
/// The default largest request body: 4 MiB.
pub const DEFAULT_MAX_BODY: usize = 4 * 1024 * 1024;
/// The default time a request body may take to arrive.
pub const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(30);
/// The default bound on open connections.
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;

impl Default for GatewayLimits {
    fn default() -> GatewayLimits {
        GatewayLimits {
            max_sessions: DEFAULT_MAX_SESSIONS,
            max_sessions_per_credential: DEFAULT_MAX_SESSIONS_PER_CREDENTIAL,
            idle: DEFAULT_IDLE,
            max_body_bytes: DEFAULT_MAX_BODY,
            body_timeout: DEFAULT_BODY_TIMEOUT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
        }
    }
}

impl GatewayLimits {
    /// The limits, `max_sessions`, `idle` and `max_body_bytes` set (at least 1 each).
    pub fn new(max_sessions: usize, idle: Duration, max_body_bytes: usize) -> GatewayLimits {
        GatewayLimits {
            max_sessions: max_sessions.max(1),
            max_sessions_per_credential: DEFAULT_MAX_SESSIONS_PER_CREDENTIAL,
            idle: idle.max(Duration::from_millis(1)),
            max_body_bytes: max_body_bytes.max(1),
            body_timeout: DEFAULT_BODY_TIMEOUT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
        }
    }

    /// These limits with a request body given at most `timeout` to arrive (at least a
    /// millisecond).
    pub fn with_body_timeout(self, timeout: Duration) -> GatewayLimits {
        GatewayLimits {
            body_timeout: timeout.max(Duration::from_millis(1)),
            ..self
        }
    }

    /// These limits with at most `n` connections open at once (at least 1).
    pub fn with_max_connections(self, n: usize) -> GatewayLimits {
        GatewayLimits {
            max_connections: n.max(1),
            ..self
        }
    }

    /// These limits with at most `n` sessions open per credential (at least 1).
    pub fn with_sessions_per_credential(self, n: usize) -> GatewayLimits {
        GatewayLimits {
            max_sessions_per_credential: n.max(1),
            ..self
        }
    }
}

/// Serve MCP's Streamable HTTP transport on `listener` (at its root path and at `/mcp`)
/// until `shutdown` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    options: GatewayOptions,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    front::serve(listener, options, shutdown).await
}

/// The address a listener is on, for the daemon's start line.
pub fn local_addr(listener: &tokio::net::TcpListener) -> std::io::Result<SocketAddr> {
    listener.local_addr()
}

//! The HTTP gateway (`tally serve --mcp-listen ADDR`, docs/MCP.md, "The HTTP gateway"):
//! MCP's Streamable HTTP transport in front of several MCP servers at once, each a
//! command the gateway starts (stdio) or a remote Streamable HTTP server.
//!
//! * [`front`]: every request's credential first (a run token, else 401 and no server
//!   contacted), then every POST body classified by the same classifier as `tally mcp`'s
//!   ([`crate::classify`]); a refused one is answered with a JSON-RPC error, never
//!   passed on. What passes goes to rmcp's Streamable HTTP service (sessions,
//!   `Mcp-Session-Id`, SSE or JSON answers, GET streams, DELETE).
//! * [`session`]: one MCP server role per session: `tools/list` merges the servers'
//!   tools as `NAME__tool`; each `tools/call` goes the one gate path
//!   ([`crate::call`]) in the run the session's token names, then to its server, and
//!   its outcome is recorded.
//! * [`servers`]: one rmcp client per server, shared by the sessions, connected on first
//!   use and again after a transport failure.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::header::HeaderMap;
use zeroize::Zeroizing;

mod front;
mod servers;
mod session;

/// Tool names are `NAME__tool`: the server's name (no `_` in it), two underscores, the
/// server's own tool name. MCP's tool-name rule (letters, digits, `_`, `-`, `.`) and the
/// stricter one of some clients (`^[a-zA-Z0-9_-]{1,64}$`) both allow it.
pub const SEPARATOR: &str = "__";

/// Who a request acts for, once its credential is read.
#[derive(Clone)]
pub struct Authorized {
    /// The run it acts in.
    pub run: String,
    /// Whether reading this credential started the run (a key's new run): the session
    /// it opens stops the run when it ends (DELETE, or the idle bound).
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

/// Reads a request's credential: whom it acts for, or why not (then the request is
/// answered 401 and nothing else happens).
pub type Authorize = Arc<
    dyn Fn(
            HeaderMap,
        ) -> std::pin::Pin<
            Box<dyn std::future::Future<Output = Result<Authorized, String>> + Send>,
        > + Send
        + Sync,
>;

/// A header value the gateway sends a remote server (zeroized, never printed).
pub struct Secret(pub Zeroizing<String>);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

/// Where a server is.
#[derive(Debug)]
#[non_exhaustive]
pub enum Target {
    /// A command the gateway starts and speaks to on stdio.
    Command(Vec<String>),
    /// A remote Streamable HTTP server, with the header the credential goes in.
    Url {
        /// Its URL.
        url: String,
        /// The credential's header and value.
        credential: Option<(String, Secret)>,
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
    /// Reads a request's credential.
    pub authorize: Authorize,
    /// A session with no request for this long is closed (as a DELETE would).
    pub idle: Duration,
    /// The worker name the gateway's checks are recorded with.
    pub worker: Option<String>,
    /// Environment variables every stdio server is started without: the credentials
    /// of the remote servers (`credential_env`).
    pub hidden_env: Vec<String>,
}

/// The default idle bound of a session.
pub const DEFAULT_IDLE: Duration = Duration::from_secs(30 * 60);

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

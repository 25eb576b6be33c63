//! How `tally serve` is asked to serve ([`ServeOptions`]), in groups: where (the
//! ledger, the sockets, the policy, the state), the limits on what clients may hold
//! ([`RequestLimits`]), the witnesses it pushes to ([`WitnessOptions`]), the operator's
//! view ([`ObserveOptions`]) and the model proxy ([`crate::ProxyServe`]).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tally_ledger::clock::{Clock, SystemClock};

use crate::{LogFormat, ProxyServe, SharedState, DEFAULT_OTLP_SAMPLE};

/// How to serve. Build with [`ServeOptions::new`], then adjust fields.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ServeOptions {
    /// The ledger directory ([`crate::run`] opens it; [`crate::serve`] is given the open
    /// ledger).
    pub ledger: PathBuf,
    /// The Unix socket path. A stale socket left by a dead daemon is replaced; a live
    /// one, or a file that is not a socket, is refused.
    pub socket: PathBuf,
    /// The operator socket (mode 0600: the daemon's user only): raw decisions for runs
    /// the gate does not govern, pause, resume, kill, approvals, export. Without it,
    /// none of those is reachable.
    pub operator_socket: Option<PathBuf>,
    /// The gate's policy (default: the built-in defaults, recorded as the empty text).
    pub policy: tally_policy::Recorded,
    /// Where the gate keeps its state: `None` (the default) in the ledger's own store;
    /// `Some` a store several daemons, each with its own ledger, share (`tally serve
    /// --state postgres://...` wires PostgreSQL here: docs/FLEET.md).
    pub state: Option<SharedState>,
    /// Also listen on this TCP address; it must be loopback.
    pub listen: Option<SocketAddr>,
    /// The socket file's permission bits (default `0o660`: the daemon's user and group).
    pub socket_mode: u32,
    /// Give the socket file to this group, so agents in it can connect (default: the
    /// daemon's group).
    pub socket_gid: Option<u32>,
    /// Where the gate, the ledger and the per-peer rate limit read the time (default: the
    /// system's clock; tests pass a `ManualClock` to drive deadlines, breakers, back-off
    /// and buckets without sleeping).
    pub clock: Arc<dyn Clock>,
    /// What one client may send and hold.
    pub limits: RequestLimits,
    /// The witnesses checkpoints are pushed to.
    pub witness: WitnessOptions,
    /// The operator's view: metrics, the live page, the log, traces.
    pub observe: ObserveOptions,
    /// The HTTP/model proxy for the policy's upstreams (docs/PROXY.md); `None` (the
    /// default): no proxy, and starts answer no run token.
    pub proxy: Option<ProxyServe>,
    /// The MCP gateway's loopback TCP address (`--mcp-listen`): MCP's Streamable HTTP
    /// transport in front of the policy's `[mcp.NAME]` servers (docs/MCP.md, "The HTTP
    /// gateway"); `None` (the default): no gateway.
    pub mcp_listen: Option<SocketAddr>,
    /// The MCP gateway's bounds: sessions open at once, their idle time, the largest
    /// request body (`--mcp-max-sessions`, `--mcp-idle-secs`, `--mcp-max-body-bytes`).
    pub mcp_limits: tally_mcp::gateway::GatewayLimits,
    /// Where approval requests, their answers and their expiry are POSTed
    /// (docs/APPROVALS.md, "Notifications").
    pub notify: crate::NotifyOptions,
}

/// What one client may send and hold on the agent and operator sockets.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct RequestLimits {
    /// Largest request body accepted, in bytes (default 1 MiB); larger gets 413. Parsing
    /// expands JSON several times over in memory, so keep it modest.
    pub max_body_bytes: usize,
    /// Most decisions in one request (default 10,000); more gets 413.
    pub max_batch: usize,
    /// Append requests processed at once (default 256); more wait for a slot.
    pub max_in_flight: usize,
    /// Open connections (default 256); more wait in the kernel's accept queue.
    pub max_connections: usize,
    /// Open connections of one peer (default 128, half of `max_connections`): one uid on
    /// the Unix sockets, and all loopback TCP clients together. One more is answered
    /// `429 too_many_connections` and closed, so one client cannot hold the connections
    /// everyone else needs.
    pub max_connections_per_peer: usize,
    /// Decisions per second each peer (Unix uid; all loopback TCP clients are one peer)
    /// may append; `None` (the default) for no limit. Every POST on the agent socket
    /// pays one, a raw `POST /v1/decisions` one per decision. Over the limit: 429 with
    /// `Retry-After`.
    pub rate_per_sec: Option<u32>,
    /// Request headers, and then the whole body, must each arrive within this time
    /// (default 10 s); a slow body gets 408, slow headers a closed connection. Idle
    /// keep-alive connections are closed after this long too.
    pub read_timeout: Duration,
    /// A connection whose client reads none of its responses for this long (default
    /// 10 s) is closed: a write that makes no progress for it fails. A slow reader that
    /// keeps reading is not affected.
    pub write_timeout: Duration,
}

impl Default for RequestLimits {
    fn default() -> RequestLimits {
        RequestLimits {
            max_body_bytes: 1024 * 1024,
            max_batch: 10_000,
            max_in_flight: 256,
            max_connections: 256,
            max_connections_per_peer: 128,
            rate_per_sec: None,
            read_timeout: Duration::from_secs(10),
            write_timeout: Duration::from_secs(10),
        }
    }
}

/// The witnesses `tally serve` pushes its checkpoints to.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct WitnessOptions {
    /// Push checkpoints to the witnesses this C2SP tlog-policy names (those with a URL),
    /// keeping the latest one its quorum cosigned beside the ledger
    /// (`checkpoint.cosigned`).
    pub policy: Option<tally_ledger::tlog::policy::Policy>,
    /// The least time between two pushes (default 1 s).
    pub interval: Duration,
    /// By witness name: a PEM file of CA certificates the pusher trusts for that witness
    /// beside the Mozilla roots (a witness whose certificate a private CA issued).
    pub ca_files: BTreeMap<String, PathBuf>,
}

impl Default for WitnessOptions {
    fn default() -> WitnessOptions {
        WitnessOptions {
            policy: None,
            interval: Duration::from_secs(1),
            ca_files: BTreeMap::new(),
        }
    }
}

/// The operator's view of the daemon: metrics, the live page, the log, traces.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ObserveOptions {
    /// Also serve the read-only operator's view (`/metrics`, the live page) on this TCP
    /// address; it must be loopback (the page names every run).
    pub metrics_listen: Option<SocketAddr>,
    /// Connections the `metrics_listen` listener serves at once (default 32), apart
    /// from the agent and operator sockets' connections; one more is answered `503
    /// too_many_connections` with `Retry-After` and closed.
    pub metrics_max_connections: usize,
    /// The live page's event streams open at once, on the operator socket and the
    /// metrics listener together (default 8); one more is answered `503
    /// too_many_streams` with `Retry-After`.
    pub max_live_streams: usize,
    /// How the log is written (default text; JSON adds a line per decision).
    pub log_format: LogFormat,
    /// Export a span per check to this OTLP/HTTP endpoint (`http://host:4318`).
    pub otlp_endpoint: Option<String>,
    /// The ratio of checks and proxied calls that start their own trace whose spans are
    /// exported (0 to 1; default [`DEFAULT_OTLP_SAMPLE`]). A span whose caller sent a
    /// `traceparent` follows the caller's sampled flag. A check's decision records the
    /// caller's trace id, or its own span's when it is exported (docs/OPERATOR.md).
    pub otlp_sample: f64,
}

impl Default for ObserveOptions {
    fn default() -> ObserveOptions {
        ObserveOptions {
            metrics_listen: None,
            metrics_max_connections: 32,
            max_live_streams: 8,
            log_format: LogFormat::Text,
            otlp_endpoint: None,
            otlp_sample: DEFAULT_OTLP_SAMPLE,
        }
    }
}

impl ServeOptions {
    /// Defaults for serving the ledger in `ledger` on the socket `socket`.
    pub fn new(ledger: impl Into<PathBuf>, socket: impl Into<PathBuf>) -> ServeOptions {
        ServeOptions {
            ledger: ledger.into(),
            socket: socket.into(),
            operator_socket: None,
            policy: tally_policy::Recorded::default_policy(),
            state: None,
            listen: None,
            socket_mode: 0o660,
            socket_gid: None,
            clock: Arc::new(SystemClock),
            limits: RequestLimits::default(),
            witness: WitnessOptions::default(),
            observe: ObserveOptions::default(),
            proxy: None,
            mcp_listen: None,
            mcp_limits: tally_mcp::gateway::GatewayLimits::default(),
            notify: crate::NotifyOptions::default(),
        }
    }
}

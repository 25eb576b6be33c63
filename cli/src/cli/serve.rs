//! The flags of `tally serve`: its ledger, sockets, policy, state, listeners and bounds.

use std::path::PathBuf;

/// `tally serve`'s flags.
#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    /// The ledger directory.
    #[arg(long)]
    pub ledger: PathBuf,
    /// The Unix socket to listen on.
    #[arg(long)]
    pub socket: PathBuf,
    /// Also listen on this loopback TCP address (e.g. 127.0.0.1:7878).
    #[arg(long)]
    pub listen: Option<std::net::SocketAddr>,
    /// The operator socket (mode 0600): raw decisions, pause, resume, kill,
    /// approvals, export.
    #[arg(long)]
    pub operator_socket: Option<PathBuf>,
    /// The gate's policy (TOML; default: the built-in defaults).
    #[arg(long)]
    pub policy: Option<PathBuf>,
    /// Keep the gate's state in this PostgreSQL database, shared by every daemon
    /// given it (each keeps its own ledger): `host=/run/postgresql dbname=tally
    /// user=tally`, or a postgres:// URL [default: the ledger's own store]. Prefer
    /// a Unix socket with peer authentication: a password here is visible to `ps`.
    #[arg(long, value_name = "CONNINFO")]
    pub state: Option<String>,
    /// Decide runs inside leased slices of their budgets (with --state): a run with a
    /// budget is decided on the daemon holding its slice, without a round trip for
    /// the run; its tool, credential and principal stay shared per call
    /// (docs/FLEET.md, "The leased mode").
    #[arg(long, requires = "state")]
    pub leases: bool,
    /// This daemon's name among the fleet's lease holders: unique in the fleet, the
    /// same across its restarts [default: ledger-ID, the ledger's id].
    #[arg(long, value_name = "NAME", requires = "leases")]
    pub lease_holder: Option<String>,
    /// How long a leased slice lasts, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 10_000)]
    pub lease_ttl_ms: u64,
    /// How long past its expiry a slice is left to its holder before another daemon
    /// reclaims it (above the clocks' drift), in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 5_000)]
    pub lease_margin_ms: u64,
    /// How often the lease thread renews slices in use, gives back idle ones and
    /// reclaims expired ones, in milliseconds [default: a fifth of --lease-ttl-ms].
    #[arg(long, value_name = "MS")]
    pub lease_refresh_ms: Option<u64>,
    /// A slice not used for this long is given back at the next refresh (its run may
    /// then be decided on another daemon), in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 5_000)]
    pub lease_idle_ms: u64,
    /// The agent socket's permission bits, in octal.
    #[arg(long, value_name = "MODE", default_value = "0660")]
    pub socket_mode: String,
    /// Give the agent socket to this group (name or gid), so agents in it can connect
    /// [default: the daemon's group].
    #[arg(long, value_name = "GROUP")]
    pub socket_group: Option<String>,
    /// Largest request body, in bytes; larger gets 413.
    #[arg(long, value_name = "BYTES", default_value_t = 1024 * 1024)]
    pub max_body_bytes: usize,
    /// Decisions per second each peer (uid; loopback TCP is one peer) may append;
    /// over it, 429 with Retry-After [default: no limit].
    #[arg(long, value_name = "N")]
    pub rate_per_sec: Option<u32>,
    /// Open connections one peer (uid; loopback TCP is one peer) may hold; one more
    /// gets 429.
    #[arg(long, value_name = "N", default_value_t = 128)]
    pub max_connections_per_peer: usize,
    /// Push each new checkpoint to the witnesses this C2SP tlog-policy names (those with
    /// a URL) and keep the latest one its quorum cosigned (DIR/checkpoint.cosigned).
    #[arg(long, value_name = "FILE")]
    pub witness_policy: Option<PathBuf>,
    /// The least time between two pushes to the witnesses, in ms.
    #[arg(
        long,
        value_name = "MS",
        default_value_t = 1000,
        requires = "witness_policy"
    )]
    pub witness_interval_ms: u64,
    /// A PEM file of CA certificates to trust for witness NAME's HTTPS beside the
    /// Mozilla roots (a witness whose certificate a private CA issued); repeatable.
    #[arg(long, value_name = "NAME=PEM", requires = "witness_policy")]
    pub witness_ca: Vec<String>,
    /// POST each new approval request, each answer and each expiry as signed JSON to
    /// this http:// or https:// URL (a Slack incoming webhook, a chat bridge);
    /// repeatable (docs/APPROVALS.md, "Notifications").
    #[arg(long, value_name = "URL")]
    pub notify: Vec<String>,
    /// The secret --notify signs with (HMAC-SHA256): a file only its owner may read
    /// (0600), at least 32 bytes.
    #[arg(long, value_name = "FILE", requires = "notify")]
    pub notify_secret_file: Option<PathBuf>,
    /// A PEM file of CA certificates to trust for --notify's https:// receivers beside
    /// the Mozilla roots (a receiver whose certificate a private CA issued).
    #[arg(long, value_name = "PEM", requires = "notify")]
    pub notify_ca: Option<PathBuf>,
    /// Also serve the operator's read-only view (`/metrics`, the live page at `/live`)
    /// on this loopback TCP address (e.g. 127.0.0.1:9464, or a port alone for
    /// 127.0.0.1). It is on the operator socket either way.
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<String>,
    /// Connections the `--metrics-listen` listener serves at once; one more gets 503.
    #[arg(long, value_name = "N", default_value_t = 32)]
    pub metrics_max_connections: usize,
    /// The live page's event streams open at once, on every listener together; one more
    /// gets 503.
    #[arg(long, value_name = "N", default_value_t = 8)]
    pub max_live_streams: usize,
    /// The log's format: `text`, or `json` (one object per line, and a line per
    /// decision: run, tool, decision, reason, seq; never arguments).
    #[arg(long, value_name = "FORMAT", default_value = "text", value_parser = ["text", "json"])]
    pub log_format: String,
    /// Export a span per check (OpenTelemetry, GenAI conventions: `execute_tool`) and per
    /// proxied model call (`chat`) to this OTLP/HTTP collector, e.g.
    /// http://127.0.0.1:4318; the span's trace id (the agent's `traceparent`'s, if it sent
    /// one) is recorded on the decision.
    #[arg(long, value_name = "URL")]
    pub otlp_endpoint: Option<String>,
    /// The share of traces tally starts that are exported, 0 to 1 (default 0.1): a check
    /// or proxied call with no `traceparent` starts a trace, sampled at this ratio; one
    /// with a `traceparent` is exported exactly when its caller sampled it. A check's
    /// decision records the caller's trace id, or its own span's when it is exported.
    #[arg(long, value_name = "RATIO", requires = "otlp_endpoint")]
    pub otlp_sample: Option<String>,
    /// Run the HTTP/model proxy for the policy's `[upstreams.NAME]` on this loopback TCP
    /// address (e.g. 127.0.0.1:7390): agents call http://ADDR/NAME/PATH with their run's
    /// token as the API key (docs/PROXY.md).
    #[arg(long, value_name = "ADDR")]
    pub proxy_listen: Option<String>,
    /// Run the MCP gateway for the policy's `[mcp.NAME]` servers on this loopback TCP
    /// address (e.g. 127.0.0.1:7391): MCP clients connect to http://ADDR/mcp
    /// (Streamable HTTP) with their run's token as a Bearer credential (docs/MCP.md).
    #[arg(long, value_name = "ADDR")]
    pub mcp_listen: Option<String>,
    /// MCP gateway sessions open at once; one more initialize gets 503 and opens
    /// nothing [default: 1024].
    #[arg(long, value_name = "N", requires = "mcp_listen")]
    pub mcp_max_sessions: Option<usize>,
    /// MCP gateway sessions one credential (a run token, a key) holds open at once;
    /// one more initialize with it gets 429 and opens nothing [default: 64].
    #[arg(long, value_name = "N", requires = "mcp_listen")]
    pub mcp_max_sessions_per_credential: Option<usize>,
    /// Close an MCP gateway session after this many seconds without a request (a run
    /// its initialize started is stopped) [default: 1800].
    #[arg(long, value_name = "SECS", requires = "mcp_listen")]
    pub mcp_idle_secs: Option<u64>,
    /// The largest request body the MCP gateway reads; a larger one gets 413, refused
    /// unread [default: 4194304].
    #[arg(long, value_name = "BYTES", requires = "mcp_listen")]
    pub mcp_max_body_bytes: Option<usize>,
    /// MCP gateway connections open at once; one more is answered 503 with Retry-After
    /// at once, unread, and closed [default: 1024].
    #[arg(long, value_name = "N", requires = "mcp_listen")]
    pub mcp_max_connections: Option<usize>,
    /// Run the proxy on this Unix socket too (the agent socket's mode and group).
    #[arg(long, value_name = "PATH")]
    pub proxy_socket: Option<PathBuf>,
    /// Open proxy connections one peer (uid on --proxy-socket; all loopback TCP clients
    /// together) may hold, apart from the agent socket's; one more gets 429
    /// too_many_connections [default: 64].
    #[arg(long, value_name = "N")]
    pub proxy_max_connections_per_peer: Option<usize>,
    /// A proxied request's headers, and then its whole body, must each arrive within
    /// this many ms; a body too slow gets 408 (recorded), and the connection is closed
    /// [default: 10000].
    #[arg(long, value_name = "MS")]
    pub proxy_read_timeout_ms: Option<u64>,
    /// An upstream credential's secret, read from FILE (mode 0600, one line); repeat
    /// for each credential the policy's upstreams name. Never logged; zeroized.
    #[arg(long, value_name = "NAME=FILE")]
    pub credential: Vec<String>,
}

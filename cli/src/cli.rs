//! Command-line definitions only (clap). Behaviour lives in `commands.rs`.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

/// tally: an append-only, hash-chained, encrypted audit ledger for AI-agent budget
/// decisions, and the offline verifier that audits it.
///
/// Exit codes: 0 verified intact, 1 tampering or inconsistency found, 2 usage or I/O
/// error, 3 intact but incomplete evidence (unsealed tail, or a required anchor missing).
#[derive(Parser, Debug)]
#[command(name = "tally", version, about, long_about = None)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Options shared by the commands that read a ledger for the auditor.
#[derive(clap::Args, Debug, Clone)]
pub struct ReadArgs {
    /// A ledger directory (when no writer holds it) or an export file.
    pub path: PathBuf,
    /// The ledger's public verification key (ledger.pub), obtained from the ledger's owner.
    #[arg(long)]
    pub key: PathBuf,
    /// A checkpoint held elsewhere that the ledger must contain (repeatable).
    #[arg(long = "anchor", value_name = "CP")]
    pub anchors: Vec<PathBuf>,
    /// Exit 3 unless at least one --anchor is given and matched.
    #[arg(long)]
    pub require_anchor: bool,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Loop thresholds (defaults and their meaning: docs/REPORTS.md).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct Thresholds {
    /// Exact repetition: identical calls (same tool and args digest) that make a loop [default: 3].
    #[arg(long, value_name = "N")]
    pub repeat_min: Option<u64>,
    /// Exact repetition window, ms of run time [default: 60000].
    #[arg(long, value_name = "MS")]
    pub repeat_window_ms: Option<u64>,
    /// High call count: calls of one tool in the window that make a loop [default: 60].
    #[arg(long, value_name = "N")]
    pub burst_min: Option<u64>,
    /// High call count window, ms of run time [default: 60000].
    #[arg(long, value_name = "MS")]
    pub burst_window_ms: Option<u64>,
    /// Retry storm: failures of identical calls (or of one tool across runs) [default: 4].
    #[arg(long, value_name = "N")]
    pub storm_min_failures: Option<u64>,
    /// A storm ends after this many ms without a failure [default: 60000].
    #[arg(long, value_name = "MS")]
    pub storm_window_ms: Option<u64>,
    /// A storm across workers or runs needs this many distinct sources [default: 3].
    #[arg(long, value_name = "N")]
    pub storm_min_sources: Option<u64>,
    /// Calls before an upstream Retry-After elapsed that make retries or polls a loop [default: 2].
    #[arg(long, value_name = "N")]
    pub retry_after_ignored_min: Option<u64>,
    /// Polls with no change of observed state that make polling a loop [default: 20].
    #[arg(long, value_name = "N")]
    pub poll_stall_min: Option<u64>,
}

/// The subcommands (SPEC section 6).
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Create the auditor's X25519 key pair: FILE (0600) and FILE with extension .pub.
    Keygen {
        /// Where to write the secret key.
        #[arg(long)]
        out: PathBuf,
        /// An approver's Ed25519 key pair (its public half goes in the policy's
        /// `[approvals.approvers]`), instead of an auditor's X25519 pair.
        #[arg(long)]
        approver: bool,
    },
    /// Sign and record a human's approval for a run: a bounded extra allocation, used
    /// once, until it expires.
    Approve {
        /// The daemon's operator socket.
        #[arg(long)]
        operator_socket: PathBuf,
        /// The run.
        #[arg(long)]
        run: String,
        /// The approver's secret key (`tally keygen --approver`).
        #[arg(long)]
        key: PathBuf,
        /// The approver's name in the policy (default: the key file's name, `dana` for
        /// `dana.key`).
        #[arg(long)]
        approver: Option<String>,
        /// How long it is valid, on the run's clock: `30s`, `10m`, `2h`, `500ms`.
        #[arg(long)]
        expires: String,
        /// Extra attempts (and side effects).
        #[arg(long)]
        attempts: Option<u64>,
        /// Extra cents.
        #[arg(long)]
        cents: Option<u64>,
        /// The one tool it is for (unblocks it, if the policy blocks it).
        #[arg(long)]
        tool: Option<String>,
        /// The one operation it is for.
        #[arg(long)]
        operation: Option<String>,
        /// Why, for the record.
        #[arg(long)]
        note: Option<String>,
    },
    /// Every run the gate holds: state, and used of limit.
    Runs {
        /// The daemon's operator socket.
        #[arg(long)]
        operator_socket: PathBuf,
        /// JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Pause a run: its next check, from any worker, is refused until it is resumed.
    Pause {
        /// The daemon's operator socket.
        #[arg(long)]
        operator_socket: PathBuf,
        /// The run.
        #[arg(long)]
        run: String,
    },
    /// Resume a paused run.
    Resume {
        /// The daemon's operator socket.
        #[arg(long)]
        operator_socket: PathBuf,
        /// The run.
        #[arg(long)]
        run: String,
    },
    /// Kill a run: a stop record (`killed_by_operator`); every later check is refused.
    Kill {
        /// The daemon's operator socket.
        #[arg(long)]
        operator_socket: PathBuf,
        /// The run.
        #[arg(long)]
        run: String,
    },
    /// Create a new ledger whose records only the auditor can decrypt.
    Init {
        /// The ledger directory to create (0700).
        #[arg(long)]
        ledger: PathBuf,
        /// The auditor's public key (auditor.pub).
        #[arg(long)]
        recipient: PathBuf,
        /// Rotate key epochs after this many entries.
        #[arg(long, default_value_t = 100_000)]
        rotate_records: u64,
        /// Rotate key epochs after this many seconds.
        #[arg(long, default_value_t = 600)]
        rotate_secs: u64,
    },
    /// Append decisions: one JSON object as argument, or NDJSON on stdin. Prints one
    /// receipt (seq, hash) per decision, once durable.
    Append {
        /// The ledger directory.
        #[arg(long)]
        ledger: PathBuf,
        /// One decision as JSON; without it, NDJSON is read from stdin.
        json: Option<String>,
        /// With NDJSON on stdin: decisions per atomic commit.
        #[arg(long, default_value_t = 10_000)]
        batch: usize,
    },
    /// Print the latest signed checkpoint (text) on stdout, to keep elsewhere as an anchor.
    Checkpoint {
        /// The ledger directory.
        #[arg(long)]
        ledger: PathBuf,
    },
    /// Start a new key epoch now (the old epoch's secrets are destroyed).
    Rotate {
        /// The ledger directory.
        #[arg(long)]
        ledger: PathBuf,
    },
    /// Write one self-describing file for offline audit.
    Export {
        /// The ledger directory.
        #[arg(long)]
        ledger: PathBuf,
        /// The export file to write.
        #[arg(long)]
        out: PathBuf,
    },
    /// Prove a ledger or export intact, with only its public key.
    Verify {
        /// What to read and check against.
        #[command(flatten)]
        read: ReadArgs,
        /// Also decrypt every decision and check it (auditor.key).
        #[arg(long)]
        auditor_key: Option<PathBuf>,
    },
    /// Reconstruct loops: retry storms, identical repeated calls, endless polling.
    Loops {
        /// What to read and check against.
        #[command(flatten)]
        read: ReadArgs,
        /// The auditor's secret key.
        #[arg(long)]
        auditor_key: PathBuf,
        /// Report even if the chain does not verify (every page says so).
        #[arg(long)]
        force: bool,
        /// Loop thresholds.
        #[command(flatten)]
        thresholds: Thresholds,
    },
    /// Resumable handoff summaries: why each run stopped and what is safe to resume.
    Handoff {
        /// What to read and check against.
        #[command(flatten)]
        read: ReadArgs,
        /// The auditor's secret key.
        #[arg(long)]
        auditor_key: PathBuf,
        /// Only this run.
        #[arg(long)]
        run: Option<String>,
        /// Report even if the chain does not verify (every page says so).
        #[arg(long)]
        force: bool,
        /// Loop thresholds.
        #[command(flatten)]
        thresholds: Thresholds,
    },
    /// Run the append daemon: HTTP/1.1 JSON on a Unix socket (and optionally loopback TCP).
    Serve {
        /// The ledger directory.
        #[arg(long)]
        ledger: PathBuf,
        /// The Unix socket to listen on.
        #[arg(long)]
        socket: PathBuf,
        /// Also listen on this loopback TCP address (e.g. 127.0.0.1:7878).
        #[arg(long)]
        listen: Option<std::net::SocketAddr>,
        /// The operator socket (mode 0600): raw decisions, pause, resume, kill,
        /// approvals, export.
        #[arg(long)]
        operator_socket: Option<PathBuf>,
        /// The gate's policy (TOML; default: the built-in defaults).
        #[arg(long)]
        policy: Option<PathBuf>,
        /// The agent socket's permission bits, in octal.
        #[arg(long, value_name = "MODE", default_value = "0660")]
        socket_mode: String,
        /// Give the agent socket to this group (name or gid), so agents in it can connect
        /// [default: the daemon's group].
        #[arg(long, value_name = "GROUP")]
        socket_group: Option<String>,
        /// Largest request body, in bytes; larger gets 413.
        #[arg(long, value_name = "BYTES", default_value_t = 1024 * 1024)]
        max_body_bytes: usize,
        /// Decisions per second each peer (uid; loopback TCP is one peer) may append;
        /// over it, 429 with Retry-After [default: no limit].
        #[arg(long, value_name = "N")]
        rate_per_sec: Option<u32>,
        /// Open connections one peer (uid; loopback TCP is one peer) may hold; one more
        /// gets 429.
        #[arg(long, value_name = "N", default_value_t = 128)]
        max_connections_per_peer: usize,
    },
    /// Policies: `tally policy check FILE` validates one and prints it with its defaults.
    Policy {
        #[command(subcommand)]
        command: PolicyCommand,
    },
    /// The whole story on the embedded store: agents append decisions, the ledger is
    /// exported and verified, loops are found and handoffs printed.
    Demo {
        /// Keep the demo's files here (default: a temporary directory, removed after).
        #[arg(long)]
        dir: Option<PathBuf>,
    },
}

/// `tally policy ...`.
#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Validate a policy file and print it with every default filled in.
    Check {
        /// The policy file (TOML).
        file: PathBuf,
    },
}

//! Command-line definitions only (clap). Behaviour lives in `commands.rs`.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

mod operator;
mod serve;
pub use operator::{
    ApprovalsArgs, ApproveArgs, DenyArgs, KeyCreateArgs, KeyListArgs, KeyRevokeArgs, KeysCommand,
    RunArgs, RunsArgs, SettleArgs, TopArgs,
};
pub use serve::ServeArgs;

/// tally: an append-only, hash-chained, encrypted audit ledger for AI-agent budget
/// decisions, and the offline verifier that audits it.
#[derive(Parser, Debug)]
#[command(name = "tally", version, after_help = AFTER_HELP)]
pub struct Cli {
    /// Say nothing on standard error but errors: no notes, no progress.
    #[arg(short, long, global = true)]
    pub quiet: bool,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Exit codes and examples, under `tally --help`.
const AFTER_HELP: &str = "\
Exit codes:
  0  done; for verify, loops and handoff: verified intact
  1  tampering or an inconsistency found
  2  usage or I/O error (nothing changed, unless the message says what was)
  3  intact but incomplete evidence (an unsealed tail, or a required anchor missing)

Examples:
  tally init --ledger ./ledger --recipient auditor.pub
  tally append --ledger ./ledger < decisions.ndjson
  curl --unix-socket operator.sock http://tally/v1/export | tally verify - --key ledger.pub

A PATH or FILE of `-` is standard input. Man pages: `tally man DIR`; shell completions:
`tally completions bash|zsh|fish`.";

/// Options shared by the commands that read a ledger for the auditor.
#[derive(clap::Args, Debug, Clone)]
pub struct ReadArgs {
    /// A ledger directory (when no writer holds it), an export file, or `-` for an
    /// export on standard input. Several ledgers whose gates share one state (a fleet,
    /// docs/FLEET.md) are audited as one: each run gets one report and one handoff.
    #[arg(required = true, value_name = "PATH")]
    pub paths: Vec<PathBuf>,
    /// The ledger's public verification key (ledger.pub), obtained from the ledger's
    /// owner: one per ledger, in the order the ledgers are given.
    #[arg(long = "key", required = true, value_name = "KEY")]
    pub keys: Vec<PathBuf>,
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

/// The rules runs are read under (docs/REPORTS.md).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct Rules {
    /// The policy runs with no recorded policy (appended raw, not started by the gate)
    /// are read under: its exempt tools, loop breakers, retries, polling and approvers; a
    /// policy file as `tally serve --policy` takes [default: the gate's defaults]. A run
    /// the gate governs is always read under the policy recorded with it.
    #[arg(long, value_name = "FILE")]
    pub policy: Option<PathBuf>,
}

/// The subcommands (docs/CLI.md).
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Create the auditor's X25519 key pair: FILE (0600) and FILE with extension .pub.
    Keygen(KeygenArgs),
    /// Sign and record a human's approval for a run: a bounded extra allocation, used
    /// once, until it expires.
    Approve(ApproveArgs),
    /// Sign and record a human's denial of an approval request: the agent's next try of
    /// exactly that call is refused `denied_by_approver` (stop), with the note.
    Deny(DenyArgs),
    /// The approval requests the gate holds, pending first, nearest deadline first: the
    /// refused call, what granting it would cost, where its run stands, who asked.
    Approvals(ApprovalsArgs),
    /// Every run the gate holds, nearest to a limit first: state, nearest limit, used
    /// of limit, its last refusal and the action it was told.
    Runs(RunsArgs),
    /// A run's token again (its agent's API key for the proxy), for the operator.
    Token(RunArgs),
    /// Keys that start runs through the proxy: create, list, revoke (docs/KEYS.md).
    Keys {
        #[command(subcommand)]
        command: KeysCommand,
    },
    /// Watch the gate live in the terminal: runs nearest to a limit first, their last
    /// refusal and action, breakers, refusals, approvals waiting (q quits). Without a
    /// terminal (a pipe, TERM=dumb) it prints one plain table and exits.
    Top(TopArgs),
    /// Pause a run: its next check, from any worker, is refused until it is resumed.
    Pause(RunArgs),
    /// Resume a paused run.
    Resume(RunArgs),
    /// Kill a run: a stop record (`killed_by_operator`); every later check is refused.
    Kill(RunArgs),
    /// Settle what an attempt holds when nobody saw how it ended (a cut stream, a daemon
    /// killed mid-call): its outcome, from the upstream's own figure (its console or
    /// invoice), recorded as the operator's.
    Settle(SettleArgs),
    /// Create a new ledger whose records only the auditor can decrypt.
    Init(InitArgs),
    /// Append decisions: one JSON object as argument, or NDJSON on stdin. Every line is
    /// checked before anything is written; prints one receipt (seq, hash) per decision,
    /// once durable.
    Append(AppendArgs),
    /// Print the latest checkpoint on stdout, to keep elsewhere as an anchor: a C2SP
    /// checkpoint (origin, size, Merkle root) signed by the ledger's log key.
    Checkpoint(CheckpointArgs),
    /// Write a C2SP tlog-proof: one entry (--seq), every entry of a run (--run, with the
    /// auditor key), or a consistency proof from an older checkpoint (--from).
    Prove(ProveArgs),
    /// Check a proof offline with the ledger's public key: inclusion of each entry, the
    /// checkpoint's signature, the witnesses' quorum; with the auditor key, show the
    /// decisions and whether a run's are complete.
    VerifyProof(VerifyProofArgs),
    /// A C2SP tlog-witness: `tally witness keygen`, `tally witness serve`.
    Witness {
        #[command(subcommand)]
        command: WitnessCommand,
    },
    /// Rebuild the ledger's index (the gate's derived state, seq positions) from its log
    /// segments; nothing that verifies trusts the index. The ledger must not be held.
    Reindex(LedgerArgs),
    /// Start a new key epoch now (the old epoch's secrets are destroyed).
    Rotate(LedgerArgs),
    /// Write one self-describing file for offline audit.
    Export(ExportArgs),
    /// Prove a ledger or export intact, with only its public key.
    Verify(VerifyArgs),
    /// Reconstruct loops: retry storms, identical repeated calls, endless polling.
    Loops(LoopsArgs),
    /// Resumable handoff summaries: why each run stopped and what is safe to resume.
    Handoff(ReportArgs),
    /// Attempts per run against its cap, and spend against its limit.
    Stats(ReportArgs),
    /// Run the append daemon: HTTP/1.1 JSON on a Unix socket (and optionally loopback TCP).
    Serve(Box<ServeArgs>),
    /// A stdio MCP proxy: the MCP client starts it in place of the server; it starts the
    /// server and checks every `tools/call` with the gate first (docs/MCP.md).
    Mcp(McpArgs),
    /// Policies: `tally policy check FILE` validates one and prints it with its defaults;
    /// `tally policy example claude-code` prints the one shipped for Claude Code.
    Policy {
        #[command(subcommand)]
        command: PolicyCommand,
    },
    /// Model prices: `tally prices import FILE` reads a published price table (LiteLLM's
    /// JSON) into policy price entries with their source and date.
    Prices {
        #[command(subcommand)]
        command: PricesCommand,
    },
    /// Agent hooks answered by the gate: `tally hook claude-code` for Claude Code's
    /// PreToolUse, PostToolUse and SessionEnd hooks.
    Hook {
        #[command(subcommand)]
        command: HookCommand,
    },
    /// The MCP server of `tally demo`'s MCP story (a tool that keeps failing), on stdio.
    #[command(hide = true)]
    McpDemoServer,
    /// The whole story on the embedded store: agents append decisions, the ledger is
    /// exported and verified, loops are found and handoffs printed.
    Demo(DemoArgs),
    /// Write man pages (tally.1 and one per subcommand) into DIR.
    #[command(hide = true)]
    Man(ManArgs),
    /// Print a shell completion script.
    #[command(hide = true)]
    Completions(CompletionsArgs),
}

/// `tally verify`'s arguments.
#[derive(clap::Args, Debug)]
pub struct VerifyArgs {
    /// What to read and check against.
    #[command(flatten)]
    pub read: ReadArgs,
    /// Also decrypt every decision and check it (auditor.key): replay every gate
    /// decision and audit every record with the policy core.
    #[arg(long)]
    pub auditor_key: Option<PathBuf>,
    /// The rules runs are read under.
    #[command(flatten)]
    pub rules: Rules,
    /// Judge the cosigned checkpoints by this C2SP tlog-policy: without one its quorum
    /// cosigned, exit 3; say which seqs they cover.
    #[arg(long, value_name = "FILE")]
    pub witness_policy: Option<PathBuf>,
    /// Also ask each witness of --witness-policy that has a URL for the latest
    /// checkpoint it cosigned, and hold the ledger to it (truncation, rollback, fork).
    #[arg(long, requires = "witness_policy")]
    pub ask_witnesses: bool,
    /// A PEM file of CA certificates to trust for witness NAME's HTTPS beside the
    /// Mozilla roots (a private CA); repeatable.
    #[arg(long, value_name = "NAME=PEM", requires = "ask_witnesses")]
    pub witness_ca: Vec<String>,
    /// Check each C2SP --anchor by an RFC 9162 consistency proof from the ledger
    /// directory's tree files to the tree its log records, without reading the entries:
    /// shows the log was not cut below or forked from the anchor, and nothing more (the
    /// entries, signatures, decryption and replay are the walk's; docs/VERIFY.md).
    /// Exit 0 consistent, 1 cut, fork or foreign anchor, 3 unproven (tree files that do
    /// not match the log: `tally reindex`).
    #[arg(long, requires = "anchors", conflicts_with_all = ["auditor_key", "witness_policy", "require_anchor"])]
    pub no_walk: bool,
}

/// `tally loops`'s arguments.
#[derive(clap::Args, Debug)]
pub struct LoopsArgs {
    /// What to read and check against.
    #[command(flatten)]
    pub read: ReadArgs,
    /// The auditor's secret key.
    #[arg(long)]
    pub auditor_key: PathBuf,
    /// Report even if the chain does not verify (every page says so).
    #[arg(long)]
    pub force: bool,
    /// The rules runs are read under.
    #[command(flatten)]
    pub rules: Rules,
}

/// The arguments of `tally handoff` and `tally stats`.
#[derive(clap::Args, Debug)]
pub struct ReportArgs {
    /// What to read and check against.
    #[command(flatten)]
    pub read: ReadArgs,
    /// The auditor's secret key.
    #[arg(long)]
    pub auditor_key: PathBuf,
    /// Only this run.
    #[arg(long)]
    pub run: Option<String>,
    /// Report even if the chain does not verify (every page says so).
    #[arg(long)]
    pub force: bool,
    /// The rules runs are read under.
    #[command(flatten)]
    pub rules: Rules,
}

/// `tally keygen`'s arguments.
#[derive(clap::Args, Debug)]
pub struct KeygenArgs {
    /// Where to write the secret key.
    #[arg(long)]
    pub out: PathBuf,
    /// An approver's Ed25519 key pair (its public half goes in the policy's
    /// `[approvals.approvers]`), instead of an auditor's X25519 pair.
    #[arg(long)]
    pub approver: bool,
}

/// `tally init`'s arguments.
#[derive(clap::Args, Debug)]
pub struct InitArgs {
    /// The ledger directory to create (0700).
    #[arg(long)]
    pub ledger: PathBuf,
    /// The auditor's public key (auditor.pub).
    #[arg(long)]
    pub recipient: PathBuf,
    /// Rotate key epochs after this many entries.
    #[arg(long, default_value_t = 100_000)]
    pub rotate_records: u64,
    /// Rotate key epochs after this many seconds.
    #[arg(long, default_value_t = 600)]
    pub rotate_secs: u64,
}

/// `tally append`'s arguments.
#[derive(clap::Args, Debug)]
pub struct AppendArgs {
    /// The ledger directory.
    #[arg(long)]
    pub ledger: PathBuf,
    /// One decision as JSON; without it (or with `-`), NDJSON is read from stdin.
    pub json: Option<String>,
    /// With NDJSON on stdin: decisions per atomic commit.
    #[arg(long, default_value_t = 10_000)]
    pub batch: usize,
}

/// `tally checkpoint`'s arguments.
#[derive(clap::Args, Debug)]
pub struct CheckpointArgs {
    /// The ledger directory.
    #[arg(long)]
    pub ledger: PathBuf,
    /// Print the log key's vkey instead (what witnesses and tlog-policy files name).
    #[arg(long, conflicts_with = "chain")]
    pub vkey: bool,
    /// Print the chain's own checkpoint (the epoch key's seal in the log) instead.
    #[arg(long)]
    pub chain: bool,
}

/// A ledger directory: `tally reindex` and `tally rotate`.
#[derive(clap::Args, Debug)]
pub struct LedgerArgs {
    /// The ledger directory.
    #[arg(long)]
    pub ledger: PathBuf,
}

/// `tally export`'s arguments.
#[derive(clap::Args, Debug)]
pub struct ExportArgs {
    /// The ledger directory.
    #[arg(long)]
    pub ledger: PathBuf,
    /// The export file to write, by convention NAME.tally (it must not exist, unless
    /// --force).
    #[arg(long)]
    pub out: PathBuf,
    /// Replace an existing file at --out (a symlink there is replaced, not followed).
    #[arg(long)]
    pub force: bool,
}

/// `tally demo`'s arguments.
#[derive(clap::Args, Debug)]
pub struct DemoArgs {
    /// Keep the demo's files here (default: a temporary directory, removed after).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Print everything: every loop, finding and handoff, and the anchor's text
    /// (default: about a screen per act).
    #[arg(long, short)]
    pub verbose: bool,
}

/// `tally prove`'s arguments.
#[derive(clap::Args, Debug)]
pub struct ProveArgs {
    /// The ledger directory.
    #[arg(long)]
    pub ledger: PathBuf,
    /// The entry to prove.
    #[arg(long, conflicts_with_all = ["run", "from"])]
    pub seq: Option<u64>,
    /// The run whose every entry to prove (needs --auditor-key to find them).
    #[arg(long, conflicts_with = "from", requires = "auditor_key")]
    pub run: Option<String>,
    /// An older C2SP checkpoint of this ledger: prove the latest one extends it.
    #[arg(long, value_name = "CP")]
    pub from: Option<PathBuf>,
    /// The auditor's secret key (for --run).
    #[arg(long)]
    pub auditor_key: Option<PathBuf>,
    /// Where to write the proof (default: standard output).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// `tally verify-proof`'s arguments.
#[derive(clap::Args, Debug)]
pub struct VerifyProofArgs {
    /// The proof file (`tally prove`), or `-` for standard input.
    pub file: PathBuf,
    /// The ledger's public verification key (ledger.pub, version 2: with its log key).
    #[arg(long)]
    pub key: PathBuf,
    /// Require a quorum of valid cosignatures (C2SP tlog-policy file).
    #[arg(long, value_name = "FILE")]
    pub witness_policy: Option<PathBuf>,
    /// The auditor's secret key: decrypt and show the decisions.
    #[arg(long)]
    pub auditor_key: Option<PathBuf>,
    /// For a consistency proof: the older checkpoint it starts from (held by you).
    #[arg(long, value_name = "CP")]
    pub from: Option<PathBuf>,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// `tally mcp`'s arguments.
#[derive(clap::Args, Debug)]
pub struct McpArgs {
    /// The gate's agent socket (`tally serve --socket`).
    #[arg(long)]
    pub socket: PathBuf,
    /// The run the calls are checked under: started if new, joined if it exists.
    #[arg(long)]
    pub run: String,
    /// Effect overrides: a TOML file, `[effects]` with `"server/tool" = "read"`.
    #[arg(long, value_name = "FILE")]
    pub policy_map: Option<PathBuf>,
    /// The server's name in tool names (`server/tool`) [default: its initialize
    /// answer's serverInfo.name].
    #[arg(long)]
    pub server_name: Option<String>,
    /// The run's goal, if this starts it.
    #[arg(long)]
    pub goal: Option<String>,
    /// The worker name recorded with each decision.
    #[arg(long)]
    pub worker: Option<String>,
    /// The credential the run is started and checked under.
    #[arg(long)]
    pub credential: Option<String>,
    /// The MCP server's command and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "SERVER_COMMAND")]
    pub command: Vec<std::ffi::OsString>,
}

/// `tally witness ...`.
#[derive(Debug, Subcommand)]
pub enum WitnessCommand {
    /// Make a witness key: FILE (0600, its name and Ed25519 secret) and FILE.pub (its
    /// cosigner vkey, for tlog-policy files).
    Keygen {
        /// The witness's name (its cosignatures' key name), e.g. `example.org/w1`.
        #[arg(long)]
        name: String,
        /// Where to write the secret key.
        #[arg(long)]
        out: PathBuf,
    },
    /// Serve C2SP tlog-witness (`POST /add-checkpoint`, `GET /<origin hash>/checkpoint`)
    /// over HTTPS (--tls-cert, --tls-key), or plain HTTP on a loopback address (or,
    /// with --plain-http, behind a TLS-terminating proxy).
    Serve {
        /// The witness key (`tally witness keygen`).
        #[arg(long)]
        key: PathBuf,
        /// Where to listen, e.g. 127.0.0.1:7380 or 0.0.0.0:443.
        #[arg(long)]
        listen: std::net::SocketAddr,
        /// The TLS certificate chain (PEM, leaf first): serve HTTPS.
        #[arg(long, value_name = "PEM", requires = "tls_key")]
        tls_cert: Option<PathBuf>,
        /// The TLS private key (PEM, mode 0600).
        #[arg(long, value_name = "PEM", requires = "tls_cert")]
        tls_key: Option<PathBuf>,
        /// Serve plain HTTP on a non-loopback address: only behind a TLS-terminating
        /// proxy (without TLS, plain HTTP is served on loopback alone).
        #[arg(long, conflicts_with = "tls_cert")]
        plain_http: bool,
        /// The state directory (the latest checkpoint cosigned per log; created 0700).
        #[arg(long)]
        state: PathBuf,
        /// A log to witness: its vkey (`tally checkpoint --vkey`); repeatable.
        #[arg(long = "log", value_name = "VKEY", required = true)]
        logs: Vec<String>,
    },
}

/// `tally hook ...`.
#[derive(Debug, Subcommand)]
pub enum HookCommand {
    /// Claude Code's hooks: reads the hook's JSON on stdin. PreToolUse asks the gate and
    /// prints the hook's decision (allow, deny or ask; exit 2 blocks the call when the
    /// gate cannot be asked: fail closed); PostToolUse and PostToolUseFailure record the
    /// call's outcome; SessionEnd stops the session's run.
    ClaudeCode(ClaudeCodeArgs),
}

/// `TOOL=EFFECT` for `--effect`.
fn tool_effect(s: &str) -> Result<(String, String), String> {
    let (tool, effect) = s
        .split_once('=')
        .ok_or_else(|| format!("`{s}`: give TOOL=EFFECT, e.g. Bash=read"))?;
    match effect {
        "read" | "idempotent_write" | "non_idempotent_write" => {
            Ok((tool.to_owned(), effect.to_owned()))
        }
        _ => Err(format!(
            "`{effect}` is not an effect class: read, idempotent_write or non_idempotent_write"
        )),
    }
}

/// `tally policy ...`.
#[derive(Subcommand, Debug)]
pub enum PolicyCommand {
    /// Validate a policy file and print it with every default filled in.
    Check(PolicyCheckArgs),
    /// Print a policy tally ships for one kind of agent (`claude-code`: the ceilings and
    /// breaker a Claude Code session under `tally hook claude-code` needs).
    Example(PolicyExampleArgs),
    /// Replay every run the gate governed under another policy: which calls it would
    /// have refused or allowed, where each run would have stopped, what it would have
    /// saved (docs/REPORTS.md, "backtest").
    Backtest(PolicyBacktestArgs),
}

/// `tally policy backtest`.
#[derive(clap::Args, Debug)]
pub struct PolicyBacktestArgs {
    /// The policy to try (TOML, as `tally serve --policy` takes it).
    #[arg(long, value_name = "FILE")]
    pub policy: PathBuf,
    /// What to read and check against.
    #[command(flatten)]
    pub read: ReadArgs,
    /// The auditor's secret key.
    #[arg(long)]
    pub auditor_key: PathBuf,
    /// Report even if the chain does not verify (every page says so).
    #[arg(long)]
    pub force: bool,
}

/// `tally policy example`.
#[derive(clap::Args, Debug)]
pub struct PolicyExampleArgs {
    /// Which policy.
    pub name: PolicyExample,
}

/// The policies `tally policy example` prints.
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum PolicyExample {
    /// Claude Code sessions gated by `tally hook claude-code` (dist/claude-code.toml).
    ClaudeCode,
}

/// `tally hook claude-code`.
#[derive(clap::Args, Debug)]
pub struct ClaudeCodeArgs {
    /// The daemon's agent socket.
    #[arg(long)]
    pub socket: PathBuf,
    /// The run the session's calls count against [default: claude-code-SESSION_ID].
    #[arg(long)]
    pub run: Option<String>,
    /// Where allowed calls wait for their outcome [default: $XDG_RUNTIME_DIR/tally-hook,
    /// else /tmp/tally-hook-UID].
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// A tool's effect class over the built-in one, e.g. `--effect Bash=read`
    /// (read, idempotent_write, non_idempotent_write).
    #[arg(long, value_name = "TOOL=EFFECT", value_parser = tool_effect)]
    pub effect: Vec<(String, String)>,
    /// Print no decision for an allowed call, so Claude Code's own permission rules
    /// and prompts still apply to it.
    #[arg(long)]
    pub defer: bool,
}

/// `tally policy check`.
#[derive(clap::Args, Debug)]
pub struct PolicyCheckArgs {
    /// The policy file (TOML), or `-` for standard input.
    pub file: PathBuf,
    /// The day prices' ages are counted to (`max_price_age_days`), YYYY-MM-DD
    /// [default: today, UTC].
    #[arg(long, value_name = "DATE", value_parser = day)]
    pub today: Option<tally_policy::dates::Date>,
}

/// `tally prices ...`.
#[derive(Subcommand, Debug)]
pub enum PricesCommand {
    /// Read a published price table (LiteLLM's model_prices_and_context_window.json)
    /// into `[prices.UPSTREAM."MODEL"]` tables, each with its source and as_of; chat
    /// models only, the rest skipped and counted. Nothing is written if an entry is
    /// malformed.
    Import(PricesImportArgs),
}

/// `tally prices import`.
#[derive(clap::Args, Debug)]
pub struct PricesImportArgs {
    /// The price table (JSON), as downloaded.
    pub file: PathBuf,
    /// Write the prices to this new file (never over one) [default: standard output].
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Import this provider's models (`litellm_provider`), under an upstream of its
    /// name or the one given (`gemini=google`); repeatable [default: every provider].
    #[arg(long, value_name = "PROVIDER[=UPSTREAM]", value_parser = provider)]
    pub provider: Vec<(String, String)>,
    /// Import only this model id (exact, or a prefix ending in `*`); repeatable.
    #[arg(long, value_name = "ID")]
    pub model: Vec<String>,
    /// The prices' `source` [default: the table's file name].
    #[arg(long, value_name = "TEXT")]
    pub source: Option<String>,
    /// The prices' `as_of`, YYYY-MM-DD: the day the table was published or fetched
    /// [default: today, UTC].
    #[arg(long, value_name = "DATE", value_parser = day)]
    pub as_of: Option<tally_policy::dates::Date>,
}

/// `tally man`.
#[derive(clap::Args, Debug)]
pub struct ManArgs {
    /// Where to write them (created if missing).
    pub dir: PathBuf,
}

/// `tally completions`.
#[derive(clap::Args, Debug)]
pub struct CompletionsArgs {
    /// The shell.
    pub shell: clap_complete::Shell,
}

/// `PROVIDER` or `PROVIDER=UPSTREAM`: a LiteLLM provider and the upstream its prices go
/// under (its own name by default).
fn provider(text: &str) -> Result<(String, String), String> {
    let (provider, upstream) = text.split_once('=').unwrap_or((text, text));
    if provider.is_empty() || upstream.is_empty() {
        return Err(format!(
            "`{}` is not PROVIDER or PROVIDER=UPSTREAM (e.g. openai, or gemini=google)",
            text.escape_debug()
        ));
    }
    Ok((provider.to_owned(), upstream.to_owned()))
}

/// A day, `YYYY-MM-DD`.
fn day(text: &str) -> Result<tally_policy::dates::Date, String> {
    tally_policy::dates::Date::parse(text).ok_or_else(|| {
        format!(
            "`{}` is not a date: write YYYY-MM-DD, e.g. 2026-12-01",
            text.escape_debug()
        )
    })
}

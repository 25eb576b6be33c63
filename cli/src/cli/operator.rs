//! The arguments of the commands that talk to the daemon's operator socket: runs,
//! settling, approving and the approval requests, `tally top`.

use std::path::PathBuf;

/// The operator socket and a run: `tally pause`, `resume` and `kill`.
#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// The daemon's operator socket.
    #[arg(long)]
    pub operator_socket: PathBuf,
    /// The run.
    #[arg(long)]
    pub run: String,
}

/// `tally settle`'s arguments.
#[derive(clap::Args, Debug)]
#[command(group(clap::ArgGroup::new("amount").required(true).args(["usd", "release"])))]
pub struct SettleArgs {
    /// The daemon's operator socket.
    #[arg(long)]
    pub operator_socket: PathBuf,
    /// The run.
    #[arg(long)]
    pub run: String,
    /// The attempt whose reservation is held (its `x-tally-attempt`, or the handoff's).
    #[arg(long)]
    pub attempt: u64,
    /// What the call cost, in US dollars as the upstream billed it (exact: `0.0137`).
    #[arg(long)]
    pub usd: Option<String>,
    /// It cost nothing: release what it held.
    #[arg(long)]
    pub release: bool,
}

/// `tally approve`'s arguments.
#[derive(clap::Args, Debug)]
pub struct ApproveArgs {
    /// The approval request to grant (`tally approvals` lists them): its run and the
    /// scope that lets exactly its call through are the request's. With `--new-run`, its
    /// run is the one continued, with `--attempts` and spend as the new run's budget.
    #[arg(conflicts_with_all = ["run", "tool", "operation"])]
    pub request: Option<String>,
    /// The daemon's operator socket.
    #[arg(long)]
    pub operator_socket: PathBuf,
    /// The run (a grant without a request).
    #[arg(long, required_unless_present = "request")]
    pub run: Option<String>,
    /// The approver's secret key (`tally keygen --approver`).
    #[arg(long)]
    pub key: PathBuf,
    /// The approver's name in the policy (default: the key file's name, `dana` for
    /// `dana.key`).
    #[arg(long)]
    pub approver: Option<String>,
    /// How long it is valid, on the run's clock: `30s`, `10m`, `2h`, `500ms` (for a
    /// request: at most until the run's deadline; default 10m).
    #[arg(long, required_unless_present = "request")]
    pub expires: Option<String>,
    /// Extra attempts (and side effects).
    #[arg(long)]
    pub attempts: Option<u64>,
    /// Extra spend in US dollars, exact (`0.30`).
    #[arg(long, conflicts_with = "cents")]
    pub usd: Option<String>,
    /// Extra spend in cents.
    #[arg(long)]
    pub cents: Option<u64>,
    /// The one tool it is for (unblocks it, if the policy blocks it).
    #[arg(long)]
    pub tool: Option<String>,
    /// The one operation it is for.
    #[arg(long)]
    pub operation: Option<String>,
    /// Why, for the record.
    #[arg(long)]
    pub note: Option<String>,
    /// A continuation grant: start a new run continuing `--run` (or REQUEST's run;
    /// stopped, or stopped first) with `--attempts` and spend as its budget; prints the
    /// new run and its token.
    #[arg(long, conflicts_with_all = ["tool", "operation"])]
    pub new_run: bool,
}

/// `tally deny`'s arguments.
#[derive(clap::Args, Debug)]
pub struct DenyArgs {
    /// The approval request to deny (`tally approvals` lists them): the agent's next
    /// check of exactly its call is refused `denied_by_approver`, with the note.
    pub request: String,
    /// The daemon's operator socket.
    #[arg(long)]
    pub operator_socket: PathBuf,
    /// The approver's secret key (`tally keygen --approver`).
    #[arg(long)]
    pub key: PathBuf,
    /// The approver's name in the policy (default: the key file's name, `dana` for
    /// `dana.key`).
    #[arg(long)]
    pub approver: Option<String>,
    /// Why, 1 to 500 bytes: the agent is told it.
    #[arg(long)]
    pub note: String,
}

/// `tally approvals`'s arguments.
#[derive(clap::Args, Debug)]
pub struct ApprovalsArgs {
    /// The daemon's operator socket.
    #[arg(long)]
    pub operator_socket: PathBuf,
    /// JSON instead of text: `GET /v1/approvals`'s answer.
    #[arg(long)]
    pub json: bool,
}

/// `tally runs`'s arguments.
#[derive(clap::Args, Debug)]
pub struct RunsArgs {
    /// The daemon's operator socket.
    #[arg(long)]
    pub operator_socket: PathBuf,
    /// JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// `tally top`'s arguments.
#[derive(clap::Args, Debug)]
pub struct TopArgs {
    /// The daemon's operator socket.
    #[arg(long)]
    pub operator_socket: PathBuf,
    /// Print the plain table once, even on a terminal.
    #[arg(long)]
    pub once: bool,
    /// An approver's secret key (`tally keygen --approver`): `a` then approves the
    /// selected approval request, signed as `tally approve` signs.
    #[arg(long)]
    pub approver_key: Option<PathBuf>,
    /// The approver's name in the policy (default: the key file's name).
    #[arg(long, requires = "approver_key")]
    pub approver: Option<String>,
}

/// `tally keys`: keys that start runs through the proxy (docs/KEYS.md).
#[derive(clap::Subcommand, Debug)]
pub enum KeysCommand {
    /// Make a key for a principal (a uid): printed this once, kept only as a MAC.
    Create(KeyCreateArgs),
    /// Every key: id, principal, label, made, revoked, what its runs spent this UTC day.
    List(KeyListArgs),
    /// Revoke a key: every call with it is refused from now on.
    Revoke(KeyRevokeArgs),
}

/// `tally keys create`'s arguments.
#[derive(clap::Args, Debug)]
pub struct KeyCreateArgs {
    /// The daemon's operator socket.
    #[arg(long)]
    pub operator_socket: PathBuf,
    /// The uid whose runs the key starts: its principal budget (the policy's
    /// `[principals]`) bounds them all.
    #[arg(long)]
    pub principal: u32,
    /// How long a call without `x-tally-task` continues the key's current run: `30m`,
    /// `2h`, `1d` [default: 1d].
    #[arg(long)]
    pub run_window: Option<String>,
    /// What the key's runs may spend together per UTC day, US dollars (`5`, `0.25`); its
    /// principal's budget still applies too.
    #[arg(long, value_name = "USD")]
    pub budget_per_day: Option<String>,
    /// How many runs (tasks and windows) the key may start per UTC day.
    #[arg(long, value_name = "N")]
    pub runs_per_day: Option<u64>,
    /// A label for the operator (at most 200 bytes).
    #[arg(long)]
    pub label: Option<String>,
    /// JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// `tally keys list`'s arguments.
#[derive(clap::Args, Debug)]
pub struct KeyListArgs {
    /// The daemon's operator socket.
    #[arg(long)]
    pub operator_socket: PathBuf,
    /// JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// `tally keys revoke`'s arguments.
#[derive(clap::Args, Debug)]
pub struct KeyRevokeArgs {
    /// The key's id (`tally keys list`).
    pub id: String,
    /// The daemon's operator socket.
    #[arg(long)]
    pub operator_socket: PathBuf,
}

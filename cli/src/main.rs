//! The `tally` binary: argument parsing, output and exit codes. The work is done by
//! `tally-ledger` and `tally-verify`.

// Every write goes through `output`, which never panics on a closed pipe.
#![deny(clippy::print_stdout, clippy::print_stderr)]

mod output;

mod approvals;
mod backtest;
mod cli;
mod commands;
mod continuation;
mod demo;
mod deny;
mod desk;
mod fleet;
mod gate;
mod generate;
mod hook;
mod keys;
mod mcp;
mod no_walk;
mod operator;
mod prices;
mod prove;
mod reindex;
mod serve;
mod stats;
mod top;
mod witness;

use std::process::ExitCode;

/// The verifier frees on one thread what its workers allocate on another, and the
/// analyses allocate per call: mimalloc does this much better than the system allocator.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use clap::Parser;

use cli::{Cli, Command};
use output::errln;

/// How `tally` ends: the only exit codes it has (argument errors from clap are 2 too).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    /// 0: done; for an audit, verified intact.
    Success,
    /// 1: tampering or an inconsistency found.
    Findings,
    /// 2: a usage or I/O error; nothing was changed unless the message says what was.
    Error,
    /// 3: intact but incomplete evidence (an unsealed tail, a required anchor missing).
    Incomplete,
}

impl From<tally_verify::Verdict> for Exit {
    /// A verdict's exit: intact 0, tampered 1, incomplete 3 (docs/CLI.md).
    fn from(verdict: tally_verify::Verdict) -> Exit {
        match verdict {
            tally_verify::Verdict::Intact => Exit::Success,
            tally_verify::Verdict::Tampered => Exit::Findings,
            tally_verify::Verdict::Incomplete => Exit::Incomplete,
        }
    }
}

impl From<Exit> for ExitCode {
    fn from(exit: Exit) -> ExitCode {
        ExitCode::from(match exit {
            Exit::Success => 0,
            Exit::Findings => 1,
            Exit::Error => 2,
            Exit::Incomplete => 3,
        })
    }
}

fn main() -> ExitCode {
    // Transparent huge pages off for this process: the allocator returns memory and takes
    // fresh pages again, and with THP each first touch zeroes 2 MiB (a tenth of the
    // ledger's commit stage; docs/PERFORMANCE.md). A kernel without the prctl is fine too.
    let _ = rustix::thread::disable_transparent_huge_pages(true);
    let cli = Cli::parse();
    output::set_quiet(cli.quiet);
    let exit = match run(cli.command) {
        Ok(exit) => exit,
        Err(e) if is_closed_pipe(&e) => Exit::Success,
        Err(e) => {
            errln!("tally: error: {}", render(&e));
            Exit::Error
        }
    };
    match output::finish() {
        // A closed pipe (`tally verify ... | head`) ends quietly, with the command's code.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => exit.into(),
        Err(e) => {
            errln!("tally: error: writing to standard output: {e}");
            Exit::Error.into()
        }
        Ok(()) => exit.into(),
    }
}

fn is_closed_pipe(e: &anyhow::Error) -> bool {
    e.chain()
        .filter_map(|c| c.downcast_ref::<std::io::Error>())
        .any(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
}

/// The error and its causes, each said once: library errors often carry their source in
/// their own message (`path: File exists (os error 17)`), and anyhow would repeat it.
fn render(e: &anyhow::Error) -> String {
    let mut text = e.to_string();
    for cause in e.chain().skip(1) {
        let c = cause.to_string();
        if !text.contains(&c) {
            text.push_str(": ");
            text.push_str(&c);
        }
    }
    text
}

fn run(command: Command) -> anyhow::Result<Exit> {
    match command {
        Command::Keygen(args) => commands::keygen(&args),
        Command::Approve(args) if args.new_run => continuation::approve(&args),
        Command::Approve(args) => operator::approve(&args),
        Command::Deny(args) => deny::deny(&args),
        Command::Approvals(args) => approvals::approvals(&args),
        Command::Runs(args) => match args.json {
            true => operator::runs(&args),
            false => top::runs_text(&args.operator_socket),
        },
        Command::Token(args) => keys::token(&args),
        Command::Keys { command } => keys::keys(&command),
        Command::Top(args) => top::top(&args),
        Command::Pause(args) => operator::lifecycle(&args, tally_api::RunAction::Pause),
        Command::Resume(args) => operator::lifecycle(&args, tally_api::RunAction::Resume),
        Command::Kill(args) => operator::lifecycle(&args, tally_api::RunAction::Kill),
        Command::Settle(args) => operator::settle(&args),
        Command::Init(args) => commands::init(&args),
        Command::Append(args) => commands::append(&args),
        Command::Checkpoint(args) => match (args.vkey, args.chain) {
            (_, true) => commands::checkpoint(&args.ledger),
            (true, _) => prove::vkey(&args.ledger),
            _ => prove::checkpoint(&args.ledger),
        },
        Command::Prove(args) => prove::prove(&args),
        Command::VerifyProof(args) => prove::verify_proof(&args),
        Command::Witness { command } => witness::run(command),
        Command::Rotate(args) => commands::rotate(&args),
        Command::Reindex(args) => reindex::run(&args),
        Command::Export(args) => commands::export(&args),
        Command::Verify(args) => commands::verify(&args),
        Command::Loops(args) => commands::loops(&args),
        Command::Handoff(args) => commands::handoff(&args),
        Command::Stats(args) => stats::stats(&args),
        Command::Serve(args) => serve::serve(*args),
        Command::Policy {
            command: cli::PolicyCommand::Check(args),
        } => commands::policy_check(&args),
        Command::Policy {
            command: cli::PolicyCommand::Example(args),
        } => commands::policy_example(&args),
        Command::Policy {
            command: cli::PolicyCommand::Backtest(args),
        } => backtest::run(&args),
        Command::Prices {
            command: cli::PricesCommand::Import(args),
        } => prices::import(&args),
        Command::Hook {
            command: cli::HookCommand::ClaudeCode(args),
        } => hook::run(&args),
        Command::Demo(args) => demo::run(&args),
        Command::McpDemoServer => demo::mcp_server(),
        Command::Man(args) => generate::man(&args),
        Command::Completions(args) => generate::completions(&args),
        Command::Mcp(args) => mcp::run(args),
    }
}

//! The `tally` binary: argument parsing, output and exit codes. The work is done by
//! `tally-ledger` and `tally-verify`.

mod cli;
mod commands;
mod demo;
mod operator;
mod serve;

use std::process::ExitCode;

/// The verifier frees on one thread what its workers allocate on another, and the
/// analyses allocate per call: mimalloc does this much better than the system allocator.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use clap::Parser;

use cli::{Cli, Command};
use tally_ledger::Rotation;

fn main() -> ExitCode {
    // Transparent huge pages off for this process: the allocator returns memory and takes
    // fresh pages again, and with THP each first touch zeroes 2 MiB (a tenth of the
    // ledger's commit stage; docs/PERFORMANCE.md). A kernel without the prctl is fine too.
    let _ = rustix::thread::disable_transparent_huge_pages(true);
    let cli = Cli::parse();
    match run(cli.command) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            // A closed pipe (e.g. `tally verify ... | head`) is not an error.
            if e.chain()
                .filter_map(|c| c.downcast_ref::<std::io::Error>())
                .any(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
            {
                return ExitCode::SUCCESS;
            }
            eprintln!("tally: error: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn run(command: Command) -> anyhow::Result<u8> {
    match command {
        Command::Keygen { out, approver } => commands::keygen(&out, approver),
        Command::Approve {
            operator_socket,
            run,
            key,
            approver,
            expires,
            attempts,
            cents,
            tool,
            operation,
            note,
        } => operator::approve(
            &operator_socket,
            operator::Grant {
                run,
                key,
                approver,
                expires,
                scope: tally_ledger::decision::Scope {
                    attempts,
                    cents,
                    tool,
                    operation,
                },
                note,
            },
        ),
        Command::Runs {
            operator_socket,
            json,
        } => operator::runs(&operator_socket, json),
        Command::Pause {
            operator_socket,
            run,
        } => operator::lifecycle(&operator_socket, &run, "pause"),
        Command::Resume {
            operator_socket,
            run,
        } => operator::lifecycle(&operator_socket, &run, "resume"),
        Command::Kill {
            operator_socket,
            run,
        } => operator::lifecycle(&operator_socket, &run, "kill"),
        Command::Init {
            ledger,
            recipient,
            rotate_records,
            rotate_secs,
        } => commands::init(
            &ledger,
            &recipient,
            Rotation {
                records: rotate_records,
                ms: rotate_secs.saturating_mul(1000),
            },
        ),
        Command::Append {
            ledger,
            json,
            batch,
        } => commands::append(&ledger, json.as_deref(), batch),
        Command::Checkpoint { ledger } => commands::checkpoint(&ledger),
        Command::Rotate { ledger } => commands::rotate(&ledger),
        Command::Export { ledger, out } => commands::export(&ledger, &out),
        Command::Verify { read, auditor_key } => commands::verify(&read, auditor_key.as_deref()),
        Command::Loops {
            read,
            auditor_key,
            force,
            thresholds,
        } => commands::loops(&read, &auditor_key, force, &thresholds),
        Command::Handoff {
            read,
            auditor_key,
            run,
            force,
            thresholds,
        } => commands::handoff(&read, &auditor_key, run.as_deref(), force, &thresholds),
        Command::Serve {
            ledger,
            socket,
            listen,
            operator_socket,
            policy,
            socket_mode,
            socket_group,
            max_body_bytes,
            rate_per_sec,
            max_connections_per_peer,
        } => serve::serve(serve::Serve {
            ledger,
            socket,
            listen,
            operator_socket,
            policy,
            socket_mode,
            socket_group,
            max_body_bytes,
            rate_per_sec,
            max_connections_per_peer,
        }),
        Command::Policy {
            command: cli::PolicyCommand::Check { file },
        } => commands::policy_check(&file),
        Command::Demo { dir } => demo::run(dir.as_deref()),
    }
}

//! `tally-load`: the append daemon's load generator, and a way to run a daemon for it
//! (and for the kill -9 test) without the `tally` CLI.
//!
//! ```text
//! tally-load init  --ledger DIR                       # a ledger with a throwaway auditor key
//! tally-load serve --ledger DIR --socket PATH [...]   # tally_daemon::run
//! tally-load bench --socket PATH --clients 64 --batch 1 --seconds 5 [--offered 5000]
//! tally-load bench --socket PATH --clients 64 --seconds 5 --check [--ask-every 10]
//! ```
//! `bench` runs closed-loop (each client sends its next request when the last is
//! acknowledged) unless `--offered` gives a target rate in decisions/s: then requests are
//! scheduled at that rate and latency is measured from each request's scheduled time,
//! so a stalled server cannot hide its queueing (no coordinated omission); every request
//! due within `--seconds` is sent, so against a server that cannot keep up the run lasts
//! longer than that. By default each connection sleeps on tokio's timer until its request
//! is due: the timer has 1 ms granularity, so requests leave in small bursts on
//! millisecond ticks, each up to 1 ms late (counted in its latency). `--even` hands out the due times from a thread of its
//! own instead, precise to tens of microseconds: arrivals evenly spaced, as from many
//! independent agents, at the cost of one thread wakeup per request in the client.

/// The allocator `tally serve` runs with, so what is measured here is what users run.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod args;
mod bench;
mod plan;
mod report;
mod requests;

use std::path::PathBuf;
use std::process::ExitCode;

use tally_daemon::ServeOptions;
use tally_ledger::{AuditorKey, Ledger, Rotation};

use crate::args::Args;
use crate::plan::Plan;

const USAGE: &str = "usage:
  tally-load init  --ledger DIR
  tally-load serve --ledger DIR --socket PATH [--operator-socket PATH] [--policy FILE] [--listen ADDR] [--max-in-flight N]
                   [--metrics-listen ADDR] [--otlp-endpoint URL [--otlp-sample RATIO]]
  tally-load bench (--socket PATH | --tcp ADDR) [--clients N] [--batch N] [--seconds S]
                   [--check | --pairs]   # a call through the gate (check + outcome), or the same two decisions appended
                   [--ask-every N]       # with --check: every Nth call names tool `ask.me` (refused require_approval where the policy blocks it)
                   [--start-on SOCK,...] # with --check: client i's run started through the i-th socket (mod their number), e.g. another daemon of a fleet
                   [--offered DECISIONS_PER_SEC [--even]] [--json]";

fn main() -> ExitCode {
    match run(std::env::args().skip(1)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("tally-load: {e}\n{USAGE}");
            ExitCode::from(2)
        }
    }
}

/// The command the arguments name, run; an error is a usage error.
fn run(mut argv: impl Iterator<Item = String>) -> Result<ExitCode, String> {
    let command = argv.next().unwrap_or_default();
    let known = [
        "ledger",
        "socket",
        "listen",
        "operator-socket",
        "policy",
        "max-in-flight",
        "tcp",
        "clients",
        "batch",
        "seconds",
        "offered",
        "metrics-listen",
        "otlp-endpoint",
        "otlp-sample",
        "ask-every",
        "start-on",
    ];
    let args = Args::parse(argv, &known, &["json", "even", "check", "pairs"])?;
    match command.as_str() {
        "init" => init(args),
        "serve" => serve(args),
        "bench" => bench(args),
        other => Err(format!("unknown command `{other}`")),
    }
}

/// `tally-load init`: a ledger with a throwaway auditor key.
fn init(mut args: Args) -> Result<ExitCode, String> {
    let ledger: PathBuf = args.required("ledger")?;
    args.done()?;
    Ok(
        match Ledger::init(
            &ledger,
            &AuditorKey::generate().public(),
            Rotation::default(),
        ) {
            Ok(_) => ExitCode::SUCCESS,
            Err(e) => fail(e),
        },
    )
}

/// `tally-load serve`: the daemon, as `tally_daemon::run` runs it.
fn serve(mut args: Args) -> Result<ExitCode, String> {
    let mut options = ServeOptions::new(
        args.required::<PathBuf>("ledger")?,
        args.required::<PathBuf>("socket")?,
    );
    options.listen = args.value("listen")?;
    options.operator_socket = args.value("operator-socket")?;
    if let Some(path) = args.value::<PathBuf>("policy")? {
        let text = std::fs::read_to_string(&path)
            .map_err(|e| format!("--policy {}: {e}", path.display()))?;
        options.policy = tally_policy::Recorded::new(&text)
            .map_err(|e| format!("--policy {}: {e}", path.display()))?;
    }
    options.limits.max_in_flight = args.value("max-in-flight")?.unwrap_or(256);
    // The operator's view, for its cost (docs/PERFORMANCE.md).
    options.observe.metrics_listen = args.value("metrics-listen")?;
    options.observe.otlp_endpoint = args.value("otlp-endpoint")?;
    if let Some(r) = args.value::<f64>("otlp-sample")? {
        options.observe.otlp_sample = r;
    }
    args.done()?;
    Ok(match tally_daemon::run(options) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(e),
    })
}

/// `tally-load bench`: the plan run, its report printed (and as JSON with `--json`).
fn bench(mut args: Args) -> Result<ExitCode, String> {
    let plan = Plan::from_args(&mut args)?;
    let json = args.take("json").is_some();
    args.done()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    Ok(match runtime.block_on(bench::bench(plan)) {
        Ok(report) => {
            println!("{}", report.text());
            if json {
                println!("{}", report.json());
            }
            ExitCode::SUCCESS
        }
        Err(e) => fail(e),
    })
}

fn fail(e: impl std::fmt::Display) -> ExitCode {
    eprintln!("tally-load: {e}");
    ExitCode::from(2)
}

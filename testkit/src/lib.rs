//! What tally's test suites share: the `tally` binary ([`Tally`]), `tally serve` as a
//! fixture ([`Daemon`]), a temporary PostgreSQL cluster ([`postgres::Cluster`]), and how a
//! test that cannot run here says so ([`skip`]).
//!
//! A test that needs something this machine may lack (PostgreSQL, pytest, schemathesis,
//! the MCP SDKs, node, root (to mount a [`tmpfs::Tmpfs`] and fill it), `chattr`, `ip`,
//! `curl`) never passes quietly without it: it calls [`skip`], which prints `SKIPPED`
//! where the person running `cargo test` sees it, and under `CI` fails the test instead.
//! README.md lists what the full suite needs and the one command that installs it.
#![forbid(unsafe_code)]

pub mod otlp;
pub mod tls;
pub mod tmpfs;
pub mod upstream;

use std::io::Write;

pub mod daemon;
pub mod postgres;
pub mod tally;

pub use daemon::Daemon;
pub use tally::Tally;

/// Whether the environment variable `CI` is set: every test must then run.
pub fn ci() -> bool {
    std::env::var_os("CI").is_some()
}

/// The test running on this thread, as the test harness names its threads.
fn current_test() -> String {
    std::thread::current()
        .name()
        .filter(|n| *n != "main")
        .unwrap_or("this test")
        .to_string()
}

/// The current test cannot run here because `why`; `fix` says what makes it run. Under
/// `CI` this panics (the test fails); elsewhere it prints `SKIPPED test: why (fix)` on
/// the process's standard error, not the test harness's captured output, so it shows in
/// the middle of `cargo test`'s output even for a test that then returns and "passes".
pub fn skip(why: &str, fix: &str) {
    let test = current_test();
    if ci() {
        panic!("{test}: {why}, and CI requires this test to run: {fix}");
    }
    // Straight to the handle: the harness captures `eprintln!`, and shows it only for a
    // failed test.
    let _ = writeln!(std::io::stderr(), "SKIPPED {test}: {why} ({fix})");
}

/// Whether `program` runs and exits 0 (with `--version`, or `args` if given); if not,
/// [`skip`]s the current test with `fix`.
pub fn have(program: &str, args: &[&str], fix: &str) -> bool {
    let args: &[&str] = if args.is_empty() {
        &["--version"]
    } else {
        args
    };
    let ran = std::process::Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status();
    match ran {
        Ok(status) if status.success() => true,
        Ok(status) => {
            skip(
                &format!("`{program} {}` failed ({status})", args.join(" ")),
                fix,
            );
            false
        }
        Err(e) => {
            skip(&format!("`{program}` cannot be run ({e})"), fix);
            false
        }
    }
}

/// Whether this process runs as root; if not, [`skip`]s the current test (`needs`: what
/// for, e.g. "to run a client as `nobody`").
pub fn root(needs: &str) -> bool {
    let uid = std::fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m))
        .ok();
    if uid == Some(0) {
        return true;
    }
    skip(
        &format!("needs root {needs}"),
        "run the suite as root, as CI does (.ci/run)",
    );
    false
}

//! What a new user and an attacker meet first, on the real binary and daemon: verify
//! naming the entry whose bytes were changed, without the auditor key; errors that say
//! what, where and what to do; numbers as a person reads them.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Output;

use serde_json::Value;
use tally_testkit::tally::text;
use tally_testkit::{Daemon, Tally};

mod blocks;
mod errors;
mod gate;
mod verify;
mod words;

fn tally() -> Tally {
    Tally::new(env!("CARGO_BIN_EXE_tally"))
}

fn run(dir: &Path, args: &[&str], stdin: &str) -> Output {
    tally().run(dir, args, stdin)
}

fn ok(dir: &Path, args: &[&str], stdin: &str) -> String {
    tally().ok(dir, args, stdin)
}

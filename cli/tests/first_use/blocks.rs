//! The shell blocks of README.md, SECURITY.md, CONTRIBUTING.md, ARCHITECTURE.md and docs/ as a new user pastes them: each
//! one a test can run is run as written, with the `tally` under test first on `PATH`, in
//! a directory of its own (and `HOME` there too); each one it cannot run is listed with
//! why. A new block fails the listing test until it is put on one side or the other, so
//! no command block goes stale unread. docs/PERFORMANCE.md is a lab notebook of measured
//! commands (release builds, minutes each) and is not read here.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// What the tests do with a block.
enum Plan {
    /// Run it, without the lines that start with one of `skip` (a build the test has
    /// already done), each `(from, to)` of `rewrite` replaced (a system path made local).
    Run {
        skip: &'static [&'static str],
        rewrite: &'static [(&'static str, &'static str)],
    },
    /// Not run, and why.
    Not(&'static str),
}

/// Every shell block, by its file and the start of its first line.
const PLANS: &[(&str, &str, Plan)] = &[
    (
        "README.md",
        "cargo run -q -p tally-cli -- demo",
        Plan::Not(
            "the demo and the suite: the demo is run by first_use::words, the suite is CI itself",
        ),
    ),
    (
        "README.md",
        "cargo build --release -p tally-cli",
        Plan::Run {
            skip: &["cargo build --release"],
            rewrite: &[],
        },
    ),
    (
        "README.md",
        "tally man ~/.local/share/man/man1",
        Plan::Run {
            skip: &[],
            rewrite: &[],
        },
    ),
    (
        "README.md",
        "tally serve --ledger ./ledger --socket /run/tally/agent.sock",
        Plan::Not("`tally serve` in the foreground, then curl from a second shell"),
    ),
    (
        "README.md",
        "install -m 0755 target/release/tally",
        Plan::Not("installs as root into /usr/local, /etc and systemd"),
    ),
    (
        "CONTRIBUTING.md",
        "cargo build  ",
        Plan::Not("builds the workspace the test is part of; the demo is run by first_use::words"),
    ),
    (
        "CONTRIBUTING.md",
        "RUSTC_BOOTSTRAP=1 cargo fuzz run",
        Plan::Not("ten minutes of fuzzing on a nightly feature"),
    ),
    (
        "SECURITY.md",
        "RUSTC_BOOTSTRAP=1 nice -n 19 cargo fuzz run",
        Plan::Not("ten minutes of fuzzing on a nightly feature"),
    ),
    (
        "docs/CLI.md",
        "tally man ~/.local/share/man/man1",
        Plan::Run {
            skip: &[],
            rewrite: &[],
        },
    ),
    (
        "docs/DAEMON.md",
        "tally keygen --out auditor.key && tally init",
        Plan::Run {
            skip: &[],
            rewrite: &[],
        },
    ),
    (
        "docs/DAEMON.md",
        "sudo useradd --system",
        Plan::Not("creates system users and groups as root"),
    ),
    (
        "docs/DAEMON.md",
        "S=/run/tally/tally.sock",
        Plan::Not("calls a daemon already running on /run/tally"),
    ),
    (
        "docs/DAEMON.md",
        "cargo build --release -p tally-load",
        Plan::Not("a release build and a benchmark of minutes"),
    ),
    (
        "docs/FLEET.md",
        "tally serve --ledger /var/lib/tally/ledger",
        Plan::Not("needs a PostgreSQL the fleet tests start themselves"),
    ),
    (
        "docs/FLEET.md",
        "tally handoff a/ledger b/ledger c/ledger",
        Plan::Not("reads three fleet ledgers; cli/tests/fleet writes and reads them"),
    ),
    (
        "docs/FLEET.md",
        "cargo test -p tally-gate-postgres",
        Plan::Not("runs test suites: CI runs them"),
    ),
    (
        "docs/GATE.md",
        "tally serve --ledger DIR",
        Plan::Not("a synopsis with placeholders (DIR)"),
    ),
    (
        "docs/MCP.md",
        "tally serve --ledger DIR",
        Plan::Not("a synopsis with placeholders (DIR, RUN, SERVER_COMMAND)"),
    ),
    (
        "docs/MCP.md",
        "tally serve --ledger ./ledger --socket ./agent.sock --policy policy.toml",
        Plan::Not("`tally serve` in the foreground, in front of servers the policy names (files_server.py, a remote URL); the gateway's tests run it (mcp/tests/proxy/gateway.rs)"),
    ),
    (
        "docs/PROXY.md",
        "install -m 0600 /dev/stdin /etc/tally/openai.key",
        Plan::Not("needs real upstream keys and writes /etc"),
    ),
    (
        "docs/PROXY.md",
        "S=/run/tally/agent.sock",
        Plan::Not("calls a daemon already running on /run/tally"),
    ),
    (
        "docs/PROXY.md",
        "export OPENAI_BASE_URL",
        Plan::Not("runs the reader's own agent.py"),
    ),
    (
        "docs/PROXY.md",
        "export ANTHROPIC_BASE_URL",
        Plan::Not("environment for the reader's own agent"),
    ),
    (
        "docs/PROXY.md",
        "export GOOGLE_GEMINI_BASE_URL",
        Plan::Not(
            "environment for the reader's own agent (cli/tests/proxy_sdk/dialects.rs sets it)",
        ),
    ),
    (
        "docs/PROXY.md",
        "export AWS_BEARER_TOKEN_BEDROCK",
        Plan::Not(
            "environment for the reader's own agent (cli/tests/proxy_sdk/bedrock.rs sets it)",
        ),
    ),
    (
        "docs/PROXY.md",
        "printf '%s:%s:%s",
        Plan::Not("writes the operator's AWS credential, which a test does not have"),
    ),
    (
        "docs/PROXY.md",
        "export AZURE_OPENAI_ENDPOINT",
        Plan::Not(
            "environment for the reader's own agent (cli/tests/proxy_sdk/dialects.rs sets it)",
        ),
    ),
    (
        "docs/PROXY.md",
        "S=/run/tally/agent.sock\ncurl -s",
        Plan::Not("calls a daemon already running on /run/tally"),
    ),
    (
        "docs/PROXY.md",
        "tally prices import model_prices_and_context_window.json",
        Plan::Not(
            "needs LiteLLM's whole table, which the operator downloads; the import runs in \
             the prices-import cases (cli/tests/cmd) and cli/tests/prices.rs on an excerpt",
        ),
    ),
    (
        "docs/PROXY.md",
        "tally policy example claude-code > /etc/tally/policy.toml",
        Plan::Run {
            skip: &[],
            rewrite: &[("/etc/tally/", "")],
        },
    ),
    (
        "docs/REPORTS.md",
        "PROPTEST_CASES=200000 cargo test --release",
        Plan::Not("a long release-mode property run"),
    ),
];

/// The repository's root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The files whose shell blocks are read.
fn files() -> Vec<String> {
    let mut files: Vec<String> = [
        "README.md",
        "SECURITY.md",
        "CONTRIBUTING.md",
        "ARCHITECTURE.md",
    ]
    .map(String::from)
    .to_vec();
    let mut docs: Vec<String> = std::fs::read_dir(root().join("docs"))
        .expect("docs")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md") && n != "PERFORMANCE.md")
        .map(|n| format!("docs/{n}"))
        .collect();
    docs.sort();
    files.extend(docs);
    files
}

/// A file's ```` ```sh ```` blocks: the line each starts on (1-based) and its text.
fn blocks(file: &str) -> Vec<(usize, String)> {
    let text = std::fs::read_to_string(root().join(file)).expect("read");
    let mut out = Vec::new();
    let mut open: Option<(usize, Vec<&str>)> = None;
    for (i, line) in text.lines().enumerate() {
        match &mut open {
            None if line.trim_end() == "```sh" => open = Some((i + 1, Vec::new())),
            Some((start, body)) if line.starts_with("```") => {
                out.push((*start, body.join("\n")));
                open = None;
            }
            Some((_, body)) => body.push(line),
            None => {}
        }
    }
    assert!(open.is_none(), "{file}: a ```sh block is never closed");
    out
}

/// The plan for a block: the entry whose file is `file` and whose prefix the block
/// starts with, the longest such prefix winning.
fn plan(file: &str, block: &str) -> Option<&'static (&'static str, &'static str, Plan)> {
    PLANS
        .iter()
        .filter(|(f, prefix, _)| *f == file && block.starts_with(prefix))
        .max_by_key(|(_, prefix, _)| prefix.len())
}

#[test]
fn every_shell_block_of_the_docs_is_run_or_says_why_not() {
    let mut unlisted = Vec::new();
    let mut used = vec![false; PLANS.len()];
    for file in files() {
        for (line, block) in blocks(&file) {
            match plan(&file, &block) {
                Some(p) => {
                    let i = PLANS
                        .iter()
                        .position(|q| std::ptr::eq(q, p))
                        .expect("index");
                    used[i] = true;
                }
                None => unlisted.push(format!(
                    "{file}:{line}: {}",
                    block.lines().next().unwrap_or("")
                )),
            }
        }
    }
    assert!(
        unlisted.is_empty(),
        "shell blocks neither run nor listed with why not (add each to PLANS in {}):\n{}",
        file!(),
        unlisted.join("\n")
    );
    for (file, prefix, plan) in PLANS {
        if let Plan::Not(why) = plan {
            assert!(why.len() > 10, "{file}: {prefix}: say why it is not run");
        }
    }
    let stale: Vec<_> = PLANS
        .iter()
        .zip(&used)
        .filter(|(_, u)| !**u)
        .map(|((f, p, _), _)| format!("{f}: {p}"))
        .collect();
    assert!(
        stale.is_empty(),
        "PLANS names blocks no file has:\n{}",
        stale.join("\n")
    );
}

#[test]
fn the_shell_blocks_of_the_docs_run_as_written() {
    let tally = PathBuf::from(env!("CARGO_BIN_EXE_tally"));
    let bin = tally.parent().expect("bin dir").to_owned();
    let mut ran = 0;
    for file in files() {
        for (line, block) in blocks(&file) {
            let Some((_, _, Plan::Run { skip, rewrite })) = plan(&file, &block) else {
                continue;
            };
            let script: Vec<String> = block
                .lines()
                .filter(|l| !skip.iter().any(|s| l.starts_with(s)))
                .map(|l| {
                    rewrite
                        .iter()
                        .fold(l.to_owned(), |l, (a, b)| l.replace(a, b))
                })
                .collect();
            run_block(&format!("{file}:{line}"), &script.join("\n"), &bin);
            ran += 1;
        }
    }
    assert!(ran >= 5, "only {ran} blocks ran");
}

/// Run one block under bash with `set -euo pipefail` in a fresh directory (also its
/// `HOME` and `TMPDIR`), the test's `tally` first on `PATH`; background jobs are killed
/// when it ends. Fails with its output if it exits non-zero or runs past a minute.
fn run_block(at: &str, script: &str, bin: &Path) {
    let dir = tempfile::tempdir().expect("dir");
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let text =
        format!("set -euo pipefail\ntrap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n{script}\n");
    let logs = tempfile::tempdir().expect("logs");
    let (out, err) = (logs.path().join("stdout"), logs.path().join("stderr"));
    let mut child = Command::new("bash")
        .arg("-c")
        .arg(&text)
        .current_dir(dir.path())
        .env("PATH", path)
        .env("HOME", dir.path())
        .env("TMPDIR", dir.path())
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).expect("stdout"))
        .stderr(std::fs::File::create(&err).expect("stderr"))
        .spawn()
        .expect("bash");
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if start.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("{at}: still running after a minute");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let out = std::fs::read_to_string(out).unwrap_or_default();
    let err = std::fs::read_to_string(err).unwrap_or_default();
    assert!(
        status.success(),
        "{at}: the block failed ({status}):\n{script}\n--- stdout\n{out}\n--- stderr\n{err}"
    );
}

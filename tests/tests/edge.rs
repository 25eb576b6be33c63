//! The verifier's and the reports' edge, through the real `tally` binary: exit
//! codes that agree with the text, user mistakes told apart from tampering, messages that
//! show what differs, JSON that matches its published schema, wording, and agent-supplied
//! strings that never reach a terminal raw.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::{json, Value};
use tally_ledger::Frame;
use tally_tests::*;
use tally_verify::FindingKind;

mod exits;
mod findings;
mod legacy;
mod schemas;
mod terminal;

/// The `tally` binary of this workspace, built by cargo (the test crate cannot name another
/// package's binary), or `TALLY_UNDER_TEST` (to see these tests fail on an older build).
fn tally_bin() -> PathBuf {
    tally_testkit::Tally::workspace().path().to_path_buf()
}

/// A ledger made with the real CLI in a temporary directory: `a.key`/`a.pub`, the ledger
/// in `L/` and its export in `L.tally`.
struct Cli {
    tmp: tempfile::TempDir,
}

impl Cli {
    fn new(decisions: &[Value]) -> Cli {
        let cli = Cli {
            tmp: tempfile::tempdir().expect("tempdir"),
        };
        cli.ok(&["keygen", "--out", "a.key"]);
        cli.ok(&["init", "--ledger", "L", "--recipient", "a.pub"]);
        cli.append("L", decisions);
        cli.ok(&["export", "--ledger", "L", "--out", "L.tally"]);
        cli
    }

    fn path(&self, name: &str) -> PathBuf {
        self.tmp.path().join(name)
    }

    fn append(&self, ledger: &str, decisions: &[Value]) {
        let mut child = Command::new(tally_bin())
            .args(["append", "--ledger", ledger])
            .current_dir(self.tmp.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn tally append");
        let mut stdin = child.stdin.take().expect("stdin");
        for d in decisions {
            writeln!(stdin, "{d}").expect("write decision");
        }
        drop(stdin);
        assert!(child.wait().expect("tally append").success(), "append");
    }

    fn run(&self, args: &[&str]) -> Output {
        Command::new(tally_bin())
            .args(args)
            .current_dir(self.tmp.path())
            .output()
            .expect("run tally")
    }

    fn ok(&self, args: &[&str]) -> Output {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "tally {args:?}: {}",
            text(&out.stderr)
        );
        out
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn code(out: &Output) -> i32 {
    out.status.code().expect("exit code")
}

const KEYS: [&str; 4] = ["--key", "L/ledger.pub", "--auditor-key", "a.key"];

fn with_keys<'a>(args: &[&'a str]) -> Vec<&'a str> {
    args.iter().copied().chain(KEYS).collect()
}

fn clean_run(run: &str) -> Vec<Value> {
    vec![
        json!({"run": run, "kind": "start", "goal": "clean", "budget": {"attempts": 5}}),
        json!({"run": run, "kind": "allow", "tool": "http.get", "attempt": 1, "effect": "read", "args": {"u": 1}}),
        json!({"run": run, "kind": "outcome", "status": "ok", "attempt": 1}),
        json!({"run": run, "kind": "stop", "reason": "completed"}),
    ]
}

/// A run with an audit finding: a refund of an attempt never allowed.
fn bad_run(run: &str) -> Vec<Value> {
    vec![
        json!({"run": run, "kind": "start", "goal": "bad", "budget": {"attempts": 5}}),
        json!({"run": run, "kind": "refund", "of": 3}),
    ]
}

/// The export without its end marker: cut short at a frame boundary.
fn cut_at_boundary(cli: &Cli) -> PathBuf {
    let bytes = std::fs::read(cli.path("L.tally")).expect("export");
    let cut = cli.path("cut.tally");
    std::fs::write(&cut, &bytes[..bytes.len() - END_FRAME_LEN]).expect("write cut");
    cut
}

/// The export with one bit of its last entry flipped: it does not verify.
fn tampered(cli: &Cli) -> PathBuf {
    let bytes = std::fs::read(cli.path("L.tally")).expect("export");
    let mut frames = parse_frames(&bytes);
    let last = frames
        .iter_mut()
        .rev()
        .find_map(|f| match f {
            Frame::Entry(b) => Some(b),
            Frame::Checkpoint(_) | Frame::Cosigned(_) => None,
        })
        .expect("an entry");
    let mid = last.len() / 2;
    last[mid] ^= 1;
    let path = cli.path("bad.tally");
    std::fs::write(&path, write_export(&frames)).expect("write tampered");
    path
}

//! The tail check, on the real binary: a ledger whose tail does not verify is never
//! written to, by `tally append` or `tally serve`; they refuse with the `tally verify`
//! command to run and change no byte. A crash's torn write still reopens, and is said.
//!
//! `TALLY_UNDER_TEST` runs these against another build (they fail against one from
//! before the tail was checked).

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use tally_testkit::tally::text;
use tally_testkit::Tally;

fn tally() -> Tally {
    Tally::new(env!("CARGO_BIN_EXE_tally"))
}

fn run(dir: &Path, args: &[&str], stdin: &str) -> Output {
    tally().run(dir, args, stdin)
}

/// [`run`], which must succeed: what it said on standard error.
fn ok(dir: &Path, args: &[&str], stdin: &str) -> String {
    let out = run(dir, args, stdin);
    assert!(out.status.success(), "tally {args:?}: {}", text(&out));
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A ledger in `dir/ledger` of three appends (three commit groups), the last of three
/// decisions.
fn ledger(dir: &Path) {
    tally().ledger(dir);
    for run in ["a", "b"] {
        ok(
            dir,
            &["append", "--ledger", "ledger"],
            &format!("{{\"run\":\"{run}\",\"kind\":\"start\",\"goal\":\"g\"}}\n"),
        );
    }
    ok(
        dir,
        &["append", "--ledger", "ledger"],
        "{\"run\":\"c\",\"kind\":\"start\",\"goal\":\"g\"}\n\
         {\"run\":\"c\",\"kind\":\"allow\",\"tool\":\"t\",\"attempt\":1}\n\
         {\"run\":\"c\",\"kind\":\"stop\",\"reason\":\"completed\"}\n",
    );
}

fn segment(dir: &Path, n: u64) -> PathBuf {
    dir.join(format!("ledger/log/{n:020}.seg"))
}

/// The frames of segment 0: (offset, tag, payload length).
fn frames(bytes: &[u8]) -> Vec<(usize, u8, usize)> {
    let mut out = Vec::new();
    let mut at = 80;
    while at + 5 <= bytes.len() {
        let len = u32::from_be_bytes(bytes[at + 1..at + 5].try_into().unwrap()) as usize;
        out.push((at, bytes[at], len));
        at += 5 + len;
    }
    out
}

/// Every file of the ledger directory with its bytes.
fn snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut todo = vec![dir.join("ledger")];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).expect("read_dir") {
            let e = e.expect("entry");
            if e.file_type().expect("type").is_dir() {
                todo.push(e.path());
            } else {
                out.push((e.path(), std::fs::read(e.path()).expect("read")));
            }
        }
    }
    out.sort();
    out
}

/// `tally append` and `tally serve` on the ledger in `dir`: each refuses, says to run
/// `tally verify`, and changes no file.
fn both_refuse(dir: &Path, what: &str) {
    let before = snapshot(dir);
    let out = run(
        dir,
        &["append", "--ledger", "ledger"],
        "{\"run\":\"d\",\"kind\":\"start\",\"goal\":\"on top\"}\n",
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{what}: tally append wrote: {err}");
    assert!(
        err.contains("refusing to write") && err.contains("tally verify ledger --key"),
        "{what}: {err}"
    );
    assert!(
        snapshot(dir) == before,
        "{what}: tally append changed a file"
    );
    let mut serve = tally()
        .command()
        .args([
            "serve",
            "--ledger",
            "ledger",
            "--socket",
            "agent.sock",
            "--operator-socket",
            "operator.sock",
        ])
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("tally serve");
    let started = Instant::now();
    let status = loop {
        if let Some(status) = serve.try_wait().expect("wait") {
            break status;
        }
        if started.elapsed() > Duration::from_secs(20) || dir.join("agent.sock").exists() {
            let _ = serve.kill();
            let _ = serve.wait();
            panic!("{what}: tally serve started over the ledger");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let err = serve.wait_with_output().expect("serve output").stderr;
    let err = String::from_utf8_lossy(&err);
    assert!(!status.success(), "{what}: {err}");
    assert!(err.contains("tally verify ledger --key"), "{what}: {err}");
    assert!(
        snapshot(dir) == before,
        "{what}: tally serve changed a file"
    );
}

/// A byte of the last commit group changed (not its last entry, whose hash the last
/// checkpoint names: an earlier one), or of the checkpoint sealing it: refused.
#[test]
fn regression_issue_21_a_tampered_tail_is_never_written_to() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let d = tmp.path();
    ledger(d);
    let path = segment(d, 0);
    let pristine = std::fs::read(&path).expect("segment");
    let f = frames(&pristine);
    let entries: Vec<_> = f.iter().filter(|x| x.1 == 1).collect();
    let checkpoint = f.last().expect("a checkpoint");
    assert_eq!(checkpoint.1, 2);
    // The last group's first entry (`c`'s start), and the last checkpoint's signature.
    let first_of_last = entries[entries.len() - 3];
    for (what, at) in [
        (
            "a byte of the last group's first entry",
            first_of_last.0 + 5 + 120,
        ),
        ("a byte of its checkpoint's signature", pristine.len() - 10),
    ] {
        let mut bad = pristine.clone();
        bad[at] ^= 0x04;
        std::fs::write(&path, &bad).expect("write");
        both_refuse(d, what);
    }
}

/// A frame prefix changed in an earlier group makes the groups after it look like a torn
/// write: the writer must not resume after the earlier checkpoint, dropping decisions it
/// acknowledged.
#[test]
fn regression_issue_21_sealed_decisions_are_never_dropped_as_a_torn_write() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let d = tmp.path();
    ledger(d);
    let path = segment(d, 0);
    let mut bytes = std::fs::read(&path).expect("segment");
    // `b`'s start: the second append's entry frame.
    let f = frames(&bytes);
    let b = f.iter().filter(|x| x.1 == 1).nth(2).expect("b's entry");
    bytes[b.0] = 7;
    std::fs::write(&path, &bytes).expect("write");
    both_refuse(d, "a changed frame tag in the second group");
    assert!(!segment(d, 1).exists());
}

/// A crash's torn write (half a frame after the last checkpoint) reopens: the append is
/// made in a new segment, and the torn bytes are kept and said.
#[test]
fn regression_issue_21_a_crash_torn_tail_reopens_and_is_reported() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let d = tmp.path();
    ledger(d);
    let path = segment(d, 0);
    let mut bytes = std::fs::read(&path).expect("segment");
    let f = frames(&bytes);
    let e = f.iter().rfind(|x| x.1 == 1).expect("an entry");
    let half = bytes[e.0..e.0 + 5 + e.2 / 2].to_vec();
    let sealed = bytes.len();
    bytes.extend_from_slice(&half);
    std::fs::write(&path, &bytes).expect("write");
    let err = ok(
        d,
        &["append", "--ledger", "ledger"],
        "{\"run\":\"d\",\"kind\":\"start\",\"goal\":\"after a crash\"}\n",
    );
    assert!(
        err.contains(&format!(
            "torn write: {} bytes from byte {sealed} of ",
            half.len()
        )),
        "{err}"
    );
    assert_eq!(std::fs::read(&path).expect("segment"), bytes, "kept");
    assert!(segment(d, 1).exists(), "resumed in a new segment");
    let out = run(d, &["verify", "ledger", "--key", "ledger/ledger.pub"], "");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("torn write"), "{text}");
}

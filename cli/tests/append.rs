//! `tally append` of NDJSON in bounded memory, through the real binary: the checked input
//! waits in an unnamed spool in $TMPDIR, so a bad line anywhere, or a spool that cannot be
//! written, still changes no byte of the ledger, and a large input commits in batches.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use crate::fixture;

/// `tally args` in `dir` with `TMPDIR=tmpdir`, fed `stdin`.
fn tally(dir: &Path, tmpdir: &Path, args: &[&str], stdin: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tally"))
        .current_dir(dir)
        .env("TMPDIR", tmpdir)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run tally");
    let mut input = child.stdin.take().expect("stdin");
    // The binary may refuse before reading everything: a closed pipe here is fine.
    let _ = input.write_all(stdin.as_bytes());
    drop(input);
    child.wait_with_output().expect("tally output")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A new ledger at `dir/ledger` holding four decisions, and an empty `dir/tmp` for TMPDIR.
fn setup(dir: &Path) -> PathBuf {
    let tmp = dir.join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    for args in [
        &["keygen", "--out", "auditor.key"][..],
        &["init", "--ledger", "ledger", "--recipient", "auditor.pub"],
    ] {
        let o = tally(dir, &tmp, args, "");
        assert!(o.status.success(), "{}", stderr(&o));
    }
    let o = tally(dir, &tmp, &["append", "--ledger", "ledger"], &good(0..4));
    assert!(o.status.success(), "{}", stderr(&o));
    tmp
}

/// One good decision per line, for runs `range`.
fn good(range: std::ops::Range<usize>) -> String {
    range
        .map(|i| format!("{{\"run\":\"b{i}\",\"kind\":\"start\",\"goal\":\"goal {i}\"}}\n"))
        .collect()
}

/// Every file and directory under `dir`, with the BLAKE3 of each file's bytes.
fn hashes(dir: &Path) -> Vec<(String, String)> {
    let mut all = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let name = e.path().display().to_string();
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
                all.push((name, "dir".into()));
            } else {
                let bytes = std::fs::read(e.path()).unwrap();
                all.push((name, blake3::hash(&bytes).to_hex().to_string()));
            }
        }
    }
    all.sort();
    all
}

fn is_empty(dir: &Path) -> bool {
    std::fs::read_dir(dir).unwrap().next().is_none()
}

/// `verify`'s report on `dir/ledger`, which must be intact.
fn verified(dir: &Path, tmp: &Path) -> String {
    let o = tally(
        dir,
        tmp,
        &["verify", "ledger", "--key", "ledger/ledger.pub"],
        "",
    );
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert_eq!(o.status.code(), Some(0), "{out}{}", stderr(&o));
    assert!(out.starts_with("INTACT: "), "{out}");
    out
}

// A bad line after more than one batch of good ones (and blank lines, so that stdin line
// numbers are not decision numbers): the error is the one `append` gave when it held its
// whole input in memory, and the ledger directory keeps every byte.
#[test]
fn a_late_bad_line_changes_no_byte_of_the_ledger() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let tmpdir = setup(d);
    let before = hashes(&d.join("ledger"));
    let mut input = String::new();
    for (i, line) in good(0..2500).lines().enumerate() {
        input.push_str(line);
        input.push('\n');
        if i % 10 == 0 {
            input.push_str(if i % 20 == 0 { "\n" } else { " \t\r\n" });
        }
    }
    // 2,500 decisions and 250 blank lines before it.
    input.push_str("{\"run\":\"bulk\",\"kind\":\"no_such_kind\"}\n");
    input.push_str(&good(0..10));
    let o = tally(
        d,
        &tmpdir,
        &["append", "--ledger", "ledger", "--batch", "1000"],
        &input,
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert_eq!(
        stderr(&o),
        "tally: error: stdin line 2751: nothing was written: invalid decision JSON: unknown variant `no_such_kind`, expected one of `start`, `allow`, `deny`, `outcome`, `refund`, `override`, `stop`, `policy`, `pause`, `resume`, `lease` at line 1 column 35\n"
    );
    assert!(o.stdout.is_empty(), "receipts printed for a refused input");
    assert_eq!(hashes(&d.join("ledger")), before, "the ledger changed");
    assert!(is_empty(&tmpdir), "the spool left a file in TMPDIR");
}

// 30,000 decisions in batches of 1,000: every one appended, with consecutive seqs, one
// receipt each in input order; blank lines skipped; the ledger verifies.
#[test]
fn a_large_input_appends_in_batches() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let tmpdir = setup(d);
    let mut input = String::new();
    for (i, line) in good(0..30_000).lines().enumerate() {
        if i % 1000 == 999 {
            input.push('\n');
        }
        input.push_str(line);
        input.push('\n');
    }
    let o = tally(
        d,
        &tmpdir,
        &["append", "--ledger", "ledger", "--batch", "1000"],
        &input,
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(stderr(&o), "");
    let receipts = String::from_utf8(o.stdout).unwrap();
    let seqs: Vec<u64> = receipts
        .lines()
        .map(|r| {
            serde_json::from_str::<serde_json::Value>(r).unwrap()["seq"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert_eq!(seqs, (5..30_005).collect::<Vec<u64>>());
    assert!(is_empty(&tmpdir), "the spool left a file in TMPDIR");
    let out = verified(d, &tmpdir);
    assert!(
        out.contains("30005 (30004 decisions, 1 key epoch)"),
        "{out}"
    );
}

// While `append` reads its input the spool is open in TMPDIR under no name, and `kill -9`
// then leaves nothing behind there, nor in the ledger.
#[test]
fn the_spool_has_no_name_and_a_kill_leaves_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let tmpdir = setup(d);
    let before = hashes(&d.join("ledger"));
    let mut child = Command::new(env!("CARGO_BIN_EXE_tally"))
        .current_dir(d)
        .env("TMPDIR", &tmpdir)
        .args(["append", "--ledger", "ledger"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    input.write_all(good(0..5000).as_bytes()).unwrap();
    input.flush().unwrap();
    // The binary now waits for more input, its spool open.
    let fds = Path::new("/proc").join(child.id().to_string()).join("fd");
    let canonical = tmpdir.canonicalize().unwrap();
    let mut spooled = false;
    for _ in 0..200 {
        spooled = std::fs::read_dir(&fds)
            .unwrap()
            .filter_map(|e| std::fs::read_link(e.unwrap().path()).ok())
            .any(|target| target.starts_with(&canonical));
        if spooled {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(spooled, "no file open in TMPDIR");
    assert!(is_empty(&tmpdir), "the spool has a name in TMPDIR");
    child.kill().unwrap();
    let o = child.wait_with_output().unwrap();
    assert!(o.stdout.is_empty());
    assert!(is_empty(&tmpdir), "the spool outlived kill -9");
    assert_eq!(hashes(&d.join("ledger")), before, "the ledger changed");
    drop(input);
}

// TMPDIR missing: refused before anything is written, naming the directory.
#[test]
fn a_missing_tmpdir_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    setup(d);
    let before = hashes(&d.join("ledger"));
    let missing = d.join("no-such-dir");
    let o = tally(d, &missing, &["append", "--ledger", "ledger"], &good(0..10));
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(
        e.starts_with("tally: error: nothing was written: ")
            && e.contains(&format!("{} ($TMPDIR)", missing.display())),
        "{e}"
    );
    assert!(o.stdout.is_empty());
    assert_eq!(hashes(&d.join("ledger")), before, "the ledger changed");
}

// TMPDIR inside the ledger: refused, so that no spool ever lands in the ledger directory.
#[test]
fn a_tmpdir_inside_the_ledger_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    setup(d);
    let before = hashes(&d.join("ledger"));
    let o = tally(
        d,
        &d.join("ledger"),
        &["append", "--ledger", "ledger"],
        &good(0..10),
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(e.contains("is inside the ledger"), "{e}");
    assert!(e.contains("point TMPDIR at another directory"), "{e}");
    assert_eq!(hashes(&d.join("ledger")), before, "the ledger changed");
}

// TMPDIR full (a real 1 MiB tmpfs, for about 5 MB of prepared input): the error says
// nothing was written and names TMPDIR; the ledger keeps every byte.
#[test]
fn a_full_tmpdir_writes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    setup(d);
    let small = d.join("small");
    // CI runs as root: there the test must run.
    let Some(_unmount) = fixture::mount_tmpfs(&small, 1) else {
        return;
    };
    let before = hashes(&d.join("ledger"));
    let o = tally(
        d,
        &small,
        &["append", "--ledger", "ledger", "--batch", "1000"],
        &good(0..20_000),
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(
        e.starts_with("tally: error: nothing was written: cannot spool the checked input")
            && e.contains(&format!("{} ($TMPDIR)", small.display()))
            && e.ends_with("No space left on device (os error 28)\n"),
        "{e}"
    );
    assert!(o.stdout.is_empty(), "receipts printed for a refused input");
    assert_eq!(hashes(&d.join("ledger")), before, "the ledger changed");
    assert!(is_empty(&small), "the spool left a file in TMPDIR");
    // With room, the same input goes in whole.
    let o = tally(
        d,
        &d.join("tmp"),
        &["append", "--ledger", "ledger", "--batch", "1000"],
        &good(0..20_000),
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(String::from_utf8(o.stdout).unwrap().lines().count(), 20_000);
    verified(d, &d.join("tmp"));
}

//! Regression tests of the CLI's edge, each with the real binary.

use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::Path;
use std::process::{Output, Stdio};

use crate::fixture::{self, tally, R1};

fn run(dir: &Path, args: &[&str]) -> Output {
    tally()
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .expect("run tally")
}

fn run_stdin(dir: &Path, args: &[&str], stdin: &str) -> Output {
    fixture::kit().run(dir, args, stdin)
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Every file under `dir` with its length, mode and modification time.
fn snapshot(dir: &Path) -> Vec<(String, u64, u32, std::time::SystemTime)> {
    let mut all = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let m = e.metadata().unwrap();
            if m.is_dir() {
                stack.push(e.path());
            }
            all.push((
                e.path().display().to_string(),
                m.len(),
                m.permissions().mode(),
                m.modified().unwrap(),
            ));
        }
    }
    all.sort();
    all
}

fn entries(dir: &Path) -> String {
    let o = run(dir, &["checkpoint", "--ledger", "ledger"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    // The C2SP checkpoint's second line is the tree size.
    let text = String::from_utf8(o.stdout).unwrap();
    text.lines()
        .nth(1)
        .unwrap_or_else(|| panic!("no size in {text}"))
        .to_owned()
}

// `init --ledger .` in a source checkout took over the directory.
#[test]
fn init_refuses_a_directory_with_files() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    fixture::ok(d, &["keygen", "--out", "auditor.key"], "");
    std::fs::create_dir(d.join("src")).unwrap();
    std::fs::write(d.join("src/lib.rs"), "//! mine\n").unwrap();
    std::fs::set_permissions(d.join("src"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let before = snapshot(d);
    let o = run(
        d,
        &["init", "--ledger", "src", "--recipient", "auditor.pub"],
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("not empty"), "{}", stderr(&o));
    assert_eq!(snapshot(d), before, "init changed the directory it refused");
}

// `keygen --out x` wrote x, then failed on an existing x.pub, leaving x.
#[test]
fn keygen_writes_nothing_when_an_output_exists() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    for approver in [false, true] {
        std::fs::write(d.join("x.pub"), "someone else's\n").unwrap();
        let before = snapshot(d);
        let mut args = vec!["keygen", "--out", "x"];
        if approver {
            args.push("--approver");
        }
        let o = run(d, &args);
        assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
        assert!(stderr(&o).contains("x.pub"), "{}", stderr(&o));
        assert_eq!(snapshot(d), before, "keygen {args:?} left files behind");
        let o = run(d, &["keygen", "--out", "y.pub"]);
        assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
        assert!(!d.join("y.pub").exists() && !d.join("y.pub.pub").exists());
        std::fs::remove_file(d.join("x.pub")).unwrap();
    }
}

// A report piped to `head` panicked (exit 101).
#[test]
fn a_closed_pipe_ends_quietly() {
    let dir = fixture::build_once();
    for args in [
        &["verify", "ledger.tally", "--key", "ledger/ledger.pub"][..],
        &["verify", "tampered.tally", "--key", "ledger/ledger.pub"][..],
        &["policy", "check", "policy.toml"][..],
        &["--help"][..],
    ] {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let o = tally()
            .args(args)
            .current_dir(&dir)
            .stdout(writer)
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        let code = o.status.code();
        assert!(
            matches!(code, Some(0..=3)),
            "tally {args:?} exited {code:?}: {}",
            stderr(&o)
        );
        assert!(!stderr(&o).contains("panicked"), "{}", stderr(&o));
        assert!(!stderr(&o).contains("Broken pipe"), "{}", stderr(&o));
    }
}

// Any other write error is exit 2 with a message.
#[test]
fn a_full_disk_exits_2() {
    let dir = fixture::build_once();
    for args in [
        &["verify", "ledger.tally", "--key", "ledger/ledger.pub"][..],
        &["policy", "check", "policy.toml"][..],
    ] {
        let full = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap();
        let o = tally()
            .args(args)
            .current_dir(&dir)
            .stdout(full)
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(2), "tally {args:?}: {}", stderr(&o));
        assert!(
            stderr(&o).contains("standard output"),
            "tally {args:?}: {}",
            stderr(&o)
        );
    }
}

// A bad line after good ones committed the good ones; a retry wrote them twice.
#[test]
fn append_with_a_bad_line_writes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    fixture::ledger(d);
    let before = entries(d);
    let mut input = String::new();
    for i in 0..12_000 {
        input.push_str(&format!("{{\"run\":\"b{i}\",\"kind\":\"start\"}}\n"));
    }
    input.push_str("{\"run\":\"bulk\",\"kind\":\"no_such_kind\"}\n");
    let o = run_stdin(d, &["append", "--ledger", "ledger"], &input);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("line 12001"), "{}", stderr(&o));
    assert!(o.stdout.is_empty(), "receipts printed for a refused input");
    assert_eq!(entries(d), before, "a refused input was partly committed");
}

// A refused command rewrote store/snap.* (the store was opened first).
// The export to a missing directory was refused only after opening the store.
#[test]
fn refused_commands_leave_the_store_untouched() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    fixture::ledger(d);
    let before = snapshot(&d.join("ledger"));
    std::thread::sleep(std::time::Duration::from_millis(20));
    let o = run(d, &["append", "--ledger", "ledger", "{\"run\":\"r\"}"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let o = run_stdin(d, &["append", "--ledger", "ledger"], "not json\n");
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    std::fs::write(d.join("taken.tally"), "").unwrap();
    for out in ["taken.tally", "no/such/dir.tally"] {
        let o = run(d, &["export", "--ledger", "ledger", "--out", out]);
        assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    }
    assert_eq!(snapshot(&d.join("ledger")), before);
}

/// Every file under `dir` and the BLAKE3 of its bytes.
fn hashes(dir: &Path) -> Vec<(String, String)> {
    let mut all = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            } else {
                let bytes = std::fs::read(e.path()).unwrap();
                let hash = blake3::hash(&bytes).to_hex().to_string();
                all.push((e.path().display().to_string(), hash));
            }
        }
    }
    all.sort();
    all
}

// A refused append, `checkpoint`, `export` and `verify DIR` read the log in
// place and change no byte of the ledger directory (no lock file, no sled snapshot);
// and `verify DIR` works while a writer holds the ledger.
#[test]
fn readers_and_refusals_change_no_byte_of_the_ledger() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    fixture::ledger(d);
    let before = hashes(&d.join("ledger"));
    let o = run(d, &["append", "--ledger", "ledger", "{\"run\":\"r\"}"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let o = run(d, &["checkpoint", "--ledger", "ledger"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let o = run(d, &["export", "--ledger", "ledger", "--out", "x.tally"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let o = run(d, &["verify", "ledger", "--key", "ledger/ledger.pub"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(
        hashes(&d.join("ledger")),
        before,
        "a reader changed the ledger"
    );
    // Held by a writer (this process), the directory still verifies and exports.
    let held = tally_ledger::Ledger::open(&d.join("ledger")).unwrap();
    let line = R1.lines().next().unwrap().replace("r1", "r8");
    held.append(tally_ledger::Decision::from_json(&line).unwrap())
        .unwrap();
    let o = run(d, &["verify", "ledger", "--key", "ledger/ledger.pub"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("all 6 entries"));
    let o = run(d, &["export", "--ledger", "ledger", "--out", "y.tally"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let o = run(d, &["checkpoint", "--ledger", "ledger"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout).lines().nth(1), Some("6"));
}

// `serve` refuses a ledger directory others can enter; `append` took it.
#[test]
fn append_refuses_a_ledger_others_can_enter() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    fixture::ledger(d);
    std::fs::set_permissions(d.join("ledger"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let line = R1.lines().next().unwrap().replace("r1", "r9");
    let o = run(d, &["append", "--ledger", "ledger", &line]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("chmod 700"), "{}", stderr(&o));
}

// An error repeated its cause (`(os error 17): File exists (os error 17)`).
#[test]
fn errors_do_not_repeat_their_cause() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let o = run(d, &["init", "--ledger", "l", "--recipient", "nothere.pub"]);
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    assert!(e.contains("nothere.pub"), "{e}");
    assert_eq!(e.matches("os error 2)").count(), 1, "{e}");
    assert!(!d.join("l").exists());
}

// `export --out` silently overwrote an existing file.
#[test]
fn export_refuses_to_overwrite() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    fixture::ledger(d);
    std::fs::write(d.join("mine.tally"), "precious\n").unwrap();
    let o = run(d, &["export", "--ledger", "ledger", "--out", "mine.tally"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--force"), "{}", stderr(&o));
    assert_eq!(std::fs::read(d.join("mine.tally")).unwrap(), b"precious\n");
    let o = run(
        d,
        &[
            "export",
            "--ledger",
            "ledger",
            "--out",
            "mine.tally",
            "--force",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_ne!(std::fs::read(d.join("mine.tally")).unwrap(), b"precious\n");
}

// `export --out X` wrote through a symlink planted at X.partial (or X).
#[test]
fn export_never_writes_through_a_symlink() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    fixture::ledger(d);
    std::fs::write(d.join("victim"), "precious\n").unwrap();
    symlink(d.join("victim"), d.join("out.tally.partial")).unwrap();
    symlink(d.join("victim"), d.join("out.partial")).unwrap();
    let o = run(d, &["export", "--ledger", "ledger", "--out", "out.tally"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(std::fs::read(d.join("victim")).unwrap(), b"precious\n");
    assert!(!stderr(&o).contains("partial"), "{}", stderr(&o));
    // A symlink at the target itself: refused, and with --force replaced, not followed.
    symlink(d.join("victim"), d.join("link.tally")).unwrap();
    let o = run(d, &["export", "--ledger", "ledger", "--out", "link.tally"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let o = run(
        d,
        &[
            "export",
            "--ledger",
            "ledger",
            "--out",
            "link.tally",
            "--force",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(std::fs::read(d.join("victim")).unwrap(), b"precious\n");
    assert!(!std::fs::symlink_metadata(d.join("link.tally"))
        .unwrap()
        .file_type()
        .is_symlink());
}

// Conventions: man pages and completions come from the clap definitions.
#[test]
fn man_pages_and_completions_generate() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let o = run(d, &["man", "man"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let page = std::fs::read_to_string(d.join("man/tally.1")).unwrap();
    for sub in [
        "keygen",
        "approve",
        "runs",
        "top",
        "pause",
        "resume",
        "kill",
        "init",
        "append",
        "checkpoint",
        "rotate",
        "export",
        "verify",
        "loops",
        "handoff",
        "serve",
        "policy",
        "demo",
    ] {
        assert!(page.contains(sub), "tally.1 does not mention {sub}");
        assert!(
            d.join(format!("man/tally-{sub}.1")).exists(),
            "no man page for {sub}"
        );
    }
    for shell in ["bash", "zsh", "fish"] {
        let o = run(d, &["completions", shell]);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        let text = String::from_utf8(o.stdout).unwrap();
        assert!(text.contains("handoff"), "{shell} completions lack handoff");
    }
}

// Conventions: `-` is standard input (the `curl .../v1/export | tally verify -` form), and
// `export --out -` writes the export to standard output.
#[test]
fn a_dash_reads_and_writes_the_standard_streams() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    fixture::ledger(d);
    let o = tally()
        .args(["export", "--ledger", "ledger", "--out", "-"])
        .current_dir(d)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stderr(&o).contains("to standard output"), "{}", stderr(&o));
    let export = o.stdout;
    assert!(export.starts_with(b"tally export v2\n"));
    let mut child = tally()
        .args(["verify", "-", "--key", "ledger/ledger.pub", "--json"])
        .current_dir(d)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child.stdin.take().unwrap().write_all(&export).unwrap();
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(report["entries"], 5);
    assert_eq!(report["tail"]["state"], "complete");
}

/// Run `command` under a pseudo-terminal (util-linux `script`): stdout and stderr are
/// terminals, as for someone typing it.
fn on_a_terminal(dir: &Path, command: &str) -> (Option<i32>, String) {
    let o = std::process::Command::new("script")
        .args(["-qec", command, "/dev/null"])
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .expect("script(1) from util-linux");
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
    )
}

// Conventions: progress on a terminal for append and export, as for verify; none with -q.
#[test]
fn append_and_export_show_progress_on_a_terminal() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    fixture::ledger(d);
    std::fs::write(
        d.join("more.ndjson"),
        "{\"run\":\"p1\",\"kind\":\"start\"}\n{\"run\":\"p2\",\"kind\":\"start\"}\n",
    )
    .unwrap();
    let bin = env!("CARGO_BIN_EXE_tally");
    let (code, text) = on_a_terminal(d, &format!("{bin} append --ledger ledger < more.ndjson"));
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("appending: 2 of 2"), "{text}");
    let (code, text) = on_a_terminal(d, &format!("{bin} export --ledger ledger --out a.tally"));
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("exporting: 1 of 7"), "{text}");
    let (code, text) = on_a_terminal(
        d,
        &format!("{bin} -q append --ledger ledger < more.ndjson; {bin} -q export --ledger ledger --out b.tally"),
    );
    assert_eq!(code, Some(0), "{text}");
    assert!(
        !text.contains("appending") && !text.contains("exporting"),
        "{text}"
    );
    assert!(!text.contains("exported"), "-q kept a note: {text}");
}

// The operator's forms (docs/CLI.md): runs, approve, pause, resume, kill, on the real daemon.
#[test]
fn operator_commands_against_the_daemon() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    fixture::ledger(d);
    let approvers = fixture::ok(d, &["keygen", "--approver", "--out", "dana.key"], "");
    std::fs::write(d.join("policy.toml"), approvers).unwrap();
    let daemon = tally_testkit::Tally::new(env!("CARGO_BIN_EXE_tally")).serve(d, &[]);
    let (status, reply) = daemon.agent(
        "POST",
        "/v1/runs",
        Some(serde_json::json!({"run":"r2","goal":"triage inbox","budget":{"attempts":10,"spend_cents":200}})),
    );
    assert_eq!(status, 201, "{reply}");
    let op = ["--operator-socket", "operator.sock"];
    let with = |args: &[&str]| {
        let mut all = vec![args[0]];
        all.extend(op);
        all.extend(&args[1..]);
        run(d, &all)
    };
    let o = with(&["runs"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let listed = String::from_utf8_lossy(&o.stdout);
    assert!(listed.contains("r2"), "{listed}");
    // How long the run has been going, as a person reads it.
    assert!(
        listed.contains("STARTED") && listed.contains(" ago"),
        "{listed}"
    );
    let o = with(&["runs", "--json"]);
    let runs: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(runs[0]["run"], "r2");
    let o = with(&[
        "approve",
        "--run",
        "r2",
        "--key",
        "dana.key",
        "--expires",
        "10m",
        "--attempts",
        "1",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let granted = String::from_utf8_lossy(&o.stdout);
    assert!(granted.contains("recorded at seq"), "{granted}");
    // Its validity and expiry as a person reads them, never `600000 ms`.
    assert!(
        granted.contains("valid for 10 min 00 s (until 10 min")
            && granted.contains("after the run started)"),
        "{granted}"
    );
    for what in ["pause", "resume", "kill"] {
        let o = with(&[what, "--run", "r2"]);
        assert_eq!(o.status.code(), Some(0), "{what}: {}", stderr(&o));
        assert_eq!(
            String::from_utf8_lossy(&o.stdout),
            format!("run r2: {what} done\n")
        );
    }
    let o = with(&["pause", "--run", "nobody"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("refused"), "{}", stderr(&o));
}

// `tally stats`: a run allowed beyond its cap is shown over it, and the audit's finding
// makes it exit 1.
#[test]
fn stats_shows_a_run_over_its_cap() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    fixture::ok(d, &["keygen", "--out", "a.key"], "");
    fixture::ok(d, &["init", "--ledger", "l", "--recipient", "a.pub"], "");
    let corpus = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../corpus/allow_beyond_limit.ndjson"
    ))
    .unwrap();
    let decisions: String = corpus
        .lines()
        .filter(|l| !l.contains("\"expect\""))
        .map(|l| format!("{l}\n"))
        .collect();
    fixture::ok(d, &["append", "--ledger", "l"], &decisions);
    let o = run(
        d,
        &[
            "stats",
            "l",
            "--key",
            "l/ledger.pub",
            "--auditor-key",
            "a.key",
        ],
    );
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    let r1 = text
        .lines()
        .find(|l| l.starts_with("r1 "))
        .expect("r1 listed");
    assert!(
        r1.contains("2 of 1") && r1.contains("over the cap by 1"),
        "{text}"
    );
    assert!(text.contains("inconsistencies found"), "{text}");
}

// Errors named internal temporary files (`writer.tmp`, `X.partial`).
#[test]
fn errors_name_the_file_not_its_temporary() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    fixture::ledger(d);
    // A directory where the writer key's temporary file goes: its write fails.
    std::fs::create_dir(d.join("ledger/writer.key.tmp")).unwrap();
    std::fs::write(d.join("ledger/writer.key.tmp/x"), "").unwrap();
    let o = run(d, &["rotate", "--ledger", "ledger"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(!stderr(&o).contains(".tmp"), "{}", stderr(&o));
    assert!(stderr(&o).contains("writer.key"), "{}", stderr(&o));
}

// When a commit fails part-way (here a real full disk), the message says
// exactly which lines and seqs were committed and where to start again.
#[test]
fn a_failed_commit_says_what_was_committed() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let small = d.join("small");
    // CI runs as root: there the test must run.
    let Some(_unmount) = fixture::mount_tmpfs(&small, 12) else {
        return;
    };
    fixture::ok(d, &["keygen", "--out", "a.key"], "");
    fixture::ok(
        d,
        &["init", "--ledger", "small/l", "--recipient", "a.pub"],
        "",
    );
    // Room to free once the disk is full.
    std::fs::write(small.join("filler"), vec![0u8; 1 << 20]).unwrap();
    let goal = "x".repeat(100);
    let input: String = (0..100_000)
        .map(|i| format!("{{\"run\":\"b{i}\",\"kind\":\"start\",\"goal\":\"{goal}\"}}\n"))
        .collect();
    let o = run_stdin(
        d,
        &["append", "--ledger", "small/l", "--batch", "5000"],
        &input,
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let receipts = String::from_utf8(o.stdout.clone()).unwrap();
    let n = receipts.lines().count();
    assert!(
        n > 0 && n < 100_000 && n.is_multiple_of(5000),
        "{n} receipts; {}",
        stderr(&o)
    );
    let last: serde_json::Value = serde_json::from_str(receipts.lines().last().unwrap()).unwrap();
    assert_eq!(last["seq"], n as u64);
    let e = stderr(&o);
    assert!(
        e.contains(&format!(
            "{n} decisions before it were committed (seqs 1-{n}"
        )),
        "{e}"
    );
    assert!(
        e.contains(&format!("lines {}-100000 were not written", n + 1)),
        "{e}"
    );
    assert!(e.contains(&format!("tail -n +{}", n + 1)), "{e}");
    // Space freed, the ledger takes appends again (in a new segment, after the
    // torn write the full disk left, which stays in place), and verifies intact.
    std::fs::remove_file(small.join("filler")).unwrap();
    let line = "{\"run\":\"after\",\"kind\":\"start\"}";
    let o = run(d, &["append", "--ledger", "small/l", line]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["seq"], n as u64 + 1);
    let o = run(d, &["verify", "small/l", "--key", "small/l/ledger.pub"]);
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert_eq!(o.status.code(), Some(0), "{out}{}", stderr(&o));
    assert!(out.starts_with("INTACT: "), "{out}");
    // The failed write is torn unless the disk was full to the byte before it (then
    // nothing of it landed): whatever landed is named, at the segment's sealed end.
    let seg0 = small.join("l/log/00000000000000000000.seg");
    let scan = tally_ledger::segment::scan(&seg0).unwrap();
    eprintln!("the full disk left {} unsealed bytes", scan.unsealed());
    if scan.unsealed() > 0 {
        let line = format!("torn write  segment 0 at byte {}:", scan.sealed_end);
        assert!(out.contains(&line), "{out}");
    }
}

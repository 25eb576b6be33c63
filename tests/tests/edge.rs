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

/// `handoff --run X` exits on X's findings, not on other runs'.
#[test]
fn handoff_of_one_run_exits_on_that_runs_findings_only() {
    let mut decisions = clean_run("clean");
    decisions.extend(bad_run("bad"));
    let cli = Cli::new(&decisions);
    let one = cli.run(&with_keys(&["handoff", "L.tally", "--run", "clean"]));
    assert_eq!(code(&one), 0, "{}{}", text(&one.stdout), text(&one.stderr));
    let bad = cli.run(&with_keys(&["handoff", "L.tally", "--run", "bad"]));
    assert_eq!(code(&bad), 1, "{}", text(&bad.stdout));
    let all = cli.run(&with_keys(&["handoff", "L.tally"]));
    assert_eq!(code(&all), 1, "{}", text(&all.stdout));
}

/// Verify with the auditor key exits 1 on audit findings whatever the
/// chain's verdict, as loops and handoff do (over a cut copy it exited 3), and says so.
#[test]
fn verify_with_audit_findings_exits_1_and_says_inconsistent() {
    let cli = Cli::new(&bad_run("bad"));
    let cut = cut_at_boundary(&cli);
    for path in ["L.tally", cut.to_str().expect("path")] {
        let out = cli.run(&with_keys(&["verify", path]));
        let stdout = text(&out.stdout);
        assert_eq!(code(&out), 1, "{path}: {stdout}");
        assert!(
            stdout.trim_end().ends_with(
                "INCONSISTENT: the chain verifies, but decisions in it are inconsistent (the findings above): exit 1"
            ),
            "{stdout}"
        );
        let loops = cli.run(&with_keys(&["loops", path]));
        assert_eq!(code(&loops), code(&out), "{path}");
    }
}

/// Loops and handoff on incomplete evidence exit 3 and say so.
#[test]
fn incomplete_evidence_is_stated_by_loops_and_handoff() {
    let cli = Cli::new(&clean_run("r"));
    let cut = cut_at_boundary(&cli);
    let cut = cut.to_str().expect("utf-8 path");
    for command in ["loops", "handoff"] {
        let out = cli.run(&with_keys(&[command, cut]));
        let stdout = text(&out.stdout);
        assert_eq!(code(&out), 3, "{command}: {stdout}{}", text(&out.stderr));
        assert!(
            stdout.starts_with("NOTE: the evidence is incomplete (INCOMPLETE: "),
            "{command}: {stdout}"
        );
        assert!(stdout.contains("without its end marker"), "{stdout}");
    }
}

/// A report refused without `--force` still answers `--json` on stdout.
#[test]
fn a_refused_json_report_prints_a_document() {
    let cli = Cli::new(&clean_run("r"));
    let bad = tampered(&cli);
    let bad = bad.to_str().expect("utf-8 path");
    for command in ["loops", "handoff"] {
        let out = cli.run(&with_keys(&[command, bad, "--json"]));
        assert_eq!(code(&out), 1, "{}", text(&out.stderr));
        let doc: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "{command}: stdout is not JSON ({e}): {:?}",
                text(&out.stdout)
            )
        });
        assert_eq!(doc["version"], 2);
        assert_eq!(doc["verification"]["verdict"], "tampered");
        assert!(doc["refused"]
            .as_str()
            .is_some_and(|r| r.contains("--force")));
        assert!(doc["verification"]["first_bad"]["seq"].is_u64(), "{doc}");
    }
}

/// The CLI calls a copy cut inside a frame incomplete (exit 3) and names
/// the last sealed seq, as for a cut between frames.
#[test]
fn a_copy_cut_inside_a_frame_exits_3() {
    let cli = Cli::new(&clean_run("r"));
    let bytes = std::fs::read(cli.path("L.tally")).expect("export");
    // Cut inside the last checkpoint frame (the end marker and a few bytes before it).
    let cut = cli.path("torn.tally");
    std::fs::write(&cut, &bytes[..bytes.len() - END_FRAME_LEN - 7]).expect("write cut");
    let out = cli.run(&[
        "verify",
        cut.to_str().expect("path"),
        "--key",
        "L/ledger.pub",
    ]);
    let stdout = text(&out.stdout);
    assert_eq!(code(&out), 3, "{stdout}");
    assert!(stdout.starts_with("INCOMPLETE: "), "{stdout}");
    // The four decisions were one batch, sealed by the checkpoint that was cut.
    assert!(stdout.contains("last sealed seq 0"), "{stdout}");
    assert!(stdout.contains("seq 1..=4 read but not sealed"), "{stdout}");
    assert!(stdout.contains("ends inside the frame"), "{stdout}");
}

/// Another ledger's `ledger.pub` or anchor is a mistake (exit 2) that
/// names both ledger ids, not tampering.
#[test]
fn another_ledgers_key_or_anchor_is_a_usage_error_naming_both_ids() {
    let cli = Cli::new(&clean_run("r"));
    cli.ok(&["init", "--ledger", "M", "--recipient", "a.pub"]);
    let id = |dir: &str| {
        tally_ledger::LedgerPublic::read(&cli.path(dir).join("ledger.pub"))
            .expect("ledger.pub")
            .ledger_id
            .to_string()
    };
    let (ours, theirs) = (id("L"), id("M"));
    for args in [
        vec!["verify", "L.tally", "--key", "M/ledger.pub"],
        vec!["verify", "L", "--key", "M/ledger.pub"],
        vec![
            "loops",
            "L.tally",
            "--key",
            "M/ledger.pub",
            "--auditor-key",
            "a.key",
        ],
    ] {
        let out = cli.run(&args);
        let stderr = text(&out.stderr);
        assert_eq!(code(&out), 2, "{args:?}: {}{stderr}", text(&out.stdout));
        assert!(
            stderr.contains(&ours) && stderr.contains(&theirs),
            "{stderr}"
        );
        assert!(out.stdout.is_empty(), "{}", text(&out.stdout));
    }
    let anchor = cli.ok(&["checkpoint", "--ledger", "M"]).stdout;
    std::fs::write(cli.path("m.cp"), anchor).expect("anchor");
    let out = cli.run(&[
        "verify",
        "L.tally",
        "--key",
        "L/ledger.pub",
        "--anchor",
        "m.cp",
    ]);
    let stderr = text(&out.stderr);
    assert_eq!(code(&out), 2, "{}{stderr}", text(&out.stdout));
    assert!(
        stderr.contains(&ours) && stderr.contains(&theirs),
        "{stderr}"
    );
}

/// A flipped bit in the genesis recipient, with `--auditor-key`, is
/// tampering reported by the keyless walk (exit 1), not a key error with no report.
#[test]
fn a_flipped_genesis_recipient_is_reported_as_tampering() {
    let cli = Cli::new(&clean_run("r"));
    let recipient =
        tally_ledger::keys::read_auditor_public(&cli.path("a.pub")).expect("auditor public");
    let mut bytes = std::fs::read(cli.path("L.tally")).expect("export");
    let at = bytes
        .windows(32)
        .position(|w| w == recipient)
        .expect("the recipient in the genesis");
    bytes[at + 16] ^= 0x10;
    std::fs::write(cli.path("flip.tally"), &bytes).expect("write");
    for command in ["verify", "loops", "handoff"] {
        let out = cli.run(&with_keys(&[command, "flip.tally"]));
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        assert_eq!(code(&out), 1, "{command}: {stdout}{stderr}");
        let report = if command == "verify" {
            &stdout
        } else {
            &stderr
        };
        assert!(
            report.starts_with("TAMPERED: first bad seq 0") && report.contains("bad_genesis"),
            "{command}: {stdout}{stderr}"
        );
    }
}

/// A damaged store is a finding (exit 1), not "Read corrupted data"
/// with exit 2. In layout 2: a segment whose header is damaged.
#[test]
fn a_damaged_store_is_a_finding() {
    let cli = Cli::new(&clean_run("r"));
    let seg = cli
        .path("L")
        .join(tally_ledger::segment::LOG_DIR)
        .join(tally_ledger::segment::segment_name(0));
    let mut bytes = std::fs::read(&seg).expect("segment");
    for b in &mut bytes[..8] {
        *b ^= 0xff;
    }
    std::fs::write(&seg, &bytes).expect("write damaged segment");
    let out = cli.run(&["verify", "L", "--key", "L/ledger.pub"]);
    let stdout = text(&out.stdout);
    assert_eq!(code(&out), 1, "{stdout}{}", text(&out.stderr));
    assert!(
        stdout.starts_with("TAMPERED: ") && stdout.contains("store_error"),
        "{stdout}"
    );
}

/// A broken link shows the two hashes far enough to see them differ
/// (it printed `previous-hash 491ce7e6985a8528 is not the hash 491ce7e6985a8528`).
#[test]
fn a_broken_link_shows_what_differs() {
    let fx = Fixture::standard();
    let mut frames = fx.frames();
    let real = header(entry_bytes(&frames, 4)).prev_hash;
    let mut near = real;
    near.0[31] ^= 1; // differs in the last hex digit only
    set_prev_hash(entry_mut(&mut frames, 4), near);
    let report = verify_frames(&frames, &fx.options());
    let f = report
        .findings
        .iter()
        .find(|f| f.kind == FindingKind::BrokenLink)
        .expect("a broken link");
    let words: Vec<&str> = f.detail.split_whitespace().collect();
    let (found, want) = (words[1], words[6]);
    assert_ne!(found, want, "{}", f.detail);
    assert_eq!(found, near.to_string(), "{}", f.detail);
    assert_eq!(want, real.to_string(), "{}", f.detail);
    // JSON carries both in full.
    assert_eq!(
        f.hashes,
        Some(tally_verify::Hashes {
            found: near.to_string(),
            expected: real.to_string(),
        })
    );
}

/// Copies of a checkpoint are a finding (they verified intact), found
/// in linear time (each copy is compared, not checked against every other).
#[test]
fn duplicated_checkpoints_are_one_finding() {
    let fx = Fixture::standard();
    let mut frames = fx.frames();
    let last = frames.pop().expect("last checkpoint");
    let copies = 20_000;
    frames.extend(std::iter::repeat_n(last, copies + 1));
    let started = std::time::Instant::now();
    let report = verify_frames(&frames, &fx.options());
    let took = started.elapsed();
    assert_eq!(
        findings(&report),
        [(FindingKind::CheckpointDuplicate, 10)],
        "{}",
        report.to_text()
    );
    assert!(
        report.findings[0].detail.starts_with(&format!(
            "{copies} more checkpoints of size 10 after the first"
        )),
        "{}",
        report.findings[0].detail
    );
    eprintln!("{copies} duplicated checkpoints verified in {took:?}");
}

/// Amounts never wrap in reports: a reservation of u64::MAX cents and
/// then 2 more stays at u64::MAX, with an `amount_overflow` finding.
#[test]
fn reservations_that_would_overflow_are_a_finding_never_a_wrap() {
    let cli = Cli::new(&[
        json!({"run": "r", "kind": "start", "goal": "g", "budget": {"spend_cents": 10}}),
        json!({"run": "r", "kind": "allow", "tool": "t", "attempt": 1, "reserve_cents": u64::MAX}),
        json!({"run": "r", "kind": "allow", "tool": "t", "attempt": 2, "reserve_cents": 2}),
    ]);
    let out = cli.run(&with_keys(&["handoff", "L.tally"]));
    let stdout = text(&out.stdout);
    assert_eq!(code(&out), 1, "{stdout}");
    assert!(
        stdout.contains(&format!("{}¢ reserved", u64::MAX)),
        "{stdout}"
    );
    let loops = text(&cli.run(&with_keys(&["loops", "L.tally"])).stdout);
    assert!(
        loops.contains("overflow: held_cents would overflow"),
        "{loops}"
    );
}

/// Handoff wording: a start without a goal, attempts without a limit,
/// storms without named workers, and times that say which clock they are on.
#[test]
fn handoff_wording_says_what_is_known() {
    let mut decisions = vec![json!({"run": "nogoal", "kind": "start", "at_ms": 0})];
    decisions.push(json!({"run": "nogoal", "kind": "stop", "reason": "completed", "at_ms": 5}));
    decisions.push(json!({"run": "orphan", "kind": "allow", "tool": "t", "attempt": 1}));
    // A storm across three runs with no worker named.
    for run in ["s1", "s2", "s3"] {
        decisions.push(json!({"run": run, "kind": "start", "goal": "sync"}));
        for a in 1..=2 {
            decisions.push(json!({"run": run, "kind": "allow", "tool": "billing", "attempt": a, "args": {"a": a}}));
            decisions.push(json!({"run": run, "kind": "outcome", "status": "error", "attempt": a}));
        }
    }
    let cli = Cli::new(&decisions);
    let out = cli.run(&with_keys(&["handoff", "L.tally"]));
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("Run nogoal: (its start record gives no goal)"),
        "{stdout}"
    );
    assert!(stdout.contains("Run orphan: (no start record)"), "{stdout}");
    assert!(stdout.contains("Attempts: 1 used (no limit)"), "{stdout}");
    assert!(!stdout.contains("of no limit"), "{stdout}");
    assert!(!stdout.contains("(s)"), "{stdout}");
    assert!(!stdout.contains("0 worker"), "{stdout}");
    assert!(
        stdout.contains("5 ms after the run started, recorded 20"),
        "{stdout}"
    );
}

/// True if `s` holds a character that drives a terminal: C0 controls but the line break,
/// DEL, C1 controls, bidi overrides.
fn drives_a_terminal(s: &str) -> Option<char> {
    s.chars().find(|&c| {
        (c.is_control() && c != '\n')
            || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    })
}

/// Agent-supplied strings are shown escaped. A run named to erase the
/// lines above it (`\r\e[10A\r\e[J`) hid another run's "Must not repeat" line.
#[test]
fn agent_strings_never_reach_the_terminal_raw() {
    let evil = "x\r\u{1b}[10A\r\u{1b}[J\u{7}\u{9b}2J\u{202e}\nMust not repeat: nothing known.";
    let decisions = vec![
        json!({"run": evil, "kind": "start", "goal": evil, "parent": evil, "budget": {"attempts": 9}}),
        json!({"run": evil, "kind": "allow", "tool": evil, "operation": evil, "worker": evil,
               "attempt": 1, "effect": "non_idempotent_write", "args": {"a": 1}, "at_ms": 1}),
        json!({"run": evil, "kind": "outcome", "status": "running", "attempt": 1,
               "remote_ref": evil, "observed": evil, "retry_after_ms": 10}),
        json!({"run": evil, "kind": "allow", "tool": evil, "operation": evil, "worker": evil,
               "attempt": 2, "effect": "non_idempotent_write", "args": {"a": 2}, "at_ms": 2}),
        json!({"run": evil, "kind": "outcome", "status": "ok", "attempt": 2,
               "remote_ref": format!("{evil}2"), "observed": evil}),
        json!({"run": evil, "kind": "allow", "tool": evil, "operation": evil, "worker": evil,
               "attempt": 3, "effect": "non_idempotent_write", "args": {"a": 3}, "at_ms": 3}),
        json!({"run": evil, "kind": "outcome", "status": "unknown", "attempt": 3}),
        json!({"run": evil, "kind": "allow", "tool": evil, "operation": evil, "worker": evil,
               "attempt": 4, "effect": "non_idempotent_write", "args": {"a": 3}, "at_ms": 4}),
        json!({"run": evil, "kind": "deny", "tool": evil, "operation": evil, "reason": "approval_required"}),
        json!({"run": evil, "kind": "refund", "of": 9}),
    ];
    let mut decisions = decisions;
    for a in 5..=8 {
        decisions.push(
            json!({"run": evil, "kind": "allow", "tool": evil, "attempt": a,
                              "args": {"same": true}, "at_ms": 10 + a}),
        );
    }
    let cli = Cli::new(&decisions);
    for args in [
        with_keys(&["verify", "L.tally"]),
        with_keys(&["loops", "L.tally"]),
        with_keys(&["handoff", "L.tally"]),
    ] {
        let out = cli.run(&args);
        let stdout = text(&out.stdout);
        if let Some(c) = drives_a_terminal(&stdout) {
            panic!("{args:?}: raw {c:?} on stdout:\n{stdout:?}");
        }
        assert!(
            stdout.contains("x\\u{d}\\u{1b}[10A"),
            "{args:?}: the run is named, escaped:\n{stdout}"
        );
        assert!(
            !stdout.contains("\nMust not repeat: nothing known."),
            "{stdout}"
        );
    }
}

/// The JSON the commands print is what the docs say: one document with
/// `version` (and `verdict` for verify), each valid against its schema in docs/schemas/.
#[test]
fn json_reports_match_their_published_schemas() {
    let mut decisions = clean_run("clean");
    decisions.extend(bad_run("bad"));
    decisions.extend([
        json!({"run": "w", "kind": "start", "goal": "write", "budget": {"attempts": 9, "spend_cents": 100}}),
        json!({"run": "w", "kind": "allow", "tool": "pay", "operation": "pay.create", "attempt": 1,
               "effect": "non_idempotent_write", "args": {"a": 1}, "reserve_cents": 40, "at_ms": 1}),
        json!({"run": "w", "kind": "outcome", "status": "timeout", "attempt": 1}),
        json!({"run": "w", "kind": "allow", "tool": "job", "operation": "job.start", "attempt": 2,
               "effect": "idempotent_write", "args": {"a": 2}, "at_ms": 2}),
        json!({"run": "w", "kind": "outcome", "status": "running", "attempt": 2, "remote_ref": "j1",
               "observed": "queued", "retry_after_ms": 100}),
    ]);
    for a in 3..=6 {
        decisions.push(
            json!({"run": "w", "kind": "allow", "tool": "get", "attempt": a,
                              "args": {"same": 1}, "effect": "read", "at_ms": 10 + a}),
        );
    }
    let cli = Cli::new(&decisions);
    let cut = cut_at_boundary(&cli);
    let cut = cut.to_str().expect("path");
    let bad = tampered(&cli);
    let bad = bad.to_str().expect("path");
    let schema = |name: &str| {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../docs/schemas")
            .join(format!("{name}.json"));
        let text = std::fs::read_to_string(&path).expect("schema file");
        let schema: Value = serde_json::from_str(&text).expect("schema is JSON");
        assert_eq!(
            schema["$schema"], "https://json-schema.org/draft/2020-12/schema",
            "{name}"
        );
        jsonschema::draft202012::new(&schema).expect("a valid schema")
    };
    // For verify, the chain's verdict: audit findings make it exit 1 whatever the
    // verdict, over incomplete evidence too, as loops and handoff do.
    let verdicts = ["intact", "intact", "incomplete", "incomplete", "tampered"];
    let cases: Vec<(&str, Vec<&str>, i32)> = vec![
        (
            "verify",
            vec!["verify", "L.tally", "--key", "L/ledger.pub", "--json"],
            0,
        ),
        ("verify", with_keys(&["verify", "L.tally", "--json"]), 1),
        (
            "verify",
            vec!["verify", cut, "--key", "L/ledger.pub", "--json"],
            3,
        ),
        ("verify", with_keys(&["verify", cut, "--json"]), 1),
        (
            "verify",
            vec!["verify", bad, "--key", "L/ledger.pub", "--json"],
            1,
        ),
        ("loops", with_keys(&["loops", "L.tally", "--json"]), 1),
        ("loops", with_keys(&["loops", cut, "--json"]), 1),
        ("loops", with_keys(&["loops", bad, "--json"]), 1),
        ("loops", with_keys(&["loops", bad, "--json", "--force"]), 1),
        ("handoff", with_keys(&["handoff", "L.tally", "--json"]), 1),
        (
            "handoff",
            with_keys(&["handoff", "L.tally", "--run", "w", "--json"]),
            0,
        ),
        (
            "handoff",
            with_keys(&["handoff", cut, "--run", "clean", "--json"]),
            3,
        ),
        ("handoff", with_keys(&["handoff", bad, "--json"]), 1),
        ("stats", with_keys(&["stats", "L.tally", "--json"]), 1),
        (
            "stats",
            with_keys(&["stats", "L.tally", "--run", "w", "--json"]),
            0,
        ),
        (
            "stats",
            with_keys(&["stats", cut, "--run", "clean", "--json"]),
            3,
        ),
        ("stats", with_keys(&["stats", bad, "--json"]), 1),
    ];
    for (i, (name, args, want)) in cases.into_iter().enumerate() {
        let out = cli.run(&args);
        assert_eq!(code(&out), want, "{args:?}: {}", text(&out.stderr));
        let doc: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{args:?}: not JSON ({e}): {}", text(&out.stdout)));
        let errors: Vec<String> = schema(name)
            .iter_errors(&doc)
            .map(|e| format!("{} at {}", e, e.instance_path()))
            .collect();
        assert!(
            errors.is_empty(),
            "{args:?}:\n{}\n{doc:#}",
            errors.join("\n")
        );
        assert_eq!(doc["version"], 2, "{args:?}");
        if let Some(verdict) = verdicts.get(i) {
            assert_eq!(doc["verdict"], *verdict, "{args:?}");
        }
    }
}

/// The documents REPORTS.md shows are what the schemas accept, so the
/// docs cannot drift from the output the schema test checks.
#[test]
fn the_documented_examples_match_the_schemas() {
    let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs");
    let reports = std::fs::read_to_string(docs.join("REPORTS.md")).expect("REPORTS.md");
    let mut checked = Vec::new();
    for block in reports.split("```json\n").skip(1) {
        let body = block.split("```").next().unwrap_or_default();
        let Ok(doc) = serde_json::from_str::<Value>(body) else {
            continue; // a fragment, not a whole document
        };
        let name = if doc.get("loops").is_some() {
            "loops"
        } else if doc.get("handoffs").is_some() {
            "handoff"
        } else if doc.get("runs").is_some() {
            "stats"
        } else {
            continue;
        };
        let text = std::fs::read_to_string(docs.join("schemas").join(format!("{name}.json")))
            .expect("schema");
        let schema: Value = serde_json::from_str(&text).expect("schema JSON");
        let validator = jsonschema::draft202012::new(&schema).expect("valid schema");
        let errors: Vec<String> = validator
            .iter_errors(&doc)
            .map(|e| format!("{e} at {}", e.instance_path()))
            .collect();
        assert!(errors.is_empty(), "{name} example:\n{}", errors.join("\n"));
        checked.push(name);
    }
    assert_eq!(checked, ["loops", "handoff", "stats"]);
}

//! Exit codes that agree with the text, and user mistakes told apart from tampering.

use super::*;

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

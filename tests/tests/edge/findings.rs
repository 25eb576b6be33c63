//! Tampering and damage as findings, with messages that show what differs.

use super::*;

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
/// with exit 2. In layout 3: a segment whose header is damaged.
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
        json!({"run": "r", "kind": "allow", "tool": "t", "attempt": 1, "reserve_nanos": u64::MAX}),
        json!({"run": "r", "kind": "allow", "tool": "t", "attempt": 2, "reserve_cents": 2}),
    ]);
    let out = cli.run(&with_keys(&["handoff", "L.tally"]));
    let stdout = text(&out.stdout);
    assert_eq!(code(&out), 1, "{stdout}");
    assert!(
        stdout.contains("$18446744073.709551615 reserved"),
        "{stdout}"
    );
    let loops = text(&cli.run(&with_keys(&["loops", "L.tally"])).stdout);
    assert!(
        loops.contains("overflow: held_nanos would overflow"),
        "{loops}"
    );
}

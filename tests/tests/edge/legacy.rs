//! Ledgers written before layout 3 (`tests/fixtures/layout2`, made by the last build of
//! layout 2): their exports (`tally export v1`, entries chained over their bytes) still
//! verify, decrypt and replay; their directories are refused with a message that says
//! what to do, and nothing in them changes; and the magic that names the chain rule
//! cannot be swapped to pass one rule's export off as the other's.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt as _;

use super::*;

/// The fixture copied into a temporary directory (a checkout's key files are not 0600).
fn fixture() -> tempfile::TempDir {
    let from = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/layout2");
    let tmp = tempfile::tempdir().expect("tempdir");
    copy_dir(&from, tmp.path());
    for key in ["auditor.key", "ledger/writer.key", "ledger/log.key"] {
        fs::set_permissions(tmp.path().join(key), fs::Permissions::from_mode(0o600))
            .expect("chmod");
    }
    fs::set_permissions(tmp.path().join("ledger"), fs::Permissions::from_mode(0o700))
        .expect("chmod");
    tmp
}

fn run_in(dir: &Path, args: &[&str]) -> Output {
    Command::new(tally_bin())
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run tally")
}

/// `tally verify FILE --key KEY --json` and `more`, run in `dir`: its exit code and report.
fn verify_json(dir: &Path, file: &str, key: &str, more: &[&str]) -> (i32, Value) {
    let mut args = vec!["verify", file, "--key", key, "--json"];
    args.extend_from_slice(more);
    let out = run_in(dir, &args);
    let report = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{args:?}: not JSON ({e}): {}", text(&out.stderr)));
    (code(&out), report)
}

/// Every file under `dir` with its bytes.
fn tree(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for item in fs::read_dir(&d).expect("read_dir") {
            let path = item.expect("entry").path();
            if path.is_dir() {
                out.insert(path.clone(), Vec::new());
                todo.push(path);
            } else {
                out.insert(path.clone(), fs::read(&path).expect("read"));
            }
        }
    }
    out
}

#[test]
fn a_layout_2_export_verifies_decrypts_and_replays() {
    let tmp = fixture();
    let keyless = run_in(
        tmp.path(),
        &["verify", "export-v1.tally", "--key", "ledger/ledger.pub"],
    );
    let stdout = text(&keyless.stdout);
    assert_eq!(code(&keyless), 0, "{stdout}{}", text(&keyless.stderr));
    assert!(
        stdout.starts_with("INTACT: all 8 entries (seq 0..=7) verified and sealed"),
        "{stdout}"
    );
    // With the auditor key: every decision opens and the replay judges them (the run
    // the fixture was made from refunds one attempt twice).
    let (code, report) = verify_json(
        tmp.path(),
        "export-v1.tally",
        "ledger/ledger.pub",
        &["--auditor-key", "auditor.key"],
    );
    assert_eq!(code, 1, "{report}");
    assert_eq!(report["entries"], 8);
    assert_eq!(report["epochs"], 2);
    assert_eq!(report["decrypted"], 6);
    assert_eq!(report["findings"], json!([]), "the chain is intact");
    assert_eq!(
        report["audit"]["findings"][0]["kind"], "refunded_twice",
        "{report}"
    );
    assert_eq!(report["audit"]["findings"][0]["seq"], 5);
}

/// Bytes changed in an old export are caught under the old rule as under the new.
#[test]
fn a_changed_layout_2_export_is_tampered() {
    let tmp = fixture();
    let export = fs::read(tmp.path().join("export-v1.tally")).expect("export");
    let frames = parse_frames(&export);
    let at = entry_at(&frames, 3);
    let mut changed = frames.clone();
    let Frame::Entry(bytes) = &mut changed[at] else {
        panic!("entry")
    };
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    let mut bytes = write_export(&changed);
    bytes[..16].copy_from_slice(b"tally export v1\n");
    fs::write(tmp.path().join("changed.tally"), &bytes).expect("write");
    let (code, report) = verify_json(tmp.path(), "changed.tally", "ledger/ledger.pub", &[]);
    assert_eq!(code, 1, "{report}");
    assert_eq!(report["verdict"], "tampered", "{report}");
    assert_eq!(report["findings"][0]["seq"], 3, "{report}");
}

/// The magic names the rule: an export relabelled as the other version breaks at its
/// first seal (the checkpoint of size 1 signs the genesis hash under the true rule),
/// whichever way it is relabelled.
#[test]
fn relabelling_an_export_breaks_its_first_seal() {
    let tmp = fixture();
    let old = fs::read(tmp.path().join("export-v1.tally")).expect("export");
    let cli = Cli::new(&clean_run("r"));
    let new = fs::read(cli.path("L.tally")).expect("export");
    assert_eq!(&new[..16], b"tally export v2\n");
    for (name, bytes, key, magic) in [
        (
            "old-as-v2",
            old,
            tmp.path().join("ledger/ledger.pub"),
            b"tally export v2\n",
        ),
        (
            "new-as-v1",
            new,
            cli.path("L/ledger.pub"),
            b"tally export v1\n",
        ),
    ] {
        let mut bytes = bytes;
        bytes[..16].copy_from_slice(magic);
        let path = tmp.path().join(name);
        fs::write(&path, &bytes).expect("write");
        let (code, report) = verify_json(
            tmp.path(),
            path.to_str().expect("utf-8"),
            key.to_str().expect("utf-8"),
            &[],
        );
        assert_eq!(code, 1, "{name}: {report}");
        assert_eq!(report["verdict"], "tampered", "{name}: {report}");
        assert_eq!(
            report["findings"][0]["kind"], "entry_altered",
            "{name}: {report}"
        );
        assert_eq!(report["findings"][0]["seq"], 0, "{name}: {report}");
    }
}

/// A layout 2 directory is refused by the verifier and by every writer, with what to do,
/// and not one byte of it changes (no index built, no lock file, no segment opened for
/// writing).
#[test]
fn a_layout_2_directory_is_refused_and_left_as_it_was() {
    let tmp = fixture();
    let before = tree(tmp.path());
    let decision = r#"{"run":"r3","kind":"start","at_ms":200}"#;
    // The daemon's socket outside the fixture, so that only the ledger is compared.
    let elsewhere = tempfile::tempdir().expect("tempdir");
    let socket = elsewhere.path().join("tally.sock");
    let socket = socket.to_str().expect("utf-8 path");
    for args in [
        vec!["verify", "ledger", "--key", "ledger/ledger.pub"],
        vec!["append", "--ledger", "ledger", decision],
        vec!["export", "--ledger", "ledger", "--out", "again.tally"],
        vec!["rotate", "--ledger", "ledger"],
        vec!["checkpoint", "--ledger", "ledger"],
        vec!["reindex", "--ledger", "ledger"],
        vec!["prove", "--ledger", "ledger", "--seq", "1"],
        vec!["serve", "--ledger", "ledger", "--socket", socket],
    ] {
        let out = run_in(tmp.path(), &args);
        let stderr = text(&out.stderr);
        assert_eq!(code(&out), 2, "{args:?}: {stderr}{}", text(&out.stdout));
        assert!(
            stderr.contains("this ledger is in layout 2")
                && stderr.contains("tally export --ledger DIR --out FILE")
                && stderr.contains("tally init"),
            "{args:?}: {stderr}"
        );
        assert_eq!(tree(tmp.path()), before, "{args:?} changed the fixture");
    }
}

/// The chain rule is the source's to name once, before its first frame: a rule named
/// later (no source does so; a crafted one could) is a finding, never a switch of rule
/// for the entries after it.
#[test]
fn a_chain_rule_named_after_the_first_frame_is_a_finding() {
    use tally_ledger::format::ChainRule;
    use tally_verify::walk::SourceError;
    let tmp = fixture();
    let export = fs::read(tmp.path().join("export-v1.tally")).expect("export");
    let public = tally_ledger::keys::LedgerPublic::read(&tmp.path().join("ledger/ledger.pub"))
        .expect("ledger.pub");
    let opts = tally_verify::Options::new(public);
    let items: Vec<_> = tally_verify::walk::export_frames(&export[..])
        .expect("export")
        .collect();
    assert_eq!(items[0], Err(SourceError::Chain(ChainRule::EntryBytes)));
    let run = |items: Vec<Result<Frame, SourceError>>| {
        tally_verify::verify(items.into_iter(), &opts, |_| {}, |_| {})
    };
    assert_eq!(findings(&run(items.clone())), vec![], "the export as it is");
    for late in [ChainRule::EntryBytes, ChainRule::LeafHash] {
        let mut crafted = items.clone();
        crafted.insert(2, Err(SourceError::Chain(late)));
        let report = run(crafted);
        assert_eq!(
            report.findings.first().map(|f| f.kind),
            Some(FindingKind::StoreError),
            "{late:?}: {:?}",
            report.findings
        );
        assert!(
            report
                .findings
                .iter()
                .all(|f| f.kind != FindingKind::EntryAltered),
            "{late:?}: the rule changed: {:?}",
            report.findings
        );
    }
}

/// The refusal is not a place to hide damage: a layout 3 ledger whose first segment's
/// magic is changed to layout 2's (its genesis not sealed under layout 2's rule) is a
/// damaged store, a finding with exit 1, not an old ledger to be exported elsewhere.
#[test]
fn a_layout_3_ledger_relabelled_layout_2_is_tampered() {
    let cli = Cli::new(&clean_run("r"));
    let seg = cli
        .path("L")
        .join(tally_ledger::segment::LOG_DIR)
        .join(tally_ledger::segment::segment_name(0));
    let mut bytes = fs::read(&seg).expect("segment");
    assert_eq!(&bytes[..16], b"tally segment 3\n");
    bytes[..16].copy_from_slice(b"tally segment 2\n");
    fs::write(&seg, &bytes).expect("write");
    let out = cli.run(&["verify", "L", "--key", "L/ledger.pub", "--json"]);
    let stderr = text(&out.stderr);
    assert_eq!(code(&out), 1, "{stderr}{}", text(&out.stdout));
    assert!(!stderr.contains("layout 2"), "{stderr}");
    let report: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(report["verdict"], "tampered", "{report}");
    assert_eq!(report["findings"][0]["kind"], "store_error", "{report}");
}

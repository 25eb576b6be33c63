//! The Merkle tree files with the real binary: `tally reindex` rebuilds them from the
//! entries after they were deleted, cut or corrupted (and proofs work again, against the
//! same root), and `tally verify --anchor CP --no-walk` proves an old anchor with a
//! consistency proof, refusing a fork, a cut, an anchor past the end and tree files that
//! do not lead to the log's root.

use std::path::Path;
use std::process::{Command, Output};

const TALLY: &str = env!("CARGO_BIN_EXE_tally");

fn tally(dir: &Path, args: &[&str], stdin: Option<&str>) -> Output {
    tally_testkit::Tally::new(TALLY).run(dir, args, stdin.unwrap_or(""))
}

fn ok(dir: &Path, args: &[&str]) -> String {
    let o = tally(dir, args, None);
    assert!(
        o.status.success(),
        "tally {args:?}: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).expect("utf-8")
}

fn append(dir: &Path, ledger: &str, run: &str, n: usize) {
    let lines: String = (0..n)
        .map(|i| format!("{{\"run\":\"{run}\",\"kind\":\"start\",\"goal\":\"step {i}\"}}\n"))
        .collect();
    let o = tally(dir, &["append", "--ledger", ledger], Some(&lines));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

fn copy_dir(from: &Path, to: &Path) {
    let status = Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .expect("cp");
    assert!(status.success());
}

/// A new ledger `L` in a private temporary directory.
fn ledger() -> tempfile::TempDir {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path();
    std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))
        .expect("mode");
    ok(dir, &["keygen", "--out", "auditor.key"]);
    ok(
        dir,
        &["init", "--ledger", "L", "--recipient", "auditor.pub"],
    );
    tmp
}

/// The checkpoint's size and root lines.
fn head(cp: &str) -> (String, String) {
    let mut l = cp.lines().skip(1);
    (
        l.next().expect("size").to_owned(),
        l.next().expect("root").to_owned(),
    )
}

/// `tally prove --seq N` then `tally verify-proof`: the checkpoint the proof is against.
fn prove_and_check(dir: &Path, seq: u64) -> String {
    let _ = std::fs::remove_file(dir.join("p"));
    ok(
        dir,
        &[
            "prove",
            "--ledger",
            "L",
            "--seq",
            &seq.to_string(),
            "--out",
            "p",
        ],
    );
    let checked = ok(dir, &["verify-proof", "p", "--key", "L/ledger.pub"]);
    assert!(checked.contains("checkpoint"), "{checked}");
    let proof = std::fs::read_to_string(dir.join("p")).expect("proof");
    // The checkpoint is what follows the proof's blank line.
    proof
        .split_once("\n\n")
        .expect("a checkpoint after the proof")
        .1
        .to_owned()
}

fn proving_fails(dir: &Path, seq: u64) -> String {
    let o = tally(
        dir,
        &[
            "prove",
            "--ledger",
            "L",
            "--seq",
            &seq.to_string(),
            "--out",
            "q",
        ],
        None,
    );
    assert_eq!(o.status.code(), Some(2), "proving with bad tree files");
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn reindex_rebuilds_deleted_cut_or_corrupt_tree_files_and_proofs_work_again() {
    let tmp = ledger();
    let dir = tmp.path();
    append(dir, "L", "r1", 300);
    let signed = ok(dir, &["checkpoint", "--ledger", "L"]);
    let (size, root) = head(&signed);
    assert_eq!(size, "301");
    let before = prove_and_check(dir, 257);
    assert_eq!(head(&before), (size.clone(), root.clone()));
    let level0 = dir.join("L/tree/0");

    type Damage = fn(&Path);
    let damages: [(&str, Damage); 4] = [
        ("deleted", |d| {
            std::fs::remove_dir_all(d.join("L/tree")).expect("rm tree")
        }),
        ("cut", |d| {
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(d.join("L/tree/0"))
                .expect("open");
            f.set_len(32 * 100).expect("truncate");
        }),
        ("bit-flipped leaf hash", |d| {
            let p = d.join("L/tree/0");
            let mut b = std::fs::read(&p).expect("read");
            b[32 * 257 + 3] ^= 0x10;
            std::fs::write(&p, b).expect("write");
        }),
        ("bit-flipped level 1", |d| {
            let p = d.join("L/tree/1");
            let mut b = std::fs::read(&p).expect("read");
            b[0] ^= 1;
            std::fs::write(&p, b).expect("write");
        }),
    ];
    for (what, damage) in damages {
        damage(dir);
        let why = proving_fails(dir, 257);
        assert!(why.contains("tree"), "{what}: {why}");
        let said = ok(dir, &["reindex", "--ledger", "L"]);
        assert!(
            said.contains("rebuilt the Merkle tree files from the entries: 301 leaves"),
            "{what}: {said}"
        );
        assert_eq!(
            std::fs::metadata(&level0).expect("level 0").len(),
            32 * 301,
            "{what}"
        );
        for leftover in ["L/tree.rebuild", "L/tree.old"] {
            assert!(!dir.join(leftover).exists(), "{what}: {leftover} left");
        }
        // Proofs work again, against the root the log signed before the damage.
        let after = prove_and_check(dir, 257);
        assert_eq!(head(&after), (size.clone(), root.clone()), "{what}");
        assert_eq!(
            head(&ok(dir, &["checkpoint", "--ledger", "L"])),
            head(&signed)
        );
        let v = tally(dir, &["verify", "L", "--key", "L/ledger.pub"], None);
        assert_eq!(v.status.code(), Some(0), "{what}");
    }
}

/// `v` is valid against docs/schemas/verify.json (its `no_walk` form).
fn schema_valid(v: &serde_json::Value) {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/schemas/verify.json");
    let schema: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("schema")).expect("json");
    let validator = jsonschema::draft202012::new(&schema).expect("a valid schema");
    let errors: Vec<String> = validator.iter_errors(v).map(|e| e.to_string()).collect();
    assert!(errors.is_empty(), "{errors:#?}\n{v:#}");
}

/// Run `tally verify PATH --key KEY --anchor A --no-walk [--json]`.
fn no_walk(dir: &Path, path: &str, anchor: &str, json: bool) -> (Option<i32>, String) {
    let key = format!("{path}/ledger.pub");
    let mut args = vec![
        "verify",
        path,
        "--key",
        &key,
        "--anchor",
        anchor,
        "--no-walk",
    ];
    if json {
        args.push("--json");
    }
    let o = tally(dir, &args, None);
    (
        o.status.code(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ),
    )
}

#[test]
fn verify_no_walk_proves_an_old_anchor_and_refuses_forks_cuts_and_bad_tree_files() {
    let tmp = ledger();
    let dir = tmp.path();
    append(dir, "L", "r1", 3);
    std::fs::write(dir.join("a4"), ok(dir, &["checkpoint", "--ledger", "L"])).expect("anchor");
    copy_dir(&dir.join("L"), &dir.join("L.cut"));
    copy_dir(&dir.join("L"), &dir.join("L.fork"));
    append(dir, "L", "r2", 5);
    std::fs::write(dir.join("a9"), ok(dir, &["checkpoint", "--ledger", "L"])).expect("anchor");

    // The old anchor is a prefix of today's tree: consistent, by a proof, no walk.
    let (code, text) = no_walk(dir, "L", "a4", false);
    assert_eq!(code, Some(0), "{text}");
    assert!(
        text.starts_with("CONSISTENT (no walk)")
            && text.contains("size 4")
            && text.contains("Consistent")
            && text.contains("not checked without the walk"),
        "{text}"
    );
    let (code, json) = no_walk(dir, "L", "a9", true);
    assert_eq!(code, Some(0), "{json}");
    let v: serde_json::Value = serde_json::from_str(&json).expect("json");
    schema_valid(&v);
    assert_eq!(v["mode"], "no_walk");
    assert_eq!(v["verdict"], "consistent");
    assert_eq!(v["size"], 9);
    assert_eq!(v["anchors"][0]["status"], "consistent");
    assert!(v["not_checked"].as_array().is_some_and(|a| !a.is_empty()));

    // Cut back to 4 and re-sealed (what a compromised writer keeps): the anchor of 9
    // is past its end.
    let (code, text) = no_walk(dir, "L.cut", "a9", false);
    assert_eq!(code, Some(1), "{text}");
    let (_, json) = no_walk(dir, "L.cut", "a9", true);
    let v: serde_json::Value = serde_json::from_str(&json).expect("json");
    schema_valid(&v);
    assert_eq!(
        (&v["verdict"], &v["anchors"][0]["status"]),
        (&"inconsistent".into(), &"truncated".into())
    );
    assert!(
        text.starts_with("NOT CONSISTENT") && text.contains("Truncated"),
        "{text}"
    );

    // A fork: from 4, another history, with its own valid tree files.
    append(dir, "L.fork", "evil", 6);
    let (code, text) = no_walk(dir, "L.fork", "a9", false);
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("Fork") && text.contains("forked"), "{text}");
    // ... where the common prefix still is one.
    assert_eq!(no_walk(dir, "L.fork", "a4", false).0, Some(0));
    // And the fork's own checkpoint, held against the real log: a fork too.
    std::fs::write(
        dir.join("f10"),
        ok(dir, &["checkpoint", "--ledger", "L.fork"]),
    )
    .expect("anchor");
    let (code, text) = no_walk(dir, "L", "f10", false);
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains("Truncated") || text.contains("Fork"),
        "{text}"
    );

    // The log's last group torn off (a cut in the file): its sealed end is earlier.
    copy_dir(&dir.join("L"), &dir.join("L.torn"));
    let seg = std::fs::read_dir(dir.join("L.torn/log"))
        .expect("log")
        .map(|e| e.expect("entry").path())
        .max()
        .expect("a segment");
    let len = std::fs::metadata(&seg).expect("segment").len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&seg)
        .expect("open")
        .set_len(len - 40)
        .expect("cut");
    let (code, text) = no_walk(dir, "L.torn", "a9", false);
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("Truncated"), "{text}");

    // Tree files that do not lead to the recorded root make no proof: exit 3, and say
    // what to do; after `tally reindex` the anchor is proven again.
    let level0 = dir.join("L/tree/0");
    let mut b = std::fs::read(&level0).expect("tree");
    b[40] ^= 4;
    std::fs::write(&level0, b).expect("write");
    let (code, text) = no_walk(dir, "L", "a4", false);
    assert_eq!(code, Some(3), "{text}");
    assert!(
        text.starts_with("UNPROVEN") && text.contains("tally reindex"),
        "{text}"
    );
    ok(dir, &["reindex", "--ledger", "L"]);
    assert_eq!(no_walk(dir, "L", "a4", false).0, Some(0));

    // A tampered anchor (its root changed, so its signature fails): not this log's.
    let a4 = std::fs::read_to_string(dir.join("a4")).expect("a4");
    let mut lines: Vec<&str> = a4.lines().collect();
    let swap = if lines[2].starts_with("AA") {
        "BB"
    } else {
        "AA"
    };
    let forged_root = format!("{swap}{}", &lines[2][2..]);
    lines[2] = &forged_root;
    std::fs::write(dir.join("forged"), lines.join("\n") + "\n").expect("forged");
    let (code, text) = no_walk(dir, "L", "forged", false);
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("Invalid"), "{text}");

    // Usage: an export has no tree files; another ledger's anchor; no anchor at all.
    ok(dir, &["export", "--ledger", "L", "--out", "L.export"]);
    let o = tally(
        dir,
        &[
            "verify",
            "L.export",
            "--key",
            "L/ledger.pub",
            "--anchor",
            "a4",
            "--no-walk",
        ],
        None,
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("not a ledger directory"));
    let o = tally(
        dir,
        &["verify", "L", "--key", "L/ledger.pub", "--no-walk"],
        None,
    );
    assert_eq!(o.status.code(), Some(2));
    ok(
        dir,
        &["init", "--ledger", "M", "--recipient", "auditor.pub"],
    );
    let (code, text) = no_walk(dir, "M", "a4", false);
    assert_eq!(code, Some(2), "{text}");
    assert!(text.contains("give an anchor of this ledger"), "{text}");

    // The walk still checks the same anchors, entry by entry.
    let v = tally(
        dir,
        &[
            "verify",
            "L",
            "--key",
            "L/ledger.pub",
            "--anchor",
            "a4",
            "--anchor",
            "a9",
        ],
        None,
    );
    assert_eq!(v.status.code(), Some(0));
    let v = tally(
        dir,
        &[
            "verify",
            "L.fork",
            "--key",
            "L.fork/ledger.pub",
            "--anchor",
            "a9",
        ],
        None,
    );
    assert_eq!(v.status.code(), Some(1));
}

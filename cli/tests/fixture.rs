//! The files that case files start from, made with the real binary: an auditor key pair,
//! a ledger with the README's four decisions, an anchor, an export and a tampered copy.

use std::path::{Path, PathBuf};
use std::process::Command;

use tally_testkit::tmpfs::Tmpfs;
use tally_testkit::Tally;

/// The README walkthrough's decisions for run `r1`.
pub const R1: &str = r#"{"run":"r1","kind":"start","goal":"export Q3 report","budget":{"attempts":3,"spend_cents":200}}
{"run":"r1","kind":"allow","tool":"http","operation":"export.create","args":{"q":3},"effect":"non_idempotent_write","attempt":1,"reserve_cents":20}
{"run":"r1","kind":"outcome","attempt":1,"status":"unknown"}
{"run":"r1","kind":"stop","reason":"outcome_unknown_non_idempotent"}
"#;

/// The binary under test.
pub fn kit() -> Tally {
    Tally::new(env!("CARGO_BIN_EXE_tally"))
}

pub fn tally() -> Command {
    kit().command()
}

/// Run `tally args` in `dir` with `stdin`; panics unless it exits 0.
pub fn ok(dir: &Path, args: &[&str], stdin: &str) -> Vec<u8> {
    let out = kit().run(dir, args, stdin);
    assert!(
        out.status.success(),
        "tally {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// A new ledger in `dir/ledger` encrypted to `dir/auditor.pub`, holding [`R1`].
pub fn ledger(dir: &Path) {
    ok(dir, &["keygen", "--out", "auditor.key"], "");
    ok(
        dir,
        &["init", "--ledger", "ledger", "--recipient", "auditor.pub"],
        "",
    );
    ok(dir, &["append", "--ledger", "ledger"], R1);
}

/// `tests/fixture`, made anew.
pub fn build() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixture");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    ledger(&dir);
    let anchor = ok(&dir, &["checkpoint", "--ledger", "ledger"], "");
    std::fs::write(dir.join("anchor.cp"), anchor).unwrap();
    ok(
        &dir,
        &["export", "--ledger", "ledger", "--out", "ledger.tally"],
        "",
    );
    // One bit of a record's ciphertext flipped: verify must exit 1.
    let mut bytes = std::fs::read(dir.join("ledger.tally")).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 1;
    std::fs::write(dir.join("tampered.tally"), bytes).unwrap();
    std::fs::write(dir.join("r1.ndjson"), R1).unwrap();
    std::fs::write(dir.join("policy.toml"), "").unwrap();
    dir
}

/// The fixture, built once per test process for the tests that only read it.
pub fn build_once() -> PathBuf {
    static DIR: std::sync::OnceLock<tempfile::TempDir> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        ledger(d);
        ok(
            d,
            &["export", "--ledger", "ledger", "--out", "ledger.tally"],
            "",
        );
        let mut bytes = std::fs::read(d.join("ledger.tally")).unwrap();
        let at = bytes.len() / 2;
        bytes[at] ^= 1;
        std::fs::write(d.join("tampered.tally"), bytes).unwrap();
        std::fs::write(d.join("policy.toml"), "").unwrap();
        tmp
    })
    .path()
    .to_path_buf()
}

/// A tmpfs of `mib` MiB mounted on `dir` (created), unmounted on drop: a real full disk.
/// `None` where mounting needs a root this process lacks (under CI, which runs as root,
/// that fails the test instead).
pub fn mount_tmpfs(dir: &Path, mib: u64) -> Option<Tmpfs> {
    Tmpfs::mount_on(dir, mib << 20)
}

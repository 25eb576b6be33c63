//! The repository's files as git lists them, for the structure checks that read the
//! source (rules in the core, dimension names, issue numbers).

use std::path::{Path, PathBuf};
use std::process::Command;

/// The workspace's root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The files git tracks or would track (`git ls-files --cached --others
/// --exclude-standard`), matching `patterns` (all files if none), relative to [`root`].
/// Outside a git checkout (a source archive) the check cannot list them: `None`, after
/// [`tally_testkit::skip`] (a failure under `CI`, SKIPPED elsewhere).
pub fn listed(patterns: &[&str]) -> Option<Vec<String>> {
    let out = Command::new("git")
        .args(["ls-files", "--cached", "--others", "--exclude-standard"])
        .args(patterns)
        .current_dir(root())
        .output();
    match out.ok().filter(|o| o.status.success()) {
        Some(out) => Some(
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .map(str::to_owned)
                .collect(),
        ),
        None => {
            tally_testkit::skip(
                "not a git checkout: the source files cannot be listed",
                "run the structure checks in a clone",
            );
            None
        }
    }
}

/// Whether `path` is test code (tests, benches, a `tests.rs` module, fuzz targets), which
/// the structure checks of production code leave out.
pub fn is_test_code(path: &str) -> bool {
    path.contains("/tests/")
        || path.contains("/benches/")
        || path.ends_with("tests.rs")
        || path.starts_with("fuzz/")
}

/// What `check` finds in each production source file (Rust, not test code, not one
/// `leave_out` names), by [`listed`]; `None` where the files cannot be listed. At least
/// 100 files are read, so a check that reads nothing cannot pass.
pub fn found_in_production_code(
    leave_out: impl Fn(&str) -> bool,
    check: impl Fn(&str, &str) -> Vec<String>,
) -> Option<Vec<String>> {
    let root = root();
    let mut found = Vec::new();
    let mut read = 0;
    for path in listed(&["*.rs"])?.iter().map(String::as_str) {
        if is_test_code(path) || leave_out(path) {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(root.join(path)) else {
            continue;
        };
        read += 1;
        found.extend(check(path, &text));
    }
    assert!(read > 100, "only {read} source files read");
    Some(found)
}

//! The `tally` binary, tested through its real executable.
//!
//! `cmd/*.toml` are CLI cases as data, one per file: args, stdin, exit code, stdout and
//! stderr (run by trycmd). The tests beside them here cover what a case file cannot
//! state: a pipe closed early, a full disk, a store left untouched, a symlink planted at
//! an export's target.

mod append;
mod edge;
mod fixture;
mod merged;
mod prices;

#[test]
fn cases() {
    let dir = fixture::build();
    // Cases copy the fixture into a sandbox with the process umask: keep it 0700, as a
    // ledger directory must be (the binary refuses one others can enter).
    let _ = rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o077));
    let _ = dir;
    trycmd::TestCases::new()
        .default_bin_name("tally")
        .case("tests/cmd/*.toml");
}

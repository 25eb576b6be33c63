//! A skip is said where a person running `cargo test` sees it, and fails under `CI`.

use std::process::Command;

/// What the test below runs as a child: a test that cannot run here.
#[test]
#[ignore = "run by a_skip_says_skipped_and_fails_under_ci as its child"]
fn child_that_cannot_run_here() {
    tally_testkit::skip("no frobnicator here", "apt-get install frobnicator");
}

fn child(ci: bool) -> (bool, String) {
    let mut cmd = Command::new(std::env::current_exe().expect("this test binary"));
    cmd.args(["--ignored", "--exact", "child_that_cannot_run_here"])
        .env_remove("CI");
    if ci {
        cmd.env("CI", "true");
    }
    let out = cmd.output().expect("run the child test");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

#[test]
fn a_skip_says_skipped_and_fails_under_ci() {
    let (passed, text) = child(false);
    assert!(passed, "{text}");
    assert!(
        text.contains(
            "SKIPPED child_that_cannot_run_here: no frobnicator here (apt-get install frobnicator)"
        ),
        "{text}"
    );
    let (passed, text) = child(true);
    assert!(!passed, "passed under CI: {text}");
    assert!(
        text.contains("CI requires this test to run: apt-get install frobnicator"),
        "{text}"
    );
}

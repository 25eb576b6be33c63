//! The Python client (`clients/python`) against the real daemon: its pytest suite starts
//! this package's `tally-load serve` for each test.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The whole suite runs in a few seconds; this bounds a hang.
const LIMIT: Duration = Duration::from_secs(60);

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the daemon crate is in the workspace")
        .to_path_buf()
}

/// Whether `python3` runs and has pytest.
fn pytest_available() -> bool {
    Command::new("python3")
        .args(["-c", "import pytest"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

#[test]
fn python_client_against_the_real_daemon() {
    if !pytest_available() {
        if std::env::var_os("CI").is_some() {
            panic!("python3 with pytest is required in CI: `python3 -m pip install pytest`");
        }
        // Straight to the stderr handle: the test harness captures `eprintln!`.
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED python_client_against_the_real_daemon: pytest not installed (pip install pytest)"
        );
        return;
    }
    let repo = repo();
    let out = tempfile::tempfile().expect("a file for pytest's output");
    let mut child = Command::new("python3")
        .args([
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "clients/python/tests",
        ])
        .current_dir(&repo)
        .env("TALLY_LOAD", env!("CARGO_BIN_EXE_tally-load"))
        .env("PYTHONPATH", repo.join("clients/python"))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .stdin(Stdio::null())
        .stdout(out.try_clone().expect("dup"))
        .stderr(out.try_clone().expect("dup"))
        .spawn()
        .expect("spawn python3 -m pytest");
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for pytest") {
            break Some(status);
        }
        if started.elapsed() > LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let output = {
        use std::io::{Read, Seek};
        let mut out = out;
        let mut text = String::new();
        out.rewind().expect("rewind pytest's output");
        out.read_to_string(&mut text).expect("read pytest's output");
        text
    };
    match status {
        Some(s) if s.success() => println!("{output}"),
        Some(s) => panic!("the Python client's tests failed ({s}):\n{output}"),
        None => panic!(
            "the Python client's tests did not finish within {} s:\n{output}",
            LIMIT.as_secs()
        ),
    }
}

//! The clients people install, against the real daemon: the Python client
//! (`clients/python`) and the Node client (`clients/node`) run their own suites, each
//! test starting `tally-load serve` (the tally-load package's, built by cargo); and each installs the way its
//! README says (`pip install`, `npm install`) into a throwaway environment.
//!
//! A missing interpreter skips a test, loudly; with env `CI` set it fails instead.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use tally_testkit::skip;

use crate::common::tally_load;

/// A whole suite runs in a few seconds; this bounds a hang.
const LIMIT: Duration = Duration::from_secs(60);

/// An install (venv, pip, npm pack and install) runs in a few seconds; this bounds a hang.
const INSTALL_LIMIT: Duration = Duration::from_secs(120);

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the daemon crate is in the workspace")
        .to_path_buf()
}

/// Whether `program args...` runs and exits 0 (its output discarded).
fn succeeds(program: impl AsRef<std::ffi::OsStr>, args: &[&str]) -> bool {
    Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Run `cmd` to its end, killed after `limit`: its exit (None: it was killed) and its
/// stdout and stderr together.
fn run_bounded(mut cmd: Command, limit: Duration) -> (Option<ExitStatus>, String) {
    let what = format!("{cmd:?}");
    let out = tempfile::tempfile().expect("a file for the output");
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(out.try_clone().expect("dup"))
        .stderr(out.try_clone().expect("dup"))
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {what}: {e}"));
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for the child") {
            break Some(status);
        }
        if started.elapsed() > limit {
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
        out.rewind().expect("rewind the output");
        out.read_to_string(&mut text).expect("read the output");
        text
    };
    (status, output)
}

/// Run `cmd` (`what` names it) and panic unless it exits 0 within `limit`; its output.
fn run_ok(cmd: Command, limit: Duration, what: &str) -> String {
    match run_bounded(cmd, limit) {
        (Some(s), output) if s.success() => output,
        (Some(s), output) => panic!("{what} failed ({s}):\n{output}"),
        (None, output) => panic!(
            "{what} did not finish within {} s:\n{output}",
            limit.as_secs()
        ),
    }
}

/// Copy the directory `from` to `to`, without build output (`build/`, `*.egg-info`,
/// `__pycache__`, `node_modules`): an install builds in the tree it is given, and the
/// repository's own tree is left as it is.
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("create the copy's directory");
    for entry in std::fs::read_dir(from).expect("read the directory to copy") {
        let entry = entry.expect("a directory entry");
        let name = entry.file_name();
        let name_str = name.to_string_lossy();
        if ["build", "__pycache__", "node_modules", ".pytest_cache"].contains(&&*name_str)
            || name_str.ends_with(".egg-info")
        {
            continue;
        }
        let kind = entry.file_type().expect("the entry's type");
        if kind.is_dir() {
            copy_tree(&entry.path(), &to.join(&name));
        } else if kind.is_file() {
            std::fs::copy(entry.path(), to.join(&name)).expect("copy a file");
        }
    }
}

#[test]
fn python_client_against_the_real_daemon() {
    if !succeeds("python3", &["-c", "import pytest"]) {
        skip(
            "python3 with pytest is not installed",
            "python3 -m pip install pytest",
        );
        return;
    }
    let repo = repo();
    let mut cmd = Command::new("python3");
    cmd.args([
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "clients/python/tests",
    ])
    .current_dir(&repo)
    .env("TALLY_LOAD", tally_load())
    .env("PYTHONPATH", repo.join("clients/python"))
    .env("PYTHONDONTWRITEBYTECODE", "1");
    println!("{}", run_ok(cmd, LIMIT, "the Python client's tests"));
}

/// What the installed package must be, checked by the venv's interpreter in isolated
/// mode (`-I`: no PYTHONPATH, no current directory on `sys.path`) from a directory that
/// holds no source: the module comes from the venv's site-packages, with its `py.typed`
/// and its metadata, and depends on nothing.
const INSTALLED: &str = r#"
import importlib.metadata as md, os, sys, sysconfig
import tally_gate
from tally_gate import AsyncGate, Gate, GateUnavailable, RequestError
here = os.path.dirname(os.path.realpath(tally_gate.__file__))
site = os.path.realpath(sysconfig.get_paths()["purelib"])
assert os.path.commonpath([here, site]) == site, f"imported {here}, not from {site}"
assert os.path.isfile(os.path.join(here, "py.typed")), f"no py.typed in {here}"
assert md.version("tally-gate") == tally_gate.__version__, md.version("tally-gate")
files = {str(f).replace(os.sep, "/") for f in (md.files("tally-gate") or [])}
assert "tally_gate/py.typed" in files, sorted(files)
assert not md.requires("tally-gate"), md.requires("tally-gate")
print(here)
"#;

/// Whether the venv's `python` can build a wheel offline: setuptools with its own
/// `bdist_wheel` (70.1 on), or an older one with the `wheel` package.
const CAN_BUILD: &str = r#"
import importlib.util as u, sys
ok = u.find_spec("setuptools") and (u.find_spec("wheel") or u.find_spec("setuptools.command.bdist_wheel"))
sys.exit(0 if ok else 1)
"#;

#[test]
fn python_client_installs_with_pip() {
    let tmp = tempfile::tempdir().expect("a temporary directory");
    let venv = tmp.path().join("venv");
    let venv_str = venv.to_str().expect("a UTF-8 temporary path");
    if !succeeds(
        "python3",
        &["-m", "venv", "--system-site-packages", venv_str],
    ) {
        skip(
            "python3 with the venv module is not installed",
            "apt-get install python3-venv",
        );
        return;
    }
    let python = venv.join("bin/python");
    if !succeeds(&python, &["-c", CAN_BUILD]) {
        // setuptools before 70.1 builds wheels only with the `wheel` package: bring it
        // into this throwaway venv (never the system's), if the package index answers.
        let mut get = Command::new(&python);
        get.args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "wheel",
        ]);
        let (status, output) = run_bounded(get, INSTALL_LIMIT);
        if !status.is_some_and(|s| s.success()) || !succeeds(&python, &["-c", CAN_BUILD]) {
            skip(
                &format!(
                    "python3's setuptools cannot build a wheel and `wheel` could not be \
                     installed into the test's venv: {}",
                    output.trim()
                ),
                "python3 -m pip install setuptools wheel",
            );
            return;
        }
    }

    // What a user runs, offline: setuptools comes from the system's site-packages.
    let source = tmp.path().join("src/python");
    copy_tree(&repo().join("clients/python"), &source);
    let mut install = Command::new(&python);
    install
        .args([
            "-m",
            "pip",
            "install",
            "--no-build-isolation",
            "--no-index",
            "--quiet",
            "--disable-pip-version-check",
        ])
        .arg(&source)
        .current_dir(tmp.path())
        .env("PYTHONDONTWRITEBYTECODE", "1");
    run_ok(install, INSTALL_LIMIT, "pip install ./clients/python");

    // The source is gone: only the installed package can answer.
    std::fs::remove_dir_all(tmp.path().join("src")).expect("remove the source copy");
    let elsewhere = tmp.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).expect("an empty working directory");
    let mut check = Command::new(&python);
    check
        .args(["-I", "-c", INSTALLED])
        .current_dir(&elsewhere)
        .env_remove("PYTHONPATH");
    let installed = run_ok(check, INSTALL_LIMIT, "importing the installed tally_gate");
    let installed = Path::new(installed.trim());
    let venv = venv.canonicalize().expect("the venv's real path");
    assert!(
        installed.starts_with(&venv),
        "tally_gate was imported from {}, not from the venv {}",
        installed.display(),
        venv.display()
    );
}

/// The major version of `node`, if it runs.
fn node_major() -> Option<u32> {
    let out = Command::new("node")
        .arg("--version")
        .stdin(Stdio::null())
        .output()
        .ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    text.trim()
        .strip_prefix('v')?
        .split('.')
        .next()?
        .parse()
        .ok()
}

/// Whether a usable `node` (18 or later: `node --test`) is there; skips (or, under CI,
/// fails) the current test if not.
fn node_usable() -> bool {
    match node_major() {
        Some(major) if major >= 18 => true,
        Some(major) => {
            skip(
                &format!("node {major} is too old (the client needs 18 or later)"),
                "install Node.js 18 or later",
            );
            false
        }
        None => {
            skip("node is not installed", "apt-get install nodejs npm");
            false
        }
    }
}

#[test]
fn node_client_against_the_real_daemon() {
    if !node_usable() {
        return;
    }
    let repo = repo();
    // The test files, named: how `node --test` searches a directory differs between
    // releases, and test/daemon.mjs is a helper, not a test.
    let mut files: Vec<PathBuf> = std::fs::read_dir(repo.join("clients/node/test"))
        .expect("read clients/node/test")
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.to_string_lossy().ends_with(".test.mjs"))
        .collect();
    files.sort();
    assert!(
        files.len() >= 4,
        "clients/node/test has only {} test files",
        files.len()
    );
    let mut cmd = Command::new("node");
    cmd.arg("--test")
        .args(&files)
        .current_dir(&repo)
        .env("TALLY_LOAD", tally_load());
    let output = run_ok(cmd, LIMIT, "the Node client's tests");
    // The runner's summary: some tests ran, none failed.
    let count = |key: &str| -> Option<u64> {
        output
            .lines()
            .find_map(|l| l.strip_prefix(&format!("# {key} "))?.trim().parse().ok())
    };
    assert!(
        count("pass").is_some_and(|n| n >= 20) && count("fail") == Some(0),
        "the Node client's tests did not all run and pass:\n{output}"
    );
    println!("{output}");
}

/// What the installed package must be, checked by `node` from the project it was
/// installed into: `tally-gate` resolves to that project's node_modules, its declared
/// types are there, and it works.
const NODE_INSTALLED: &str = r#"
import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";
import { Gate, GateUnavailable, VERSION } from "tally-gate";
const require = createRequire(path.join(process.cwd(), "index.js"));
const entry = fs.realpathSync(require.resolve("tally-gate"));
const root = fs.realpathSync(path.join(process.cwd(), "node_modules", "tally-gate"));
if (!entry.startsWith(root + path.sep)) throw new Error(`tally-gate resolved to ${entry}, not under ${root}`);
const pkg = JSON.parse(fs.readFileSync(path.join(root, "package.json"), "utf8"));
if (pkg.version !== VERSION) throw new Error(`VERSION ${VERSION}, package.json ${pkg.version}`);
for (const file of [pkg.types, pkg.exports["."].types, "README.md"]) {
  if (!fs.existsSync(path.join(root, file))) throw new Error(`${file} is not installed`);
}
if (pkg.dependencies && Object.keys(pkg.dependencies).length) throw new Error("it has dependencies");
try {
  await new Gate(path.join(process.cwd(), "no-such.sock")).startRun("r1");
  throw new Error("a missing socket started a run");
} catch (e) {
  if (!(e instanceof GateUnavailable)) throw e;
}
console.log(entry);
"#;

#[test]
fn node_client_installs_with_npm() {
    if !node_usable() {
        return;
    }
    if !succeeds("npm", &["--version"]) {
        skip("npm is not installed", "apt-get install npm");
        return;
    }
    let tmp = tempfile::tempdir().expect("a temporary directory");
    let cache = tmp.path().join("npm-cache");
    let npm = |dir: &Path| {
        let mut cmd = Command::new("npm");
        cmd.current_dir(dir).arg("--cache").arg(&cache).args([
            "--no-audit",
            "--no-fund",
            "--no-update-notifier",
        ]);
        cmd
    };

    // The package as it would be published (package.json `files`), then installed
    // offline into a project of its own.
    let mut pack = npm(tmp.path());
    pack.args(["pack", "--silent", "--pack-destination"])
        .arg(tmp.path())
        .arg(repo().join("clients/node"));
    let tarball = run_ok(pack, INSTALL_LIMIT, "npm pack clients/node");
    let tarball = tmp
        .path()
        .join(tarball.trim().lines().last().unwrap_or_default());
    assert!(tarball.is_file(), "npm pack made no {}", tarball.display());
    let project = tmp.path().join("project");
    std::fs::create_dir(&project).expect("the project's directory");
    std::fs::write(
        project.join("package.json"),
        r#"{"name": "uses-tally-gate", "private": true, "type": "module"}"#,
    )
    .expect("the project's package.json");
    let mut install = npm(&project);
    install
        .args(["install", "--offline", "--silent"])
        .arg(&tarball);
    run_ok(install, INSTALL_LIMIT, "npm install tally-gate");

    let mut check = Command::new("node");
    check
        .args(["--input-type=module", "-e", NODE_INSTALLED])
        .current_dir(&project);
    let entry = run_ok(check, INSTALL_LIMIT, "importing the installed tally-gate");
    assert!(
        entry
            .trim()
            .ends_with("node_modules/tally-gate/src/index.mjs"),
        "tally-gate resolved to {entry}"
    );
}

//! The `tally` binary under test, and running it.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Mutex;

/// The `tally` binary a test runs. `TALLY_UNDER_TEST` names another build instead (to see
/// a regression test fail on a build from before its fix).
#[derive(Debug, Clone)]
pub struct Tally {
    bin: PathBuf,
}

impl Tally {
    /// `built`, the binary cargo built for this test (the cli package's tests pass
    /// `env!("CARGO_BIN_EXE_tally")`), or `TALLY_UNDER_TEST`.
    pub fn new(built: impl Into<PathBuf>) -> Tally {
        let bin = std::env::var_os("TALLY_UNDER_TEST")
            .map(PathBuf::from)
            .unwrap_or_else(|| built.into());
        Tally { bin }
    }

    /// For another package's tests, which cannot name the cli package's binary: the
    /// workspace's `tally` ([`workspace_bin`]), or `TALLY_UNDER_TEST` (then nothing is
    /// built).
    pub fn workspace() -> Tally {
        match std::env::var_os("TALLY_UNDER_TEST") {
            Some(bin) => Tally {
                bin: PathBuf::from(bin),
            },
            None => Tally::new(workspace_bin("tally-cli", "tally")),
        }
    }

    /// The binary's path.
    pub fn path(&self) -> &Path {
        &self.bin
    }

    /// A command for the binary.
    pub fn command(&self) -> Command {
        Command::new(&self.bin)
    }

    /// `tally args` in `dir` with `stdin`: what it did.
    pub fn run(&self, dir: &Path, args: &[&str], stdin: &str) -> Output {
        let mut child = self
            .command()
            .args(args)
            .current_dir(dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", self.bin.display()));
        // A command that exits before reading its input closes the pipe: not an error here.
        let _ = child
            .stdin
            .take()
            .expect("stdin")
            .write_all(stdin.as_bytes());
        child.wait_with_output().expect("tally's output")
    }

    /// [`Tally::run`], which must exit 0: its standard output.
    pub fn ok(&self, dir: &Path, args: &[&str], stdin: &str) -> String {
        let out = self.run(dir, args, stdin);
        assert!(
            out.status.success(),
            "tally {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// A fresh ledger in `dir/ledger` encrypted to `dir/auditor.pub` (its key in
    /// `dir/auditor.key`).
    pub fn ledger(&self, dir: &Path) {
        self.ok(dir, &["keygen", "--out", "auditor.key"], "");
        self.ok(
            dir,
            &["init", "--ledger", "ledger", "--recipient", "auditor.pub"],
            "",
        );
    }

    /// [`Tally::ledger`], and `policy` in `dir/policy.toml`: what [`Tally::serve`] serves.
    pub fn init(&self, dir: &Path, policy: &str) {
        self.ledger(dir);
        std::fs::write(dir.join("policy.toml"), policy).expect("write policy.toml");
    }

    /// `tally COMMAND ledger --key ledger/ledger.pub --auditor-key auditor.key EXTRA...`
    /// in `dir` (a ledger [`Tally::ledger`] made, not held by a writer): what it did.
    pub fn audit(&self, dir: &Path, command: &str, extra: &[&str]) -> Output {
        let mut args = vec![
            command,
            "ledger",
            "--key",
            "ledger/ledger.pub",
            "--auditor-key",
            "auditor.key",
        ];
        args.extend_from_slice(extra);
        self.run(dir, &args, "")
    }

    /// [`Tally::audit`] with `--json`: how it exited, and its report (the test fails if
    /// standard output is not JSON).
    pub fn report(&self, dir: &Path, command: &str, extra: &[&str]) -> (Output, serde_json::Value) {
        let mut extra = extra.to_vec();
        extra.push("--json");
        let out = self.audit(dir, command, &extra);
        let report = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("tally {command} --json: {e}: {}", text(&out)));
        (out, report)
    }

    /// [`Tally::report`] of `tally verify`: the ledger must verify, and replay must find
    /// nothing. The report.
    pub fn verifies(&self, dir: &Path) -> serde_json::Value {
        let (out, report) = self.report(dir, "verify", &[]);
        assert!(out.status.success(), "{report}");
        assert_eq!(
            report["replay"]["findings"],
            serde_json::json!([]),
            "{report}"
        );
        report
    }

    /// The decisions of `run` in `dir`'s ledger (not held by a writer), decrypted: each
    /// `{seq, decision}`, through `tally prove --run` and `tally verify-proof
    /// --auditor-key --json`.
    pub fn decisions(&self, dir: &Path, run: &str) -> Vec<serde_json::Value> {
        let proof = format!("{run}.proof");
        self.ok(
            dir,
            &[
                "prove",
                "--ledger",
                "ledger",
                "--run",
                run,
                "--auditor-key",
                "auditor.key",
                "--out",
                &proof,
            ],
            "",
        );
        let text = self.ok(
            dir,
            &[
                "verify-proof",
                &proof,
                "--key",
                "ledger/ledger.pub",
                "--auditor-key",
                "auditor.key",
                "--json",
            ],
            "",
        );
        let v: serde_json::Value = serde_json::from_str(&text).expect("verify-proof json");
        v["decisions"].as_array().cloned().unwrap_or_default()
    }
}

/// Binary `bin` of workspace package `package`, built once per test process by `cargo
/// build -p PACKAGE --bin BIN` in this test's target directory and profile (a no-op when
/// it is up to date): how a package's tests run another package's binary, which only
/// that package's own tests can name (`CARGO_BIN_EXE_*`). Never a stale build.
pub fn workspace_bin(package: &str, bin: &str) -> PathBuf {
    static BUILT: Mutex<BTreeMap<(String, String), PathBuf>> = Mutex::new(BTreeMap::new());
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    let key = (package.to_owned(), bin.to_owned());
    if let Some(path) = built.get(&key) {
        return path.clone();
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    // target/<profile>/deps/<test>-<hash> -> target/<profile>/<bin>
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("the target directory")
        .to_path_buf();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut build = Command::new(cargo);
    build.args(["build", "--quiet", "-p", package, "--bin", bin]);
    if profile_dir.file_name().is_some_and(|n| n == "release") {
        build.arg("--release");
    }
    let status = build
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .status()
        .expect("run cargo build");
    assert!(status.success(), "building {bin} (-p {package}) failed");
    let path = profile_dir.join(bin);
    built.insert(key, path.clone());
    path
}

/// Standard output and standard error of `out`, as text.
pub fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

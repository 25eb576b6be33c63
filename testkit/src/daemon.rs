//! `tally serve` as a fixture: the real binary on real Unix sockets in a test's directory.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::tally::Tally;

/// How long a daemon may take to listen, or to stop after SIGTERM.
const PATIENCE: Duration = Duration::from_secs(30);

/// The daemon as the [`Tally`] binary starts it.
impl Tally {
    /// `tally serve` in `dir` (see [`Daemon::start`]).
    pub fn serve(&self, dir: &Path, extra: &[&str]) -> Daemon {
        Daemon::start(self, dir, extra)
    }
}

/// `tally serve` over `DIR/ledger` under `DIR/policy.toml` (what [`Tally::init`] makes), on
/// the agent socket `DIR/agent.sock` and the operator socket `DIR/operator.sock`, its
/// standard error in `DIR/serve.log` and its standard output in `DIR/serve.out`. Killed (SIGKILL) if still running when dropped.
#[derive(Debug)]
pub struct Daemon {
    tally: Tally,
    dir: PathBuf,
    extra: Vec<OsString>,
    child: Option<Child>,
}

impl Daemon {
    /// Start `tally serve` in `dir` with `extra` flags after the usual ones; returns once
    /// both sockets accept connections.
    pub fn start(tally: &Tally, dir: &Path, extra: &[&str]) -> Daemon {
        let mut daemon = Daemon {
            tally: tally.clone(),
            dir: dir.to_path_buf(),
            extra: extra.iter().map(OsString::from).collect(),
            child: None,
        };
        daemon.restart();
        daemon
    }

    /// Start it again (after [`Daemon::stop`] or [`Daemon::kill_9`]) with the same flags.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "the daemon is still running");
        let _ = std::fs::remove_file(self.agent_socket());
        let _ = std::fs::remove_file(self.operator_socket());
        let log = std::fs::File::create(self.dir.join("serve.log")).expect("serve.log");
        let out = std::fs::File::create(self.dir.join("serve.out")).expect("serve.out");
        let child = self
            .tally
            .command()
            .args([
                "serve",
                "--ledger",
                "ledger",
                "--socket",
                "agent.sock",
                "--operator-socket",
                "operator.sock",
                "--policy",
                "policy.toml",
            ])
            .args(&self.extra)
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(log)
            .spawn()
            .expect("spawn tally serve");
        self.child = Some(child);
        self.wait_listening(&[self.agent_socket(), self.operator_socket()]);
    }

    /// Wait until every one of `sockets` accepts connections (or the daemon exits, or
    /// [`PATIENCE`] runs out: the test fails with its log).
    fn wait_listening(&mut self, sockets: &[PathBuf]) {
        let started = Instant::now();
        while !sockets.iter().all(|s| listens(s)) {
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().ok()?) {
                panic!("tally serve exited ({status}): {}", self.log());
            }
            assert!(
                started.elapsed() < PATIENCE,
                "tally serve did not listen on {sockets:?} within {PATIENCE:?}: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Wait until `name` in its directory (a socket its flags added, such as the
    /// proxy's) accepts connections.
    pub fn wait_for_socket(&mut self, name: &str) {
        self.wait_listening(&[self.path(name)]);
    }

    /// The directory it runs in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `name` in its directory.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// The agent socket (the gate).
    pub fn agent_socket(&self) -> PathBuf {
        self.dir.join("agent.sock")
    }

    /// The operator socket.
    pub fn operator_socket(&self) -> PathBuf {
        self.dir.join("operator.sock")
    }

    /// What it wrote on its standard error so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("serve.log")).unwrap_or_default()
    }

    /// What it wrote on its standard output so far.
    pub fn out(&self) -> String {
        std::fs::read_to_string(self.dir.join("serve.out")).unwrap_or_default()
    }

    /// Its process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// One request on the agent socket: the status and the body as JSON (`Null` if it
    /// is not JSON).
    pub fn agent(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        json(request(&self.agent_socket(), method, path, body.as_ref()))
    }

    /// One request on the operator socket, as [`Daemon::agent`].
    pub fn operator(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        json(request(
            &self.operator_socket(),
            method,
            path,
            body.as_ref(),
        ))
    }

    /// One `read` of tool `search` by `run` on the agent socket, with arguments no
    /// earlier call had (no loop rule fires): the decision and its reason (`""` for an
    /// allow).
    pub fn check_read(&self, run: &str) -> (String, String) {
        use std::sync::atomic::{AtomicU64, Ordering};
        static N: AtomicU64 = AtomicU64::new(0);
        let q = N.fetch_add(1, Ordering::Relaxed);
        let (status, v) = self.agent(
            "POST",
            "/v1/check",
            Some(serde_json::json!({"run": run, "tool": "search", "effect": "read", "args": {"q": q}})),
        );
        assert_eq!(status, 200, "{v}");
        (
            v["decision"].as_str().unwrap_or("?").to_owned(),
            v["reason"].as_str().unwrap_or("").to_owned(),
        )
    }

    /// Stop it cleanly (SIGTERM) and wait for it to exit (SIGKILL after 30 s): how it
    /// exited, if it was running.
    pub fn stop(&mut self) -> Option<ExitStatus> {
        let mut child = self.child.take()?;
        signal(&child, rustix::process::Signal::TERM);
        let started = Instant::now();
        loop {
            if let Some(status) = child.try_wait().expect("wait") {
                return Some(status);
            }
            if started.elapsed() > PATIENCE {
                let _ = child.kill();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Kill it (SIGKILL: no drain, no shutdown) and reap it.
    pub fn kill_9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill_9();
    }
}

fn signal(child: &Child, signal: rustix::process::Signal) {
    let _ = rustix::process::kill_process(rustix::process::Pid::from_child(child), signal);
}

/// Whether something accepts connections on `socket`.
fn listens(socket: &Path) -> bool {
    std::os::unix::net::UnixStream::connect(socket).is_ok()
}

fn json((status, body): (u16, Vec<u8>)) -> (u16, Value) {
    (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

/// One request on a daemon's socket with the daemon's client (`tally_api::client`): the
/// status and the body. `body`, if any, is sent as `application/json`.
pub fn request(socket: &Path, method: &str, path: &str, body: Option<&Value>) -> (u16, Vec<u8>) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let mut client = tally_api::client::Client::unix(socket)
            .await
            .unwrap_or_else(|e| panic!("connect to {}: {e}", socket.display()));
        let reply = client
            .request(
                method.parse().expect("an HTTP method"),
                path,
                body.map(|_| "application/json"),
                body.map(Value::to_string).unwrap_or_default(),
            )
            .await
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        (reply.status.as_u16(), reply.body.to_vec())
    })
}

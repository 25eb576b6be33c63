//! The harness: a real daemon on a temporary Unix socket over a temporary ledger, and a
//! chain walk that checks what ended up in the store.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::http::Method;
use tally_api::client::{Client, Reply};
use tally_daemon::{DaemonError, ServeOptions};
use tally_ledger::format::Frame;
use tally_ledger::keys::{verify_checkpoint, DataKey};
use tally_ledger::{
    AuditorKey, Checkpoint, Decision, Entry, EntryType, Hash, Ledger, Receipt, Rotation,
};
use tempfile::TempDir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// `tally-load` (the `tally-load` package's binary: `tally-load serve` runs the daemon in a
/// child process), built by cargo for these tests.
pub fn tally_load() -> PathBuf {
    tally_testkit::tally::workspace_bin("tally-load", "tally-load")
}

/// A running daemon over a fresh ledger.
pub struct Daemon {
    pub dir: TempDir,
    pub ledger_dir: PathBuf,
    /// The operator socket: raw decisions, export, pause, approvals.
    pub socket: PathBuf,
    /// The agent socket: the gate.
    pub agent_socket: PathBuf,
    pub auditor: AuditorKey,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), DaemonError>>>,
}

/// A new ledger in a new temporary directory.
pub fn new_ledger(rotation: Rotation) -> (TempDir, PathBuf, AuditorKey) {
    new_ledger_in(&std::env::temp_dir(), rotation)
}

/// A new ledger in a new temporary directory under `parent`.
pub fn new_ledger_in(parent: &Path, rotation: Rotation) -> (TempDir, PathBuf, AuditorKey) {
    let dir = tempfile::tempdir_in(parent).expect("tempdir");
    let ledger_dir = dir.path().join("ledger");
    let auditor = AuditorKey::generate();
    Ledger::init(&ledger_dir, &auditor.public(), rotation).expect("init ledger");
    (dir, ledger_dir, auditor)
}

impl Daemon {
    /// Start a daemon on a new ledger; `configure` adjusts the options.
    pub async fn start(configure: impl FnOnce(&mut ServeOptions)) -> Daemon {
        Daemon::start_with(Rotation::default(), configure).await
    }

    /// Start a daemon on a new ledger with the given rotation settings.
    pub async fn start_with(
        rotation: Rotation,
        configure: impl FnOnce(&mut ServeOptions),
    ) -> Daemon {
        Daemon::start_in(&std::env::temp_dir(), rotation, configure).await
    }

    /// Start a daemon on a new ledger in a new directory under `parent` (its sockets
    /// beside the ledger).
    pub async fn start_in(
        parent: &Path,
        rotation: Rotation,
        configure: impl FnOnce(&mut ServeOptions),
    ) -> Daemon {
        let (dir, ledger_dir, auditor) = new_ledger_in(parent, rotation);
        let socket = dir.path().join("tally.sock");
        let agent_socket = dir.path().join("agent.sock");
        let mut daemon = Daemon {
            dir,
            ledger_dir,
            socket,
            agent_socket,
            auditor,
            stop: None,
            task: None,
        };
        daemon.restart(configure).await;
        daemon
    }

    /// Options for this daemon's ledger and socket.
    pub fn options(&self) -> ServeOptions {
        let mut o = ServeOptions::new(&self.ledger_dir, &self.agent_socket);
        o.operator_socket = Some(self.socket.clone());
        o
    }

    /// (Re)open the ledger and serve it.
    pub async fn restart(&mut self, configure: impl FnOnce(&mut ServeOptions)) {
        let ledger = Arc::new(open_ledger(&self.ledger_dir));
        self.serve(ledger, configure).await;
    }

    /// Start a daemon on a new ledger opened on `clock` (its commit pipeline's times);
    /// the ledger too, as the daemon holds it.
    pub async fn start_on_clock(
        clock: Arc<dyn tally_ledger::clock::Clock>,
        configure: impl FnOnce(&mut ServeOptions),
    ) -> (Daemon, Arc<Ledger>) {
        let (dir, ledger_dir, auditor) = new_ledger(Rotation::default());
        let ledger = Arc::new(Ledger::open_with_clock(&ledger_dir, clock).expect("open"));
        let mut daemon = Daemon {
            socket: dir.path().join("tally.sock"),
            agent_socket: dir.path().join("agent.sock"),
            dir,
            ledger_dir,
            auditor,
            stop: None,
            task: None,
        };
        daemon.serve(Arc::clone(&ledger), configure).await;
        (daemon, ledger)
    }

    /// Serve `ledger`, the options adjusted by `configure`.
    async fn serve(&mut self, ledger: Arc<Ledger>, configure: impl FnOnce(&mut ServeOptions)) {
        let mut options = self.options();
        configure(&mut options);
        let (stop, stopped) = oneshot::channel::<()>();
        self.stop = Some(stop);
        self.task = Some(tokio::spawn(tally_daemon::serve(ledger, options, async {
            let _ = stopped.await;
        })));
        wait_for_socket(&self.socket).await;
        wait_for_socket(&self.agent_socket).await;
    }

    /// A new connection to the operator socket.
    pub async fn client(&self) -> Client {
        Client::unix(&self.socket).await.expect("connect")
    }

    /// A new connection to the agent socket.
    pub async fn agent(&self) -> Client {
        Client::unix(&self.agent_socket).await.expect("connect")
    }

    /// Signal shutdown and wait for the daemon to drain and return.
    pub async fn shutdown(&mut self) -> Result<(), DaemonError> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let task = self.task.take().expect("daemon running");
        tokio::time::timeout(Duration::from_secs(20), task)
            .await
            .expect("daemon drains within 20 s")
            .expect("serve task")
    }

    /// Signal shutdown without waiting.
    pub fn signal_shutdown(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }

    /// Wait for a signalled daemon to return.
    pub async fn wait(&mut self) -> Result<(), DaemonError> {
        let task = self.task.take().expect("daemon running");
        tokio::time::timeout(Duration::from_secs(20), task)
            .await
            .expect("daemon drains within 20 s")
            .expect("serve task")
    }
}

/// Open a ledger. sled lets go of its lock a moment after the last handle drops, and the
/// ledger retries for only a second; on a loaded 2-core machine allow longer.
pub fn open_ledger(dir: &Path) -> Ledger {
    for _ in 0..20 {
        match Ledger::open(dir) {
            Ok(l) => return l,
            Err(tally_ledger::Error::Busy(_)) => std::thread::sleep(Duration::from_millis(100)),
            Err(e) => panic!("open {}: {e}", dir.display()),
        }
    }
    panic!(
        "{} stays locked: the daemon did not release the ledger",
        dir.display()
    );
}

/// Wait until something accepts connections on `socket`.
pub async fn wait_for_socket(socket: &Path) {
    for _ in 0..500 {
        if UnixStream::connect(socket).await.is_ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("nothing listens on {}", socket.display());
}

/// An `allow` decision marked with its writer and position, so the walk can find it.
pub fn allow(run: &str, worker: &str, at_ms: u64) -> String {
    format!(
        r#"{{"run":"{run}","kind":"allow","worker":"{worker}","at_ms":{at_ms},"tool":"http.get","args":{{"q":{at_ms}}},"reserve_cents":2}}"#
    )
}

/// GET a path and return the reply.
pub async fn get(client: &mut Client, path: &str) -> Reply {
    client
        .request(Method::GET, path, None, bytes::Bytes::new())
        .await
        .expect("GET")
}

/// The latest checkpoint as the daemon serves it.
pub async fn checkpoint_text(client: &mut Client) -> String {
    let reply = get(client, "/v1/checkpoint").await;
    assert_eq!(reply.status, 200);
    String::from_utf8(reply.body.to_vec()).expect("utf8")
}

/// Send raw bytes on a new connection and read what comes back until the daemon closes
/// the connection or `wait` passes.
pub async fn raw(socket: &Path, request: &[u8], wait: Duration) -> (String, bool) {
    let mut stream = UnixStream::connect(socket).await.expect("connect");
    stream.write_all(request).await.expect("write");
    read_until_closed(&mut stream, wait).await
}

/// Read until EOF (true) or `wait` passes (false).
pub async fn read_until_closed(stream: &mut UnixStream, wait: Duration) -> (String, bool) {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Err(_) => return (String::from_utf8_lossy(&out).into_owned(), false),
            Ok(Ok(0)) | Ok(Err(_)) => return (String::from_utf8_lossy(&out).into_owned(), true),
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
        }
    }
}

/// One decision entry found by the walk.
pub struct Walked {
    pub hash: Hash,
    pub decision: Option<Decision>,
}

/// What the store holds, checked link by link.
pub struct Chain {
    /// Entries by seq (index = seq).
    pub entries: Vec<Walked>,
    /// The last checkpoint.
    pub checkpoint: Checkpoint,
}

impl Chain {
    /// Every acknowledged receipt is in the chain with the same hash.
    pub fn assert_holds(&self, receipts: &[Receipt]) {
        for r in receipts {
            let entry = self.entries.get(r.seq as usize).unwrap_or_else(|| {
                panic!(
                    "acknowledged seq {} is missing (chain has {})",
                    r.seq,
                    self.entries.len()
                )
            });
            assert_eq!(
                entry.hash, r.hash,
                "seq {} hash differs from its receipt",
                r.seq
            );
        }
    }
}

/// Reopen the ledger (the daemon must have released it) and walk its chain: seqs from 0
/// with no gap, each entry linked to the previous hash, decisions decrypted with the
/// auditor key, checkpoints signed by their epoch's key, the last one sealing the head.
pub fn walk(ledger_dir: &Path, auditor: &AuditorKey) -> Chain {
    let ledger = open_ledger(ledger_dir);
    let id = ledger.id();
    let mut entries: Vec<Walked> = Vec::new();
    let mut prev = Hash::default();
    let mut data_key: Option<DataKey> = None;
    let mut keys: Vec<[u8; 32]> = Vec::new();
    let mut last_checkpoint = None;
    for frame in ledger.snapshot() {
        match frame.expect("frame") {
            Frame::Entry(bytes) => {
                let entry = Entry::decode(&bytes).expect("entry decodes");
                let seq = entries.len() as u64;
                assert_eq!(entry.header.seq, seq, "gap or reorder at seq {seq}");
                assert_eq!(entry.header.prev_hash, prev, "broken link at seq {seq}");
                assert_eq!(entry.header.ledger_id, id);
                let decision = match entry.header.entry_type {
                    EntryType::Genesis => {
                        let g = entry.genesis().expect("genesis body");
                        keys.push(g.verifying_key);
                        data_key =
                            Some(auditor.epoch_key(&g.ephemeral, id, 0).expect("epoch 0 key"));
                        None
                    }
                    EntryType::Epoch => {
                        let e = entry.epoch_cert().expect("epoch body");
                        keys.push(e.verifying_key);
                        data_key = Some(
                            auditor
                                .epoch_key(&e.ephemeral, id, entry.header.epoch)
                                .expect("epoch key"),
                        );
                        None
                    }
                    _ => {
                        let key = data_key.as_ref().expect("a key before decisions");
                        let plain = key
                            .open(&entry.header.nonce, entry.header_bytes(), entry.body())
                            .unwrap_or_else(|e| panic!("seq {seq} does not decrypt: {e}"));
                        Some(Decision::from_stored(&plain).expect("stored decision is canonical"))
                    }
                };
                prev = entry.hash();
                entries.push(Walked {
                    hash: prev,
                    decision,
                });
            }
            Frame::Checkpoint(text) => {
                let cp = Checkpoint::from_text(&text).expect("checkpoint parses");
                let key = keys
                    .get(cp.epoch as usize)
                    .expect("checkpoint of a known epoch");
                verify_checkpoint(&cp, key).expect("checkpoint signature");
                assert_eq!(
                    cp.size,
                    entries.len() as u64,
                    "checkpoint does not follow the entry it seals"
                );
                assert_eq!(cp.head, prev, "checkpoint head is not the entry it seals");
                last_checkpoint = Some(cp);
            }
            // Cosignatures are judged by the verifier; this walk checks the chain.
            Frame::Cosigned(_) => {}
        }
    }
    let checkpoint = last_checkpoint.expect("at least one checkpoint");
    assert_eq!(checkpoint.size, entries.len() as u64, "unsealed tail");
    Chain {
        entries,
        checkpoint,
    }
}

/// A loopback address with a port that was free a moment ago.
pub fn free_loopback_addr() -> std::net::SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("free port")
        .local_addr()
        .expect("addr")
}

/// POST a JSON body; the status and the JSON reply.
pub async fn post_json(client: &mut Client, path: &str, body: &str) -> (u16, serde_json::Value) {
    let reply = client
        .request(
            axum::http::Method::POST,
            path,
            Some("application/json"),
            body.to_owned(),
        )
        .await
        .expect("request");
    let value = serde_json::from_slice(&reply.body).unwrap_or(serde_json::Value::Null);
    (reply.status.as_u16(), value)
}

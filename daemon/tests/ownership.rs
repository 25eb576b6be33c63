//! Agents reach only the socket: a client running as another user appends through it but
//! cannot open, change or delete the store. Needs root (to switch users) and `runuser`
//! and `curl`; without them it says SKIPPED (and fails under `CI`).

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};

use tally_ledger::Receipt;

use crate::common::{post_json, walk, Daemon};

const NOBODY: &str = "nobody";

fn as_nobody(args: &[&str]) -> Output {
    Command::new("runuser")
        .args(["-u", NOBODY, "--"])
        .args(args)
        .output()
        .expect("runuser")
}

fn available(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

fn nobody_gid() -> Option<u32> {
    let out = Command::new("id").args(["-g", NOBODY]).output().ok()?;
    String::from_utf8(out.stdout).ok()?.trim().parse().ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_uid_appends_through_the_socket_but_cannot_touch_the_store() {
    if !tally_testkit::root(&format!("to run a client as `{NOBODY}`")) {
        return;
    }
    let Some(gid) = nobody_gid() else {
        tally_testkit::skip(&format!("no `{NOBODY}` user"), &format!("useradd {NOBODY}"));
        return;
    };
    for (tool, package) in [("runuser", "util-linux"), ("curl", "curl")] {
        if !available(tool) {
            tally_testkit::skip(
                &format!("`{tool}` is not installed"),
                &format!("apt-get install {package}"),
            );
            return;
        }
    }
    let mut daemon = Daemon::start(move |o| o.socket_gid = Some(gid)).await;
    // Only the ledger directory's own 0700 protects the store: its parent is open.
    std::fs::set_permissions(daemon.dir.path(), std::fs::Permissions::from_mode(0o755))
        .expect("chmod parent");
    let ledger = daemon.ledger_dir.clone();
    assert_eq!(
        std::fs::metadata(&ledger)
            .expect("ledger")
            .permissions()
            .mode()
            & 0o777,
        0o700
    );

    let agent = daemon.agent_socket.to_string_lossy().into_owned();
    let curl = |method: &str, path: &str, body: &str| {
        let url = format!("http://localhost{path}");
        let out = as_nobody(&[
            "curl",
            "-sS",
            "--unix-socket",
            &agent,
            "-X",
            method,
            "-H",
            "content-type: application/json",
            "-d",
            body,
            "-w",
            "\n%{http_code}",
            &url,
        ]);
        assert!(
            out.status.success(),
            "curl as nobody: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n').expect("status line");
        (code.trim().parse::<u16>().expect("status"), body.to_owned())
    };
    // Another uid reaches the gate through the agent socket...
    let (status, body) = curl(
        "POST",
        "/v1/runs",
        r#"{"run":"from-nobody","goal":"prove the socket is the only way in"}"#,
    );
    assert_eq!(status, 201, "{body}");
    let started: serde_json::Value = serde_json::from_str(&body).expect("json");
    let receipts = vec![Receipt {
        seq: started["seq"].as_u64().expect("seq"),
        hash: tally_ledger::Hash(hex_hash(started["hash"].as_str().expect("hash"))),
    }];
    // ...but cannot append decisions of its own (SECURITY.md 5.7), not even for its own run...
    let (status, body) = curl(
        "POST",
        "/v1/decisions",
        r#"{"run":"from-nobody","kind":"allow","tool":"t","attempt":1}"#,
    );
    assert_eq!(status, 403, "{body}");
    // ...nor read or stop a run another uid started.
    let mut root = daemon.agent().await;
    let (status, _) = post_json(&mut root, "/v1/runs", r#"{"run":"root-run"}"#).await;
    assert_eq!(status, 201);
    let (status, body) = curl("GET", "/v1/runs/root-run", "");
    assert_eq!(status, 403, "{body}");
    let (status, body) = curl("POST", "/v1/runs/root-run/stop", "{}");
    assert_eq!(status, 403, "{body}");
    let (status, body) = curl(
        "POST",
        "/v1/check",
        r#"{"run":"root-run","tool":"t","effect":"read"}"#,
    );
    assert_eq!(status, 403, "{body}");
    // The operator socket is the daemon user's alone.
    let op = daemon.socket.to_string_lossy().into_owned();
    let out = as_nobody(&[
        "curl",
        "-sS",
        "--unix-socket",
        &op,
        "http://localhost/v1/runs",
    ]);
    assert!(!out.status.success(), "nobody reached the operator socket");
    drop(root);

    let store = ledger.join("log");
    let db = store.join("00000000000000000000.seg");
    let key = ledger.join("writer.key");
    let (l, s, d, k) = (p(&ledger), p(&store), p(&db), p(&key));
    let append = format!("echo x >> {d}");
    let attempts: [(&str, Vec<&str>); 6] = [
        ("list the ledger", vec!["ls", l.as_str()]),
        ("read the store", vec!["cat", d.as_str()]),
        ("read the writer key", vec!["cat", k.as_str()]),
        ("append to the store", vec!["sh", "-c", append.as_str()]),
        ("delete the store", vec!["rm", "-rf", s.as_str()]),
        (
            "rename the ledger",
            vec!["mv", l.as_str(), "/tmp/stolen-ledger"],
        ),
    ];
    for (what, args) in &attempts {
        let out = as_nobody(args);
        assert!(!out.status.success(), "nobody could {what}");
    }
    assert!(db.is_file() && key.is_file(), "the store is intact");
    daemon.shutdown().await.expect("clean shutdown");
    let chain = walk(&daemon.ledger_dir, &daemon.auditor);
    // Genesis, the policy, nobody's start and root's start: nothing else.
    assert_eq!(chain.entries.len(), 4);
    chain.assert_holds(&receipts);
}

fn p(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

fn hex_hash(s: &str) -> [u8; 32] {
    let mut out = [0u8; 32];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("hex");
    }
    out
}

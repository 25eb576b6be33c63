//! Notifications (`serve --notify`; docs/APPROVALS.md, "Notifications") against the real
//! daemon: a receiver on loopback gets each new request, its answer and an expiry, each
//! signed with HMAC-SHA256 that this test checks on its own (with the hmac crate), and a
//! dead receiver neither holds a decision nor goes uncounted.

use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::http::HeaderMap;
use hmac::{Hmac, KeyInit, Mac};
use serde_json::{json, Value};
use tally_daemon::ServeOptions;
use tally_ledger::clock::{Clock, ManualClock};
use tally_policy::Recorded;
use tokio::sync::mpsc;

use crate::common::{free_loopback_addr, get, post_json, Daemon};

const SECRET: &str = "0123456789abcdef0123456789abcdef-notify";

/// What a receiver got: the signature header and the body's bytes.
type Got = (String, Bytes);

/// A receiver on loopback: its URL and what it gets.
async fn receiver() -> (String, mpsc::UnboundedReceiver<Got>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |headers: HeaderMap, body: Bytes| {
            let tx = tx.clone();
            async move {
                let sig = headers
                    .get(tally_daemon::NOTIFY_SIGNATURE_HEADER)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_owned();
                let _ = tx.send((sig, body));
                "ok"
            }
        }),
    );
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (format!("http://{addr}/hook"), rx)
}

/// Verify `header` (`t=..,v1=..`) over `body` with `secret`, independently of the daemon.
fn verifies(secret: &[u8], header: &str, body: &[u8]) -> bool {
    let mut t = None;
    let mut v1 = None;
    for part in header.split(',') {
        match part.split_once('=') {
            Some(("t", x)) => t = Some(x),
            Some(("v1", x)) => v1 = Some(x),
            _ => {}
        }
    }
    let (Some(t), Some(v1)) = (t, v1) else {
        return false;
    };
    let Ok(tag) = (0..v1.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(v1.get(i..i + 2).unwrap_or("zz"), 16))
        .collect::<Result<Vec<u8>, _>>()
    else {
        return false;
    };
    let mut mac = Hmac::<sha2_next::Sha256>::new_from_slice(secret).expect("key");
    mac.update(t.as_bytes());
    mac.update(b".");
    mac.update(body);
    mac.verify_slice(&tag).is_ok()
}

/// The next event, its signature checked (and a tampered copy refused).
async fn next(rx: &mut mpsc::UnboundedReceiver<Got>) -> Value {
    let (sig, body) = tokio::time::timeout(Duration::from_secs(30), rx.recv())
        .await
        .expect("an event within 30 s")
        .expect("the receiver is up");
    assert!(verifies(SECRET.as_bytes(), &sig, &body), "{sig}");
    let mut tampered = body.to_vec();
    let at = tampered.len() / 2;
    tampered[at] ^= 1;
    assert!(!verifies(SECRET.as_bytes(), &sig, &tampered));
    assert!(!verifies(
        b"another secret of thirty-two bytes",
        &sig,
        &body
    ));
    serde_json::from_slice(&body).expect("json")
}

fn secret_file(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("notify.secret");
    std::fs::write(&path, format!("{SECRET}\n")).expect("write");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("mode");
    path
}

/// `receivers` notified, retried quickly (`base`), looked at every 20 ms.
fn notifying(o: &mut ServeOptions, receivers: Vec<String>, secret: &std::path::Path, base: u64) {
    o.notify.receivers = receivers;
    o.notify.secret_file = Some(secret.to_path_buf());
    o.notify.retry_base = Duration::from_millis(base);
    o.notify.retry_cap = Duration::from_millis(base * 4);
    o.notify.attempts = 3;
    o.notify.queue = 4;
    o.notify.poll = Duration::from_millis(20);
}

async fn agent_post(d: &Daemon, path: &str, body: Value) -> Value {
    let mut c = d.agent().await;
    let (s, b) = post_json(&mut c, path, &body.to_string()).await;
    assert!(s == 200 || s == 201, "{s} {b}");
    b
}

/// Run `run` with one attempt and a one-minute deadline, its attempt used; then `asks`
/// calls each refused `require_approval`.
async fn ask(d: &Daemon, run: &str, asks: usize) {
    agent_post(
        d,
        "/v1/runs",
        json!({"run": run, "goal": "g",
        "budget": {"attempts": 1, "deadline_ms": 60_000}}),
    )
    .await;
    let first = json!({"run": run, "tool": "search", "operation": "q", "effect": "read"});
    assert_eq!(agent_post(d, "/v1/check", first).await["decision"], "allow");
    for i in 0..asks {
        let call = json!({"run": run, "worker": "w2", "tool": "email.send",
            "operation": format!("send:{i}"), "effect": "non_idempotent_write",
            "target": "smtp", "args_preview": "\u{1b}[31m<!channel>\u{202e} to x@example.com"});
        let a = agent_post(d, "/v1/check", call).await;
        assert_eq!(a["decision"], "require_approval", "{a}");
    }
}

/// The value of the series `name` in the daemon's `/metrics` (0 when absent).
async fn metric(d: &Daemon, name: &str) -> f64 {
    let mut c = d.client().await;
    let text = String::from_utf8(get(&mut c, "/metrics").await.body.to_vec()).expect("utf8");
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(' ')))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

/// Wait (bounded) until `name` is at least `want`.
async fn metric_reaches(d: &Daemon, name: &str, want: f64) -> f64 {
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let v = metric(d, name).await;
        if v >= want || Instant::now() > until {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `dana`'s answer to the request `id` of `run`: its cost, signed with the id.
fn approval(key: &tally_ledger::keys::ApproverKey, run: &str, id: &str, scope: Value) -> Value {
    let s: tally_ledger::decision::Scope = serde_json::from_value(scope.clone()).expect("scope");
    let expires_ms = 3_600_000;
    let digest = tally_policy::approval::answer_digest(run, "dana", &s, expires_ms, Some(id));
    let signature = tally_policy::approval::sign(key.signing_key(), &digest);
    json!({"run": run, "approver": "dana", "scope": scope, "expires_ms": expires_ms,
           "request": id, "digest": digest, "signature": signature, "note": "ok <!here>"})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_its_answer_and_an_expiry_reach_the_receiver_signed() {
    let dana = tally_ledger::keys::ApproverKey::generate();
    let policy = format!("[approvals.approvers]\ndana = \"{}\"\n", dana.public_hex());
    let recorded = Recorded::new(&policy).expect("policy");
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    let dir = tempfile::tempdir().expect("dir");
    let secret = secret_file(dir.path());
    let (url, mut got) = receiver().await;
    let dead = format!("http://{}/hook", free_loopback_addr());
    let c = Arc::clone(&clock) as Arc<dyn Clock>;
    let mut d = Daemon::start(move |o| {
        o.policy = recorded;
        o.clock = c;
        notifying(o, vec![url, dead], &secret, 5);
    })
    .await;
    ask(&d, "r", 1).await;
    let asked = next(&mut got).await;
    assert_eq!(asked["event"], "requested", "{asked}");
    let id = asked["request"]["id"].as_str().expect("id").to_owned();
    assert_eq!(asked["request"]["state"], "pending");
    assert_eq!(asked["request"]["run"], "r");
    assert_eq!(asked["at_ms"], 1_700_000_000_000u64);
    let text = asked["text"].as_str().expect("text");
    assert!(text.contains(&format!("`tally approve {id}`")), "{text}");
    assert!(
        text.contains("email.send send:0 (non_idempotent_write) to smtp"),
        "{text}"
    );
    assert!(text.contains("&lt;!channel&gt; to x@example.com"), "{text}");
    assert!(
        !text.contains('\u{1b}') && !text.contains('\u{202e}'),
        "{text}"
    );
    assert!(text.contains("granting costs 1 attempt"), "{text}");
    // The answer: the operator socket's approval of exactly that request's cost.
    let mut op = d.client().await;
    let scope = asked["request"]["cost"].clone();
    let (s, b) = post_json(
        &mut op,
        "/v1/approvals",
        &approval(&dana, "r", &id, scope).to_string(),
    )
    .await;
    assert_eq!(s, 200, "{b}");
    let answered = next(&mut got).await;
    assert_eq!(answered["event"], "answered", "{answered}");
    assert_eq!(answered["request"]["id"], id.as_str());
    assert_eq!(answered["request"]["state"], "approved");
    assert_eq!(answered["request"]["answered_by"], "dana");
    assert!(answered["text"]
        .as_str()
        .expect("text")
        .contains("by dana: ok &lt;!here&gt;"));
    // Another run's request, unanswered past its deadline: expired.
    ask(&d, "late", 1).await;
    let late = next(&mut got).await;
    assert_eq!(
        (late["event"].as_str(), late["request"]["run"].as_str()),
        (Some("requested"), Some("late"))
    );
    clock.advance(61_000);
    let expired = next(&mut got).await;
    assert_eq!(expired["event"], "expired", "{expired}");
    assert_eq!(expired["request"]["id"], late["request"]["id"]);
    assert_eq!(expired["request"]["state"], "expired");
    // The live receiver answered all four; the dead one failed each event's three
    // attempts, and each was given up.
    let delivered = metric_reaches(&d, "tally_notify_delivered_total", 4.0).await;
    assert_eq!(delivered, 4.0);
    let gave_up = metric_reaches(&d, "tally_notify_dropped_total{why=\"gave_up\"}", 4.0).await;
    assert_eq!(gave_up, 4.0);
    let failed = metric(&d, "tally_notify_failed_attempts_total").await;
    assert_eq!(failed, 12.0);
    d.shutdown().await.expect("shutdown");
}

/// A denial reaches the receiver as an answer: the request `denied`, by whom, and the
/// note escaped in `text`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denial_reaches_the_receiver_as_an_answer() {
    let dana = tally_ledger::keys::ApproverKey::generate();
    let policy = format!("[approvals.approvers]\ndana = \"{}\"\n", dana.public_hex());
    let recorded = Recorded::new(&policy).expect("policy");
    let dir = tempfile::tempdir().expect("dir");
    let secret = secret_file(dir.path());
    let (url, mut got) = receiver().await;
    let mut d = Daemon::start(move |o| {
        o.policy = recorded;
        notifying(o, vec![url], &secret, 5);
    })
    .await;
    ask(&d, "r", 1).await;
    let asked = next(&mut got).await;
    assert_eq!(asked["event"], "requested", "{asked}");
    let r: tally_api::ApprovalRequest =
        serde_json::from_value(asked["request"].clone()).expect("a request");
    let note = "no <!here>";
    let call = tally_policy::approval::DeniedCall {
        tool: &r.tool,
        operation: r.operation.as_deref(),
        args_digest: r.args_digest.as_deref(),
    };
    let digest = tally_policy::approval::denial_digest("r", "dana", &r.id, call, note);
    let denial = json!({"run": "r", "request": r.id, "approver": "dana", "note": note,
        "signature": tally_policy::approval::sign(dana.signing_key(), &digest),
        "digest": digest});
    let mut op = d.client().await;
    let (s, b) = post_json(&mut op, "/v1/approvals/denials", &denial.to_string()).await;
    assert_eq!(s, 200, "{b}");
    let answered = next(&mut got).await;
    assert_eq!(answered["event"], "answered", "{answered}");
    assert_eq!(answered["request"]["state"], "denied");
    assert_eq!(answered["request"]["answered_by"], "dana");
    assert_eq!(answered["request"]["note"], note);
    let text = answered["text"].as_str().expect("text");
    assert!(
        text.starts_with(&format!("Approval denied ({})", r.id)),
        "{text}"
    );
    assert!(text.contains("by dana: no &lt;!here&gt;"), "{text}");
    d.shutdown().await.expect("shutdown");
}

/// `n` asks on a fresh daemon configured by `configure`: the time they took.
async fn timed_asks(d: &Daemon, n: usize) -> Duration {
    let started = Instant::now();
    ask(d, "many", n).await;
    started.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_receiver_holds_no_decision_and_its_drops_are_counted() {
    const N: usize = 100;
    let dir = tempfile::tempdir().expect("dir");
    let secret = secret_file(dir.path());
    let mut plain = Daemon::start(|_| {}).await;
    let without = timed_asks(&plain, N).await;
    plain.shutdown().await.expect("shutdown");
    let dead = format!("http://{}/hook", free_loopback_addr());
    // The first event's retry waits 30 s: every other one meets a full queue.
    let mut d = Daemon::start(move |o| notifying(o, vec![dead], &secret, 30_000)).await;
    let with = timed_asks(&d, N).await;
    eprintln!("{N} asks: {without:?} without notifications, {with:?} with a dead receiver");
    // Every event was queued: one taken by the delivery task (its first attempt failed,
    // its retry waits 30 s), four waiting, the other 95 dropped as the oldest of a full
    // queue.
    let failed = metric_reaches(&d, "tally_notify_failed_attempts_total", 1.0).await;
    assert_eq!(failed, 1.0);
    let full = "tally_notify_dropped_total{why=\"queue_full\"}";
    let dropped = metric_reaches(&d, full, (N - 5) as f64).await;
    assert_eq!(dropped, (N - 5) as f64);
    assert_eq!(metric(&d, "tally_notify_queue_depth").await, 4.0);
    assert_eq!(metric(&d, "tally_notify_delivered_total").await, 0.0);
    d.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_or_readable_secret_stops_the_start() {
    let dir = tempfile::tempdir().expect("dir");
    let (_l, ledger, _a) = crate::common::new_ledger(tally_ledger::Rotation::default());
    let socket = dir.path().join("s.sock");
    let mut o = ServeOptions::new(&ledger, &socket);
    o.notify.receivers = vec!["http://127.0.0.1:9/hook".into()];
    let serve = |o: ServeOptions| {
        let opened = Arc::new(crate::common::open_ledger(&ledger));
        tally_daemon::serve(opened, o, std::future::pending())
    };
    let e = serve(o.clone()).await.unwrap_err();
    assert!(e.to_string().contains("--notify-secret-file"), "{e}");
    let path = dir.path().join("open.secret");
    std::fs::write(&path, SECRET).expect("write");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("mode");
    o.notify.secret_file = Some(path);
    let e = serve(o.clone()).await.unwrap_err();
    assert!(e.to_string().contains("chmod 600"), "{e}");
    o.notify.receivers = vec!["ftp://example.com/hook".into()];
    let e = serve(o).await.unwrap_err();
    assert!(e.to_string().contains("only http:// and https://"), "{e}");
    assert!(!socket.exists());
}

//! Proxied attempts against the real daemon on its real agent socket: a call the proxy
//! made (checked through the daemon's own gate, in process, as the proxy will) has its
//! outcome from the proxy only. The agent's `POST /v1/outcome` for it is refused
//! `403 outcome_owned_by_proxy` and recorded nowhere; its own calls it still reports.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use tally_gate::{Caller, CheckRequest, Gatekeeper, OutcomeRequest};
use tally_policy::{Recorded, Verdict};

use crate::common::{post_json, Daemon};

/// Where run `r` stands, as the agent socket says.
async fn standing_of(c: &mut tally_api::client::Client) -> serde_json::Value {
    let reply = crate::common::get(c, "/v1/runs/r").await;
    serde_json::from_slice(&reply.body).expect("json")
}

type Slot = Arc<Mutex<Option<Arc<dyn Gatekeeper>>>>;

/// A daemon whose gate (the embedded one) the test also holds, as the proxy in
/// `tally serve` does.
async fn with_gate(policy: &str) -> (Daemon, Arc<dyn Gatekeeper>) {
    let (slot, configure) = holding_gate(policy);
    let d = Daemon::start(configure).await;
    let gate = slot.lock().expect("slot").clone().expect("the gate opened");
    (d, gate)
}

/// Options that open the embedded gate under `policy` and keep it in the slot.
fn holding_gate(policy: &str) -> (Slot, impl FnOnce(&mut tally_daemon::ServeOptions)) {
    let slot: Slot = Arc::new(Mutex::new(None));
    let kept = Arc::clone(&slot);
    let recorded = Recorded::new(policy).expect("policy");
    let open: tally_daemon::OpenGate = Arc::new(move |ledger, policy, clock| {
        let gate = tally_gate::Gate::open(ledger, policy)
            .map_err(|e| e.to_string())?
            .with_clock(clock);
        let gate: Arc<dyn Gatekeeper> = Arc::new(gate);
        *kept.lock().expect("slot") = Some(Arc::clone(&gate));
        Ok(gate)
    });
    let configure = move |o: &mut tally_daemon::ServeOptions| {
        o.policy = recorded;
        o.state = Some(tally_daemon::SharedState {
            open,
            timeout: Duration::from_secs(2),
            label: "the test's gate".into(),
        });
    };
    (slot, configure)
}

/// Call the gate as the proxy does, for the run owner `uid`.
async fn proxied_check(gate: &Arc<dyn Gatekeeper>, uid: Option<u32>, run: &str) -> u64 {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let req: CheckRequest = serde_json::from_value(json!({
        "run": run, "tool": "openai", "effect": "non_idempotent_write",
        "channel": "model", "args": {"model": "m"}, "reserve_cents": 3,
    }))
    .expect("request");
    let proxy = Caller {
        uid,
        proxied: true,
        ..Caller::default()
    };
    gate.check(
        proxy,
        req,
        Box::new(move |r| {
            let _ = tx.send(r);
        }),
    );
    let answer = rx.await.expect("answered").expect("decided");
    assert_eq!(answer.decision, Verdict::Allow, "{answer:?}");
    answer.attempt.expect("an attempt")
}

#[tokio::test]
async fn the_agent_socket_refuses_outcomes_of_proxied_attempts() {
    let (d, gate) = with_gate("").await;
    let mut c = d.agent().await;
    let (status, body) = post_json(&mut c, "/v1/runs", &json!({"run": "r"}).to_string()).await;
    assert_eq!(status, 201, "{body}");
    let standing = standing_of(&mut c).await;
    let owner = standing["owner_uid"].as_u64().map(|u| u as u32);
    let proxied = proxied_check(&gate, owner, "r").await;
    let (status, own) = post_json(
        &mut c,
        "/v1/check",
        &json!({"run": "r", "tool": "search", "effect": "read", "args": {"q": 1}}).to_string(),
    )
    .await;
    assert_eq!(
        (status, own["decision"].as_str()),
        (200, Some("allow")),
        "{own}"
    );

    let outcome = |attempt: u64| {
        json!({"run": "r", "attempt": attempt, "status": "ok", "settled_cents": 0}).to_string()
    };
    let (status, body) = post_json(&mut c, "/v1/outcome", &outcome(proxied)).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (403, Some("outcome_owned_by_proxy")),
        "{body}"
    );
    // Refused, not recorded: the reservation is still held.
    let standing = standing_of(&mut c).await;
    assert_eq!(standing["held_nanos"], 3 * 10_000_000, "{standing}");
    // Its own call the agent reports as before.
    let own_attempt = own["attempt"].as_u64().expect("attempt");
    let (status, body) = post_json(&mut c, "/v1/outcome", &outcome(own_attempt)).await;
    assert_eq!(status, 200, "{body}");
    // The proxy reports what it observed.
    let (tx, rx) = tokio::sync::oneshot::channel();
    let req = OutcomeRequest {
        run: "r".into(),
        attempt: proxied,
        status: tally_ledger::Status::Ok,
        settled_cents: Some(2),
        settled_nanos: None,
        remote_ref: None,
        observed: None,
        retry_after_ms: None,
        result_digest: None,
        worker: None,
        usage_refused: None,
        usage: None,
    };
    let proxy = Caller {
        uid: owner,
        proxied: true,
        ..Caller::default()
    };
    gate.outcome(
        proxy,
        req,
        Box::new(move |r| {
            let _ = tx.send(r);
        }),
    );
    rx.await.expect("answered").expect("the proxy's outcome");
    let standing = standing_of(&mut c).await;
    assert_eq!(
        (
            standing["held_nanos"].as_u64(),
            standing["settled_nanos"].as_u64()
        ),
        (Some(0), Some(2 * 10_000_000)),
        "{standing}"
    );
}

/// A proxied outcome answered once sequenced waits in the ledger's queue to ride the next
/// commit group (here for good: the ledger's clock is held, so its linger never ends).
/// Told to stop, the daemon commits it before `serve` returns: the size `tally serve`
/// then says (the durable checkpoint's) counts it, as `tally verify` will.
#[tokio::test]
async fn an_outcome_still_lingering_at_shutdown_is_committed_before_serve_returns() {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("time")
        .as_millis() as u64;
    let clock = Arc::new(tally_ledger::clock::ManualClock::new(now));
    let (slot, configure) = holding_gate("");
    let (mut d, ledger) = Daemon::start_on_clock(clock, configure).await;
    let gate = slot.lock().expect("slot").clone().expect("the gate opened");
    let mut c = d.agent().await;
    let (status, body) = post_json(&mut c, "/v1/runs", &json!({"run": "r"}).to_string()).await;
    assert_eq!(status, 201, "{body}");
    let owner = standing_of(&mut c).await["owner_uid"]
        .as_u64()
        .map(|u| u as u32);
    drop(c);
    let attempt = proxied_check(&gate, owner, "r").await;
    let req = OutcomeRequest {
        run: "r".into(),
        attempt,
        status: tally_ledger::Status::Ok,
        settled_cents: Some(2),
        settled_nanos: None,
        remote_ref: None,
        observed: None,
        retry_after_ms: None,
        result_digest: None,
        worker: None,
        usage_refused: None,
        usage: None,
    };
    let proxy = Caller {
        uid: owner,
        proxied: true,
        ..Caller::default()
    };
    let (sequenced, is_sequenced) = tokio::sync::oneshot::channel();
    let (durable, is_durable) = std::sync::mpsc::channel();
    gate.outcome_sequenced(
        proxy,
        req,
        Box::new(move |r| {
            let _ = sequenced.send(r);
        }),
        Box::new(move |r| {
            let _ = durable.send(r.map(|l| l.seq));
        }),
    );
    is_sequenced.await.expect("answered").expect("sequenced");
    let before = ledger.checkpoint().size;
    assert!(
        is_durable.recv_timeout(Duration::from_millis(200)).is_err(),
        "lingering: the held clock never ends its wait"
    );
    drop(gate);
    d.shutdown().await.expect("a clean stop");
    let seq = is_durable
        .recv_timeout(Duration::from_secs(10))
        .expect("answered")
        .expect("durable");
    assert_eq!(seq, before, "the outcome is the next entry");
    assert_eq!(
        ledger.checkpoint().size,
        before + 1,
        "the durable size counts it once serve has returned"
    );
}

/// A policy an earlier build recorded may name an upstream over plain `http://` to a
/// host that is not loopback (such a policy is refused in force now): the daemon given
/// it (a `Recorded` read from a ledger) does not start its proxy, naming the upstream,
/// its URL redacted.
#[tokio::test]
async fn a_recorded_plain_http_upstream_elsewhere_is_never_forwarded_to() {
    let text = "[upstreams.gw]\nurl = \"http://10.0.0.7:8000/t/SECRET/v1\"\nkind = \"openai\"\ncredential = \"key\"\n\n[prices.gw.\"m\"]\ninput_per_mtok = 1\noutput_per_mtok = 1\n";
    assert!(Recorded::new(text).is_err());
    let (dir, ledger_dir, _) = crate::common::new_ledger(Default::default());
    let mut options = tally_daemon::ServeOptions::new(&ledger_dir, dir.path().join("agent.sock"));
    options.policy = Recorded::from_ledger(text).expect("a recorded policy reads");
    let mut proxy = tally_daemon::ProxyServe::default();
    proxy.listen = Some("127.0.0.1:0".parse().expect("an address"));
    proxy.credentials.insert(
        "key".into(),
        tally_proxy::Secret::new("sk-upstream".to_owned()),
    );
    options.proxy = Some(proxy);
    let ledger = std::sync::Arc::new(crate::common::open_ledger(&ledger_dir));
    let served = tokio::time::timeout(
        Duration::from_secs(30),
        tally_daemon::serve(ledger, options, std::future::pending()),
    )
    .await
    .expect("the daemon refused to start");
    let why = served
        .expect_err("a proxy over a plain-http upstream")
        .to_string();
    assert!(
        why.contains("upstream `gw`") && why.contains("not loopback"),
        "{why}"
    );
    assert!(!why.contains("SECRET"), "{why}");
}

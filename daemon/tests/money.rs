//! Money through the real daemon on its real socket: nanodollars or cents (one form per
//! amount, exactly), tool prices as the least reservation, and a budget raced by 64
//! concurrent checks never held beyond.

use serde_json::{json, Value};
use tally_policy::Recorded;

use crate::common::{get, post_json, Daemon};

const CENT: u64 = 10_000_000;

async fn gated(policy: &str) -> Daemon {
    let recorded = Recorded::new(policy).expect("policy");
    Daemon::start(move |o| o.policy = recorded).await
}

async fn post(d: &Daemon, path: &str, body: Value) -> (u16, Value) {
    let mut c = d.agent().await;
    post_json(&mut c, path, &body.to_string()).await
}

async fn standing(d: &Daemon, run: &str) -> Value {
    let mut c = d.agent().await;
    serde_json::from_slice(&get(&mut c, &format!("/v1/runs/{run}")).await.body).expect("json")
}

/// A check of a priced tool reserves at least its price: declaring 0 (or nothing) is no
/// way around a spend budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_price_is_the_least_a_check_reserves() {
    let mut d = gated("[tool_prices]\nsearch = \"0.30\"\n").await;
    let (code, started) = post(
        &d,
        "/v1/runs",
        json!({"run": "r", "budget": {"spend_usd_is_not_a_field": 1}}),
    )
    .await;
    assert_eq!(code, 400, "{started}");
    let (code, started) = post(
        &d,
        "/v1/runs",
        json!({"run": "r", "budget": {"spend_nanos": 1_000_000_000u64}}),
    )
    .await;
    assert_eq!(code, 201, "{started}");
    assert_eq!(started["budget"]["spend_nanos"], 1_000_000_000u64);
    let mut allowed = 0;
    for (i, declared) in [
        json!({}),
        json!({"reserve_nanos": 0}),
        json!({"reserve_cents": 0}),
    ]
    .into_iter()
    .enumerate()
    {
        let mut body =
            json!({"run": "r", "tool": "search", "operation": format!("q{i}"), "effect": "read"});
        if let (Value::Object(b), Value::Object(e)) = (&mut body, declared) {
            b.extend(e);
        }
        let (code, a) = post(&d, "/v1/check", body).await;
        assert_eq!(code, 200, "{a}");
        assert_eq!(a["decision"], "allow", "{a}");
        assert_eq!(a["reserve_nanos"], 30 * CENT, "{a}");
        allowed += 1;
    }
    let s = standing(&d, "r").await;
    assert_eq!(s["held_nanos"], allowed * 30 * CENT, "{s}");
    // $0.90 held of $1.00: a fourth search at its price does not fit, whatever it declares.
    let (code, a) = post(
        &d,
        "/v1/check",
        json!({"run": "r", "tool": "search", "operation": "q9", "effect": "read", "reserve_nanos": 0}),
    )
    .await;
    assert_eq!(code, 200, "{a}");
    assert_ne!(a["decision"], "allow", "{a}");
    assert_eq!(a["limits"]["spend_nanos"]["used"], 90 * CENT, "{a}");
    // An unpriced tool reserves what it declares; a declaration above the price wins.
    let (_, a) = post(
        &d,
        "/v1/check",
        json!({"run": "r", "tool": "other", "effect": "read", "reserve_nanos": 7}),
    )
    .await;
    assert_eq!(
        (a["decision"].as_str(), a["reserve_nanos"].as_u64()),
        (Some("allow"), Some(7)),
        "{a}"
    );
    d.shutdown().await.expect("shutdown");
    // The allow records carry the reservation made, so replay re-derives it.
    let chain = crate::common::walk(&d.ledger_dir, &d.auditor);
    let reserved: Vec<u64> = chain
        .entries
        .iter()
        .filter_map(|w| w.decision.as_ref())
        .filter(|x| x.tool.as_deref() == Some("search") && x.attempt.is_some())
        .filter_map(|x| x.reserve_nanos)
        .collect();
    assert_eq!(reserved, vec![30 * CENT; 3]);
}

/// One form per amount, cents that fit, integers only: typed 400s naming the fields,
/// nothing recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_amounts_are_refused_with_typed_errors() {
    let mut d = gated("").await;
    let (code, _) = post(&d, "/v1/runs", json!({"run": "r"})).await;
    assert_eq!(code, 201);
    let both = post(
        &d,
        "/v1/runs",
        json!({"run": "r2", "budget": {"spend_cents": 1, "spend_nanos": 1}}),
    )
    .await;
    assert_eq!(both.0, 400, "{}", both.1);
    let text = both.1.to_string();
    assert!(
        text.contains("budget.spend_cents") && text.contains("budget.spend_nanos"),
        "{text}"
    );
    let base = json!({"run": "r", "tool": "t", "effect": "read"});
    let with = |extra: Value| {
        let mut b = base.clone();
        if let (Value::Object(b), Value::Object(e)) = (&mut b, extra) {
            b.extend(e);
        }
        b
    };
    let (code, e) = post(
        &d,
        "/v1/check",
        with(json!({"reserve_cents": 1, "reserve_nanos": 10_000_000})),
    )
    .await;
    assert_eq!(code, 400, "{e}");
    let text = e.to_string();
    assert!(
        text.contains("reserve_cents") && text.contains("reserve_nanos"),
        "{text}"
    );
    let (code, e) = post(
        &d,
        "/v1/check",
        with(json!({"reserve_cents": 1_844_674_407_371u64})),
    )
    .await;
    assert_eq!(code, 400, "{e}");
    assert!(e.to_string().contains("does not fit"), "{e}");
    for bad in [json!(-1), json!(1.5), json!("5"), json!(1e3)] {
        for field in ["reserve_nanos", "reserve_cents"] {
            let (code, e) = post(&d, "/v1/check", with(json!({ field: bad.clone() }))).await;
            assert_eq!(code, 400, "{field}={bad}: {e}");
        }
    }
    // Nothing was recorded by the refusals: the one allow below is attempt 1.
    let (code, a) = post(&d, "/v1/check", with(json!({"reserve_cents": 12}))).await;
    assert_eq!(code, 200, "{a}");
    assert_eq!(
        (a["attempt"].as_u64(), a["reserve_nanos"].as_u64()),
        (Some(1), Some(12 * CENT))
    );
    let (code, e) = post(
        &d,
        "/v1/outcome",
        json!({"run": "r", "attempt": 1, "status": "ok", "settled_cents": 7, "settled_nanos": 70_000_000}),
    )
    .await;
    assert_eq!(code, 400, "{e}");
    assert!(e.to_string().contains("settled_nanos"), "{e}");
    let (code, e) = post(
        &d,
        "/v1/outcome",
        json!({"run": "r", "attempt": 1, "status": "ok", "settled_cents": u64::MAX}),
    )
    .await;
    assert_eq!(code, 400, "{e}");
    // Cents settle exactly as nanodollars.
    let (code, e) = post(
        &d,
        "/v1/outcome",
        json!({"run": "r", "attempt": 1, "status": "ok", "settled_cents": 7}),
    )
    .await;
    assert_eq!(code, 200, "{e}");
    let s = standing(&d, "r").await;
    assert_eq!(
        (s["held_nanos"].as_u64(), s["settled_nanos"].as_u64()),
        (Some(0), Some(7 * CENT)),
        "{s}"
    );
    d.shutdown().await.expect("shutdown");
}

/// 64 concurrent checks race a budget of $1.00 (each reserving $0.03, and a sub-cent
/// remainder): the held total never passes the budget, and the allows are exactly those
/// that fit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_checks_racing_a_budget_never_hold_more_than_it() {
    let mut d = gated("[rate]\nrun_per_sec = 0\ntool_per_sec = 0\ntool_in_flight = 0\n").await;
    let budget = 100 * CENT;
    let (code, _) = post(
        &d,
        "/v1/runs",
        json!({"run": "r", "budget": {"spend_nanos": budget}}),
    )
    .await;
    assert_eq!(code, 201);
    let each = 3 * CENT + 1; // not a whole number of cents
    let mut tasks = Vec::new();
    for i in 0..64 {
        let socket = d.agent_socket.clone();
        tasks.push(tokio::spawn(async move {
            let mut c = tally_api::client::Client::unix(&socket).await.expect("connect");
            let body = json!({"run": "r", "worker": format!("w{i}"), "tool": "llm", "operation": format!("gen-{i}"), "effect": "read", "reserve_nanos": each});
            post_json(&mut c, "/v1/check", &body.to_string()).await
        }));
    }
    let mut allows = 0u64;
    for t in tasks {
        let (code, a) = t.await.expect("task");
        assert_eq!(code, 200, "{a}");
        if a["decision"] == "allow" {
            allows += 1;
        }
        let used = a["limits"]["spend_nanos"]["used"]
            .as_u64()
            .expect("spend used");
        assert!(used <= budget, "{a}");
    }
    assert_eq!(
        allows,
        budget / each,
        "every reservation that fits, and no more"
    );
    let s = standing(&d, "r").await;
    assert_eq!(s["held_nanos"].as_u64(), Some(allows * each), "{s}");
    assert!(allows * each <= budget);
    d.shutdown().await.expect("shutdown");
}

//! A PostgreSQL restart mid-load.

use super::*;

/// PostgreSQL stopped mid-load under three daemons: while it is down every check gets
/// `gate_unavailable` (action `retry`), never an allow; once it is started again the same
/// daemons (not restarted) allow again; no acknowledged decision is lost and the fleet's
/// attempts stay within what the state issued.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_restart_mid_load_refuses_then_recovers() {
    let Some(cluster) = pg::Cluster::start() else {
        return;
    };
    let mut fleet = Fleet::start(&cluster);
    fleet.ready().await;
    let stop = Arc::new(AtomicBool::new(false));
    let (allows, tasks) = under_load(&fleet, &stop).await;
    cluster.stop();
    let down = Instant::now();
    // A check of our own on each daemon while the server is down (the workers may all be
    // retrying the outcomes of calls allowed just before it stopped).
    for d in 0..DAEMONS {
        let mut c = Client::unix(fleet.socket(d)).await.expect("connect");
        let check = json!({"run": "r", "tool": "api0", "operation": "probe", "effect": "read"});
        let (status, a) = post(&mut c, "/v1/check", &check).await.expect("an answer");
        assert_eq!(status, 503, "daemon {d}: {a}");
        assert_eq!(
            (
                a["decision"].as_str(),
                a["reason"].as_str(),
                a["action"].as_str()
            ),
            (Some("deny"), Some("gate_unavailable"), Some("retry")),
            "daemon {d}: {a}"
        );
        assert!(a["seq"].is_null() && a["attempt"].is_null(), "{a}");
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let up_begins = Instant::now();
    cluster.restart();
    let recovered = allow_again(&allows, Duration::from_secs(30), "PostgreSQL came back").await;
    stop.store(true, Ordering::Relaxed);
    let seen = joined(tasks).await;

    for (d, seen) in seen.iter().enumerate() {
        let bad: Vec<&Seen> = seen
            .iter()
            .filter(|s| matches!(s.what, What::Lost(_) | What::Other(..) | What::Deny(_)))
            .collect();
        assert!(bad.is_empty(), "daemon {d}: {bad:?}");
        // Asked and answered while the server was down: refused, retry, never an allow.
        let during: Vec<&Seen> = seen
            .iter()
            .filter(|s| s.sent >= down && s.got <= up_begins)
            .collect();
        assert!(
            during.len() >= 5,
            "daemon {d}: {} asked while down",
            during.len()
        );
        for s in &during {
            let What::Unavailable(a) = &s.what else {
                panic!("daemon {d}: answered while PostgreSQL was down: {s:?}");
            };
            assert!(
                a["reason"] == "gate_unavailable" || a["error"]["code"] == "gate_unavailable",
                "daemon {d}: {a}"
            );
            if a["decision"] == "deny" {
                assert_eq!(a["action"], "retry", "daemon {d}: {a}");
            }
        }
        // (The server accepts before `pg_ctl start -w` returns: count from its start.)
        assert!(
            count(seen, |s| is_allow(s) && s.got > up_begins) >= 20,
            "daemon {d}: allows again"
        );
    }
    let standing = get(&fleet.socket(2), "/v1/runs/r").await;
    fleet.stop();
    let (per_host, given, issued) =
        none_lost_state_at_most_one_ahead(&fleet, "r", &seen, &standing);
    let settled: u64 = per_host.iter().map(|h| h.2).sum();
    let refused: usize = seen
        .iter()
        .map(|s| count(s, |s| matches!(s.what, What::Unavailable(_))))
        .sum();
    eprintln!(
        "PostgreSQL restart: {refused} refused as unavailable; 20 allows on each daemon {:.1} s \
         after pg_ctl start returned; {given} allows in the ledgers, the state issued {issued}",
        recovered.as_secs_f64()
    );
    assert!(
        standing["settled_nanos"].as_u64() >= Some(settled * 10_000_000),
        "{standing} < {settled}"
    );
}

//! A race for a run's last cents across the fleet.

use super::*;

/// Three daemons x 8 workers race for a run's last cents (reserve 7, settle 7, 1000
/// cents): exactly 142 calls are allowed across the fleet (994 cents; the last 6 cannot
/// cover a reservation), every worker ends on `reservation_insufficient`, and the ledgers hold
/// exactly the cents the state settled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_for_the_last_cents_across_three_daemons_never_overspends() {
    const CENTS: u64 = 1000;
    const RESERVE: u64 = 7;
    let Some(cluster) = pg::Cluster::start() else {
        return;
    };
    let mut fleet = Fleet::start(&cluster);
    fleet.ready().await;
    start_run(
        &fleet.socket(0),
        json!({"run": "cents", "budget": {"attempts": 1_000_000, "spend_cents": CENTS}}),
    )
    .await;
    let stop = Arc::new(AtomicBool::new(false));
    let (_, tasks) = load(&fleet, "cents", RESERVE, &stop);
    let seen = joined(tasks).await;
    for (d, seen) in seen.iter().enumerate() {
        // 6 cents left cannot cover a reservation of 7.
        let odd: Vec<&Seen> = seen
            .iter()
            .filter(|s| match &s.what {
                What::Deny(r) => r != "reservation_insufficient",
                What::Allow { .. } | What::Outcome { .. } => false,
                _ => true,
            })
            .collect();
        assert!(odd.is_empty(), "daemon {d}: {odd:?}");
        assert_eq!(count(seen, |s| matches!(s.what, What::Deny(_))), WORKERS);
    }
    let standing = get(&fleet.socket(1), "/v1/runs/cents").await;
    fleet.stop();
    merged_audit_is_one(&fleet, &["cents"], Replayed::Clean);
    let per_host = acknowledged_are_in_ledgers(&fleet, "cents", &seen);
    let given = distinct_attempts(&per_host);
    assert_eq!(given, CENTS / RESERVE, "allows across the fleet");
    let reserved: u64 = per_host.iter().map(|h| h.1).sum();
    let settled: u64 = per_host.iter().map(|h| h.2).sum();
    assert_eq!(reserved, RESERVE * (CENTS / RESERVE));
    assert_eq!(settled, reserved);
    assert_eq!(
        standing["settled_nanos"],
        settled * 10_000_000,
        "{standing}"
    );
    assert_eq!(standing["held_nanos"], 0, "{standing}");
}

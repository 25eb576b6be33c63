//! SIGKILL of one daemon mid-load.

use super::*;

/// kill -9 of one daemon while 8 workers on each of three daemons check and report
/// outcomes against one run's 600 attempts: every decision the killed daemon acknowledged
/// is in its ledger with that hash, the other two answer throughout, the fleet never
/// allows more than 600, and the killed daemon restarted on the same ledger and database
/// goes on deciding.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_one_daemon_mid_load_loses_no_acknowledged_decision() {
    const CAP: u64 = 600;
    let Some(cluster) = pg::Cluster::start() else {
        return;
    };
    let mut fleet = Fleet::start(&cluster);
    fleet.ready().await;
    start_run(
        &fleet.socket(0),
        json!({"run": "fleet", "budget": {"attempts": CAP, "spend_cents": 1_000_000}}),
    )
    .await;
    let stop = Arc::new(AtomicBool::new(false));
    let (allows, tasks) = load(&fleet, "fleet", 1, &stop);
    let waited = Instant::now();
    while allows[0].load(Ordering::Relaxed) < 40 {
        assert!(waited.elapsed() < Duration::from_secs(60), "no load");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    fleet.kill(0);
    let killed = Instant::now();
    let total_at_kill: u64 = allows.iter().map(|a| a.load(Ordering::Relaxed)).sum();
    assert!(
        total_at_kill < CAP,
        "the kill came after the budget was done"
    );
    let seen = joined(tasks).await;

    // The killed daemon's workers saw their connections break; none after the kill got an
    // answer.
    assert!(
        count(&seen[0], |s| matches!(s.what, What::Lost(_))) > 0,
        "the killed daemon's workers noticed"
    );
    assert_eq!(
        count(&seen[0], |s| !matches!(s.what, What::Lost(_))
            && s.sent > killed),
        0
    );
    for (d, seen) in seen.iter().enumerate().skip(1) {
        // The others answered every request, before and after the kill, until the budget
        // was done.
        let broken: Vec<&Seen> = seen
            .iter()
            .filter(|s| {
                matches!(
                    s.what,
                    What::Lost(_) | What::Other(..) | What::Unavailable(_)
                )
            })
            .collect();
        assert!(broken.is_empty(), "daemon {d}: {broken:?}");
        assert!(
            count(seen, |s| is_allow(s) && s.sent > killed) > 0,
            "daemon {d} allowed nothing after the kill"
        );
        assert!(
            seen.iter()
                .all(|s| !matches!(&s.what, What::Deny(r) if r != "attempts_exhausted")),
            "daemon {d}"
        );
        assert_eq!(
            count(seen, |s| matches!(s.what, What::Deny(_))),
            WORKERS,
            "daemon {d}: each worker ends on the budget"
        );
    }

    // The killed daemon restarted on the same ledger and database, no repair: the run's
    // budget is still done, and a new run goes on.
    fleet.restart(0);
    fleet.ready().await;
    let mut c = Client::unix(fleet.socket(0)).await.expect("connect");
    let check = json!({"run": "fleet", "tool": "api0", "operation": "late", "effect": "read"});
    let (status, late) = post(&mut c, "/v1/check", &check).await.expect("check");
    assert_eq!(
        (status, late["reason"].as_str()),
        (200, Some("attempts_exhausted")),
        "{late}"
    );
    start_run(&fleet.socket(0), json!({"run": "after"})).await;
    let check = json!({"run": "after", "tool": "api0", "operation": "again", "effect": "read"});
    let (status, again) = post(&mut c, "/v1/check", &check).await.expect("check");
    assert_eq!(
        (status, again["decision"].as_str()),
        (200, Some("allow")),
        "{again}"
    );
    drop(c);
    let standing = get(&fleet.socket(1), "/v1/runs/fleet").await;
    fleet.stop();

    let per_host = acknowledged_are_in_ledgers(&fleet, "fleet", &seen);
    let given = distinct_attempts(&per_host);
    assert!(given <= CAP, "{given} allows against {CAP} attempts");
    // The survivors drove the run to its cap: the state counts every attempt issued,
    // those the dead daemon committed and never recorded included (never fewer). The
    // ledgers miss only what it had committed and not yet made durable, never answered:
    // at most one per request in flight, one per worker.
    assert_eq!(standing["calls_allowed"], CAP, "{standing}");
    assert!(given + WORKERS as u64 >= CAP, "{given} recorded of {CAP}");
    let acked: usize = seen.iter().map(|s| count(s, is_allow)).sum();
    assert!(acked as u64 <= given);
    eprintln!(
        "kill -9: {total_at_kill} allows acknowledged at the kill, {acked} in all; {given} in the \
         ledgers; the state issued {}",
        standing["calls_allowed"]
    );
    merged_audit_is_one(&fleet, &["fleet", "after"], Replayed::CrashGapsAllowed);
    // The restarted daemon appended after what it had before the kill.
    let ledger = fleet.ledger(0);
    let last = ledger.values().last().expect("entries");
    assert_eq!(last.1["run"], "after", "{}", last.1);
}

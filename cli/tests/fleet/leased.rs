//! The leased mode through real daemons (`tally serve --state URL --leases`, docs/FLEET.md
//! "The leased mode"): three daemons x 8 workers race one run's last cents and another's
//! last attempts and never pass either budget, and the fleet's ledgers audit as one;
//! kill -9 of the daemon a run is at home on gives its slice back once, after its expiry
//! plus the margin, and the run goes on elsewhere; a pause through one daemon stops the
//! run's calls on the daemon it is at home on at its next call.
//!
//! Lease time is real here (the daemons' own clocks): slices of 2 s, reclaimed 1 s past
//! their expiry, ticks every 200 ms ([`LEASES`]); every wait is bounded.

use super::*;

/// Daemon `d`'s `/metrics` (on the operator socket).
pub(crate) async fn metrics(fleet: &Fleet, d: usize) -> String {
    let mut c = Client::unix(fleet.host(d).join("operator.sock"))
        .await
        .expect("operator socket");
    let reply = c
        .request(Method::GET, "/metrics", None, "")
        .await
        .expect("metrics");
    assert_eq!(reply.status.as_u16(), 200);
    String::from_utf8_lossy(&reply.body).into_owned()
}

/// Daemon `d`'s `tally_lease_events_total`, by event, from its `/metrics`.
pub(crate) async fn lease_events(fleet: &Fleet, d: usize) -> BTreeMap<String, u64> {
    metrics(fleet, d)
        .await
        .lines()
        .filter_map(|l| l.strip_prefix("tally_lease_events_total{event=\""))
        .filter_map(|rest| {
            let (event, n) = rest.split_once("\"} ")?;
            Some((event.to_owned(), n.trim().parse().ok()?))
        })
        .collect()
}

/// The holder a run is at home on (`hostN`), or none.
pub(crate) fn home_of(cluster: &pg::Cluster, run: &str) -> Option<usize> {
    let out = cluster.psql(&format!("SELECT home FROM tally_runs WHERE name = '{run}'"));
    out.trim().strip_prefix("host").and_then(|n| n.parse().ok())
}

/// Every answer is an allow, an outcome, a deny for `reason`, or a 503 `gate_unavailable`
/// (retry: the run at home on another daemon); each daemon's 8 workers end on the deny.
fn only_retries_and(seen: &[Vec<Seen>], reason: &str) {
    for (d, seen) in seen.iter().enumerate() {
        let odd: Vec<&Seen> = seen
            .iter()
            .filter(|s| match &s.what {
                What::Deny(r) => r != reason,
                What::Unavailable(body) => body["error"]["code"] != "gate_unavailable",
                What::Allow { .. } | What::Outcome { .. } => false,
                _ => true,
            })
            .collect();
        assert!(odd.is_empty(), "daemon {d}: {odd:?}");
        assert_eq!(count(seen, |s| matches!(s.what, What::Deny(_))), WORKERS);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leased_daemons_racing_a_runs_last_cents_and_attempts_never_pass_them() {
    const CENTS: u64 = 1000;
    const RESERVE: u64 = 7;
    const ATTEMPTS: u64 = 60;
    let Some(cluster) = pg::Cluster::start() else {
        return;
    };
    let mut fleet = Fleet::start_leased(&cluster);
    fleet.ready().await;
    let stop = Arc::new(AtomicBool::new(false));
    start_run(
        &fleet.socket(0),
        json!({"run": "cents", "budget": {"attempts": 1_000_000, "spend_cents": CENTS}}),
    )
    .await;
    let (_, tasks) = load(&fleet, "cents", RESERVE, &stop);
    let cents = within(joined(tasks), "the race for the last cents").await;
    only_retries_and(&cents, "reservation_insufficient");
    start_run(
        &fleet.socket(1),
        json!({"run": "tries", "budget": {"attempts": ATTEMPTS, "spend_cents": 1_000_000}}),
    )
    .await;
    let (_, tasks) = load(&fleet, "tries", 1, &stop);
    let tries = within(joined(tasks), "the race for the last attempts").await;
    only_retries_and(&tries, "attempts_exhausted");
    let standing = get(&fleet.socket(2), "/v1/runs/cents").await;
    let (mut granted, mut grouped) = (0, 0);
    for d in 0..DAEMONS {
        let events = lease_events(&fleet, d).await;
        let named: Vec<&str> = events.keys().map(String::as_str).collect();
        assert_eq!(
            named,
            [
                "adopted",
                "breaker_flush_failed",
                "breaker_flush_unsure",
                "breaker_flushed",
                "breaker_refresh_failed",
                "breaker_unreadable",
                "granted",
                "group_commits",
                "group_decisions",
                "group_refused",
                "group_unsure",
                "guard_stale_copy",
                "guard_taken_back",
                "lost",
                "reclaimed",
                "refused",
                "renewed",
                "returned"
            ],
            "daemon {d}'s /metrics"
        );
        assert_eq!(events["lost"], 0, "daemon {d}");
        assert_eq!(events["breaker_unreadable"], 0, "daemon {d}");
        let gauge = metrics(&fleet, d).await;
        assert!(
            gauge
                .lines()
                .any(|l| l.starts_with("tally_breaker_outcomes_unflushed ")),
            "daemon {d}'s /metrics: {gauge}"
        );
        granted += events["granted"];
        grouped += events["group_decisions"];
    }
    // The policy reads the tool's breaker from each daemon's view: decisions at home
    // are committed in groups (docs/FLEET.md, "Group commit").
    assert!(grouped > 0, "no decision committed in a group");
    assert!(
        granted >= 2,
        "each run's uses were counted in slices: {granted} granted"
    );
    fleet.stop();
    merged_audit_is_one(&fleet, &["cents", "tries"], Replayed::Clean);
    let per_host = acknowledged_are_in_ledgers(&fleet, "cents", &cents);
    assert_eq!(distinct_attempts(&per_host), CENTS / RESERVE, "allows");
    let settled: u64 = per_host.iter().map(|h| h.2).sum();
    assert_eq!(settled, RESERVE * (CENTS / RESERVE));
    assert_eq!(
        standing["settled_nanos"],
        settled * 10_000_000,
        "{standing}"
    );
    assert_eq!(standing["held_nanos"], 0, "{standing}");
    let per_host = acknowledged_are_in_ledgers(&fleet, "tries", &tries);
    assert_eq!(distinct_attempts(&per_host), ATTEMPTS, "allows");
    // Every slice given back (the daemons stopped): nothing leased, nothing lost.
    let out = cluster.psql(
        "SELECT (SELECT count(*) FROM tally_leases WHERE state = 'held'), \
                (SELECT sum(leased_attempts + leased_nanos) FROM tally_lease_scopes)",
    );
    assert_eq!(out.trim(), "0|0", "slices out after the daemons stopped");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_a_runs_home_gives_its_slice_back_once_after_expiry_and_margin() {
    let Some(cluster) = pg::Cluster::start() else {
        return;
    };
    let stop = Arc::new(AtomicBool::new(false));
    let (mut fleet, allows, tasks) = loaded(&cluster, "k", &stop).await;
    let home = home_of(&cluster, "k").expect("the run is at home on a daemon");
    fleet.kill(home);
    let killed = Instant::now();
    let survivors: Vec<usize> = (0..DAEMONS).filter(|d| *d != home).collect();
    let theirs = |a: &[Arc<AtomicU64>]| {
        survivors
            .iter()
            .map(|d| a[*d].load(Ordering::Relaxed))
            .sum::<u64>()
    };
    let before = theirs(&allows);
    // Its slice is out until 2 s past its last renewal, then 1 s of margin, then the
    // next tick of a survivor reclaims it.
    while theirs(&allows) < before + 20 {
        assert!(
            killed.elapsed() < Duration::from_secs(20),
            "the survivors did not decide the run again: {}",
            fleet.log(survivors[0])
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let resumed = killed.elapsed();
    stop.store(true, Ordering::Relaxed);
    let seen = joined(tasks).await;
    assert!(
        resumed >= Duration::from_secs(1),
        "decided elsewhere {resumed:?} after the kill: before its slice could be reclaimed"
    );
    let slices = cluster.psql(&format!(
        "SELECT count(*) FILTER (WHERE state = 'held'), count(*) FILTER (WHERE state = 'reclaimed') \
         FROM tally_leases WHERE holder = 'host{home}'"
    ));
    let [held, reclaimed]: [u64; 2] = slices
        .trim()
        .split('|')
        .map(|n| n.parse().expect("count"))
        .collect::<Vec<_>>()
        .try_into()
        .expect("two counts");
    assert_eq!(held, 0, "the dead daemon's slices are all back");
    assert!(reclaimed >= 1, "its slice of the run was reclaimed");
    // A reclaim settles the slice's committed use (every decision committed on it,
    // answered or not): the scope settled at least what the ledgers allowed, never less.
    fleet.stop();
    merged_audit_is_one(&fleet, &["k"], Replayed::CrashGapsAllowed);
    let per_host = acknowledged_are_in_ledgers(&fleet, "k", &seen);
    let allowed = distinct_attempts(&per_host);
    let [settled] = scope_attempts(&cluster, "k");
    assert!(
        settled >= allowed,
        "scope settled {settled} < {allowed} allowed"
    );
    eprintln!("kill -9 of the run's home: decided elsewhere again {resumed:?} after");
}

/// `work`, which retries while refused as unavailable, done within two minutes: a hang
/// (a refusal retried forever) is a failure that says so.
pub(crate) async fn within<T>(work: impl std::future::Future<Output = T>, what: &str) -> T {
    match tokio::time::timeout(Duration::from_secs(120), work).await {
        Ok(done) => done,
        Err(_) => panic!("{what}: not done after 120 s (refused as unavailable, retried forever?)"),
    }
}

/// Three leased daemons, run `run` started through the first with room for the whole
/// test, and every worker calling it (until `stop`) once 40 calls were allowed.
pub(crate) async fn loaded(
    cluster: &pg::Cluster,
    run: &str,
    stop: &Arc<AtomicBool>,
) -> (Fleet, Vec<Arc<AtomicU64>>, Tasks) {
    let fleet = Fleet::start_leased(cluster);
    fleet.ready().await;
    start_run(
        &fleet.socket(0),
        json!({"run": run, "budget": {"attempts": 1_000_000, "spend_cents": 1_000_000}}),
    )
    .await;
    let (allows, tasks) = load(&fleet, run, 1, stop);
    let waited = Instant::now();
    while allows
        .iter()
        .map(|a| a.load(Ordering::Relaxed))
        .sum::<u64>()
        < 40
    {
        assert!(waited.elapsed() < Duration::from_secs(60), "no load");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    (fleet, allows, tasks)
}

/// A run scope's settled attempts.
pub(crate) fn scope_attempts(cluster: &pg::Cluster, run: &str) -> [u64; 1] {
    let out = cluster.psql(&format!(
        "SELECT settled_attempts FROM tally_lease_scopes WHERE kind = 'run' AND key = '{run}'"
    ));
    [out.trim().parse().expect("settled")]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_through_one_daemon_stops_the_run_on_its_home_at_its_next_call() {
    let Some(cluster) = pg::Cluster::start() else {
        return;
    };
    let stop = Arc::new(AtomicBool::new(false));
    let (mut fleet, _allows, tasks) = loaded(&cluster, "p", &stop).await;
    let home = home_of(&cluster, "p").expect("at home on a daemon");
    let other = (home + 1) % DAEMONS;
    let mut c = Client::unix(fleet.host(other).join("operator.sock"))
        .await
        .expect("operator socket");
    let (status, body) = post(&mut c, "/v1/runs/p/pause", &json!({}))
        .await
        .expect("pause");
    assert_eq!(status, 200, "{body}");
    let paused = Instant::now();
    let seen = joined(tasks).await;
    for (d, seen) in seen.iter().enumerate() {
        let late: Vec<&Seen> = seen
            .iter()
            .filter(|s| s.sent > paused && matches!(s.what, What::Allow { .. }))
            .collect();
        assert!(
            late.is_empty(),
            "daemon {d} allowed after the pause: {late:?}"
        );
        assert_eq!(
            count(
                seen,
                |s| matches!(&s.what, What::Deny(r) if r == "run_paused")
            ),
            WORKERS,
            "daemon {d}"
        );
    }
    let first = seen[home]
        .iter()
        .filter(|s| matches!(&s.what, What::Deny(r) if r == "run_paused"))
        .map(|s| s.got.saturating_duration_since(paused))
        .min()
        .expect("a deny");
    fleet.stop();
    merged_audit_is_one(&fleet, &["p"], Replayed::Clean);
    eprintln!("pause through another daemon: first refusal on the run's home {first:?} after");
}

//! A PostgreSQL restart (`pg_ctl stop`, then start) under three leased daemons mid-load.

use super::leased::{home_of, lease_events, loaded, scope_attempts, within};
use super::*;

/// The run scope's slices as the database holds them, read in one statement (one
/// snapshot): what the scope counts leased, and what its held slices add up to.
fn leased_and_held(cluster: &pg::Cluster, run: &str) -> (u64, u64) {
    let out = cluster.psql(&format!(
        "SELECT s.leased_attempts, \
                (SELECT coalesce(sum(l.attempts), 0) FROM tally_leases l \
                 WHERE l.kind = 'run' AND l.key = s.key AND l.state = 'held') \
         FROM tally_lease_scopes s WHERE s.kind = 'run' AND s.key = '{run}'"
    ));
    let (leased, held) = out.trim().split_once('|').expect("two sums");
    (leased.parse().expect("leased"), held.parse().expect("held"))
}

/// While the server is down no daemon allows a call (each decision at the run's home
/// writes its row: refused `gate_unavailable`, retry); once it is back the fleet, not
/// restarted, allows again (on the run's old home, or on another daemon that took the
/// run in once the old home's slice went back near its deadline; the others answer
/// `gate_unavailable`, retry: the run is at home elsewhere); every acknowledged decision is in its ledger;
/// the scope never counts less than the ledgers allowed, what it counts leased is what
/// its held slices add up to (no slice granted twice, none counted twice), and once the
/// daemons stop every slice is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_restart_under_leased_load_refuses_then_recovers_with_every_slice_counted_once()
{
    let Some(cluster) = pg::Cluster::start() else {
        return;
    };
    let stop = Arc::new(AtomicBool::new(false));
    let (mut fleet, allows, tasks) = loaded(&cluster, "lr", &stop).await;
    let home = home_of(&cluster, "lr").expect("the run is at home on a daemon");
    cluster.stop();
    let down = Instant::now();
    // Longer than a slice's validity (2 s) less its margin (1 s): every slice the
    // daemons held has passed the point where they may use it.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let up_begins = Instant::now();
    cluster.restart();
    let fleet_allows = || {
        allows
            .iter()
            .map(|a| a.load(Ordering::Relaxed))
            .sum::<u64>()
    };
    let before = fleet_allows();
    let recovered = within(
        async {
            while fleet_allows() < before + 20 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            up_begins.elapsed()
        },
        "the fleet allowing again after the restart",
    )
    .await;
    let (leased, held) = leased_and_held(&cluster, "lr");
    assert_eq!(
        leased, held,
        "the scope counts leased what its held slices hold"
    );
    stop.store(true, Ordering::Relaxed);
    let seen = joined(tasks).await;

    for (d, seen) in seen.iter().enumerate() {
        let odd: Vec<&Seen> = seen
            .iter()
            .filter(|s| match &s.what {
                What::Allow { .. } | What::Outcome { .. } => false,
                What::Unavailable(body) => {
                    body["reason"] != "gate_unavailable"
                        && body["error"]["code"] != "gate_unavailable"
                }
                _ => true,
            })
            .collect();
        assert!(odd.is_empty(), "daemon {d}: {odd:?}");
        let during: Vec<&Seen> = seen
            .iter()
            .filter(|s| s.sent >= down && s.got <= up_begins && is_allow(s))
            .collect();
        assert!(
            during.is_empty(),
            "daemon {d} allowed while PostgreSQL was down: {during:?}"
        );
    }
    let again: usize = seen
        .iter()
        .map(|s| count(s, |s| is_allow(s) && s.got > up_begins))
        .sum();
    assert!(again >= 20, "{again} allows after the restart");
    let home_after = home_of(&cluster, "lr");
    let standing = get(&fleet.socket(0), "/v1/runs/lr").await;
    let mut lost = 0;
    for d in 0..DAEMONS {
        lost += lease_events(&fleet, d).await["lost"];
    }
    fleet.stop();
    let (_, given, issued) = none_lost_state_at_most_one_ahead(&fleet, "lr", &seen, &standing);
    // The scope counts at least what was allowed (a slice reclaimed, a lost one too,
    // settles its committed use: every decision committed on it, answered or not), and
    // nothing is out once every daemon stopped.
    let [settled] = scope_attempts(&cluster, "lr");
    assert!(
        settled >= given,
        "scope settled {settled} < {given} allowed"
    );
    let out = cluster.psql(
        "SELECT (SELECT count(*) FROM tally_leases WHERE state = 'held'), \
                (SELECT sum(leased_attempts + leased_nanos) FROM tally_lease_scopes)",
    );
    assert_eq!(out.trim(), "0|0", "slices out after the daemons stopped");
    eprintln!(
        "leased, PostgreSQL restart: 20 allows in the fleet {:.1} s after pg_ctl start \
         returned; the run at home on host{home}, then on {home_after:?}; {given} allows in the ledgers, the state issued {issued}, the scope \
         settled {settled}; {lost} slice returns refused (left to be reclaimed)",
        recovered.as_secs_f64()
    );
}

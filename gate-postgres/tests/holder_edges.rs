//! A holder's edges on a real PostgreSQL (docs/FLEET.md, "Deciding inside slices"): a
//! central bill applied while the room is leased out, central decisions moving the
//! principal's scope as well as the run's, a tick waiting on the database never holding
//! up uses inside slices, a use judged at the time it is decided, and the small cases
//! (`take(&[])`, a grant whose answer was lost, a redefinition while slices are out).
//! Time is passed in (`now`, and a manual lease clock): nothing sleeps to wait for one.

mod common;

use std::time::{Duration, Instant};

use common::lease::{caps, check, holder, manager, use_of};
use common::Cluster;
use tally_gate_postgres::{Amounts, Caps, Grant, LeaseClock, Scope, ScopeKind, SliceError, Taken};

/// Wait until `n` sessions wait on a row lock (a statement of the test's blocked), or
/// with `n` 0, until the test's own session holding a row sleeps.
fn until_a_session_waits(cluster: &Cluster, n: usize) {
    let waiting = || {
        let sql = match n {
            0 => {
                "SELECT count(*) = 1 FROM pg_stat_activity WHERE wait_event = 'PgSleep'".to_owned()
            }
            n => format!(
                "SELECT count(*) = {n} FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
            ),
        };
        cluster.psql(&sql).trim() == "t"
    };
    let t = Instant::now();
    while !waiting() {
        assert!(t.elapsed() < Duration::from_secs(10), "no session waits");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Hold `row` (a `FROM ... WHERE ...` of one row) locked for `secs` in a session of its
/// own, on a thread.
fn hold_row<'a>(
    s: &'a std::thread::Scope<'a, '_>,
    cluster: &'a Cluster,
    row: &str,
    secs: f64,
) -> std::thread::ScopedJoinHandle<'a, String> {
    let sql = format!("BEGIN; SELECT 1 {row} FOR UPDATE; SELECT pg_sleep({secs}); COMMIT;");
    s.spawn(move || cluster.psql(&sql))
}

#[test]
fn a_central_outcome_above_its_reservation_is_applied_while_the_room_is_leased_out() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let dir = tempfile::tempdir().expect("dir");
    let gate = common::pg_gate(&cluster, dir.path(), "[approvals]\nask_on = []\n");
    let operator = tally_gate::Caller {
        uid: None,
        operator: true,
        proxied: false,
    };
    let start = serde_json::json!({"run": "r", "budget": {"attempts": 12, "spend_cents": 100}});
    gate.start_blocking(operator, serde_json::from_value(start).expect("start"))
        .expect("start");
    let run = Scope::new(ScopeKind::Run, "r");
    let host = manager(&cluster, "host-a", &LeaseClock::database());
    let none = Amounts::default();
    let cent = 10_000_000;
    host.define(&run, caps(12, 100 * cent), none, none)
        .expect("define");
    let attempt = check(&gate, operator, "r", "o1", 10).expect("allowed centrally");
    // Everything left is leased to one host.
    let Ok(Grant::Granted(slice)) = host.grant(&run, use_of(11, 90 * cent)) else {
        panic!("grant");
    };
    // The call cost 30 cents, 20 more than reserved: the bill is applied all the same.
    let req = tally_gate::OutcomeRequest {
        run: "r".into(),
        attempt,
        status: tally_ledger::Status::Ok,
        settled_cents: Some(30),
        settled_nanos: None,
        remote_ref: None,
        observed: None,
        retry_after_ms: None,
        result_digest: None,
        worker: None,
        usage_refused: None,
        usage: None,
    };
    gate.outcome_blocking(operator, req)
        .expect("the bill is applied");
    let billed = ["settled_nanos", "leased_nanos", "billed_nanos"];
    assert_eq!(
        common::lease::amounts(&cluster, &run, billed),
        [30 * cent, 90 * cent, 20 * cent].map(|n| n as i64)
    );
    // Later spending is refused instead: the run's (an overrun stops its spending until
    // a human grants more), and the scope's: no slice more while it is past its cap.
    assert_eq!(check(&gate, operator, "r", "o2", 1), None);
    assert!(matches!(
        host.grant(&run, use_of(0, cent)),
        Ok(Grant::Refused { .. })
    ));
    // The slice back unused: room again, within the cap.
    host.release(slice.id, none).expect("return");
    assert!(matches!(
        host.grant(&run, use_of(1, 70 * cent)),
        Ok(Grant::Granted(_))
    ));
    assert!(matches!(
        host.grant(&run, use_of(0, 1)),
        Ok(Grant::Refused { .. })
    ));
}

#[test]
fn a_central_decision_moves_its_principals_scope_as_well_as_its_runs() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let dir = tempfile::tempdir().expect("dir");
    let gate = common::pg_gate(&cluster, dir.path(), "[approvals]\nask_on = []\n");
    let agent = tally_gate::Caller {
        uid: Some(1000),
        operator: false,
        proxied: false,
    };
    let start = serde_json::json!({"run": "p", "budget": {"attempts": 50}});
    gate.start_blocking(agent, serde_json::from_value(start).expect("start"))
        .expect("start");
    let principal = Scope::new(ScopeKind::Principal, "1000");
    let h = holder(&cluster, "host-a", &LeaseClock::database(), 1);
    let cap = Caps {
        attempts: Some(5),
        ..Caps::default()
    };
    let none = Amounts::default();
    h.leases()
        .define(&principal, cap, none, none)
        .expect("define");
    // A host leases four of the principal's five attempts.
    assert!(matches!(
        h.take(
            std::slice::from_ref(&principal),
            use_of(4, 0),
            Instant::now()
        ),
        Ok(Taken::Local)
    ));
    assert_eq!(h.held(&principal).map(|(g, _)| g.attempts), Some(4));
    // The run has no scope of its own: the central path still counts against its uid's.
    assert!(check(&gate, agent, "p", "o1", 0).is_some());
    assert_eq!(check(&gate, agent, "p", "o2", 0), None);
    let counted = ["settled_attempts", "leased_attempts"];
    assert_eq!(
        common::lease::amounts(&cluster, &principal, counted),
        [1, 4]
    );
}

#[test]
fn a_tick_waiting_on_the_database_does_not_hold_up_uses_inside_slices() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let run = Scope::new(ScopeKind::Run, "r");
    let h = holder(&cluster, "host-a", &LeaseClock::database(), 1);
    let none = Amounts::default();
    h.leases()
        .define(&run, caps(100, 10_000), none, none)
        .expect("define");
    let (scopes, need, t0) = ([run.clone()], use_of(1, 7), Instant::now());
    assert!(matches!(h.take(&scopes, need, t0), Ok(Taken::Local)));
    std::thread::scope(|s| {
        // The holder's row held elsewhere: the tick's renewal waits on it.
        let blocker = hold_row(
            s,
            &cluster,
            "FROM tally_lease_holders WHERE holder = 'host-a'",
            3.0,
        );
        until_a_session_waits(&cluster, 0);
        let tick = s.spawn(|| h.tick(t0 + Duration::from_secs(2)));
        until_a_session_waits(&cluster, 1);
        let waited = cluster.psql(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND application_name = 'tally-leases'",
        );
        assert_eq!(waited.trim(), "1", "the tick's renewal waits on the row");
        let asked = Instant::now();
        for _ in 0..10 {
            assert!(matches!(
                h.take(&scopes, need, t0 + Duration::from_secs(2)),
                Ok(Taken::Local)
            ));
        }
        assert!(
            asked.elapsed() < Duration::from_millis(500),
            "{:?}",
            asked.elapsed()
        );
        assert!(
            !tick.is_finished(),
            "the uses were answered while the tick waited"
        );
        let ticked = tick.join().expect("tick");
        assert!(ticked.unavailable, "{ticked:?}");
        blocker.join().expect("blocker");
    });
    assert_eq!(h.held(&run).map(|(_, used)| used), Some(use_of(11, 77)));
}

#[test]
fn a_use_that_waited_behind_a_refill_is_judged_at_the_time_it_is_decided() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let (a, b) = (
        Scope::new(ScopeKind::Run, "a"),
        Scope::new(ScopeKind::Run, "b"),
    );
    let h = holder(&cluster, "host-a", &LeaseClock::database(), 1);
    let none = Amounts::default();
    for s in [&a, &b] {
        h.leases()
            .define(s, caps(100, 10_000), none, none)
            .expect("define");
    }
    let (need, t0) = (use_of(1, 7), Instant::now());
    assert!(matches!(
        h.take(std::slice::from_ref(&a), need, t0),
        Ok(Taken::Local)
    ));
    let late = std::sync::atomic::AtomicBool::new(false);
    let entered = std::sync::atomic::AtomicBool::new(false);
    let relaxed = std::sync::atomic::Ordering::SeqCst;
    std::thread::scope(|s| {
        // Run b's scope held elsewhere: a refill for it waits, holding the holder's lock.
        let blocker = hold_row(s, &cluster, "FROM tally_lease_scopes WHERE key = 'b'", 1.5);
        until_a_session_waits(&cluster, 0);
        let refill = s.spawn(|| h.take(std::slice::from_ref(&b), need, t0));
        until_a_session_waits(&cluster, 1);
        // A use of run a asks meanwhile; by the time it is decided its slice's deadline
        // (10 s, less the 1 s margin) has passed on the clock it reads.
        let waiting = s.spawn(|| {
            entered.store(true, relaxed);
            h.take_at(std::slice::from_ref(&a), need, || {
                t0 + if late.load(relaxed) {
                    Duration::from_secs(20)
                } else {
                    Duration::from_secs(1)
                }
            })
        });
        while !entered.load(relaxed) {
            std::thread::yield_now();
        }
        std::thread::sleep(Duration::from_millis(100));
        late.store(true, relaxed);
        assert!(matches!(refill.join().expect("refill"), Ok(Taken::Local)));
        assert!(matches!(waiting.join().expect("use"), Ok(Taken::Local)));
        blocker.join().expect("blocker");
    });
    // Not counted on the expired slice: a new one was granted for it.
    assert_eq!(h.metrics().granted(), 3);
    assert_eq!(h.held(&a).map(|(_, used)| used), Some(need));
}

#[test]
fn the_small_gaps_a_use_of_no_scope_a_redefinition_and_an_unseen_grant() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let run = Scope::new(ScopeKind::Run, "r");
    let h = holder(&cluster, "host-a", &LeaseClock::database(), 1);
    let none = Amounts::default();
    h.leases()
        .define(&run, caps(100, 10_000), use_of(10, 0), none)
        .expect("define");
    // No scope: nothing would count it.
    let r = h.take(&[], use_of(1, 0), Instant::now());
    assert!(matches!(r, Err(SliceError::NoScope)), "{r:?}");
    // A grant the holder never saw (its answer lost): given back at the next tick.
    let Ok(Grant::Granted(_)) = h.leases().grant(&run, use_of(20, 0)) else {
        panic!("grant");
    };
    // Redefined while it is out: the caps change, what is settled stays.
    h.leases()
        .define(&run, caps(90, 10_000), none, none)
        .expect("define");
    let cols = ["settled_attempts", "leased_attempts", "cap_attempts"];
    assert_eq!(common::lease::amounts(&cluster, &run, cols), [10, 20, 90]);
    let ticked = h.tick(Instant::now());
    assert_eq!(
        (ticked.returned, ticked.unavailable),
        (1, false),
        "{ticked:?}"
    );
    assert_eq!(common::lease::amounts(&cluster, &run, cols), [10, 0, 90]);
    assert_eq!((h.metrics().granted(), h.metrics().returned()), (1, 1));
    // With none out, a redefinition still changes the caps only (its counts may be
    // stale); a reset starts the period anew.
    h.leases()
        .define(&run, caps(90, 10_000), none, none)
        .expect("define");
    assert_eq!(common::lease::amounts(&cluster, &run, cols), [10, 0, 90]);
    h.leases().reset(&run, none, none).expect("reset");
    assert_eq!(common::lease::amounts(&cluster, &run, cols), [0, 0, 90]);
}

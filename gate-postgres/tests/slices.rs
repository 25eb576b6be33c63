//! Deciding inside leased slices on a real PostgreSQL (docs/FLEET.md, "Deciding inside
//! slices"): three holders and the central path racing for the last attempts and cents
//! of a run and of its principal never spend past a cap; one holder answers as the
//! database alone would; with the database stopped, uses inside a slice go on, others
//! are refused, and the unused part returns once it is back; a revoked run loses its
//! slices at each holder's next tick; a restarted holder returns what it left out, once.
//! The holder's edges (a bill while the room is leased out, a tick that waits, ...) are
//! in holder_edges.rs.
//! Time is passed in (`now`, and a manual lease clock): nothing sleeps.

mod common;

use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use common::lease::{at_noon, caps, holder, manager, totals, use_of, TTL};
use common::Cluster;
use tally_gate_postgres::{
    spawn_ticks, Amounts, Caps, LeaseClock, Leases, Scope, ScopeKind, SliceError, SliceOptions,
    Slices, Spent, Taken,
};

/// 8 workers per holder and 4 central ones use `need` of both scopes until refused:
/// the uses allowed (leased, central).
fn race(
    holders: &[Arc<Slices>],
    central: &Arc<Leases>,
    scopes: &[Scope],
    need: Amounts,
) -> (u64, u64) {
    let now = Instant::now();
    let mut workers = Vec::new();
    for h in holders {
        for _ in 0..8 {
            let (h, scopes) = (Arc::clone(h), scopes.to_vec());
            workers.push(std::thread::spawn(move || {
                let mut n = 0;
                loop {
                    match h.take(&scopes, need, now) {
                        Ok(_) => n += 1,
                        Err(SliceError::Leased { .. }) => continue,
                        Err(SliceError::Exhausted { .. }) => return (n, 0),
                        Err(e) => panic!("{e}"),
                    }
                }
            }));
        }
    }
    for _ in 0..4 {
        let (c, scopes) = (Arc::clone(central), scopes.to_vec());
        workers.push(std::thread::spawn(move || {
            let mut n = 0;
            loop {
                match c.spend(&scopes, need).expect("spend") {
                    Spent::Spent => n += 1,
                    Spent::Leased => continue,
                    _ => return (0, n),
                }
            }
        }));
    }
    workers
        .into_iter()
        .map(|w| w.join().expect("worker"))
        .fold((0, 0), |(a, b), (x, y)| (a + x, b + y))
}

#[test]
fn three_leased_holders_and_the_central_path_racing_never_spend_past_a_cap() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let clock = LeaseClock::database();
    for floor in [1, 3, 10] {
        let run = Scope::new(ScopeKind::Run, &format!("run-{floor}"));
        let principal = Scope::new(ScopeKind::Principal, &format!("uid-{floor}"));
        let holders: Vec<Arc<Slices>> = ["host-a", "host-b", "host-c"]
            .iter()
            .map(|h| Arc::new(holder(&cluster, h, &clock, floor)))
            .collect();
        let central = Arc::new(manager(&cluster, "central", &clock));
        // The run runs out of cents (1,000 / 7 = 142), the principal of attempts (120).
        let (none, settled) = (Amounts::default(), use_of(3, 21));
        central
            .define(&run, caps(1_000, 1_000), settled, none)
            .expect("define");
        central
            .define(&principal, caps(120, 100_000), settled, none)
            .expect("define");
        let scopes = [run.clone(), principal.clone()];
        let need = use_of(1, 7);
        // Two central spends before the race, then all at once.
        for _ in 0..2 {
            assert_eq!(central.spend(&scopes, need).expect("spend"), Spent::Spent);
        }
        let (leased, spent) = race(&holders, &central, &scopes, need);
        let spent = spent + 2;
        for h in &holders {
            h.close();
            assert_eq!(h.unreturned(), 0);
        }
        // Every worker stopped on a true refusal: nothing left, in a slice or not.
        assert_eq!(central.spend(&scopes, need).expect("spend"), Spent::Refused);
        assert_eq!(
            leased + spent,
            117,
            "floor {floor}: {leased} leased, {spent} central"
        );
        assert!(leased > 0, "floor {floor}: {leased} {spent}");
        // Settled exactly what was allowed, nothing leased or held.
        assert_eq!(
            totals(&cluster, &run),
            [120, 840, 0, 0, 0, 0],
            "floor {floor}"
        );
        assert_eq!(totals(&cluster, &principal)[..2], [120, 840]);
        let granted: u64 = holders.iter().map(|h| h.metrics().granted()).sum();
        let returned: u64 = holders.iter().map(|h| h.metrics().returned()).sum();
        assert_eq!(
            granted, returned,
            "floor {floor}: every slice returned once"
        );
    }
}

#[test]
fn one_holder_answers_as_the_database_alone_would() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let clock = LeaseClock::database();
    let (leased, central) = (
        Scope::new(ScopeKind::Run, "leased"),
        Scope::new(ScopeKind::Run, "central"),
    );
    let h = holder(&cluster, "host-a", &clock, 2);
    let none = Amounts::default();
    for s in [&leased, &central] {
        h.leases()
            .define(s, caps(40, 500), none, none)
            .expect("define");
    }
    let now = Instant::now();
    // Uses of every size, some too big for what is left, small ones after them.
    // Side effects have no cap: counted by neither slices nor refusals.
    let sequence: Vec<Amounts> = (0..80u64)
        .map(|i| Amounts {
            effects: i % 2,
            ..use_of(1 + i % 3, (i * 37) % 61)
        })
        .collect();
    let mut answers = (Vec::new(), Vec::new());
    for need in &sequence {
        answers
            .0
            .push(match h.take(std::slice::from_ref(&leased), *need, now) {
                Ok(_) => true,
                Err(SliceError::Exhausted { .. }) => false,
                Err(e) => panic!("{e}"),
            });
        let spent = h.leases().spend(std::slice::from_ref(&central), *need);
        answers.1.push(spent.expect("spend") == Spent::Spent);
    }
    assert_eq!(answers.0, answers.1);
    assert!(answers.0.contains(&false) && answers.0.iter().filter(|a| **a).count() > 10);
    h.close();
    assert_eq!(h.metrics().lost(), 0);
    assert_eq!(h.metrics().granted(), h.metrics().returned());
    assert_eq!(totals(&cluster, &leased), totals(&cluster, &central));
}

#[test]
fn with_the_database_stopped_uses_inside_a_slice_go_on_until_its_deadline_and_it_returns_once() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let clock = at_noon();
    let run = Scope::new(ScopeKind::Run, "r");
    let h = holder(&cluster, "host-a", &clock, 1);
    let none = Amounts::default();
    h.leases()
        .define(&run, caps(100, 10_000), none, none)
        .expect("define");
    let scopes = [run.clone()];
    let (need, t0) = (use_of(1, 7), Instant::now());
    assert!(matches!(h.take(&scopes, need, t0), Ok(Taken::Local)));
    assert_eq!(h.held(&run), Some((use_of(75, 7_500), need)));
    cluster.stop();
    for _ in 0..10 {
        assert!(matches!(
            h.take(&scopes, need, t0 + Duration::from_secs(1)),
            Ok(Taken::Local)
        ));
    }
    // Beyond the slice: refused, retry.
    let beyond = h.take(&scopes, use_of(70, 0), t0 + Duration::from_secs(1));
    assert!(
        matches!(beyond, Err(SliceError::Unavailable(_))),
        "{beyond:?}"
    );
    // Inside it until its deadline (10 s from the grant's request) less the 1 s margin.
    assert!(matches!(
        h.take(&scopes, need, t0 + Duration::from_secs(8)),
        Ok(Taken::Local)
    ));
    let late = h.take(&scopes, need, t0 + Duration::from_secs(9));
    assert!(matches!(late, Err(SliceError::Unavailable(_))), "{late:?}");
    // Near its deadline the tick gives it back; the database does not answer: kept,
    // and not counted returned until it confirms.
    let ticked = h.tick(t0 + Duration::from_millis(9_500));
    assert!(ticked.unavailable && ticked.returned == 0, "{ticked:?}");
    assert_eq!((h.unreturned(), h.held(&run)), (1, None));
    cluster.restart();
    // Expired on the database's clock meanwhile: reclaimed as spent whole first.
    clock.advance(TTL + Duration::from_secs(6));
    let reclaimer = manager(&cluster, "host-b", &clock);
    assert_eq!(reclaimer.reclaim_expired().expect("reclaim").len(), 1);
    assert_eq!(totals(&cluster, &run), [75, 7_500, 0, 0, 0, 0]);
    // Back: the unused part refunded, once, however many ticks follow.
    let returned: usize = (0..4)
        .map(|i| h.tick(t0 + Duration::from_secs(10 + i)).returned)
        .sum();
    assert_eq!((h.unreturned(), returned), (0, 1));
    assert_eq!(totals(&cluster, &run), [12, 84, 0, 0, 0, 0]);
    assert_eq!(h.metrics().returned(), 1);
}

#[test]
fn a_revoked_run_loses_its_slices_at_each_holders_next_tick() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let clock = LeaseClock::database();
    let run = Scope::new(ScopeKind::Run, "r");
    let (a, b) = (
        holder(&cluster, "host-a", &clock, 1),
        holder(&cluster, "host-b", &clock, 1),
    );
    let operator = manager(&cluster, "operator", &clock);
    let none = Amounts::default();
    operator
        .define(&run, caps(100, 10_000), none, none)
        .expect("define");
    let (scopes, need, t0) = ([run.clone()], use_of(1, 7), Instant::now());
    assert!(matches!(a.take(&scopes, need, t0), Ok(Taken::Local)));
    assert!(matches!(b.take(&scopes, need, t0), Ok(Taken::Local)));
    operator.revoke(&run, true).expect("revoke");
    // Until a holder's next tick (the refresh interval) its slice still serves.
    assert!(matches!(
        a.take(&scopes, need, t0 + Duration::from_secs(1)),
        Ok(Taken::Local)
    ));
    // Host a's lease thread ticks at the refresh interval; host b is ticked here.
    let refresh = t0 + Duration::from_secs(2);
    let a = Arc::new(a);
    let ((times, ticks), (done, ticked)) = (mpsc::channel(), mpsc::channel());
    let thread = spawn_ticks(Arc::clone(&a), ticks, done).expect("lease thread");
    times.send(refresh).expect("tick");
    assert_eq!(ticked.recv().expect("ticked").returned, 1);
    assert_eq!(b.tick(refresh).returned, 1);
    for h in [&*a, &b] {
        let r = h.take(&scopes, need, refresh);
        assert!(matches!(r, Err(SliceError::Revoked { .. })), "{r:?}");
    }
    drop(times);
    thread.join().expect("the lease thread ends with its times");
    assert_eq!(
        operator.spend(&scopes, need).expect("spend"),
        Spent::Revoked
    );
    assert_eq!(totals(&cluster, &run), [3, 21, 0, 0, 0, 0]);
    operator.revoke(&run, false).expect("resume");
    assert!(matches!(a.take(&scopes, need, refresh), Ok(Taken::Local)));
}

#[test]
fn a_restarted_holder_returns_the_slices_it_left_out_once() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let clock = LeaseClock::database();
    let run = Scope::new(ScopeKind::Run, "r");
    let a = holder(&cluster, "host-a", &clock, 1);
    let none = Amounts::default();
    a.leases()
        .define(&run, caps(100, 10_000), none, none)
        .expect("define");
    let (scopes, need, t0) = ([run.clone()], use_of(1, 7), Instant::now());
    for _ in 0..5 {
        assert!(matches!(a.take(&scopes, need, t0), Ok(Taken::Local)));
    }
    // The process dies without returning its slice.
    drop(a);
    assert_eq!(totals(&cluster, &run), [0, 0, 0, 0, 75, 7_500]);
    // Restarted: its ledger says 5 uses of the slice it left out.
    let options = SliceOptions::default();
    let again = Slices::open(
        manager(&cluster, "host-a", &clock),
        options.clone(),
        |_| use_of(5, 35),
        None,
    );
    assert_eq!(again.metrics().returned(), 1);
    assert_eq!(totals(&cluster, &run), [5, 35, 0, 0, 0, 0]);
    let third = Slices::open(
        manager(&cluster, "host-a", &clock),
        options,
        |l| l.granted,
        None,
    );
    assert_eq!(third.metrics().returned(), 0);
    assert_eq!(totals(&cluster, &run), [5, 35, 0, 0, 0, 0]);
}

/// Whether a check of run `r`, operation `op`, through `gate` is allowed (refused by the
/// budget, or as unavailable: no room beside the slices out).
fn central_check(gate: &tally_gate::Gate<tally_gate_postgres::Postgres>, op: &str) -> bool {
    let operator = tally_gate::Caller {
        uid: None,
        operator: true,
        proxied: false,
    };
    let req = serde_json::json!({"run": "r", "tool": "t", "operation": op, "effect": "read"});
    let req = serde_json::from_value(req).expect("check request");
    matches!(gate.check_blocking(operator, req), Ok(a) if format!("{:?}", a.decision) == "Allow")
}

/// Checks of run `r` through `gate` until one is not allowed: how many were.
fn central_checks(gate: &tally_gate::Gate<tally_gate_postgres::Postgres>, worker: usize) -> u64 {
    (0..)
        .take_while(|i| central_check(gate, &format!("w{worker}-{i}")))
        .count() as u64
}

#[test]
fn central_gates_and_leased_holders_racing_for_one_run_never_spend_past_its_budget() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let dirs: Vec<tempfile::TempDir> = (0..2).map(|_| tempfile::tempdir().expect("dir")).collect();
    let gates: Vec<Arc<_>> = dirs
        .iter()
        .map(|d| {
            Arc::new(common::pg_gate(
                &cluster,
                d.path(),
                "[approvals]\nask_on = []\n",
            ))
        })
        .collect();
    let operator = tally_gate::Caller {
        uid: None,
        operator: true,
        proxied: false,
    };
    let start = serde_json::json!({"run": "r", "budget": {"attempts": 40}});
    let start = serde_json::from_value(start).expect("start request");
    gates[0].start_blocking(operator, start).expect("start");
    let clock = LeaseClock::database();
    let holders: Vec<Arc<Slices>> = ["host-a", "host-b", "host-c"]
        .iter()
        .map(|h| Arc::new(holder(&cluster, h, &clock, 2)))
        .collect();
    // The run's scope, in step with its row: nothing used yet.
    let run = Scope::new(ScopeKind::Run, "r");
    let none = Amounts::default();
    let cap = Caps {
        attempts: Some(40),
        ..Caps::default()
    };
    holders[0]
        .leases()
        .define(&run, cap, none, none)
        .expect("define");
    // Each gate's first checks, before the race (its connection made): 4 of the 40.
    for (i, g) in gates.iter().enumerate() {
        for j in 0..2 {
            assert!(central_check(g, &format!("first-{i}-{j}")));
        }
    }
    let mut workers = Vec::new();
    for (i, g) in gates.iter().enumerate() {
        for w in 0..8 {
            let g = Arc::clone(g);
            workers.push(std::thread::spawn(move || {
                (0, central_checks(&g, i * 8 + w))
            }));
        }
    }
    let now = Instant::now();
    for h in &holders {
        for _ in 0..4 {
            let (h, run) = (Arc::clone(h), run.clone());
            workers.push(std::thread::spawn(move || {
                let mut n = 0;
                loop {
                    match h.take(std::slice::from_ref(&run), use_of(1, 0), now) {
                        Ok(_) => n += 1,
                        Err(SliceError::Leased { .. }) => continue,
                        Err(SliceError::Exhausted { .. }) => return (n, 0),
                        Err(e) => panic!("{e}"),
                    }
                }
            }));
        }
    }
    let (leased, central) = workers
        .into_iter()
        .map(|w| w.join().expect("worker"))
        .fold((0, 0), |(a, b), (x, y)| (a + x, b + y));
    for h in &holders {
        h.close();
    }
    let central = central + 4;
    assert!(
        leased + central <= 40,
        "{leased} leased + {central} central"
    );
    assert!(leased > 0, "{leased} leased, {central} central");
    // The scope holds exactly what both paths spent; what is left goes to one holder.
    let t = totals(&cluster, &run);
    assert_eq!((t[0], t[4]), ((leased + central) as i64, 0));
    let mut rest = 0;
    while holders[0]
        .take(std::slice::from_ref(&run), use_of(1, 0), now)
        .is_ok()
    {
        rest += 1;
    }
    holders[0].close();
    assert_eq!(leased + central + rest, 40);
    assert_eq!(totals(&cluster, &run)[0], 40);
}

#[test]
fn a_central_run_with_a_scope_decides_as_one_without_and_its_scope_holds_what_it_spent() {
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
    for run in ["plain", "scoped"] {
        let start = serde_json::json!({"run": run, "budget": {"attempts": 12, "spend_cents": 100}});
        let start = serde_json::from_value(start).expect("start request");
        gate.start_blocking(operator, start).expect("start");
    }
    let scoped = Scope::new(ScopeKind::Run, "scoped");
    let leases = manager(&cluster, "definer", &LeaseClock::database());
    let none = Amounts::default();
    leases
        .define(&scoped, caps(12, 1_000_000_000), none, none)
        .expect("define");
    let mut answers = (Vec::new(), Vec::new());
    let mut settled_cents = 0;
    for i in 0..20u64 {
        let reserve = 5 + (i % 3) * 10;
        for (run, out) in [("plain", &mut answers.0), ("scoped", &mut answers.1)] {
            let req = serde_json::json!({"run": run, "tool": "llm", "operation": format!("o{i}"), "effect": "read", "reserve_cents": reserve});
            let a = gate
                .check_blocking(operator, serde_json::from_value(req).expect("check"))
                .expect("check");
            out.push(format!("{:?} {:?}", a.decision, a.reason));
            let Some(attempt) = a.attempt else { continue };
            if run == "scoped" {
                settled_cents += reserve / 2;
            }
            let req = tally_gate::OutcomeRequest {
                run: run.into(),
                attempt,
                status: tally_ledger::Status::Ok,
                settled_cents: Some(reserve / 2),
                settled_nanos: None,
                remote_ref: None,
                observed: None,
                retry_after_ms: None,
                result_digest: None,
                worker: None,
                usage_refused: None,
                usage: None,
            };
            gate.outcome_blocking(operator, req).expect("outcome");
        }
    }
    assert_eq!(answers.0, answers.1);
    assert!(answers.1.iter().any(|a| !a.starts_with("Allow")));
    // Each check took its attempt and reservation, each outcome gave back the rest.
    let t = totals(&cluster, &scoped);
    assert_eq!(t, [12, settled_cents as i64 * 10_000_000, 0, 0, 0, 0]);
}

#[test]
fn a_run_paused_through_a_central_gate_revokes_its_slices_until_resumed() {
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
    let start = serde_json::json!({"run": "r", "budget": {"attempts": 50}});
    let start = serde_json::from_value(start).expect("start request");
    gate.start_blocking(operator, start).expect("start");
    let clock = LeaseClock::database();
    let h = holder(&cluster, "host-a", &clock, 1);
    let run = Scope::new(ScopeKind::Run, "r");
    let none = Amounts::default();
    let cap = Caps {
        attempts: Some(50),
        ..Caps::default()
    };
    h.leases().define(&run, cap, none, none).expect("define");
    let (scopes, t0) = ([run.clone()], Instant::now());
    assert!(matches!(
        h.take(&scopes, use_of(1, 0), t0),
        Ok(Taken::Local)
    ));
    gate.pause_blocking(operator, "r", true).expect("pause");
    let refresh = t0 + Duration::from_secs(2);
    assert_eq!(h.tick(refresh).returned, 1);
    let r = h.take(&scopes, use_of(1, 0), refresh);
    assert!(matches!(r, Err(SliceError::Revoked { .. })), "{r:?}");
    gate.pause_blocking(operator, "r", false).expect("resume");
    assert!(matches!(
        h.take(&scopes, use_of(1, 0), refresh),
        Ok(Taken::Local)
    ));
    // Stopped: revoked for good.
    let stop = serde_json::from_value(serde_json::json!({})).expect("stop request");
    gate.stop_blocking(operator, "r", stop).expect("stop");
    assert_eq!(h.tick(refresh + Duration::from_secs(2)).returned, 1);
    let r = h.take(&scopes, use_of(1, 0), refresh + Duration::from_secs(2));
    assert!(matches!(r, Err(SliceError::Revoked { .. })), "{r:?}");
    assert_eq!(totals(&cluster, &run)[..1], [2]);
}

/// A use of a scope never defined is refused as unavailable (retry), never as a scope
/// with no room left (which the gate answers with the budget's reason).
#[test]
fn a_use_of_a_scope_not_defined_is_unavailable_not_out_of_room() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let clock = LeaseClock::database();
    let h = holder(&cluster, "host-a", &clock, 2);
    let scopes = [Scope::new(ScopeKind::Run, "nowhere")];
    let r = h.take(&scopes, use_of(1, 1), Instant::now());
    assert!(matches!(r, Err(SliceError::Unavailable(_))), "{r:?}");
}

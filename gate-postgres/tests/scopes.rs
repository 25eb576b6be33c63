//! What a lease scope allows on a real PostgreSQL after what the review of the leased
//! mode attacked: a daemon of the previous schema still stepping scopes during a rolling
//! upgrade; the slices out of a scope a central bill overran; a stale redefinition, one
//! lowering a cap below what is out, one changing what is capped; a bill of attempts; a
//! principal's scope given back its run's refunded attempt; a use whose refill took time
//! past another slice's deadline. Time is passed in: nothing sleeps.

mod common;

use std::cell::Cell;
use std::time::{Duration, Instant};

use common::lease::{amounts, caps, check, manager, outcome, use_of};
use common::Cluster;
use tally_gate_postgres::{
    Amounts, Caps, Grant, LeaseClock, LeaseError, Scope, ScopeKind, SliceError, SliceOptions,
    Slices, Taken,
};

const CENT: u64 = 10_000_000;

fn holder(cluster: &Cluster, name: &str) -> Slices {
    let m = manager(cluster, name, &LeaseClock::database());
    Slices::open(m, SliceOptions::default(), |l| l.granted, None)
}

fn operator() -> tally_gate::Caller {
    tally_gate::Caller {
        uid: None,
        operator: true,
        proxied: false,
    }
}

/// `tally_lease_step` called as `sql` (its arguments), the scope's settled attempts and
/// nanodollars after: unchanged when the call was refused.
fn step(cluster: &Cluster, scope: &Scope, args: &str) -> [i64; 2] {
    cluster.psql(&format!(
        "DO $$ BEGIN PERFORM tally_lease_step({args}); \
         EXCEPTION WHEN check_violation THEN NULL; END $$;"
    ));
    amounts(cluster, scope, ["settled_attempts", "settled_nanos"])
}

#[test]
fn a_daemon_of_the_previous_schema_still_steps_its_scopes_after_the_upgrade() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let run = Scope::new(ScopeKind::Run, "r");
    let none = Amounts::default();
    manager(&cluster, "host-a", &LeaseClock::database())
        .define(&run, caps(5, 1_000), none, none)
        .expect("define");
    // The database as the schema-6 build left it: no seven-argument step.
    cluster.psql(
        "DROP FUNCTION tally_lease_step(text, text, bigint, bigint, bigint, bigint, boolean); \
         UPDATE tally_schema SET version = 6 WHERE version >= 7;",
    );
    // This build's migration puts it back; an old daemon's central decision calls it.
    let _ = manager(&cluster, "host-b", &LeaseClock::database());
    let old = "'run', 'r', 2, 100, 0, 0, NULL";
    assert_eq!(step(&cluster, &run, old), [2, 100]);
    // Held to the caps as before (never a bill).
    assert_eq!(
        step(&cluster, &run, "'run', 'r', 0, 901, 0, 0, NULL"),
        [2, 100]
    );
}

#[test]
fn a_bill_passes_a_cap_in_nanodollars_only() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let run = Scope::new(ScopeKind::Run, "r");
    let none = Amounts::default();
    manager(&cluster, "host-a", &LeaseClock::database())
        .define(&run, caps(3, 1_000), none, none)
        .expect("define");
    assert_eq!(
        step(&cluster, &run, "'run', 'r', 5, 0, 0, 0, NULL, true"),
        [0, 0]
    );
    assert_eq!(
        step(&cluster, &run, "'run', 'r', 0, 1500, 0, 0, NULL, true"),
        [0, 1_500]
    );
    let billed = ["billed_attempts", "billed_nanos"];
    assert_eq!(amounts(&cluster, &run, billed), [0, 500]);
}

#[test]
fn the_slices_out_of_a_scope_a_bill_overran_are_not_renewed_nor_spent() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let dir = tempfile::tempdir().expect("dir");
    let gate = common::pg_gate(&cluster, dir.path(), "[approvals]\nask_on = []\n");
    let start = serde_json::json!({"run": "r", "budget": {"attempts": 12, "spend_cents": 100}});
    gate.start_blocking(operator(), serde_json::from_value(start).expect("start"))
        .expect("start");
    let run = Scope::new(ScopeKind::Run, "r");
    let h = holder(&cluster, "host-a");
    let none = Amounts::default();
    h.leases()
        .define(&run, caps(12, 100 * CENT), none, none)
        .expect("define");
    let attempt = check(&gate, operator(), "r", "o1", 10).expect("allowed centrally");
    // A holder takes a cent: its slice is most of the 90 left.
    let (scopes, t0) = (std::slice::from_ref(&run), Instant::now());
    assert!(matches!(
        h.take(scopes, use_of(1, CENT), t0),
        Ok(Taken::Local)
    ));
    let granted = h.held(&run).map(|(g, _)| g.nanos).expect("held");
    assert!(granted > 60 * CENT, "{granted}");
    // The central call cost 40 cents, 30 more than reserved: past the cap beside it.
    outcome(
        &gate,
        operator(),
        "r",
        attempt,
        tally_ledger::Status::Ok,
        40,
    )
    .expect("billed");
    // The next tick cannot renew the slice: given back, what it used settled.
    let ticked = h.tick(t0 + Duration::from_secs(1));
    assert_eq!((ticked.renewed, ticked.returned), (0, 1), "{ticked:?}");
    assert_eq!(h.held(&run), None);
    // What the slice had left is not spent: 60 cents do not fit in the 59 left.
    let r = h.take(scopes, use_of(1, 60 * CENT), t0 + Duration::from_secs(2));
    assert!(matches!(r, Err(SliceError::Exhausted { .. })), "{r:?}");
    let settled = amounts(&cluster, &run, ["settled_nanos", "leased_nanos"]);
    assert_eq!(settled, [41 * CENT as i64, 0]);
}

#[test]
fn a_redefinition_changes_caps_only_and_never_below_what_is_out() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let run = Scope::new(ScopeKind::Run, "r");
    let m = manager(&cluster, "host-a", &LeaseClock::database());
    let none = Amounts::default();
    m.define(&run, caps(100, 10_000), use_of(10, 0), none)
        .expect("define");
    // A stale definer, no slice out: what is settled stays.
    m.define(&run, caps(100, 10_000), none, none)
        .expect("define");
    let cols = ["settled_attempts", "cap_attempts"];
    assert_eq!(amounts(&cluster, &run, cols), [10, 100]);
    // Two slices, a bill past the cap, one slice back: billed stays at its high water.
    let grant = |n| match m.grant(&run, use_of(0, n)) {
        Ok(Grant::Granted(l)) => l,
        other => panic!("{other:?}"),
    };
    let (one, _two) = (grant(4_500), grant(4_500));
    cluster.psql("SELECT tally_lease_step('run', 'r', 0, 3000, 0, 0, NULL, true)");
    m.release(one.id, none).expect("return");
    let out = ["settled_nanos", "leased_nanos", "billed_nanos"];
    assert_eq!(amounts(&cluster, &run, out), [3_000, 4_500, 2_000]);
    // A cap below the 7,500 settled and leased is refused, though the bill would allow it.
    let lower = m.define(&run, caps(100, 6_000), none, none);
    assert!(
        matches!(lower, Err(LeaseError::Overcommitted { .. })),
        "{lower:?}"
    );
    // A slice's capped dimensions are fixed at its grant: not changed while it is out.
    let uncapped = Caps {
        attempts: Some(100),
        ..Caps::default()
    };
    let r = m.define(&run, uncapped, none, none);
    assert!(matches!(r, Err(LeaseError::SlicesOut { .. })), "{r:?}");
    let r = m.reset(&run, none, none);
    assert!(matches!(r, Err(LeaseError::SlicesOut { .. })), "{r:?}");
    assert_eq!(
        amounts(&cluster, &run, ["cap_nanos", "settled_attempts"]),
        [10_000, 10]
    );
}

#[test]
fn a_refunded_attempt_leaves_its_principals_scope_counting_it() {
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
    let cap = Caps {
        attempts: Some(5),
        ..Caps::default()
    };
    let none = Amounts::default();
    manager(&cluster, "host-a", &LeaseClock::database())
        .define(&principal, cap, none, none)
        .expect("define");
    let attempt = check(&gate, agent, "p", "o1", 0).expect("allowed");
    // The tool refused before doing anything: the run's attempt is refunded, the
    // principal's period still counts it.
    outcome(
        &gate,
        agent,
        "p",
        attempt,
        tally_ledger::Status::Rejected,
        0,
    )
    .expect("outcome");
    assert_eq!(amounts(&cluster, &principal, ["settled_attempts"]), [1]);
}

#[test]
fn a_use_whose_refill_took_time_is_judged_on_every_slice_at_its_end() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let (a, b) = (
        Scope::new(ScopeKind::Run, "a"),
        Scope::new(ScopeKind::Principal, "7"),
    );
    let h = holder(&cluster, "host-a");
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
    // a's slice covers it when asked; b's refill ends past a's deadline.
    let reads = Cell::new(0u32);
    let clock = || {
        reads.set(reads.get() + 1);
        t0 + Duration::from_secs(if reads.get() == 1 { 1 } else { 20 })
    };
    let r = h.take_at(&[a.clone(), b.clone()], need, clock);
    assert!(matches!(r, Ok(Taken::Central)), "{r:?}");
    assert_eq!((h.held(&a), h.held(&b)), (None, None));
}

//! Tools' breakers from a view in the leased mode, on a real PostgreSQL (docs/FLEET.md,
//! "Breakers from a view"): with no tool rate bucket and no limit on calls in flight, a
//! decision at home reads the tool's breaker from its holder's view and neither locks
//! nor writes the tool's row; the holder's own failures trip its view at once, its
//! outcomes reach the row at its next tick (or at shutdown), and another holder's view
//! follows the row at its own next tick. The half-open probe stays central: one in the
//! fleet. Lease time and the gates' time are on manual clocks, ticks given their time:
//! nothing sleeps.

mod common;

use std::sync::Arc;
use std::time::Instant;

use common::lease::at_noon;
use common::Cluster;
use serde_json::json;
use tally_gate::backend::StateBackend;
use tally_gate::{Caller, CheckAnswer, Gate, GateError, Gatekeeper, ManualClock};
use tally_gate_postgres::{LeaseClock, Leased, Ticked, ViewLimits};
use tally_policy::{Recorded, Verdict};

const OPERATOR: Caller = Caller {
    uid: None,
    operator: true,
    proxied: false,
};

/// No tool rate bucket, no limit on calls in flight: the tools' breakers are viewed.
/// Three failures open a breaker for 30 s.
const POLICY: &str = "[rate]\ntool_per_sec = 0\ntool_in_flight = 0\n[breaker]\nfailures = 3\nopen_ms = 30000\nprobe_timeout_ms = 10000\n[approvals]\nask_on = []\n";

/// A leased gate named `holder` over its own ledger in `dir`: leases on `leases`, the
/// gate's time on `time`, its views kept within `views`.
fn host(
    cluster: &Cluster,
    dir: &std::path::Path,
    holder: &str,
    (leases, time): (&LeaseClock, &Arc<ManualClock>),
    views: ViewLimits,
) -> Gate<Leased> {
    let ledger = common::ledger(dir);
    let backend = common::lease::backend(cluster, &ledger, holder, leases, views);
    let policy = Recorded::new(POLICY).expect("policy");
    Gate::with_backend(ledger, backend, policy)
        .expect("gate")
        .with_clock(Arc::clone(time) as Arc<dyn tally_gate::Clock>)
}

/// Two hosts, `host-a` and `host-b`, on one lease clock and one gate clock, each with a
/// run of 100 attempts started through it (`ra`, `rb`).
struct Fleet {
    _dirs: [tempfile::TempDir; 2],
    a: Gate<Leased>,
    b: Gate<Leased>,
    time: Arc<ManualClock>,
}

fn fleet(cluster: &Cluster) -> Fleet {
    fleet_with(cluster, ViewLimits::default())
}

/// [`fleet`] with `a`'s views kept within `views`.
fn fleet_with(cluster: &Cluster, views: ViewLimits) -> Fleet {
    let leases = at_noon();
    let time = Arc::new(ManualClock::new(1_800_000_000_000));
    let dirs = [
        tempfile::tempdir().expect("dir"),
        tempfile::tempdir().expect("dir"),
    ];
    let clocks = (&leases, &time);
    let a = host(cluster, dirs[0].path(), "host-a", clocks, views);
    let b = host(
        cluster,
        dirs[1].path(),
        "host-b",
        clocks,
        ViewLimits::default(),
    );
    for (gate, run) in [(&a, "ra"), (&b, "rb")] {
        let req = json!({"run": run, "budget": {"attempts": 100}});
        gate.start_blocking(OPERATOR, serde_json::from_value(req).expect("start"))
            .expect("start");
    }
    Fleet {
        _dirs: dirs,
        a,
        b,
        time,
    }
}

/// A check of a call of the tool `llm` not made before (no loop rule trips).
fn check(gate: &Gate<Leased>, run: &str) -> Result<CheckAnswer, GateError> {
    check_tool(gate, run, "llm")
}

/// A check of a call of `tool` not made before.
fn check_tool(gate: &Gate<Leased>, run: &str, tool: &str) -> Result<CheckAnswer, GateError> {
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let req = json!({"run": run, "tool": tool, "operation": format!("q{n}"), "effect": "read"});
    gate.check_blocking(OPERATOR, serde_json::from_value(req).expect("check"))
}

fn outcome(gate: &Gate<Leased>, run: &str, attempt: u64, status: &str) {
    let req = json!({"run": run, "attempt": attempt, "status": status});
    gate.outcome_blocking(OPERATOR, serde_json::from_value(req).expect("outcome"))
        .expect("outcome recorded");
}

/// An allowed check's attempt (the test fails otherwise).
fn allowed(gate: &Gate<Leased>, run: &str) -> u64 {
    let a = check(gate, run).expect("decided");
    assert_eq!(a.decision, Verdict::Allow, "{a:?}");
    a.attempt.expect("attempt")
}

/// `n` calls allowed, each reporting a failure.
fn fail(gate: &Gate<Leased>, run: &str, n: usize) {
    for _ in 0..n {
        let attempt = allowed(gate, run);
        outcome(gate, run, attempt, "error");
    }
}

fn verdict(r: Result<CheckAnswer, GateError>) -> String {
    match r {
        Ok(a) => match a.reason {
            None => format!("{:?}", a.decision),
            Some(reason) => format!("{:?} {reason:?}", a.decision),
        },
        Err(GateError::Unavailable(_)) => "unavailable".into(),
        Err(e) => format!("error {e}"),
    }
}

const OPEN: &str = "Deny CircuitOpen";

/// One tick of `gate`'s holder (its slices' work, then its breakers flushed and
/// refreshed): its report.
fn tick(gate: &Gate<Leased>) -> Ticked {
    gate.backend().slices().tick(Instant::now())
}

/// Decisions at home committed in the group commit so far: a decision on a tool read
/// from the view is one (nothing sent while it is made), one that locks the tool's
/// row is not.
fn grouped(gate: &Gate<Leased>) -> u64 {
    use tally_gate::backend::StateBackend;
    gate.backend()
        .lease_counts()
        .and_then(|c| c.into_iter().find(|(e, _)| *e == "group_decisions"))
        .map_or(0, |(_, n)| n)
}

/// The count of lease event `event` of `gate`'s holder (as `/metrics` shows it in
/// `tally_lease_events_total`).
fn count(gate: &Gate<Leased>, event: &str) -> u64 {
    let counts = gate.backend().slices().metrics().counts();
    counts
        .into_iter()
        .find(|(e, _)| *e == event)
        .map(|(_, n)| n)
        .expect("a counted event")
}

#[test]
fn a_failure_burst_at_home_trips_here_at_once_and_on_a_second_holder_within_one_tick() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let f = fleet(&cluster);
    // The first decisions read the tool's row (no view yet), and start the views.
    let first = allowed(&f.a, "ra");
    outcome(&f.a, "ra", first, "ok");
    allowed(&f.b, "rb");
    // At home, closed: one round trip per decision (the run's guarded write, its version
    // and the commit, in the group commit), the tool's row neither locked nor written.
    let trips = || f.a.backend_round_trips().expect("counted");
    let before = trips();
    let attempt = allowed(&f.a, "ra");
    assert_eq!(trips() - before, 1, "a check at home, breaker closed");
    let before = trips();
    outcome(&f.a, "ra", attempt, "ok");
    assert_eq!(trips() - before, 1, "an outcome at home, breaker closed");
    // Three failures here: refused here at once, with the core's reason.
    fail(&f.a, "ra", 3);
    assert_eq!(verdict(check(&f.a, "ra")), OPEN, "tripped here at once");
    assert_eq!(
        f.a.backend().unflushed(),
        5,
        "five outcomes not yet in the row"
    );
    // Not yet on b (its view is the row's, which has not heard of them).
    allowed(&f.b, "rb");
    tick(&f.a);
    assert_eq!(
        f.a.backend().unflushed(),
        0,
        "folded into the row at the tick"
    );
    allowed(&f.b, "rb");
    tick(&f.b);
    assert_eq!(verdict(check(&f.b, "rb")), OPEN, "on b within one tick");
    assert_eq!(verdict(check(&f.a, "ra")), OPEN, "still here");
}

#[test]
fn a_half_open_probe_is_granted_once_across_the_fleet() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let f = fleet(&cluster);
    allowed(&f.b, "rb");
    fail(&f.a, "ra", 3);
    tick(&f.a);
    tick(&f.b);
    assert_eq!(verdict(check(&f.b, "rb")), OPEN);
    f.time.advance(30_000);
    // Both views say half-open: each decision goes the central way, which leases the
    // one probe.
    let probe = allowed(&f.a, "ra");
    assert_eq!(verdict(check(&f.b, "rb")), OPEN, "the probe is a's");
    assert_eq!(verdict(check(&f.a, "ra")), OPEN, "one probe at a time");
    tick(&f.b);
    assert_eq!(verdict(check(&f.b, "rb")), OPEN, "after b's tick too");
    outcome(&f.a, "ra", probe, "ok");
    allowed(&f.a, "ra");
    allowed(&f.b, "rb");
    tick(&f.b);
    allowed(&f.b, "rb");
}

#[test]
fn outcomes_seen_before_a_clean_stop_reach_the_row() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let f = fleet(&cluster);
    allowed(&f.b, "rb");
    fail(&f.a, "ra", 3);
    assert_eq!(verdict(check(&f.a, "ra")), OPEN);
    assert_eq!(f.a.backend().unflushed(), 3);
    // Serving ends: what is pending is folded in before the slices go back.
    Gatekeeper::close(&f.a);
    assert_eq!(f.a.backend().unflushed(), 0);
    tick(&f.b);
    assert_eq!(verdict(check(&f.b, "rb")), OPEN, "b hears of them");
}

#[test]
fn a_holder_dropped_without_a_flush_loses_only_its_unflushed_outcomes() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let f = fleet(&cluster);
    allowed(&f.b, "rb");
    fail(&f.a, "ra", 2);
    tick(&f.a);
    fail(&f.a, "ra", 1);
    assert_eq!(verdict(check(&f.a, "ra")), OPEN, "three failures here");
    assert_eq!(f.a.backend().unflushed(), 1);
    // Killed: its last failure never reached the row, the first two did.
    let Fleet { a, b, .. } = f;
    drop(a);
    tick(&b);
    allowed(&b, "rb");
    fail(&b, "rb", 1);
    assert_eq!(verdict(check(&b, "rb")), OPEN, "two from a and one here");
}

/// The tool's row's bytes, as hex.
fn row_hex(cluster: &Cluster, tool: &str) -> String {
    let sql = format!("SELECT encode(state, 'hex') FROM tally_tools WHERE name = '{tool}'");
    cluster.psql(&sql).trim().to_owned()
}

/// The tool's row set to `hex` (empty: bytes the decoder refuses).
fn set_row(cluster: &Cluster, tool: &str, hex: &str) {
    cluster.psql(&format!(
        "UPDATE tally_tools SET state = decode('{hex}', 'hex') WHERE name = '{tool}'"
    ));
}

#[test]
fn a_row_the_decoder_refuses_is_skipped_counted_and_its_tool_refused_while_the_others_refresh() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let f = fleet(&cluster);
    for tool in ["llm", "web"] {
        let a = check_tool(&f.b, "rb", tool).expect("decided");
        assert_eq!(a.decision, Verdict::Allow, "{tool} on b: {a:?}");
    }
    fail(&f.a, "ra", 3);
    assert!(
        !tick(&f.a).unavailable,
        "a's flush and refresh went through"
    );
    set_row(&cluster, "web", "");
    let t = tick(&f.b);
    assert_eq!(t.breakers.unreadable, 1, "{t:?}");
    assert!(!t.breakers.refresh_failed, "{t:?}");
    assert!(t.unavailable, "the tick says some of its work failed");
    assert_eq!(count(&f.b, "breaker_unreadable"), 1);
    // The other tool's view followed its row all the same.
    assert_eq!(verdict(check(&f.b, "rb")), OPEN, "llm refreshed on b");
    // The unreadable one is decided centrally, where its row is refused again: never
    // allowed on a guess.
    for _ in 0..2 {
        let v = verdict(check_tool(&f.b, "rb", "web"));
        assert!(v.starts_with("error") || v == "unavailable", "{v}");
    }
}

#[test]
fn a_failed_flush_is_reported_counted_and_kept_then_folded_once_the_row_reads_again() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let f = fleet(&cluster);
    allowed(&f.b, "rb");
    fail(&f.a, "ra", 3);
    let unflushed = |g: &Gate<Leased>| StateBackend::breaker_outcomes_unflushed(g.backend());
    assert_eq!(unflushed(&f.a), Some(3), "the gauge /metrics shows");
    let good = row_hex(&cluster, "llm");
    set_row(&cluster, "llm", "");
    let t = tick(&f.a);
    assert_eq!(t.breakers.flush_failed, 1, "{t:?}");
    assert_eq!(t.breakers.flushed, 0, "{t:?}");
    assert_eq!(t.breakers.unflushed, 3, "{t:?}");
    assert!(t.unavailable, "{t:?}");
    assert_eq!(count(&f.a, "breaker_flush_failed"), 1);
    assert_eq!(unflushed(&f.a), Some(3), "kept for the next tick");
    assert_ne!(
        verdict(check(&f.a, "ra")),
        "Allow",
        "never allowed on a guess"
    );
    // The row reads again: the kept outcomes are folded in, once.
    set_row(&cluster, "llm", &good);
    let t = tick(&f.a);
    assert_eq!((t.breakers.flushed, t.breakers.unflushed), (1, 0), "{t:?}");
    assert!(!t.unavailable, "{t:?}");
    assert_eq!(count(&f.a, "breaker_flushed"), 1, "{t:?}");
    assert_eq!(unflushed(&f.a), Some(0));
    tick(&f.b);
    assert_eq!(verdict(check(&f.b, "rb")), OPEN, "b hears of all three");
}

#[test]
fn at_the_batch_bound_a_tools_decisions_go_central_until_a_flush() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let f = fleet_with(
        &cluster,
        ViewLimits {
            batch: 4,
            ..ViewLimits::default()
        },
    );
    let trips = || grouped(&f.a);
    allowed(&f.a, "ra");
    while f.a.backend().unflushed() < 4 {
        let attempt = allowed(&f.a, "ra");
        outcome(&f.a, "ra", attempt, "ok");
    }
    assert_eq!(f.a.backend().unflushed(), 4);
    // At the bound: the tool's row is locked and written per decision again.
    let before = trips();
    let attempt = allowed(&f.a, "ra");
    assert_eq!(trips() - before, 0, "central at the bound");
    outcome(&f.a, "ra", attempt, "ok");
    assert_eq!(f.a.backend().unflushed(), 4, "nothing more kept");
    let t = tick(&f.a);
    assert_eq!((t.breakers.flushed, t.breakers.unflushed), (1, 0), "{t:?}");
    let before = trips();
    allowed(&f.a, "ra");
    assert_eq!(trips() - before, 1, "from the view again");
}

#[test]
fn tools_beyond_the_views_kept_and_idle_views_dropped_are_decided_centrally() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let f = fleet_with(
        &cluster,
        ViewLimits {
            views: 1,
            ..ViewLimits::default()
        },
    );
    // 1: decided from the view, in the group commit; 0: the tool's row locked.
    let trips = || grouped(&f.a);
    let one = |tool: &str| {
        let before = trips();
        let a = check_tool(&f.a, "ra", tool).expect("decided");
        assert_eq!(a.decision, Verdict::Allow, "{a:?}");
        trips() - before
    };
    one("llm");
    assert_eq!(one("llm"), 1, "llm viewed");
    one("web");
    assert_eq!(one("web"), 0, "web beyond the one view kept: central");
    // llm read since the last refresh: kept; then idle a whole tick: dropped.
    assert_eq!(tick(&f.a).breakers.dropped, 0);
    assert_eq!(tick(&f.a).breakers.dropped, 1);
    assert_eq!(one("web"), 0, "central once more");
    assert_eq!(one("web"), 1, "web viewed in llm's place");
    assert_eq!(
        one("llm"),
        0,
        "llm's view dropped, and no room for it: central"
    );
}

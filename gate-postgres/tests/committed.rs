//! A slice's committed use on a real PostgreSQL (docs/FLEET.md, "Committed use"):
//! every decision at home commits what it took of its slice (and gave back on it) with
//! its run's write, so a reclaim settles exactly what the holder's decisions committed
//! and gives the rest back (once, whatever number of reclaimers race), a restarted
//! holder adopts its slices with their committed use, and a use committed on a slice
//! reclaimed meanwhile is refused, nothing counted. Lease time is on manual clocks and
//! ticks are given their time: nothing sleeps.

mod common;

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant, SystemTime};

use common::lease::{amounts, at_noon, manager, MARGIN, TTL};
use common::Cluster;
use serde_json::json;
use tally_gate::{Caller, CheckAnswer, Gate, GateError};
use tally_gate_postgres::{
    Amounts, Grant, LeaseClock, Leased, Scope, ScopeKind, Slices, ViewLimits,
};
use tally_policy::{Recorded, Verdict};

const OPERATOR: Caller = Caller {
    uid: None,
    operator: true,
    proxied: false,
};

/// Nanodollars in a cent.
const CENT: i64 = 10_000_000;

/// A leased gate named `holder` over its ledger in `dir`, leases on `clock`.
struct Host {
    gate: Gate<Leased>,
    slices: Arc<Slices>,
}

fn leased(cluster: &Cluster, dir: &std::path::Path, holder: &str, clock: &LeaseClock) -> Host {
    let ledger = common::ledger(dir);
    let backend = common::lease::backend(cluster, &ledger, holder, clock, ViewLimits::default());
    let slices = Arc::clone(backend.slices());
    let policy = Recorded::new("[approvals]\nask_on = []\n").expect("policy");
    let gate = Gate::with_backend(ledger, backend, policy).expect("gate");
    Host { gate, slices }
}

fn start(host: &Host, req: serde_json::Value) {
    host.gate
        .start_blocking(OPERATOR, serde_json::from_value(req).expect("start"))
        .expect("start");
}

/// A check of a call not made before, reserving `cents`.
fn check(host: &Host, run: &str, cents: u64) -> Result<CheckAnswer, GateError> {
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let req = json!({"run": run, "tool": "llm", "operation": format!("c{n}"), "effect": "read", "reserve_cents": cents});
    host.gate
        .check_blocking(OPERATOR, serde_json::from_value(req).expect("check"))
}

/// A check that must be allowed: its attempt.
fn allowed(host: &Host, run: &str, cents: u64) -> u64 {
    let a = check(host, run, cents).expect("answered");
    assert_eq!(a.decision, Verdict::Allow, "{a:?}");
    a.attempt.expect("attempt")
}

fn outcome(host: &Host, run: &str, attempt: u64, cents: u64) {
    let req = json!({"run": run, "attempt": attempt, "status": "ok", "settled_cents": cents});
    host.gate
        .outcome_blocking(OPERATOR, serde_json::from_value(req).expect("outcome"))
        .expect("outcome");
}

/// Slice `id`'s state and committed attempts and nanodollars, as the database holds them
/// (`null` where not known).
fn committed(cluster: &Cluster, id: i64) -> String {
    cluster
        .psql(&format!(
            "SELECT state || ' ' || coalesce(committed_attempts::text, 'null') || ' ' || \
             coalesce(committed_nanos::text, 'null') FROM tally_leases WHERE id = {id}"
        ))
        .trim()
        .to_owned()
}

/// The id of the slice of `run`'s scope `holder` holds.
fn slice_of(cluster: &Cluster, run: &str, holder: &str) -> i64 {
    cluster
        .psql(&format!(
            "SELECT id FROM tally_leases WHERE kind = 'run' AND key = '{run}' \
             AND holder = '{holder}' AND state = 'held'"
        ))
        .trim()
        .parse()
        .expect("one held slice")
}

/// The run's scope settled and leased, attempts and nanodollars.
fn scope_counts(cluster: &Cluster, run: &str) -> [i64; 4] {
    amounts(
        cluster,
        &Scope::new(ScopeKind::Run, run),
        [
            "settled_attempts",
            "settled_nanos",
            "leased_attempts",
            "leased_nanos",
        ],
    )
}

/// Host `host-a` used 3 attempts of its 10-attempt slice of run `r` (13 attempts, 400
/// cents) and 50 cents of its 300-cent slice (three reservations of 30 cents, two
/// settled at 10), then died without giving anything back. Its slice's id.
fn three_used_then_dead(cluster: &Cluster, dir: &std::path::Path, clock: &LeaseClock) -> i64 {
    let a = leased(cluster, dir, "host-a", clock);
    start(
        &a,
        json!({"run": "r", "budget": {"attempts": 13, "spend_cents": 400}}),
    );
    let first = allowed(&a, "r", 30);
    let second = allowed(&a, "r", 30);
    outcome(&a, "r", first, 10);
    outcome(&a, "r", second, 10);
    allowed(&a, "r", 30);
    let scope = Scope::new(ScopeKind::Run, "r");
    let (granted, used) = a.slices.held(&scope).expect("a slice");
    assert_eq!(
        (granted.attempts, granted.nanos, used.attempts, used.nanos),
        (10, 300 * 10_000_000, 3, 50 * 10_000_000),
        "a 10-attempt, 300-cent slice, 3 attempts and 50 cents of it used"
    );
    let id = slice_of(cluster, "r", "host-a");
    assert_eq!(
        committed(cluster, id),
        format!("held 3 {}", 50 * CENT),
        "committed with the decisions"
    );
    // Host a dies holding its slice: nothing given back.
    drop(a);
    id
}

#[test]
fn a_dead_holders_slice_reclaimed_by_eight_at_once_settles_exactly_its_committed_use_once() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let clock = at_noon();
    let dir = tempfile::tempdir().expect("dir");
    let id = three_used_then_dead(&cluster, dir.path(), &clock);
    assert_eq!(
        scope_counts(&cluster, "r"),
        [0, 0, 10, 300 * CENT],
        "the slice is out"
    );
    clock.advance(TTL + MARGIN + Duration::from_secs(1));
    let reclaimers: Vec<_> = (0..8)
        .map(|i| manager(&cluster, &format!("reclaimer-{i}"), &clock))
        .collect();
    let gate = Arc::new(Barrier::new(reclaimers.len()));
    let reclaimed: Vec<_> = std::thread::scope(|s| {
        let each: Vec<_> = reclaimers
            .iter()
            .map(|m| {
                let gate = Arc::clone(&gate);
                s.spawn(move || {
                    gate.wait();
                    m.reclaim_expired().expect("reclaim")
                })
            })
            .collect();
        each.into_iter()
            .flat_map(|h| h.join().expect("reclaimer"))
            .collect()
    });
    assert_eq!(reclaimed.len(), 1, "reclaimed once: {reclaimed:?}");
    let r = &reclaimed[0];
    assert_eq!(
        (r.id, r.settled.attempts, r.settled.nanos),
        (id, 3, 50 * 10_000_000),
        "settles its committed use"
    );
    assert_eq!(
        scope_counts(&cluster, "r"),
        [3, 50 * CENT, 0, 0],
        "exactly the used part settled, the rest given back"
    );
    assert_eq!(
        committed(&cluster, id),
        format!("reclaimed 3 {}", 50 * CENT)
    );
    // The rest is grantable again, and no more.
    let other = manager(&cluster, "host-x", &clock);
    let scope = Scope::new(ScopeKind::Run, "r");
    let rest = Amounts {
        attempts: 10,
        nanos: 350 * 10_000_000,
        ..Amounts::default()
    };
    let more = Amounts {
        attempts: 1,
        ..Amounts::default()
    };
    assert!(matches!(other.grant(&scope, rest), Ok(Grant::Granted(_))));
    assert!(matches!(
        other.grant(&scope, more),
        Ok(Grant::Refused { .. })
    ));
}

#[test]
fn a_restarted_holder_adopts_its_slice_with_its_committed_use() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let clock = at_noon();
    let dir = tempfile::tempdir().expect("dir");
    let id = three_used_then_dead(&cluster, dir.path(), &clock);
    // The same holder back: its slice adopted and given back saying what was committed.
    let a = leased(&cluster, dir.path(), "host-a", &clock);
    assert_eq!(committed(&cluster, id), format!("returned 3 {}", 50 * CENT));
    assert_eq!(
        scope_counts(&cluster, "r"),
        [3, 50 * CENT, 0, 0],
        "settled its committed use, not the whole slice"
    );
    assert_eq!(allowed(&a, "r", 0), 4, "the run goes on from its row");
}

#[test]
fn a_use_committed_on_a_slice_reclaimed_meanwhile_is_refused_and_counts_nothing() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    // Host a's clock runs slow past the margin: to it the slice is still valid when a
    // reclaimer, whose clock is right, reclaims it.
    let slow = at_noon();
    let right = LeaseClock::manual(
        SystemTime::UNIX_EPOCH
            + Duration::from_secs(1_800_000_000)
            + TTL
            + MARGIN
            + Duration::from_secs(1),
    );
    let dir = tempfile::tempdir().expect("dir");
    let a = leased(&cluster, dir.path(), "host-a", &slow);
    start(&a, json!({"run": "l", "budget": {"attempts": 13}}));
    assert_eq!(allowed(&a, "l", 0), 1);
    let id = slice_of(&cluster, "l", "host-a");
    let reclaimer = manager(&cluster, "reclaimer", &right);
    assert_eq!(reclaimer.reclaim_expired().expect("reclaim").len(), 1);
    assert_eq!(scope_counts(&cluster, "l")[..3], [1, 0, 0]);
    // The use fits in the slice a still holds: decided, then refused at its commit.
    assert!(
        matches!(check(&a, "l", 0), Err(GateError::Unavailable(_))),
        "a late use on a reclaimed slice is refused"
    );
    assert_eq!(
        committed(&cluster, id),
        "reclaimed 1 0",
        "nothing counted on it"
    );
    assert_eq!(
        scope_counts(&cluster, "l")[..3],
        [1, 0, 0],
        "nor in the scope"
    );
    // At its next tick a finds its slice ended; its next use is on a new slice, and
    // the refused one never took an attempt.
    a.slices.tick(Instant::now());
    assert_eq!(
        scope_counts(&cluster, "l")[..3],
        [1, 0, 0],
        "its return, after the reclaim, moved nothing"
    );
    assert_eq!(
        ended(&cluster, id),
        "returned 1 true",
        "nothing counted past the use"
    );
    assert_eq!(allowed(&a, "l", 0), 2);
    let new = slice_of(&cluster, "l", "host-a");
    assert_ne!(new, id);
    assert_eq!(committed(&cluster, new), "held 1 0");
}

/// A database of schema 10 (no committed use), populated: a holder's slice out with 3
/// attempts used of it. Opened by this build, it is migrated: that slice's use is not
/// known (settled whole when reclaimed), and slices granted since count theirs.
#[test]
fn a_populated_schema_10_database_is_migrated_its_slices_out_settled_whole() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let clock = at_noon();
    let dir = tempfile::tempdir().expect("dir");
    let id = three_used_then_dead(&cluster, dir.path(), &clock);
    // What schema 10 left: no committed use, the guarded write of seven arguments only.
    cluster.psql(
        "ALTER TABLE tally_leases DROP CONSTRAINT tally_leases_committed_within, \
         DROP COLUMN committed_attempts, DROP COLUMN committed_nanos, \
         DROP COLUMN committed_effects, DROP COLUMN committed_polls, DROP COLUMN covers_use; \
         DROP FUNCTION tally_home_write(text, bytea, boolean, text, bigint, text, bigint, \
         text, bigint, bigint, bigint[], bigint, bigint[], timestamptz); \
         UPDATE tally_schema SET version = 10",
    );
    let dir_b = tempfile::tempdir().expect("dir");
    let b = leased(&cluster, dir_b.path(), "host-b", &clock);
    assert_eq!(
        cluster.psql("SELECT max(version) FROM tally_schema").trim(),
        tally_gate_postgres::SCHEMA_VERSION.to_string()
    );
    assert_eq!(committed(&cluster, id), "held null null", "not known");
    assert!(matches!(check(&b, "r", 0), Err(GateError::Unavailable(_))));
    clock.advance(TTL + MARGIN + Duration::from_secs(1));
    assert_eq!(b.slices.tick(Instant::now()).reclaimed, 1);
    assert_eq!(
        scope_counts(&cluster, "r"),
        [10, 300 * CENT, 0, 0],
        "a slice of unknown use settled whole"
    );
    assert_eq!(allowed(&b, "r", 0), 4, "the row holds what a answered");
    let new = slice_of(&cluster, "r", "host-b");
    assert_eq!(committed(&cluster, new), "held 1 0", "counted from 0");
}

/// A reclaimed slice whose committed use was known settled exactly that use, which no
/// return of its holder takes back: a central spend past what is left is refused as out
/// of room for good (`Refused`), not as room leased out that may come back (`Leased`,
/// what a reclaimed slice of unknown use still answers).
#[test]
fn a_reclaimed_slice_of_known_use_is_no_room_that_may_come_back() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let clock = at_noon();
    let known = Scope::new(ScopeKind::Run, "known");
    let unknown = Scope::new(ScopeKind::Run, "unknown");
    // Two holders: one whose uses are committed, one whose are not.
    let committing = manager(&cluster, "host-a", &clock);
    committing.commits_use();
    let plain = manager(&cluster, "host-b", &clock);
    let ten = Amounts {
        attempts: 10,
        ..Amounts::default()
    };
    let caps = tally_gate_postgres::Caps {
        attempts: Some(10),
        ..tally_gate_postgres::Caps::default()
    };
    let none = Amounts::default();
    let spender = manager(&cluster, "host-x", &clock);
    for (scope, holder) in [(&known, &committing), (&unknown, &plain)] {
        spender.define(scope, caps, none, none).expect("define");
        let Ok(Grant::Granted(lease)) = holder.grant(scope, ten) else {
            panic!("granted");
        };
        assert_eq!(lease.committed.is_some(), scope == &known);
        if lease.committed.is_some() {
            // Its holder's decisions committed all of it (as `tally_home_write` does).
            cluster.psql(&format!(
                "UPDATE tally_leases SET committed_attempts = 10 WHERE id = {}",
                lease.id
            ));
        }
    }
    clock.advance(TTL + MARGIN + Duration::from_secs(1));
    assert_eq!(spender.reclaim_expired().expect("reclaim").len(), 2);
    let one = Amounts {
        attempts: 1,
        ..Amounts::default()
    };
    let known_spent = spender.spend(&[known], one).expect("spend");
    let unknown_spent = spender.spend(&[unknown], one).expect("spend");
    assert_eq!(
        format!("{known_spent:?} {unknown_spent:?}"),
        "Refused Leased",
        "only a slice of unknown use may still be refunded"
    );
}

/// Host a's clock runs slow past the margin: to it slice `id` of run `l` (13 attempts) is
/// still valid when a reclaimer, whose clock is right, reclaims it, settling the one
/// attempt a's decision committed on it. The host, the slice's id and the run's scope.
fn reclaimed_under_a_slow_clock(cluster: &Cluster, dir: &std::path::Path) -> (Host, i64, Scope) {
    let slow = at_noon();
    let right = LeaseClock::manual(
        SystemTime::UNIX_EPOCH
            + Duration::from_secs(1_800_000_000)
            + TTL
            + MARGIN
            + Duration::from_secs(1),
    );
    let a = leased(cluster, dir, "host-a", &slow);
    start(&a, json!({"run": "l", "budget": {"attempts": 13}}));
    assert_eq!(allowed(&a, "l", 0), 1);
    let id = slice_of(cluster, "l", "host-a");
    let reclaimer = manager(cluster, "reclaimer", &right);
    assert_eq!(reclaimer.reclaim_expired().expect("reclaim").len(), 1);
    assert_eq!(
        scope_counts(cluster, "l")[..3],
        [1, 0, 0],
        "its committed use"
    );
    (a, id, Scope::new(ScopeKind::Run, "l"))
}

/// One attempt.
fn one() -> Amounts {
    Amounts {
        attempts: 1,
        ..Amounts::default()
    }
}

/// Host a's use counted on `scope`'s slice it holds (its decision not written yet):
/// the slice's id.
fn counted(a: &Host, scope: &Scope) -> i64 {
    let (_, on) = a
        .slices
        .take_on(std::slice::from_ref(scope), one(), Instant::now)
        .expect("taken");
    on.expect("on its slice")
}

/// The write of a decision of host-a at home on run `l` that took one attempt of slice
/// `id`, as a group commit sends it (`tally_home_write`, the slow clock's time):
/// `accepted`, or `refused: ` and why.
fn late_write(cluster: &Cluster, id: i64) -> String {
    cluster
        .psql(&format!(
            "CREATE FUNCTION pg_temp.w() RETURNS text LANGUAGE plpgsql AS $f$ BEGIN
                 PERFORM tally_home_write(name, state, open, home, home_epoch, home, home_epoch,
                     home, home_epoch, {id}, ARRAY[1, 0, 0, 0]::bigint[], NULL, NULL,
                     to_timestamp(1800000000))
                 FROM tally_runs WHERE name = 'l';
                 RETURN 'accepted';
             EXCEPTION WHEN serialization_failure THEN
                 RETURN 'refused: ' || SQLERRM;
             END $f$;
             SELECT pg_temp.w()"
        ))
        .lines()
        .last()
        .unwrap_or_default()
        .to_owned()
}

/// Slice `id`'s state, the attempts its end settled and whether its return settled all
/// its holder said it used.
fn ended(cluster: &Cluster, id: i64) -> String {
    cluster
        .psql(&format!(
            "SELECT state || ' ' || used_attempts || ' ' || coalesce(covers_use::text, 'null') \
             FROM tally_leases WHERE id = {id}"
        ))
        .trim()
        .to_owned()
}

/// A use counted on a slice reclaimed meanwhile; the holder's tick then returns the
/// slice (its renewal refused) saying that use: the reclaim settled only the committed
/// use, so the return moves nothing and does not vouch for the use; the use's write
/// comes after, and is refused; rolled back, it gives back nothing (it was never
/// counted). The scope stays at the one attempt committed.
#[test]
fn a_late_use_on_a_slice_reclaimed_then_returned_is_refused_and_gives_nothing_back() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let dir = tempfile::tempdir().expect("dir");
    let (a, id, scope) = reclaimed_under_a_slow_clock(&cluster, dir.path());
    assert_eq!(counted(&a, &scope), id);
    // The tick between the use's count and its write.
    a.slices.tick(Instant::now());
    assert!(!a.slices.holds(&scope, id));
    assert_eq!(
        ended(&cluster, id),
        "returned 1 false",
        "the reclaim's use kept"
    );
    assert_eq!(scope_counts(&cluster, "l")[..3], [1, 0, 0]);
    let w = late_write(&cluster, id);
    assert!(w.starts_with("refused: slice"), "{w}");
    assert_eq!(committed(&cluster, id), "returned 1 0");
    // Its decision rolled back, answered after the tick.
    a.slices.untake(&scope, Some(id), one());
    assert_eq!(
        scope_counts(&cluster, "l")[..3],
        [1, 0, 0],
        "the committed attempt stays settled: nothing given back"
    );
}

/// The same use's write before the tick: refused (the slice reclaimed); the tick then
/// returns the slice, and the decision's rollback is answered after it: the room is
/// not given back a second time (the reclaim gave back all but the committed use).
#[test]
fn a_use_refused_before_its_slice_went_back_is_not_given_back_twice() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let dir = tempfile::tempdir().expect("dir");
    let (a, id, scope) = reclaimed_under_a_slow_clock(&cluster, dir.path());
    assert_eq!(counted(&a, &scope), id);
    let w = late_write(&cluster, id);
    assert!(w.starts_with("refused: slice"), "{w}");
    a.slices.tick(Instant::now());
    assert!(!a.slices.holds(&scope, id));
    a.slices.untake(&scope, Some(id), one());
    assert_eq!(scope_counts(&cluster, "l")[..3], [1, 0, 0]);
    // The run goes on, on a new slice, from the one attempt answered.
    assert_eq!(allowed(&a, "l", 0), 2);
    assert_eq!(scope_counts(&cluster, "l")[..1], [1]);
}

/// A slice returned while held, saying two uses counted after its committed one: the
/// return settled them, so one's late write is accepted (counted in the return), and the
/// other's rollback gives its attempt back, within what the return said.
#[test]
fn a_late_use_on_a_slice_returned_while_held_is_counted_in_its_return() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let dir = tempfile::tempdir().expect("dir");
    let a = leased(&cluster, dir.path(), "host-a", &at_noon());
    start(&a, json!({"run": "l", "budget": {"attempts": 13}}));
    assert_eq!(allowed(&a, "l", 0), 1);
    let scope = Scope::new(ScopeKind::Run, "l");
    let id = counted(&a, &scope);
    assert_eq!(counted(&a, &scope), id);
    a.slices.close();
    assert_eq!(ended(&cluster, id), "returned 3 true");
    assert_eq!(scope_counts(&cluster, "l")[..3], [3, 0, 0]);
    assert_eq!(late_write(&cluster, id), "accepted");
    a.slices.untake(&scope, Some(id), one());
    assert_eq!(scope_counts(&cluster, "l")[..3], [2, 0, 0]);
}

/// Rolling upgrade: a build of schema 10 reclaims a slice whose use is known (its
/// statement settles the slice whole and records nothing of what): the room beyond the
/// committed use may still come back (a central spend is refused as leased out, not out
/// of room for good), and the holder's return refunds it.
#[test]
fn a_slice_of_known_use_reclaimed_by_a_schema_10_build_is_refunded_at_its_return() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let clock = at_noon();
    let scope = Scope::new(ScopeKind::Run, "v10");
    let holder = manager(&cluster, "host-a", &clock);
    holder.commits_use();
    let spender = manager(&cluster, "host-x", &clock);
    let caps = tally_gate_postgres::Caps {
        attempts: Some(10),
        ..tally_gate_postgres::Caps::default()
    };
    let none = Amounts::default();
    spender.define(&scope, caps, none, none).expect("define");
    let ten = Amounts {
        attempts: 10,
        ..Amounts::default()
    };
    let Ok(Grant::Granted(lease)) = holder.grant(&scope, ten) else {
        panic!("granted");
    };
    // One use committed on it; then schema 10's reclaim, as its build runs it.
    cluster.psql(&format!(
        "UPDATE tally_leases SET committed_attempts = 1 WHERE id = {id}; \
         UPDATE tally_leases SET state = 'reclaimed', ended_at = now() WHERE id = {id}; \
         UPDATE tally_lease_scopes SET leased_attempts = leased_attempts - 10, \
             settled_attempts = settled_attempts + 10 WHERE key = 'v10'",
        id = lease.id
    ));
    let spent = spender
        .spend(std::slice::from_ref(&scope), one())
        .expect("spend");
    assert_eq!(format!("{spent:?}"), "Leased", "room that may come back");
    assert_eq!(
        holder.release(lease.id, one()).expect("returned"),
        tally_gate_postgres::Released::Refunded
    );
    assert_eq!(
        amounts(&cluster, &scope, ["settled_attempts", "leased_attempts"]),
        [1, 0],
        "the committed use settled, the rest refunded"
    );
}

/// A session holding `tally_leases` (a backup's `pg_dump`, a reader idle in its
/// transaction) until its stdin is dropped: the session and its stdin, once it holds it.
fn reader_holding_slices(cluster: &Cluster) -> (std::process::Child, std::process::ChildStdin) {
    use std::io::{BufRead, Write};
    let mut reader = std::process::Command::new("psql")
        .args([cluster.url().as_str(), "-qAt", "-v", "ON_ERROR_STOP=1"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("psql");
    let mut to = reader.stdin.take().expect("stdin");
    to.write_all(b"BEGIN; LOCK TABLE tally_leases IN ACCESS SHARE MODE; SELECT 'locked';\n")
        .expect("sent");
    let mut line = String::new();
    std::io::BufReader::new(reader.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("read");
    assert_eq!(line.trim(), "locked", "the reader holds the table");
    (reader, to)
}

/// Open a lease manager as `holder` on another thread: its answer, or `None` if it has
/// not answered within a minute (a failure bound, not an ordering: it answers at once,
/// or within its own bound).
fn open_within(cluster: &Cluster, holder: &str) -> Option<Result<(), String>> {
    let (url, holder) = (cluster.url(), holder.to_owned());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let opened = tally_gate_postgres::Leases::open(
            &tally_gate_postgres::Options::new(&url),
            &holder,
            tally_gate_postgres::LeaseOptions {
                ttl: TTL,
                margin: MARGIN,
                clock: at_noon(),
            },
        );
        let _ = tx.send(opened.map(drop).map_err(|e| e.to_string()));
    });
    rx.recv_timeout(Duration::from_secs(60)).ok()
}

/// A database at this schema opened while a reader holds its slices' table: the open
/// runs no table DDL again (no lock that would queue behind the reader, and every group
/// commit behind it), so it opens at once.
#[test]
fn a_database_at_this_schema_opens_beside_a_reader_of_its_slices() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    drop(manager(&cluster, "host-a", &at_noon()));
    let (mut reader, to) = reader_holding_slices(&cluster);
    let opened = open_within(&cluster, "host-b");
    drop(to);
    reader.wait().expect("reader ended");
    assert_eq!(opened, Some(Ok(())));
}

/// A database of schema 10 opened while a reader holds its slices' table: the migration
/// (which must change the table) gives up within its bound (`lock_timeout`: its lock
/// request is not left queued, every group commit behind it), refused as unavailable;
/// once the reader is gone it migrates.
#[test]
fn a_migration_behind_a_reader_of_the_slices_gives_up_within_its_bound() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    drop(manager(&cluster, "host-a", &at_noon()));
    cluster.psql(
        "ALTER TABLE tally_leases DROP CONSTRAINT tally_leases_committed_within, \
         DROP COLUMN committed_attempts, DROP COLUMN committed_nanos, \
         DROP COLUMN committed_effects, DROP COLUMN committed_polls, DROP COLUMN covers_use; \
         UPDATE tally_schema SET version = 10",
    );
    let (mut reader, to) = reader_holding_slices(&cluster);
    let opened = open_within(&cluster, "host-b");
    drop(to);
    reader.wait().expect("reader ended");
    let why = opened
        .expect("answered within its bound")
        .expect_err("refused");
    assert!(why.contains("lock timeout"), "{why}");
    assert_eq!(open_within(&cluster, "host-b"), Some(Ok(())));
    assert_eq!(
        cluster.psql("SELECT max(version) FROM tally_schema").trim(),
        tally_gate_postgres::SCHEMA_VERSION.to_string()
    );
}

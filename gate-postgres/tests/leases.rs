//! Leased slices on a real PostgreSQL (docs/FLEET.md, "Leased slices (the foundation)"):
//! three holders racing for the last attempts and cents never lease past a cap; a
//! return counts once; a dead holder's slice is reclaimed only past its expiry and the
//! margin, once; a replaced manager is fenced by its epoch; a restarted server loses
//! nothing and grants nothing twice. Time is a clock the test moves: nothing sleeps.

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use common::lease::{amounts, at_noon, manager, MARGIN, TTL};
use common::Cluster;
use tally_gate_postgres::{
    Amounts, Caps, Grant, Lease, LeaseClock, LeaseError, Leases, Released, Scope, ScopeKind,
};
use tally_policy::{slice_size, SliceSize};

/// One manager per host of `hosts`, each on its own connection, on `clock`.
fn managers(cluster: &Cluster, hosts: &[&str], clock: &LeaseClock) -> Vec<Arc<Leases>> {
    hosts
        .iter()
        .map(|h| Arc::new(manager(cluster, h, clock)))
        .collect()
}

/// Define `scope` through `m` with a cap of `n` attempts, nothing settled or held.
fn define_attempts(m: &Leases, scope: &Scope, n: u64) {
    let caps = Caps {
        attempts: Some(n),
        ..Caps::default()
    };
    m.define(scope, caps, Amounts::default(), Amounts::default())
        .expect("define");
}

fn attempts(n: u64) -> Amounts {
    Amounts {
        attempts: n,
        ..Amounts::default()
    }
}

/// A scope's `leased_*` and `settled_*` of attempts and nanos, as the database holds them.
fn totals(cluster: &Cluster, scope: &Scope) -> [i64; 4] {
    amounts(
        cluster,
        scope,
        [
            "leased_attempts",
            "leased_nanos",
            "settled_attempts",
            "settled_nanos",
        ],
    )
}

/// The sum of the held slices' attempts and nanos in `tally_leases`, and how many.
fn held_rows(cluster: &Cluster, scope: &Scope) -> (i64, i64, i64) {
    let out = cluster.psql(&format!(
        "SELECT coalesce(sum(attempts), 0), coalesce(sum(nanos), 0), count(*) FROM tally_leases WHERE state = 'held' AND kind = '{}' AND key = '{}'",
        scope.kind.as_str(),
        scope.key
    ));
    let v: Vec<i64> = out
        .trim()
        .split('|')
        .map(|x| x.parse().expect("a number"))
        .collect();
    (v[0], v[1], v[2])
}

/// `f`'s value, retried (at most twice) while the database is unavailable.
fn retried<T>(f: impl Fn() -> Result<T, LeaseError>) -> T {
    for _ in 0..2 {
        match f() {
            Err(LeaseError::Unavailable { .. }) => continue,
            other => return other.expect("after a retry"),
        }
    }
    f().expect("the third try")
}

/// Three holders, 8 workers each, each worker granting `want` until refused: every
/// slice granted, in the order the workers got them.
fn race(managers: &[Arc<Leases>], scope: &Scope, want: Amounts) -> Vec<Lease> {
    let mut workers = Vec::new();
    for m in managers {
        for _ in 0..8 {
            let (m, scope) = (Arc::clone(m), scope.clone());
            workers.push(std::thread::spawn(move || {
                let mut got = Vec::new();
                loop {
                    match m.grant(&scope, want).expect("grant") {
                        Grant::Granted(l) => got.push(l),
                        Grant::Refused { left } => return (got, left),
                        other => panic!("{other:?}"),
                    }
                }
            }));
        }
    }
    let mut all = Vec::new();
    for w in workers {
        let (got, left) = w.join().expect("worker");
        // Refused: the slice did not fit in some dimension.
        let fits = |l: Option<u64>, w: u64| l.is_none_or(|l| w <= l);
        assert!(
            !(fits(left.attempts, want.attempts) && fits(left.nanos, want.nanos)),
            "refused with {left:?} left for {want:?}"
        );
        all.extend(got);
    }
    all
}

#[test]
fn three_holders_racing_for_the_last_attempts_and_cents_never_lease_past_a_cap() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let clock = LeaseClock::database();
    let managers = managers(&cluster, &["host-a", "host-b", "host-c"], &clock);
    let (settled, held) = (
        Amounts {
            attempts: 3,
            nanos: 40,
            ..Amounts::default()
        },
        Amounts {
            attempts: 2,
            nanos: 25,
            ..Amounts::default()
        },
    );
    let caps = Caps {
        attempts: Some(100),
        nanos: Some(1_000),
        ..Caps::default()
    };
    // (attempts, nanos) per slice: attempts run out first, cents first, or both at once.
    for (a, n) in [(1, 7), (2, 30), (3, 1), (7, 333), (0, 13), (5, 0)] {
        for kind in [ScopeKind::Run, ScopeKind::Principal] {
            let scope = Scope::new(kind, &format!("{}-{a}-{n}", kind.as_str()));
            managers[0]
                .define(&scope, caps, settled, held)
                .expect("define");
            let want = Amounts {
                attempts: a,
                nanos: n,
                ..Amounts::default()
            };
            let got = race(&managers, &scope, want);
            let (sa, sn) = (
                got.iter().map(|l| l.granted.attempts).sum::<u64>(),
                got.iter().map(|l| l.granted.nanos).sum::<u64>(),
            );
            assert!(sa + 5 <= 100 && sn + 65 <= 1_000, "{scope:?}: {sa} {sn}");
            // The last units went: what is left is less than one more slice.
            assert!(
                sa + 5 + a > 100 || sn + 65 + n > 1_000,
                "{scope:?}: {sa} {sn}"
            );
            let ids: BTreeSet<i64> = got.iter().map(|l| l.id).collect();
            assert_eq!(ids.len(), got.len(), "a lease id granted twice");
            let t = totals(&cluster, &scope);
            assert_eq!((t[0], t[1]), (sa as i64, sn as i64), "{scope:?}");
            assert_eq!(
                held_rows(&cluster, &scope),
                (sa as i64, sn as i64, got.len() as i64)
            );
        }
    }
}

#[test]
fn a_return_counts_once_however_often_and_by_however_many_it_is_sent() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let clock = LeaseClock::database();
    let m = Arc::new(manager(&cluster, "host-a", &clock));
    let other = manager(&cluster, "host-b", &clock);
    let scope = Scope::new(ScopeKind::Run, "r");
    m.define(
        &scope,
        Caps {
            attempts: Some(20),
            ..Caps::default()
        },
        Amounts::default(),
        Amounts::default(),
    )
    .expect("define");
    let Grant::Granted(lease) = m.grant(&scope, attempts(5)).expect("grant") else {
        panic!("refused");
    };
    assert_eq!(totals(&cluster, &scope), [5, 0, 0, 0]);
    // More used than granted: refused, nothing changed.
    match m.release(lease.id, attempts(6)) {
        Err(LeaseError::UsedMoreThanGranted { id, .. }) => assert_eq!(id, lease.id),
        other => panic!("{other:?}"),
    }
    // Another holder's return: refused.
    assert!(matches!(
        other.release(lease.id, attempts(0)),
        Err(LeaseError::NotHolder { .. })
    ));
    assert_eq!(totals(&cluster, &scope), [5, 0, 0, 0]);
    // Eight returns at once: one counts.
    let returns: Vec<_> = (0..8)
        .map(|_| {
            let m = Arc::clone(&m);
            std::thread::spawn(move || m.release(lease.id, attempts(2)).expect("return"))
        })
        .collect();
    let results: Vec<Released> = returns
        .into_iter()
        .map(|r| r.join().expect("thread"))
        .collect();
    assert_eq!(
        results.iter().filter(|r| **r == Released::Returned).count(),
        1,
        "{results:?}"
    );
    assert!(results
        .iter()
        .all(|r| matches!(r, Released::Returned | Released::Already)));
    assert_eq!(totals(&cluster, &scope), [0, 0, 2, 0]);
    // Again, saying something else: nothing changes.
    assert_eq!(
        m.release(lease.id, attempts(0)).expect("again"),
        Released::Already
    );
    assert_eq!(totals(&cluster, &scope), [0, 0, 2, 0]);
    // The 3 unused are there to lease again: 18 left.
    assert!(matches!(
        m.grant(&scope, attempts(18)).expect("grant"),
        Grant::Granted(_)
    ));
    assert!(matches!(
        m.grant(&scope, attempts(1)).expect("grant"),
        Grant::Refused { left } if left.attempts == Some(0)
    ));
}

#[test]
fn a_dead_holders_slice_is_reclaimed_only_past_expiry_and_margin_and_once() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let clock = at_noon();
    let scope = Scope::new(ScopeKind::Principal, "1000");
    let reclaimers = managers(&cluster, &["host-b", "host-c", "host-d"], &clock);
    define_attempts(&reclaimers[0], &scope, 10);
    let dead = manager(&cluster, "host-a", &clock);
    let Grant::Granted(lost) = dead.grant(&scope, attempts(5)).expect("grant") else {
        panic!("refused");
    };
    drop(dead);
    // A live holder renews its slice past the dead one's reclaim.
    let live = &reclaimers[2];
    let Grant::Granted(kept) = live.grant(&scope, attempts(3)).expect("grant") else {
        panic!("refused");
    };
    // At expiry, and at expiry plus the margin exactly: its holder may still spend it.
    clock.advance(TTL - Duration::from_secs(1));
    let kept = live.renew(&kept).expect("renew");
    clock.advance(Duration::from_secs(1));
    assert!(reclaimers[0].reclaim_expired().expect("reclaim").is_empty());
    clock.advance(MARGIN);
    assert!(reclaimers[0].reclaim_expired().expect("reclaim").is_empty());
    assert_eq!(totals(&cluster, &scope), [8, 0, 0, 0]);
    // Past it: reclaimed by exactly one of three reclaimers at once.
    clock.advance(Duration::from_millis(1));
    let racing: Vec<_> = reclaimers
        .iter()
        .map(|m| {
            let m = Arc::clone(m);
            std::thread::spawn(move || m.reclaim_expired().expect("reclaim"))
        })
        .collect();
    let reclaimed: Vec<_> = racing
        .into_iter()
        .flat_map(|r| r.join().expect("thread"))
        .collect();
    assert_eq!(reclaimed.len(), 1, "{reclaimed:?}");
    assert_eq!(
        (reclaimed[0].id, reclaimed[0].holder.as_str()),
        (lost.id, "host-a")
    );
    // Counted as spent whole: its holder may have spent it all before it expired.
    assert_eq!(totals(&cluster, &scope), [3, 0, 5, 0]);
    assert!(reclaimers[1].reclaim_expired().expect("again").is_empty());
    // The renewed slice is still the live holder's; the reclaimed one cannot be renewed.
    assert_eq!(live.renew(&kept).expect("renew").id, kept.id);
    let back = manager(&cluster, "host-a", &clock);
    assert!(back.adopted().is_empty(), "{:?}", back.adopted());
    match back.renew(&lost) {
        Err(LeaseError::Ended { state, .. }) => assert_eq!(state, "reclaimed"),
        other => panic!("{other:?}"),
    }
    // Its holder, back, says what it used (from its ledger): the rest comes back once.
    assert_eq!(
        back.release(lost.id, attempts(2)).expect("late"),
        Released::Refunded
    );
    assert_eq!(totals(&cluster, &scope), [3, 0, 2, 0]);
    assert_eq!(
        back.release(lost.id, attempts(0)).expect("again"),
        Released::Already
    );
    assert_eq!(totals(&cluster, &scope), [3, 0, 2, 0]);
    // An expired slice is not renewed, even before it is reclaimed.
    clock.advance(TTL + Duration::from_secs(1));
    match live.renew(&kept) {
        Err(LeaseError::Ended { state, .. }) => assert_eq!(state, "expired"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_replaced_manager_is_fenced_by_its_epoch_and_its_grants_are_adopted() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let clock = LeaseClock::database();
    let scope = Scope::new(ScopeKind::Run, "r");
    let old = Arc::new(manager(&cluster, "host-a", &clock));
    old.define(
        &scope,
        Caps {
            attempts: Some(1_000_000),
            ..Caps::default()
        },
        Amounts::default(),
        Amounts::default(),
    )
    .expect("define");
    let Grant::Granted(first) = old.grant(&scope, attempts(1)).expect("grant") else {
        panic!("refused");
    };
    // Eight workers of the old manager grant until fenced, while the holder's name is
    // taken by a new manager (once they have granted some).
    let busy = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let workers: Vec<_> = (0..8)
        .map(|_| {
            let (old, busy) = (Arc::clone(&old), Arc::clone(&busy));
            let scope = scope.clone();
            std::thread::spawn(move || {
                let mut ids = Vec::new();
                loop {
                    match old.grant(&scope, attempts(1)) {
                        Ok(Grant::Granted(l)) => {
                            ids.push(l.id);
                            busy.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                        Err(LeaseError::StaleEpoch { .. }) => return ids,
                        other => panic!("{other:?}"),
                    }
                }
            })
        })
        .collect();
    while busy.load(std::sync::atomic::Ordering::Relaxed) < 16 {
        std::thread::yield_now();
    }
    let new = manager(&cluster, "host-a", &clock);
    assert_eq!(new.epoch(), old.epoch() + 1);
    let mut granted: BTreeSet<i64> = workers
        .into_iter()
        .flat_map(|w| w.join().expect("worker"))
        .collect();
    granted.insert(first.id);
    // Every grant the old manager got is one the new one learnt: none after it opened.
    let adopted: BTreeSet<i64> = new.adopted().iter().map(|l| l.id).collect();
    assert_eq!(adopted, granted);
    assert!(
        granted.len() > 1,
        "the old manager granted nothing in the race"
    );
    assert_eq!(totals(&cluster, &scope)[0], granted.len() as i64);
    // The old manager grants, renews and returns nothing now.
    let stale = |r: Result<(), LeaseError>| {
        assert!(matches!(r, Err(LeaseError::StaleEpoch { .. })), "{r:?}")
    };
    stale(old.grant(&scope, attempts(1)).map(|_| ()));
    stale(old.renew(&first).map(|_| ()));
    stale(old.release(first.id, attempts(0)).map(|_| ()));
    // The new one does.
    new.renew(&first).expect("renew");
    assert_eq!(
        new.release(first.id, attempts(1)).expect("return"),
        Released::Returned
    );
}

#[test]
fn a_restarted_server_loses_no_slice_and_grants_none_twice() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let clock = LeaseClock::database();
    let scope = Scope::new(ScopeKind::Run, "r");
    let managers = managers(&cluster, &["host-a", "host-b", "host-c"], &clock);
    define_attempts(&managers[0], &scope, 60);
    let mut before = Vec::new();
    for m in &managers {
        for _ in 0..4 {
            match m.grant(&scope, attempts(3)).expect("grant") {
                Grant::Granted(l) => before.push(l),
                other => panic!("{other:?}"),
            }
        }
    }
    assert_eq!(
        managers[0]
            .release(before[0].id, attempts(1))
            .expect("return"),
        Released::Returned
    );
    cluster.stop();
    assert!(matches!(
        managers[1].grant(&scope, attempts(3)),
        Err(LeaseError::Unavailable { .. })
    ));
    cluster.restart();
    // Every slice is still there, the return counted once, and the race goes on. (A
    // manager's first call after the restart may find its connection closed: refused as
    // unavailable, and made again by the next call, as a daemon retries.)
    assert_eq!(
        retried(|| managers[0].release(before[0].id, attempts(1))),
        Released::Already
    );
    for (i, m) in managers.iter().enumerate() {
        let held: Vec<i64> = retried(|| m.held()).iter().map(|l| l.id).collect();
        let granted: Vec<i64> = before[i * 4..i * 4 + 4]
            .iter()
            .map(|l| l.id)
            .filter(|id| *id != before[0].id)
            .collect();
        assert_eq!(held, granted, "{}", m.holder());
    }
    assert_eq!(held_rows(&cluster, &scope), (33, 0, 11));
    let after = race(&managers, &scope, attempts(3));
    let all: Vec<i64> = before.iter().chain(&after).map(|l| l.id).collect();
    let distinct: BTreeSet<i64> = all.iter().copied().collect();
    assert_eq!(distinct.len(), all.len(), "a lease id granted twice");
    // 60 less the 1 settled: 19 slices of 3 out at most.
    let (leased, _, count) = held_rows(&cluster, &scope);
    assert_eq!((leased, count), (57, 19));
    assert_eq!(totals(&cluster, &scope), [57, 0, 1, 0]);
}

#[test]
fn the_outlook_counts_the_holders_and_sizes_their_slices() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let clock = at_noon();
    let managers: Vec<Leases> = ["host-a", "host-b", "host-c"]
        .iter()
        .map(|h| manager(&cluster, h, &clock))
        .collect();
    let scope = Scope::new(ScopeKind::Credential, "openai-main");
    define_attempts(&managers[0], &scope, 400);
    let window = Duration::from_secs(60);
    // Alone: most of what is left.
    let seen = managers[0].outlook(&scope, window).expect("outlook");
    assert_eq!((seen.left.attempts, seen.holders), (Some(400), 0));
    let SliceSize::Lease(n) = slice_size(400, seen.holders + 1, 10) else {
        panic!("central");
    };
    assert_eq!(n, 300);
    assert!(matches!(
        managers[0].grant(&scope, attempts(n)).expect("grant"),
        Grant::Granted(_)
    ));
    // Three hosts asking: small slices; then the last units are served centrally.
    for m in &managers[1..] {
        let seen = m.outlook(&scope, window).expect("outlook");
        let left = seen.left.attempts.expect("capped");
        match slice_size(left, 3, 10) {
            SliceSize::Lease(n) => {
                assert!(n * 4 <= left);
                assert!(matches!(
                    m.grant(&scope, attempts(n)).expect("grant"),
                    Grant::Granted(_)
                ));
            }
            other => panic!("{other:?} with {left} left"),
        }
    }
    let seen = managers[0].outlook(&scope, window).expect("outlook");
    assert_eq!(seen.holders, 3);
    assert_eq!(seen.left.attempts, Some(400 - 300 - 16 - 14));
    assert_eq!(slice_size(70, seen.holders, 20), SliceSize::Central);
    // A host whose slices ended long ago is no longer counted.
    for m in &managers {
        for l in m.held().expect("held") {
            m.release(l.id, attempts(0)).expect("return");
        }
    }
    clock.advance(window + Duration::from_secs(1));
    assert_eq!(
        managers[0]
            .outlook(&scope, window)
            .expect("outlook")
            .holders,
        0
    );
}

#[test]
fn a_scope_redefined_below_its_slices_and_an_unknown_scope_are_refused() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let m = manager(&cluster, "host-a", &LeaseClock::database());
    let scope = Scope::new(ScopeKind::Bucket, "search");
    assert!(matches!(
        m.grant(&scope, attempts(1)),
        Err(LeaseError::UnknownScope { .. })
    ));
    let caps = |n| Caps {
        attempts: Some(n),
        ..Caps::default()
    };
    m.define(&scope, caps(100), Amounts::default(), Amounts::default())
        .expect("define");
    assert!(matches!(
        m.grant(&scope, attempts(50)).expect("grant"),
        Grant::Granted(_)
    ));
    match m.define(&scope, caps(40), Amounts::default(), Amounts::default()) {
        Err(e @ LeaseError::Overcommitted { .. }) => {
            assert!(e.to_string().contains("bucket `search`"), "{e}")
        }
        other => panic!("{other:?}"),
    }
    // Nothing changed: 50 still leasable.
    assert!(matches!(
        m.grant(&scope, attempts(50)).expect("grant"),
        Grant::Granted(_)
    ));
    assert!(matches!(
        m.grant(&scope, Amounts::default()),
        Err(LeaseError::Invalid(_))
    ));
}

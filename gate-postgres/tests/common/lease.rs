//! The lease tests' helpers: a lease manager on the cluster, a manual clock, a holder
//! of slices, uses and caps of attempts and nanos, and a scope's amounts as the database
//! holds them.

use std::time::{Duration, SystemTime};

use std::sync::Arc;

use tally_gate_postgres::{
    open_leased, Amounts, Caps, LeaseClock, LeaseOptions, LeaseSetup, Leased, Leases, Options,
    Scope, SliceOptions, Slices, ViewLimits,
};

use super::Cluster;

/// How long a slice is granted for in these tests.
pub const TTL: Duration = Duration::from_secs(10);
/// The clock-skew margin before a slice past its expiry is reclaimed.
pub const MARGIN: Duration = Duration::from_secs(5);

/// A lease manager for `holder` on the cluster, on `clock`.
pub fn manager(cluster: &Cluster, holder: &str, clock: &LeaseClock) -> Leases {
    let options = LeaseOptions {
        ttl: TTL,
        margin: MARGIN,
        clock: clock.clone(),
    };
    Leases::open(&Options::new(&cluster.url()), holder, options).expect("lease manager")
}

/// The leased backend of `holder` on the cluster over `ledger`: leases on `clock` (slices
/// of [`TTL`], reclaimed past [`MARGIN`]), its breakers' views kept within `views`.
pub fn backend(
    cluster: &Cluster,
    ledger: &Arc<tally_ledger::Ledger>,
    holder: &str,
    clock: &LeaseClock,
    views: ViewLimits,
) -> Leased {
    let setup = LeaseSetup {
        leases: LeaseOptions {
            ttl: TTL,
            margin: MARGIN,
            clock: clock.clone(),
        },
        slices: SliceOptions::default(),
        views,
        ..LeaseSetup::new(holder)
    };
    open_leased(
        Arc::clone(ledger),
        &Options::new(&cluster.url()),
        &setup,
        |_| None,
        None,
    )
    .expect("leased backend")
}

/// A manual clock at a fixed moment, moved by the test.
pub fn at_noon() -> LeaseClock {
    LeaseClock::manual(SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000))
}

/// `columns` of `scope`'s row in `tally_lease_scopes`, in order.
pub fn amounts<const N: usize>(cluster: &Cluster, scope: &Scope, columns: [&str; N]) -> [i64; N] {
    let out = cluster.psql(&format!(
        "SELECT {} FROM tally_lease_scopes WHERE kind = '{}' AND key = '{}'",
        columns.join(", "),
        scope.kind.as_str(),
        scope.key
    ));
    let v: Vec<i64> = out
        .trim()
        .split('|')
        .map(|x| x.parse().expect("a number"))
        .collect();
    v.try_into().expect("one value per column")
}

/// A central check of `op` on `run` through `gate`, reserving `reserve` cents: its
/// attempt if allowed, `None` if refused (denied, or the database unavailable).
pub fn check(
    gate: &tally_gate::Gate<tally_gate_postgres::Postgres>,
    caller: tally_gate::Caller,
    run: &str,
    op: &str,
    reserve: u64,
) -> Option<u64> {
    let req = serde_json::json!({"run": run, "tool": "llm", "operation": op, "effect": "read", "reserve_cents": reserve});
    match gate.check_blocking(caller, serde_json::from_value(req).expect("check")) {
        Ok(a) if format!("{:?}", a.decision).starts_with("Allow") => a.attempt,
        Ok(_) => None,
        Err(e) => {
            assert!(matches!(e, tally_gate::GateError::Unavailable(_)), "{e:?}");
            None
        }
    }
}

/// An outcome of `attempt` settled at `cents`, with `status`, through `gate`.
pub fn outcome(
    gate: &tally_gate::Gate<tally_gate_postgres::Postgres>,
    caller: tally_gate::Caller,
    run: &str,
    attempt: u64,
    status: tally_ledger::Status,
    cents: u64,
) -> Result<(), tally_gate::GateError> {
    let req = tally_gate::OutcomeRequest {
        run: run.into(),
        attempt,
        status,
        settled_cents: Some(cents),
        settled_nanos: None,
        remote_ref: None,
        observed: None,
        retry_after_ms: None,
        result_digest: None,
        worker: None,
        usage_refused: None,
        usage: None,
    };
    gate.outcome_blocking(caller, req).map(drop)
}

pub fn holder(cluster: &Cluster, name: &str, clock: &LeaseClock, floor: u64) -> Slices {
    let options = SliceOptions {
        floor: Amounts {
            attempts: floor,
            nanos: floor * 7,
            ..Amounts::default()
        },
        ..SliceOptions::default()
    };
    Slices::open(manager(cluster, name, clock), options, |l| l.granted, None)
}

pub fn use_of(attempts: u64, nanos: u64) -> Amounts {
    Amounts {
        attempts,
        nanos,
        ..Amounts::default()
    }
}

pub fn caps(attempts: u64, nanos: u64) -> Caps {
    Caps {
        attempts: Some(attempts),
        nanos: Some(nanos),
        ..Caps::default()
    }
}

/// A scope's settled, held and leased attempts and nanos, as the database holds them.
pub fn totals(cluster: &Cluster, scope: &Scope) -> [i64; 6] {
    amounts(
        cluster,
        scope,
        [
            "settled_attempts",
            "settled_nanos",
            "held_attempts",
            "held_nanos",
            "leased_attempts",
            "leased_nanos",
        ],
    )
}

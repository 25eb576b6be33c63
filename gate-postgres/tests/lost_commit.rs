//! A group commit whose `COMMIT` outcome the gate cannot know (docs/FLEET.md, "Group
//! commit"): the connection between the gate and PostgreSQL is cut by a relay after the
//! server committed and before its answer reached the gate, or before the `COMMIT`
//! reached the server. Either way the decision is refused (never answered allow),
//! nothing of it is recorded, what it took stays counted (once), and after the gate
//! reconnects it decides on the row as it is: no attempt spent twice, none an allow
//! was answered for lost.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::lease::{at_noon, MARGIN, TTL};
use common::relay::Relay;
use common::Cluster;
use serde_json::json;
use tally_gate::{Caller, CheckAnswer, Gate, GateError};
use tally_gate_postgres::{
    open_leased, LeaseOptions, LeaseSetup, Leased, Options, SliceOptions, ViewLimits,
};
use tally_policy::{Recorded, Verdict};

const OPERATOR: Caller = Caller {
    uid: None,
    operator: true,
    proxied: false,
};

/// No tool rate bucket, no limit on calls in flight: a decision at home is grouped.
const VIEWED: &str = "[rate]\ntool_per_sec = 0\ntool_in_flight = 0\n[approvals]\nask_on = []\n";

/// The cluster's `host` (its socket directory) and `port`, from its URL.
fn socket(cluster: &Cluster) -> std::path::PathBuf {
    let url = cluster.url();
    let field = |name: &str| {
        url.split_whitespace()
            .find_map(|kv| kv.strip_prefix(name))
            .expect("field")
            .to_owned()
    };
    std::path::Path::new(&field("host=")).join(format!(".s.PGSQL.{}", field("port=")))
}

/// A leased gate `host-a` whose every connection goes through `relay`.
fn leased_via(relay: &Relay, dir: &std::path::Path) -> Gate<Leased> {
    let ledger = common::ledger(dir);
    let setup = LeaseSetup {
        leases: LeaseOptions {
            ttl: TTL,
            margin: MARGIN,
            clock: at_noon(),
        },
        slices: SliceOptions::default(),
        views: ViewLimits::default(),
        ..LeaseSetup::new("host-a")
    };
    let url = format!("host=127.0.0.1 port={} user=gate dbname=gate", relay.port);
    let options = Options {
        timeout: Duration::from_secs(30),
        ..Options::new(&url)
    };
    let backend =
        open_leased(Arc::clone(&ledger), &options, &setup, |_| None, None).expect("backend");
    Gate::with_backend(ledger, backend, Recorded::new(VIEWED).expect("policy")).expect("gate")
}

fn check(gate: &Gate<Leased>, n: u64) -> Result<CheckAnswer, GateError> {
    let req = json!({"run": "l", "tool": "llm", "operation": format!("q{n}"), "effect": "read"});
    gate.check_blocking(OPERATOR, serde_json::from_value(req).expect("check"))
}

/// Run `l` (5 attempts) taken in by an allow (attempt 1) on a leased gate behind a new
/// relay; then `arm` sets the relay to cut the next COMMIT, and the decision at home
/// whose COMMIT goes unanswered is refused, never as "nothing recorded". The relay, the
/// gate and the ledger's size before that decision.
fn unanswered(
    cluster: &Cluster,
    dir: &std::path::Path,
    arm: impl FnOnce(&Relay),
) -> (Relay, Gate<Leased>, u64) {
    let relay = Relay::start(socket(cluster));
    let gate = leased_via(&relay, dir);
    let req = json!({"run": "l", "budget": {"attempts": 5}});
    gate.start_blocking(OPERATOR, serde_json::from_value(req).expect("start"))
        .expect("start");
    let first = check(&gate, 0).expect("first check");
    assert_eq!((first.decision, first.attempt), (Verdict::Allow, Some(1)));
    gate.ledger().flush().expect("flush");
    let records = gate.ledger().snapshot().size();
    arm(&relay);
    match check(&gate, 1) {
        Err(GateError::Unavailable(e)) => assert!(e.contains("may have been recorded"), "{e}"),
        other => panic!("a decision whose COMMIT went unanswered: {other:?}"),
    }
    (relay, gate, records)
}

/// The committed attempts of the run's slice held (`docs/FLEET.md`, "Committed use").
fn held_slice_committed(cluster: &Cluster) -> String {
    cluster
        .psql(
            "SELECT committed_attempts FROM tally_leases \
             WHERE kind = 'run' AND key = 'l' AND state = 'held'",
        )
        .trim()
        .to_owned()
}

fn count(gate: &Gate<Leased>, name: &str) -> u64 {
    use tally_gate::backend::StateBackend;
    gate.backend()
        .lease_counts()
        .and_then(|c| c.into_iter().find(|(n, _)| *n == name))
        .map_or(0, |(_, v)| v)
}

#[test]
fn a_group_whose_commit_landed_and_whose_answer_was_lost_is_refused_and_counted_once() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let dir = tempfile::tempdir().expect("dir");
    // The COMMIT lands and its answer is lost.
    let (relay, gate, records) = unanswered(&cluster, dir.path(), Relay::arm);
    let tag = relay
        .cut
        .recv_timeout(Duration::from_secs(60))
        .expect("the relay cut a COMMIT");
    assert_eq!(tag, "COMMIT", "the server committed the group");
    assert_eq!(count(&gate, "group_refused"), 1);
    assert_eq!(count(&gate, "group_unsure"), 1);
    assert_eq!(
        held_slice_committed(&cluster),
        "2",
        "the slice's committed use holds the landed decision, as the run's row does"
    );
    gate.ledger().flush().expect("flush");
    assert_eq!(
        gate.ledger().snapshot().size(),
        records,
        "nothing recorded for it: the state is one decision ahead of the ledger"
    );
    // Reconnected, the gate reads the row as committed: attempt 2 is spent, never
    // allowed again; the run's last three attempts, then its budget's deny.
    let mut allowed = Vec::new();
    for n in 2.. {
        let a = check(&gate, n).unwrap_or_else(|e| panic!("check {n}: {e}"));
        if a.decision != Verdict::Allow {
            assert_eq!(
                a.reason,
                Some(tally_ledger::Reason::AttemptsExhausted),
                "{a:?}"
            );
            break;
        }
        allowed.push(a.attempt.expect("attempt"));
    }
    assert_eq!(allowed, [3, 4, 5]);
    // Counted once in the run's scope: its five attempts, the unanswered one included.
    gate.backend().slices().close();
    let scope = cluster.psql(
        "SELECT settled_attempts, leased_attempts FROM tally_lease_scopes WHERE kind = 'run' AND key = 'l'",
    );
    assert_eq!(scope.trim(), "5|0");
    // The four decisions after it (three allows, the deny) are in the ledger.
    gate.ledger().flush().expect("flush");
    assert!(gate.ledger().snapshot().size() >= records + 4);
}

#[test]
fn a_group_whose_commit_never_reached_the_server_is_refused_and_the_row_read_again() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let dir = tempfile::tempdir().expect("dir");
    let (relay, gate, records) = unanswered(&cluster, dir.path(), Relay::arm_unsent);
    let cut = relay.cut.recv_timeout(Duration::from_secs(60));
    assert_eq!(cut.expect("the relay cut a COMMIT"), "unsent");
    assert_eq!(count(&gate, "group_unsure"), 1);
    assert_eq!(
        held_slice_committed(&cluster),
        "1",
        "rolled back: neither the slice's committed use nor the row holds it"
    );
    gate.ledger().flush().expect("flush");
    assert_eq!(gate.ledger().snapshot().size(), records, "nothing recorded");
    // Reconnected, the row is read as it is (rolled back): attempt 2 is the next one.
    let next = check(&gate, 2).expect("next check");
    assert_eq!((next.decision, next.attempt), (Verdict::Allow, Some(2)));
    // The lost decision's use stays counted in the slice (it may have committed: the
    // conservative side), one attempt past the row's two, never under them.
    gate.backend().slices().close();
    let scope = cluster.psql(
        "SELECT settled_attempts, leased_attempts FROM tally_lease_scopes WHERE kind = 'run' AND key = 'l'",
    );
    assert_eq!(scope.trim(), "3|0");
}

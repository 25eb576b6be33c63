//! The last round trip's guard, on a real PostgreSQL: a run decided at home whose home
//! moved before the decision's last round trip rolls that round trip back, whatever
//! else it carried (no home write need follow to catch it).

use std::sync::Arc;

use tally_gate::backend::StateBackend;
use tally_gate::GateError;
use tally_ledger::keys::AuditorKey;
use tally_ledger::{Ledger, Rotation};
use tally_policy::ToolState;
use tally_testkit::postgres::Cluster;

use crate::{Options, Postgres};

#[test]
fn a_guard_finding_its_run_no_longer_at_home_rolls_the_last_round_trip_back() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("ledger");
    Ledger::init(&path, &AuditorKey::generate().public(), Rotation::default()).expect("init");
    let ledger = Arc::new(Ledger::open(&path).expect("open"));
    let pg = Postgres::open(ledger, &Options::new(&cluster.url())).expect("postgres");
    // A run whose row says it is at home on nobody: the guard of `host-a` finds no row.
    cluster
        .psql("INSERT INTO tally_runs (name, state, version, open) VALUES ('r', '\\x00', 1, true)");
    let mut t = pg.begin().expect("begin");
    t.guards.push(("r".into(), ("host-a".into(), 1)));
    t.tools.insert("llm".into(), ToolState::default());
    let last = t.row(None, Some("llm"), None);
    let sealed = t.seal(last, &[], &[]);
    assert!(
        matches!(&sealed, Err(GateError::Unavailable(why)) if why.contains("taken back")),
        "{sealed:?}"
    );
    assert!(!t.unsure, "rolled back for certain");
    drop(t);
    let tools = cluster.psql("SELECT count(*) FROM tally_tools WHERE name = 'llm'");
    assert_eq!(
        tools.trim(),
        "0",
        "nothing sent with the guard was committed"
    );
    // The connection is clean: the next transaction commits.
    let mut t = pg.begin().expect("begin");
    t.tools.insert("llm".into(), ToolState::default());
    let last = t.row(None, Some("llm"), None);
    t.seal(last, &[], &[]).expect("committed");
    let tools = cluster.psql("SELECT count(*) FROM tally_tools WHERE name = 'llm'");
    assert_eq!(tools.trim(), "1");
}

#[test]
fn a_commit_error_is_a_certain_rollback_only_at_error_severity_outside_classes_08_and_57_and_40003()
{
    use super::commit_refused_as;
    use tokio_postgres::error::{Severity, SqlState};
    let error = Some(Severity::Error);
    // The transaction aborted, the session goes on: rolled back.
    assert!(commit_refused_as(
        error,
        &SqlState::T_R_SERIALIZATION_FAILURE
    ));
    assert!(commit_refused_as(error, &SqlState::UNIQUE_VIOLATION));
    assert!(commit_refused_as(error, &SqlState::from_code("P0001")));
    // Connection exceptions and operator interventions: unknown.
    assert!(!commit_refused_as(error, &SqlState::ADMIN_SHUTDOWN));
    assert!(!commit_refused_as(error, &SqlState::QUERY_CANCELED));
    assert!(!commit_refused_as(error, &SqlState::CONNECTION_FAILURE));
    // The server itself cannot say whether it completed: unknown.
    assert!(!commit_refused_as(
        error,
        &SqlState::T_R_STATEMENT_COMPLETION_UNKNOWN
    ));
    // The session ended: unknown, whatever the code.
    for severity in [Severity::Fatal, Severity::Panic] {
        assert!(!commit_refused_as(
            Some(severity),
            &SqlState::T_R_SERIALIZATION_FAILURE
        ));
    }
    assert!(!commit_refused_as(
        Some(Severity::Fatal),
        &SqlState::ADMIN_SHUTDOWN
    ));
    // No severity the client can read: unknown.
    assert!(!commit_refused_as(None, &SqlState::UNIQUE_VIOLATION));
}

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

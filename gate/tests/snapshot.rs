//! The state seam (`tally_gate::backend`): a load gives the gate a snapshot of the
//! scopes it names, as they stand; a run that does not exist is left out, never made
//! up, and a tool seen for the first time is a fresh one.

use std::sync::Arc;

use tally_gate::backend::{Embedded, Keys, StateBackend, StateTxn};
use tally_gate::{Caller, Gate, StartRequest};
use tally_ledger::keys::AuditorKey;
use tally_ledger::{Ledger, Rotation};
use tally_policy::Recorded;

const ALICE: Caller = Caller {
    uid: Some(1000),
    operator: false,
    proxied: false,
};

#[test]
fn a_load_reads_the_scopes_named_and_makes_up_no_run() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("l");
    Ledger::init(&path, &AuditorKey::generate().public(), Rotation::default()).expect("init");
    let ledger = Arc::new(Ledger::open(&path).expect("open"));
    let gate = Gate::open(Arc::clone(&ledger), Recorded::new("").expect("policy")).expect("gate");
    let req = StartRequest {
        run: "r".into(),
        ..StartRequest::default()
    };
    gate.start_blocking(ALICE, req).expect("start");
    drop(gate);

    let backend = Embedded::open(Arc::clone(&ledger)).expect("backend");
    let keys = Keys {
        runs: vec!["r", "nobody"],
        tools: vec!["email.send"],
        ..Keys::default()
    };
    let read = backend.begin().expect("begin").load(&keys).expect("load");
    assert!(read.runs.contains_key("r"), "the run is read");
    assert!(!read.runs.contains_key("nobody"), "no run is made up");
    assert_eq!(read.runs["r"].owner_uid, Some(1000));

    assert_eq!(read.tools["email.send"], tally_policy::ToolState::default());
    assert!(read.credentials.is_empty() && read.principals.is_empty());
    // Read again: the same (a load changes nothing).
    let mut t = backend.begin().expect("begin");
    assert_eq!(t.load(&keys).expect("load"), read);
}

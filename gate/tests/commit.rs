//! The one commit path: the first decision under a policy carries the policy's record
//! just before it, and every answer carries the receipt of its own record.

use std::sync::Arc;

use tally_gate::{Caller, Gate, StartRequest};
use tally_ledger::keys::AuditorKey;
use tally_ledger::{Ledger, Rotation};
use tally_policy::Recorded;

const ALICE: Caller = Caller {
    uid: Some(1000),
    operator: false,
    proxied: false,
};

fn start(gate: &Gate, run: &str) -> u64 {
    gate.start_blocking(
        ALICE,
        StartRequest {
            run: run.into(),
            ..StartRequest::default()
        },
    )
    .expect("start")
    .seq
}

#[test]
fn the_policy_record_goes_once_before_the_first_decision_made_under_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("l");
    Ledger::init(&path, &AuditorKey::generate().public(), Rotation::default()).expect("init");
    let ledger = Arc::new(Ledger::open(&path).expect("open"));
    let first = Recorded::new("").expect("policy");
    let gate = Gate::open(Arc::clone(&ledger), first.clone()).expect("gate");

    // The first commit: the policy's record, then the start, which answers with its own.
    let before = ledger.checkpoint().size;
    assert_eq!(start(&gate, "a"), before + 1);
    assert_eq!(ledger.checkpoint().size, before + 2);
    // Later commits carry no policy record.
    assert_eq!(start(&gate, "b"), before + 2);
    assert_eq!(ledger.checkpoint().size, before + 3);

    // Reopened under the same policy: it is already the last recorded one.
    drop(gate);
    let gate = Gate::open(Arc::clone(&ledger), first).expect("reopen");
    assert_eq!(start(&gate, "c"), before + 3);

    // Under another policy: recorded once more, before the first decision under it.
    drop(gate);
    let other = Recorded::new("max_open_runs_per_uid = 9\n").expect("policy");
    let gate = Gate::open(Arc::clone(&ledger), other).expect("another policy");
    assert_eq!(start(&gate, "d"), before + 5);
    assert_eq!(ledger.checkpoint().size, before + 6);
}

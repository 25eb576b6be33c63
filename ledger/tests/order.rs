//! The writer's order within a commit group: the group's tree files are written before
//! its checkpoint is appended to the log, so a reader that sees a checkpoint finds the
//! tree files at least at its size; a writer killed between the two leaves tree files
//! ahead of the log, which the next open cuts back to it.

use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex};

use tally_ledger::prove::read_tree_head;
use tally_ledger::tlog::tiles::Tiles;
use tally_ledger::{Ledger, Rotation};

use crate::review::child_to_abort;
use crate::store::{decision, new_ledger, read_back};

const CHILD_DIR: &str = "TALLY_ORDER_DIR";
const CHILD_GROUPS: &str = "TALLY_ORDER_GROUPS";

/// A reader of the tree head at the instant each group's checkpoint becomes visible in
/// the log (on the commit thread, before the writer does anything more) finds the tree
/// files at the checkpoint's size, with the root its tree frame records: the reader is
/// strict, so tree files written after the checkpoint fail here at the first group.
#[test]
fn the_tree_head_reads_the_instant_a_checkpoint_is_appended() {
    const GROUPS: u64 = 40;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("l");
    // Epochs of 7 entries: some groups open with an epoch certificate.
    let rotation = Rotation {
        records: 7,
        ms: u64::MAX,
    };
    let (ledger, auditor) = new_ledger(&dir, rotation);
    let heads = Arc::new(Mutex::new(Vec::new()));
    let seen = heads.clone();
    let at = dir.clone();
    tally_ledger::faults::on_group_appended(&dir, move || {
        let head = read_tree_head(&at).map(|(cp, root)| (cp.size, root));
        seen.lock().unwrap().push(head.map_err(|e| e.to_string()));
    });
    let mut decisions = 0;
    for i in 0..GROUPS {
        let group: Vec<_> = (0..1 + i % 3)
            .map(|j| decision("order", i * 3 + j))
            .collect();
        decisions += group.len();
        ledger.append_batch(group).unwrap();
    }
    let heads = heads.lock().unwrap().clone();
    assert_eq!(heads.len() as u64, GROUPS, "one read per group");
    let mut last = 1;
    for (group, head) in heads.iter().enumerate() {
        let (size, _) = head
            .as_ref()
            .unwrap_or_else(|e| panic!("the tree head right after group {group}: {e}"));
        assert!(*size > last, "group {group} read size {size} after {last}");
        last = *size;
    }
    let (cp, root) = ledger.tree_head();
    assert_eq!(heads.last().unwrap().as_ref().unwrap(), &(cp.size, root));
    assert_eq!(read_back(&ledger, &auditor).len(), decisions);
}

/// The child of the test below: opens the ledger and appends `CHILD_GROUPS` groups (one
/// decision each); the fault point aborts it before one of them reaches the log.
#[test]
#[ignore = "run by order::kill_9_between_the_tree_files_and_the_log as its child process"]
fn order_child_writer() {
    let Ok(dir) = std::env::var(CHILD_DIR) else {
        return;
    };
    let n: u64 = std::env::var(CHILD_GROUPS).unwrap().parse().unwrap();
    let ledger = Ledger::open(Path::new(&dir)).unwrap();
    for i in 0..n {
        ledger.append(decision("child", i)).unwrap();
    }
    let mut out = std::io::stdout().lock();
    writeln!(out, "DONE").unwrap();
}

/// A writer dies (`abort`, as `kill -9`) after a group's tree files are written and
/// before its checkpoint is in the log: the tree files are ahead of the log. The next
/// open keeps the log's size, cuts the files back to it, and the ledger verifies and
/// goes on: every decision reads back through the chain, and the tree head read from
/// the files is the one the writer holds.
#[test]
fn kill_9_between_the_tree_files_and_the_log() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("l");
    let (ledger, auditor) = new_ledger(&dir, Rotation::default());
    for i in 0..5 {
        ledger.append(decision("before", i)).unwrap();
    }
    drop(ledger);
    let (aborted, status) = child_to_abort(
        "order::order_child_writer",
        &[
            (CHILD_DIR, dir.as_os_str()),
            (CHILD_GROUPS, "10".as_ref()),
            (tally_ledger::faults::APPEND_ABORT_BEFORE, "4".as_ref()),
        ],
    );
    assert!(
        aborted,
        "the child did not die before its fourth group's append: {status}"
    );
    // Genesis, 5 decisions, 3 of the child's: the fourth's leaf is in the tree files only.
    let sealed = Ledger::read_checkpoint(&dir).unwrap().size;
    assert_eq!(sealed, 9);
    assert_eq!(Tiles::new(&dir).count(0).unwrap(), sealed + 1);
    let ledger = Ledger::open(&dir).unwrap_or_else(|e| panic!("open after the kill: {e}"));
    assert_eq!(ledger.checkpoint().size, sealed);
    assert_eq!(Tiles::new(&dir).count(0).unwrap(), sealed);
    assert_eq!(read_tree_head(&dir).unwrap().1, ledger.tree_head().1);
    ledger.append(decision("after", 0)).unwrap();
    let (cp, root) = read_tree_head(&dir).unwrap();
    assert_eq!((cp.size, root), (sealed + 1, ledger.tree_head().1));
    assert_eq!(read_back(&ledger, &auditor).len(), 9);
}

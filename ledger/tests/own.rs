//! The writer reads back its own decisions: those of the current key epoch, with the key
//! it holds, after a reopen too; never an earlier epoch's.

use tally_ledger::{Ledger, Rotation};

use crate::store::{decision, new_ledger};

/// The runs and seqs `l` reads back from its current epoch.
fn read(l: &Ledger) -> Vec<(u64, String)> {
    let mut got = Vec::new();
    let read = l.read_epoch(|seq, d| got.push((seq, d.run))).unwrap();
    assert_eq!(read.unreadable, 0);
    assert_eq!(read.decisions, got.len() as u64);
    got
}

#[test]
fn the_writer_reads_back_the_current_epoch_and_no_earlier_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l");
    let (l, _auditor) = new_ledger(&path, Rotation::default());
    let first: Vec<_> = (0..5)
        .map(|i| l.append(decision("old", i)).unwrap())
        .collect();
    let want: Vec<_> = first.iter().map(|r| (r.seq, "old".to_owned())).collect();
    assert_eq!(read(&l), want);
    l.rotate().unwrap();
    let after: Vec<_> = (0..3)
        .map(|i| l.append(decision("new", i)).unwrap())
        .collect();
    let want: Vec<_> = after.iter().map(|r| (r.seq, "new".to_owned())).collect();
    assert_eq!(read(&l), want, "the earlier epoch's key is gone");
    drop(l);
    let l = tally_ledger::Ledger::open(&path).unwrap();
    assert_eq!(read(&l), want, "the same after a reopen");
}

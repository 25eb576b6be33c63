//! The ledger reads the time only from the clock it is given: the genesis, each entry and
//! checkpoint are stamped with it, a key epoch rotates when it has run `rotation.ms` on
//! that clock (to the millisecond, no sleeping), and a clock set back never takes the
//! ledger's times back.

use std::sync::Arc;

use tally_ledger::clock::{Clock, ManualClock};
use tally_ledger::keys::AuditorKey;
use tally_ledger::{Entry, Frame, Ledger, Rotation};

use crate::store::decision;

const T0: u64 = 1_700_000_000_000;

fn wall_times(ledger: &Ledger) -> Vec<u64> {
    ledger
        .snapshot()
        .map(Result::unwrap)
        .filter_map(|f| match f {
            Frame::Entry(bytes) => Some(Entry::decode(&bytes).unwrap().header.wall_ms),
            _ => None,
        })
        .collect()
}

#[test]
fn an_epoch_rotates_at_its_age_on_the_ledgers_clock_and_times_never_go_back() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("l");
    let clock = Arc::new(ManualClock::new(T0));
    let rotation = Rotation {
        records: u64::MAX,
        ms: 1000,
    };
    Ledger::init_with_clock(
        &dir,
        &AuditorKey::generate().public(),
        rotation,
        clock.as_ref(),
    )
    .unwrap();
    let ledger = Ledger::open_with_clock(&dir, Arc::clone(&clock) as Arc<dyn Clock>).unwrap();
    assert_eq!(ledger.checkpoint().wall_ms, T0, "the genesis checkpoint");
    clock.advance(999);
    ledger.append(decision("r", 1)).unwrap();
    assert_eq!(ledger.epoch(), 0, "999 ms into the epoch");
    assert_eq!(ledger.checkpoint().wall_ms, T0 + 999);
    clock.advance(1);
    ledger.append(decision("r", 2)).unwrap();
    assert_eq!(ledger.epoch(), 1, "rotated at 1000 ms");
    // Set back an hour: the next entry keeps the last time written.
    clock.set(T0 - 3_600_000);
    ledger.append(decision("r", 3)).unwrap();
    let times = wall_times(&ledger);
    assert_eq!(times.first(), Some(&T0), "genesis");
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "{times:?}");
    assert_eq!(*times.last().unwrap(), T0 + 1000);
}

//! The store's lock: a second writer gets a typed "busy", not a store error.

use tally_ledger::{Error, Ledger};
use tally_tests::*;

#[test]
fn second_open_is_busy() {
    let fx = Fixture::new(&[Step::Append(1)]);
    match Ledger::open(&fx.dir) {
        Err(Error::Busy(_)) => {}
        Err(e) => panic!("expected Error::Busy, got {e:?}"),
        Ok(_) => panic!("a second writer opened a held ledger"),
    }
}

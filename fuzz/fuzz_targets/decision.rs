//! Stored decisions: never panics; whatever is accepted is in its one canonical form, and
//! the fast canonical reader and the general strict parse always give the same answer.
#![no_main]
use tally_ledger::Decision;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let fast = Decision::from_stored(data);
    let general = Decision::from_stored_general(data);
    assert_eq!(fast.is_ok(), general.is_ok());
    if let (Ok(d), Ok(g)) = (&fast, &general) {
        assert_eq!(d, g);
        assert_eq!(d.to_canonical_json(), data);
    }
});

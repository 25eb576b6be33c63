//! Stored decisions (`Decision::from_stored`: every plaintext the verifier decrypts): never
//! panics; the fast canonical reader (`tally-record`'s `canonical::parse`, tried first) and
//! the general strict parse always give the same answer, and whatever is accepted is in its
//! one canonical form: it re-encodes to exactly the input bytes.
#![no_main]
use tally_ledger::Decision;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let fast = Decision::from_stored(data);
    let general = Decision::from_stored_general(data);
    assert_eq!(fast.is_ok(), general.is_ok(), "{fast:?} / {general:?}");
    if let (Ok(d), Ok(g)) = (&fast, &general) {
        assert_eq!(d, g);
        assert_eq!(d.to_canonical_json(), data);
    }
});

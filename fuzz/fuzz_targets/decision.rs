//! Stored decisions: never panics; whatever is accepted is in its one canonical form.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Ok(d) = tally_ledger::Decision::from_stored(data) {
        assert_eq!(d.to_canonical_json(), data);
    }
});

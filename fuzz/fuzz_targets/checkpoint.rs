//! Checkpoint text: never panics; whatever parses prints back to the same bytes (one encoding).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Ok(cp) = tally_ledger::Checkpoint::from_text(data) {
        assert_eq!(cp.to_text().as_bytes(), data);
    }
});

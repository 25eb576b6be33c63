//! Strict entry decoding: never panics; whatever decodes re-encodes to the same header.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Ok(e) = tally_ledger::Entry::decode(data) {
        assert_eq!(&e.header.encode()[..], e.header_bytes());
        let _ = (e.genesis(), e.epoch_cert(), e.hash());
    }
});

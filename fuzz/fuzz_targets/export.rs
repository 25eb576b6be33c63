//! Export framing: never panics, always ends.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Ok(reader) = tally_ledger::export::ExportReader::new(data) {
        for frame in reader {
            if frame.is_err() {
                break;
            }
        }
    }
});

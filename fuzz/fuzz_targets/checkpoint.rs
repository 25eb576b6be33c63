//! Checkpoint text (`Checkpoint::from_text`: stored checkpoints, export frames and the
//! anchors an auditor passes with `--anchor`): never panics; the format has one encoding,
//! so whatever parses prints back to exactly the input bytes, and its signed body is a
//! prefix of them.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Ok(cp) = tally_ledger::Checkpoint::from_text(data) {
        assert_eq!(cp.to_text().as_bytes(), data);
        assert!(data.starts_with(cp.body().as_bytes()));
        assert!(cp.size > 0);
    }
});

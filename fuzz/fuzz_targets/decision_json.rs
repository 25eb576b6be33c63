//! Decisions as agents and operators send them (`Decision::from_json`, the body of
//! `POST /v1/decisions` and each line of `tally append`): never panics; whatever parses and
//! validates is stored as canonical JSON that the stored reader accepts back as the same
//! decision, once its raw `args` are replaced by their digest.
#![no_main]
use tally_ledger::Decision;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(mut d) = Decision::from_json(text) else {
        return;
    };
    if d.validate().is_err() {
        return;
    }
    d.seal_args();
    let stored = d.to_canonical_json();
    let back = Decision::from_stored(&stored)
        .unwrap_or_else(|e| panic!("a validated decision's stored form is refused: {e}"));
    assert_eq!(back, d);
    assert_eq!(Decision::from_stored_general(&stored).as_ref(), Ok(&d));
});

//! Strict entry decoding (`Entry::decode`, the first thing the verifier does with every
//! stored or exported entry): never panics; whatever decodes is exactly one entry whose
//! header re-encodes to the same 98 bytes and decodes again to the same header, with a body
//! of the length the header gives, and a genesis or epoch body only on those entry types.
#![no_main]
use tally_ledger::format::HEADER_LEN;
use tally_ledger::{Entry, EntryType, Header};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Ok(e) = Entry::decode(data) else {
        // A strict decoder refuses every longer or shorter buffer too, never panics.
        return;
    };
    assert_eq!(e.bytes, data);
    assert_eq!(&e.header.encode()[..], e.header_bytes());
    assert_eq!(Header::decode(e.header_bytes()), Ok(e.header));
    assert_eq!(e.body().len(), e.header.body_len as usize);
    assert_eq!(data.len(), HEADER_LEN + e.body().len());
    assert_eq!(e.genesis().is_some(), e.header.entry_type == EntryType::Genesis);
    assert_eq!(e.epoch_cert().is_some(), e.header.entry_type == EntryType::Epoch);
    let _ = (e.hash(), e.signed_message());
    // One byte more or less is never one entry.
    assert!(Entry::decode(&data[..data.len() - 1]).is_err());
});

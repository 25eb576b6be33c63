//! C2SP signed notes, checkpoints, tlog-proofs and add-checkpoint bodies (what `tally
//! verify-proof`, `--anchor`, `checkpoint.cosigned` and `tally witness serve` read from
//! untrusted hands): never panics; one encoding, so whatever parses prints back to
//! exactly the input bytes.
#![no_main]
use tally_ledger::tlog::note::{Note, TreeHead};
use tally_ledger::tlog::proof::{ConsistencyProof, TlogProof};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Ok(n) = Note::parse(data) {
        assert_eq!(n.to_text().as_bytes(), data);
        if let Ok(h) = TreeHead::parse(&n.text) {
            assert_eq!(h.to_text(), n.text);
        }
    }
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(p) = TlogProof::parse(text) {
            assert_eq!(p.to_text(), text);
        }
        if let Ok(ps) = TlogProof::parse_bundle(text) {
            assert_eq!(ps.iter().map(TlogProof::to_text).collect::<String>(), text);
        }
        if let Ok(c) = ConsistencyProof::parse(text) {
            assert_eq!(c.to_text(), text);
        }
    }
});

//! C2SP tlog-policy files (`--witness-policy`): never panics, and a quorum is decided for
//! any set of witnesses without recursing past the policy's own groups.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Ok(p) = tally_ledger::tlog::policy::Policy::parse(data) {
        let all: std::collections::BTreeSet<usize> = (0..p.witnesses.len()).collect();
        let none = std::collections::BTreeSet::new();
        // More witnesses never break a quorum that fewer met.
        assert!(!p.quorum_met(&none) || p.quorum_met(&all));
    }
});

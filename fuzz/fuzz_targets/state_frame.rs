//! State frames of the log (tags 3 and 4, `StateFrame::decode` and `resolve`): never
//! panic, whatever the payload and the previous values; and a frame of tag 4 that decodes
//! and resolves holds values the writer's encoder writes as a frame with the same keys
//! and the same check, resolving to the same values.
#![no_main]
use tally_ledger::segment::{StateFrame, TAG_STATE, TAG_STATE_DELTA};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    // The first byte splits the input: previous value (all keys share it), then payload.
    let Some((&cut, rest)) = data.split_first() else {
        return;
    };
    let (base, payload) = rest.split_at((cut as usize).min(rest.len()));
    for tag in [TAG_STATE, TAG_STATE_DELTA] {
        let Ok(frame) = StateFrame::decode(tag, payload) else {
            continue;
        };
        let Ok(pairs) = frame.clone().resolve(|_| Some(base)) else {
            continue;
        };
        if tag == TAG_STATE_DELTA {
            // Same keys, in the same order, and the same check.
            let refs: Vec<(&[u8], &[u8])> = pairs
                .iter()
                .map(|(k, v)| (k.as_slice(), v.as_slice()))
                .collect();
            let again = StateFrame::encode(&refs, |_| Some(base));
            let again = StateFrame::decode(TAG_STATE_DELTA, &again).expect("encoder output decodes");
            assert_eq!(again.check, frame.check);
            let keys = |f: &StateFrame| f.pairs.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>();
            assert_eq!(keys(&again), keys(&frame));
            assert_eq!(again.resolve(|_| Some(base)).expect("encoder output resolves"), pairs);
        }
    }
});

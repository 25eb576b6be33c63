//! The gate's derived state in the log as deltas (`docs/FORMAT.md`, "Log segments", tag
//! 4): what a writer encodes against the previous values it wrote decodes, frame after
//! frame, to exactly the values written; the form is strict; and through a real ledger,
//! reopening and `reindex` give back every value while the log holds mostly deltas.

use std::collections::BTreeMap;

use proptest::prelude::*;
use tally_ledger::segment::{Item, LogReader, StateFrame, StateValue, TAG_STATE_DELTA};
use tally_ledger::{Ledger, Rotation};

use crate::store::{decision, new_ledger};

/// One value of a key's history: the step before it, edited the way a run's state is
/// (a counter bumped, a window shifted, an entry added).
fn next_value(prev: &[u8], edit: u8, salt: u8) -> Vec<u8> {
    let mut v = prev.to_vec();
    match edit % 4 {
        0 => {
            if let Some(b) = v.get_mut(3) {
                *b = b.wrapping_add(1);
            }
        }
        1 => {
            if v.len() > 12 {
                v.drain(..12);
            }
            v.extend((0..12).map(|i| salt.wrapping_mul(31).wrapping_add(i)));
        }
        2 => v.extend_from_slice(&[salt; 7]),
        _ => v.truncate(v.len() / 2),
    }
    v
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// A writer's frames (bases: the last value it wrote of each key) decode, applied in
    /// order to an index, to exactly what it wrote; and every frame decodes to the pairs
    /// it encodes.
    #[test]
    fn deltas_decode_to_the_values_written(
        groups in prop::collection::vec(
            prop::collection::vec((0u8..6, any::<u8>(), any::<u8>()), 1..6), 1..40),
    ) {
        let mut written: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
        let mut index: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
        for group in groups {
            let mut changed: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
            for (key, edit, salt) in group {
                let key = format!("r/run-{key}").into_bytes();
                let prev = changed.get(&key).or(written.get(&key)).cloned().unwrap_or_else(|| {
                    (0..200u8).map(|i| i ^ key[6]).collect()
                });
                changed.insert(key, next_value(&prev, edit, salt));
            }
            let pairs: Vec<(&[u8], &[u8])> =
                changed.iter().map(|(k, v)| (k.as_slice(), v.as_slice())).collect();
            let payload = StateFrame::encode(&pairs, |k| written.get(k).map(Vec::as_slice));
            let frame = StateFrame::decode(TAG_STATE_DELTA, &payload).unwrap();
            let stored: Vec<StateValue> = changed
                .iter()
                .map(|(k, v)| StateValue::encode(v, written.get(k).map(Vec::as_slice)))
                .collect();
            prop_assert_eq!(
                frame.pairs.clone(),
                changed.keys().cloned().zip(stored).collect::<Vec<_>>()
            );
            // Decoded against other previous values (each cut in half), the frame is
            // refused, or decodes to the same values (the delta did not refer to the cut).
            let right = frame.clone().resolve(|k| index.get(k).map(Vec::as_slice)).unwrap();
            let wrong = frame.clone().resolve(|k| {
                index
                    .get(k)
                    .map(|v| &v[..v.len() / 2])
                    .filter(|v| !v.is_empty())
            });
            prop_assert!(wrong.as_ref().map_or(true, |w| *w == right));
            for (k, value) in frame.resolve(|k| index.get(k).map(Vec::as_slice)).unwrap() {
                index.insert(k, value);
            }
            written.extend(changed);
            prop_assert_eq!(&index, &written);
        }
    }

    /// Damage never panics the decoder, and a damaged delta never resolves to another
    /// value unnoticed: it resolves to the value written, or it is refused.
    #[test]
    fn damaged_frames_are_refused_or_harmless(at in any::<prop::sample::Index>(), byte in any::<u8>()) {
        let base: Vec<u8> = (0..120u8).collect();
        let value = next_value(&base, 1, 9);
        let is_delta = matches!(StateValue::encode(&value, Some(&base)), StateValue::Delta { .. });
        prop_assert!(is_delta);
        let mut payload = StateFrame::encode(&[(&b"r/a"[..], &value[..])], |_| Some(&base[..]));
        let i = at.index(payload.len());
        payload[i] = byte;
        if let Ok(frame) = StateFrame::decode(TAG_STATE_DELTA, &payload) {
            if let Ok(pairs) = frame.resolve(|_| Some(&base[..])) {
                prop_assert_eq!(pairs, vec![(b"r/a".to_vec(), value)]);
            }
        }
    }
}

#[test]
fn a_ledger_keeps_its_state_as_deltas_and_gives_it_back() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("l");
    drop(new_ledger(&dir, Rotation::default()));
    let ledger = Ledger::open_with_segment_bytes(&dir, 64 * 1024).unwrap();
    let mut want: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
    for i in 0..400u64 {
        let key = format!("r/run-{}", i % 7).into_bytes();
        let prev = want.get(&key).cloned().unwrap_or_else(|| vec![7u8; 300]);
        let value = next_value(&prev, (i % 3) as u8, i as u8);
        want.insert(key.clone(), value.clone());
        let p = tally_ledger::ledger::prepare(vec![decision("r", i)]).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        ledger.submit_with_state(p, vec![(key, value)], move |r| tx.send(r).unwrap());
        rx.recv().unwrap().unwrap();
    }
    let check = |ledger: &Ledger, when: &str| {
        for (k, v) in &want {
            assert_eq!(ledger.state_get(k).unwrap().as_ref(), Some(v), "{when}");
        }
    };
    check(&ledger, "live");
    // Index points still folded in memory lead to the entries too.
    for seq in [1u64, 57, 200, 399, 400] {
        let bytes = ledger.entry(seq).unwrap().unwrap();
        assert_eq!(tally_ledger::Header::decode(&bytes).unwrap().seq, seq);
    }
    drop(ledger);
    // Closed cleanly, reopened: the state is all there.
    let ledger = Ledger::open(&dir).unwrap();
    check(&ledger, "reopened");
    drop(ledger);
    // Reopened with the index behind the log (lost): replayed from the log alone.
    tally_ledger::store::remove_index(&dir.join(tally_ledger::store::INDEX_DIR)).unwrap();
    let ledger = Ledger::open(&dir).unwrap();
    check(&ledger, "replayed into a new index on open");
    drop(ledger);
    // The replay on open also wrote the index's seq points (as a reindex does).
    let store = tally_ledger::store::Store::open(&dir).unwrap();
    let point = store.point(400).unwrap().expect("a seq point");
    assert!(point.seq > 100, "{point:?}");
    drop(store);
    Ledger::reindex(&dir).unwrap();
    let ledger = Ledger::open(&dir).unwrap();
    check(&ledger, "after reindex");
    drop(ledger);
    let (mut deltas, mut whole) = (0, 0);
    for item in LogReader::open(&dir).unwrap() {
        if let Item::State { frame, .. } = item.unwrap() {
            for (_, v) in frame.pairs {
                match v {
                    StateValue::Delta { .. } => deltas += 1,
                    _ => whole += 1,
                }
            }
        }
    }
    // Each key's first value is whole; the rest are deltas.
    assert!(deltas > 300, "{deltas} deltas, {whole} whole");
}

/// The writer does not try a delta for a value under 13 bytes (a run link's 8-byte seq
/// is one, in every group): LZ4 cannot write one shorter, even against a base equal to
/// the value, so skipping it never changes what is stored.
#[test]
fn values_under_13_bytes_are_never_shorter_as_deltas() {
    for len in 1..13usize {
        for base in [vec![7u8; len], vec![7u8; 64], (0..len as u8).collect()] {
            let value = vec![7u8; len];
            let block = lz4_flex::block::compress_with_dict(&value, &base);
            assert!(
                block.len() + 4 >= len,
                "{len} bytes: a {}-byte block",
                block.len()
            );
            assert_eq!(
                StateValue::encode(&value, Some(&base)),
                StateValue::Full(value)
            );
        }
    }
}

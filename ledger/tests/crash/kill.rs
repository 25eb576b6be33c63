//! SIGKILL of the writer in the middle of a stream of appends.

use super::*;

#[test]
fn kill_9_loses_no_acknowledged_append() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("l");
    let auditor = AuditorKey::generate();
    Ledger::init(
        &dir,
        &auditor.public(),
        Rotation {
            records: 50,
            ms: u64::MAX,
        },
    )
    .unwrap();
    let mut acknowledged = HashMap::new();
    let mut before = segments(&dir);
    let mut torn_seen = 0;
    // Kill points vary from round to round (a fixed pseudo-random sequence).
    let mut x = 0x9e37_79b9_u64;
    for round in 0..8 {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let wanted = 200 + (x >> 33) as usize % 1500;
        let (acks, counters) = run_and_kill(&dir, wanted);
        acknowledged.extend(acks);
        // No byte any segment held before this round changed, torn writes included.
        let after = segments(&dir);
        for (name, old) in &before {
            let new = &after[name];
            assert!(new.len() >= old.len(), "{name} shrank in round {round}");
            assert_eq!(
                blake3::hash(&new[..old.len()]),
                blake3::hash(old),
                "{name}: a byte it held before round {round} changed"
            );
        }
        // The reader names every torn remainder (no writer holds the ledger now), at
        // the offset an independent walk of the bytes finds.
        let torn: Vec<(u64, u64, u64)> = torn_writes(&dir);
        let expected: Vec<(u64, u64, u64)> = after
            .iter()
            .enumerate()
            .filter_map(|(n, (_, bytes))| {
                let end = sealed_end(bytes);
                (end < bytes.len()).then(|| (n as u64, end as u64, (bytes.len() - end) as u64))
            })
            .collect();
        assert_eq!(torn, expected, "torn writes after round {round}");
        torn_seen = torn_seen.max(torn.len());
        let ledger = Ledger::open_with_segment_bytes(&dir, SEGMENT_BYTES).unwrap();
        let stored = walk(&ledger, &auditor);
        for (seq, hash) in &acknowledged {
            assert_eq!(
                stored.get(seq),
                Some(hash),
                "acknowledged seq {seq} after round {round}"
            );
        }
        // The gate's state is never behind an acknowledged decision, and every value
        // decoded (most are deltas) is one the writer wrote.
        let mut state = Vec::new();
        for (t, i) in counters {
            let v = ledger
                .state_get(format!("w{t}").as_bytes())
                .unwrap()
                .unwrap();
            let v = state_counter(t, &v);
            assert!(
                v >= i,
                "state w{t} = {v} behind acknowledged counter {i} (round {round})"
            );
            state.push((t, v));
        }
        drop(ledger);
        // The log alone gives the same state: a reindex decodes every delta against the
        // frames before it, whatever the kills cut.
        Ledger::reindex(&dir).unwrap();
        let ledger = Ledger::open_with_segment_bytes(&dir, SEGMENT_BYTES).unwrap();
        for (t, v) in state {
            let again = ledger
                .state_get(format!("w{t}").as_bytes())
                .unwrap()
                .unwrap();
            assert_eq!(
                state_counter(t, &again),
                v,
                "w{t} after reindex (round {round})"
            );
        }
        drop(ledger);
        before = segments(&dir);
    }
    assert!(
        segments(&dir).len() > 3,
        "the rounds crossed segment boundaries"
    );
    let (mut deltas, mut whole) = (0, 0);
    for item in tally_ledger::segment::LogReader::open(&dir).unwrap() {
        if let tally_ledger::segment::Item::State { frame, .. } = item.unwrap() {
            // The ledger's run links (8-byte seqs under `\0l/`) are always whole.
            for (_, v) in frame
                .pairs
                .into_iter()
                .filter(|(k, _)| !k.starts_with(b"\0l/"))
            {
                match v {
                    tally_ledger::segment::StateValue::Delta { .. } => deltas += 1,
                    _ => whole += 1,
                }
            }
        }
    }
    assert!(
        deltas > whole,
        "most state values are deltas: {deltas} deltas, {whole} whole"
    );
    eprintln!(
        "kill -9: {} acknowledged, up to {torn_seen} torn writes at once; state values: {deltas} deltas, {whole} whole",
        acknowledged.len()
    );
}

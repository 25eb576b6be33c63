//! A write that fails (the file size limit: EFBIG) poisons the writer, and a writer killed
//! inside a write (SIGXFSZ) leaves a torn write that is named; no acknowledged append is
//! lost either way.

use super::*;

#[test]
fn a_failed_write_poisons_and_loses_no_acknowledged_append() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("l");
    let auditor = AuditorKey::generate();
    Ledger::init(&dir, &auditor.public(), Rotation::default()).unwrap();
    // `trap '' XFSZ` makes the child ignore the signal, so its writes past the limit fail
    // with EFBIG instead of killing it. `ulimit -f` counts 512- or 1024-byte blocks.
    let out = Command::new("sh")
        .arg("-c")
        .arg(r#"trap '' XFSZ; ulimit -f 6144 && exec "$0" --ignored --exact crash::full_disk_child_writer --nocapture --test-threads=1"#)
        .arg(std::env::current_exe().unwrap())
        .env(FULL_VAR, &dir)
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "child failed: {:?}\n{stdout}",
        out.status
    );
    let mut acknowledged = HashMap::new();
    let mut errors = Vec::new();
    let mut after = None;
    for line in stdout.lines() {
        if let Some((seq, hash)) = ack(line) {
            acknowledged.insert(seq, hash);
        } else if let Some(e) = line.strip_prefix("ERR ") {
            errors.push(e.to_string());
        } else if let Some(a) = line.strip_prefix("AFTER ") {
            after = Some(a.to_string());
        }
    }
    assert!(
        acknowledged.len() >= 100,
        "only {} acknowledged",
        acknowledged.len()
    );
    assert_eq!(errors.len(), 4, "every appender got an error: {errors:?}");
    let after = after.expect("the child tried one more append");
    assert!(
        after.starts_with("ledger is closed after a failed write"),
        "after a failed write: {after}"
    );
    // What the failed write left is reported where an independent walk finds it.
    let before = segments(&dir);
    let torn: Vec<(u64, u64)> = tally_ledger::segment::LogReader::open(&dir)
        .unwrap()
        .filter_map(|i| match i.unwrap() {
            tally_ledger::segment::Item::Torn(t) => Some((t.segment, t.offset)),
            _ => None,
        })
        .collect();
    let expected: Vec<(u64, u64)> = before
        .values()
        .enumerate()
        .filter(|(_, b)| sealed_end(b) < b.len())
        .map(|(n, b)| (n as u64, sealed_end(b) as u64))
        .collect();
    assert_eq!(torn, expected);
    eprintln!(
        "disk full: {} acknowledged, torn writes {torn:?}",
        acknowledged.len()
    );
    // Reopened without the limit: every acknowledged decision is there, the chain
    // links and is sealed, and appends work again.
    let ledger = Ledger::open(&dir).unwrap();
    let stored = walk(&ledger, &auditor);
    for (seq, hash) in &acknowledged {
        assert_eq!(stored.get(seq), Some(hash), "acknowledged seq {seq}");
    }
    let r = ledger
        .append(Decision::from_json(r#"{"run":"x","kind":"allow","tool":"t"}"#).unwrap())
        .unwrap();
    assert_eq!(r.seq, stored.len() as u64);
    drop(ledger);
    // ... after every byte the log held, torn write included.
    let after = segments(&dir);
    for (name, old) in &before {
        assert_eq!(&after[name][..old.len()], &old[..], "{name} changed");
    }
}

/// The file size limit kills the writer *inside* a write: `ulimit -f` below the segment
/// size, and SIGXFSZ (not ignored this time) ends the process at the write that crosses
/// it, after the bytes up to the limit landed. A real death mid-write, every time: the
/// torn write is named where an independent walk finds it, every acknowledged receipt and
/// counter survives, no earlier byte changes, and the log resumes in a new segment.
#[test]
fn killed_inside_a_write_by_the_file_size_limit() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("l");
    let auditor = AuditorKey::generate();
    Ledger::init(&dir, &auditor.public(), Rotation::default()).unwrap();
    let before = segments(&dir);
    // 240 blocks (122,880 or 245,760 bytes, by the shell's unit) < SEGMENT_BYTES.
    let out = Command::new("sh")
        .arg("-c")
        .arg(r#"ulimit -f 240 && exec "$0" --ignored --exact crash::crash_child_writer --nocapture --test-threads=1"#)
        .arg(std::env::current_exe().unwrap())
        .env(DIR_VAR, &dir)
        .stderr(Stdio::null())
        .output()
        .unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        out.status.signal(),
        Some(25),
        "SIGXFSZ ended the child: {:?}",
        out.status
    );
    let mut acknowledged = HashMap::new();
    let mut counters: HashMap<u64, u64> = HashMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        if let Some((seq, rest)) = ack(line) {
            let mut parts = rest.split(' ');
            acknowledged.insert(seq, parts.next().unwrap().to_string());
            let t: u64 = parts.next().unwrap().parse().unwrap();
            let i: u64 = parts.next().unwrap().parse().unwrap();
            let c = counters.entry(t).or_insert(0);
            *c = (*c).max(i);
        }
    }
    assert!(
        acknowledged.len() >= 5,
        "{} acknowledged",
        acknowledged.len()
    );
    let after = segments(&dir);
    for (name, old) in &before {
        assert_eq!(&after[name][..old.len()], &old[..], "{name} changed");
    }
    let seg0 = &after[&tally_ledger::segment::segment_name(0)];
    let end = sealed_end(seg0);
    assert!(
        end < seg0.len(),
        "the write that crossed the limit left a torn tail"
    );
    let torn: Vec<(u64, u64, u64)> = torn_writes(&dir);
    assert_eq!(torn, [(0, end as u64, (seg0.len() - end) as u64)]);
    let ledger = Ledger::open_with_segment_bytes(&dir, SEGMENT_BYTES).unwrap();
    let stored = walk(&ledger, &auditor);
    for (seq, hash) in &acknowledged {
        assert_eq!(stored.get(seq), Some(hash), "acknowledged seq {seq}");
    }
    for (t, i) in counters {
        let v = ledger
            .state_get(format!("w{t}").as_bytes())
            .unwrap()
            .unwrap();
        assert!(state_counter(t, &v) >= i, "state w{t} behind {i}");
    }
    let r = ledger
        .append(Decision::from_json(r#"{"run":"x","kind":"allow","tool":"t"}"#).unwrap())
        .unwrap();
    assert_eq!(r.seq, stored.len() as u64);
    drop(ledger);
    let last = segments(&dir);
    assert_eq!(
        &last[&tally_ledger::segment::segment_name(0)],
        seg0,
        "segment 0 kept whole"
    );
    assert!(
        last.contains_key(&tally_ledger::segment::segment_name(1)),
        "resumed in segment 1"
    );
}

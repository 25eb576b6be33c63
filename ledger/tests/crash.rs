//! `kill -9` in the middle of a stream of appends: every acknowledged record survives, the
//! chain still links and is sealed, the gate's derived state is never behind an
//! acknowledged decision, and no byte the log held before the kill changed. The writer is
//! this test binary re-executed as a child process (`crash_child_writer`), so the kill is
//! a real SIGKILL.

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tally_ledger::format::{Entry, EntryType};
use tally_ledger::keys::{verify_checkpoint, verify_signature, AuditorKey};
use tally_ledger::{Checkpoint, Decision, Frame, Ledger, Rotation};

mod full;
mod kill;

const DIR_VAR: &str = "TALLY_CRASH_DIR";
/// Small segments, so the kills fall across segment boundaries and rotations.
const SEGMENT_BYTES: u64 = 256 * 1024;

/// The derived state thread `t` writes with its decision `i` under `w{t}`: the counter
/// (u64 BE) and then, like a run's recent calls, the 24 counters before it and a tail that
/// never changes, so that the writer stores most of them as deltas against the previous
/// value.
fn state_value(t: u64, i: u64) -> Vec<u8> {
    let mut v = i.to_be_bytes().to_vec();
    for j in 1..=24u64 {
        v.extend_from_slice(
            &i.wrapping_sub(j)
                .wrapping_mul(0x9e37_79b9_7f4a_7c15)
                .to_be_bytes(),
        );
    }
    v.extend_from_slice(format!("thread {t}, a tail that never changes").as_bytes());
    v
}

/// The counter a `w{t}` value holds, checking that the whole value is the one written with
/// it (a delta decoded against the wrong previous value would not be).
fn state_counter(t: u64, v: &[u8]) -> u64 {
    let i = u64::from_be_bytes(v[..8].try_into().unwrap());
    assert_eq!(
        v,
        state_value(t, i),
        "state w{t} is not a value the writer wrote"
    );
    i
}

/// The child of `kill_9_loses_no_acknowledged_append`: four threads appending through
/// `submit_with_state`, each decision carrying its thread's counter in [`state_value`]
/// as derived state, printing `ACK seq hash t i` once acknowledged.
#[test]
#[ignore = "run by crash::kill_9_loses_no_acknowledged_append as its child process"]
fn crash_child_writer() {
    let Ok(dir) = std::env::var(DIR_VAR) else {
        return;
    };
    let ledger = Arc::new(Ledger::open_with_segment_bytes(Path::new(&dir), SEGMENT_BYTES).unwrap());
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let ledger = Arc::clone(&ledger);
            std::thread::spawn(move || {
                // Thread 0 appends batches of 200 (writes of ~60 KiB, which a kill can
                // cut short: torn writes); the others one decision at a time.
                let n = if t == 0 { 200 } else { 1 };
                // (Groups of 128 or more hash their tree on a second thread: these do.)
                for i in 0u64.. {
                    let ds = (0..n)
                        .map(|k| {
                            Decision::from_json(&format!(
                                r#"{{"run":"w{t}","kind":"allow","tool":"t","args":{{"i":{i},"k":{k}}},"attempt":{i}}}"#
                            ))
                            .unwrap()
                        })
                        .collect();
                    let plaintexts = tally_ledger::ledger::prepare(ds).unwrap();
                    let state = vec![(format!("w{t}").into_bytes(), state_value(t, i))];
                    let (tx, rx) = std::sync::mpsc::channel();
                    ledger.submit_with_state(plaintexts, state, move |r| {
                        let _ = tx.send(r);
                    });
                    let mut out = std::io::stdout().lock();
                    match rx.recv().unwrap() {
                        Ok(receipts) => {
                            for r in receipts {
                                writeln!(out, "ACK {} {} {t} {i}", r.seq, r.hash).unwrap();
                            }
                            out.flush().unwrap();
                        }
                        Err(e) => {
                            writeln!(out, "ERR {e}").unwrap();
                            return;
                        }
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

/// A child process's writers: four threads appending `batch(thread, i)` for i = 0, 1, ...
/// to the ledger named by `var`, printing `ACK seq hash` once each decision is
/// acknowledged, or `ERR why` when an append fails (that thread then stops). `None` when
/// run as an ordinary test (no `var`).
fn child_writers(var: &str, batch: fn(u64, u64) -> Vec<Decision>) -> Option<Arc<Ledger>> {
    let dir = std::env::var(var).ok()?;
    let ledger = Arc::new(Ledger::open(Path::new(&dir)).unwrap());
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let ledger = Arc::clone(&ledger);
            std::thread::spawn(move || {
                for i in 0u64.. {
                    let result = ledger.append_batch(batch(t, i));
                    let mut out = std::io::stdout().lock();
                    match result {
                        Ok(receipts) => {
                            for r in receipts {
                                writeln!(out, "ACK {} {}", r.seq, r.hash).unwrap();
                            }
                            out.flush().unwrap();
                        }
                        Err(e) => {
                            writeln!(out, "ERR {e}").unwrap();
                            out.flush().unwrap();
                            return;
                        }
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    Some(ledger)
}

/// `ACK seq hash` from a child's output line.
fn ack(line: &str) -> Option<(u64, String)> {
    let (seq, hash) = line.strip_prefix("ACK ")?.split_once(' ')?;
    Some((seq.parse().ok()?, hash.to_string()))
}

/// Run the child until it has acknowledged `acks_wanted` appends (then SIGKILL it): every
/// receipt by seq, and per thread the highest counter acknowledged.
fn run_and_kill(dir: &Path, acks_wanted: usize) -> (HashMap<u64, String>, HashMap<u64, u64>) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            "crash::crash_child_writer",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(DIR_VAR, dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut acks = HashMap::new();
    let mut counters: HashMap<u64, u64> = HashMap::new();
    let mut take = |line: &str, acks: &mut HashMap<u64, String>| {
        if let Some((seq, rest)) = ack(line) {
            let mut parts = rest.split(' ');
            let hash = parts.next().unwrap().to_string();
            let t: u64 = parts.next().unwrap().parse().unwrap();
            let i: u64 = parts.next().unwrap().parse().unwrap();
            acks.insert(seq, hash);
            let c = counters.entry(t).or_insert(0);
            *c = (*c).max(i);
        }
    };
    let start = Instant::now();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    while acks.len() < acks_wanted && start.elapsed() < Duration::from_secs(60) {
        let Some(Ok(line)) = lines.next() else { break };
        take(&line, &mut acks);
    }
    child.kill().unwrap(); // SIGKILL on Unix
    child.wait().unwrap();
    // Receipts printed between our last read and the kill were acknowledged too.
    for line in lines.map_while(Result::ok) {
        take(&line, &mut acks);
    }
    assert!(
        acks.len() >= acks_wanted.min(50),
        "child acknowledged only {} appends",
        acks.len()
    );
    (acks, counters)
}

/// Every segment file: its name, length and bytes.
fn segments(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir.join("log"))
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().into_string().unwrap(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect()
}

/// Where a segment's sealed frames end, by a walk written here independently of the
/// library's: the end of the last complete checkpoint frame (tag 2).
fn sealed_end(seg: &[u8]) -> usize {
    if seg.len() < 80 {
        return 0; // a torn creation: not even the header
    }
    let (mut pos, mut sealed) = (80, 80);
    while pos + 5 <= seg.len() {
        let tag = seg[pos];
        let len = u32::from_be_bytes(seg[pos + 1..pos + 5].try_into().unwrap()) as usize;
        if !(1..=5).contains(&tag) || pos + 5 + len > seg.len() {
            break;
        }
        pos += 5 + len;
        if tag == 2 {
            sealed = pos;
        }
    }
    sealed
}

/// The torn writes the reader names: (segment, offset, length) each.
fn torn_writes(dir: &Path) -> Vec<(u64, u64, u64)> {
    tally_ledger::segment::LogReader::open(dir)
        .unwrap()
        .filter_map(|i| match i.unwrap() {
            tally_ledger::segment::Item::Torn(t) => Some((t.segment, t.offset, t.len)),
            _ => None,
        })
        .collect()
}

/// Walk the stored chain: links, epoch certificates, decryption, and the last checkpoint.
/// Returns every entry's hash by seq.
fn walk(ledger: &Ledger, auditor: &AuditorKey) -> HashMap<u64, String> {
    let mut hashes = HashMap::new();
    let mut keys = Vec::new();
    let mut data = HashMap::new();
    let mut prev = None;
    let mut last_cp: Option<Checkpoint> = None;
    for f in ledger.snapshot() {
        match f.unwrap() {
            Frame::Checkpoint(t) => last_cp = Some(Checkpoint::from_text(&t).unwrap()),
            Frame::Cosigned(_) => unreachable!("a log holds no cosigned frame"),
            Frame::Entry(bytes) => {
                let e = Entry::decode(&bytes).unwrap();
                assert_eq!(e.header.seq, hashes.len() as u64, "gap-free");
                if let Some(p) = prev {
                    assert_eq!(e.header.prev_hash, p, "link at seq {}", e.header.seq);
                }
                prev = Some(e.hash());
                hashes.insert(e.header.seq, e.hash().to_string());
                let id = e.header.ledger_id;
                match e.header.entry_type {
                    EntryType::Genesis => {
                        let g = e.genesis().unwrap();
                        keys.push(g.verifying_key);
                        data.insert(0, auditor.epoch_key(&g.ephemeral, id, 0).unwrap());
                    }
                    EntryType::Epoch => {
                        let c = e.epoch_cert().unwrap();
                        let signer = keys.last().unwrap();
                        verify_signature(signer, &e.signed_message(), &c.signature, "epoch")
                            .unwrap();
                        keys.push(c.verifying_key);
                        data.insert(
                            e.header.epoch,
                            auditor.epoch_key(&c.ephemeral, id, e.header.epoch).unwrap(),
                        );
                    }
                    _ => {
                        let plain = data[&e.header.epoch]
                            .open(&e.header.nonce, e.header_bytes(), e.body())
                            .unwrap();
                        Decision::from_stored(&plain).unwrap();
                    }
                }
            }
        }
    }
    let cp = last_cp.unwrap();
    assert_eq!(cp.size, hashes.len() as u64, "every stored entry is sealed");
    assert_eq!(cp.head, prev.unwrap());
    verify_checkpoint(&cp, &keys[cp.epoch as usize]).unwrap();
    hashes
}

const FULL_VAR: &str = "TALLY_FULL_DIR";

/// The child of `a_failed_write_poisons_and_loses_no_acknowledged_append`: runs with a
/// file size limit, so the store's log hits a write error (EFBIG) after a few MiB.
#[test]
#[ignore = "run by crash::a_failed_write_poisons_and_loses_no_acknowledged_append as its child process"]
fn full_disk_child_writer() {
    let Some(ledger) = child_writers(FULL_VAR, |t, i| {
        (0..20)
            .map(|k| {
                Decision::from_json(&format!(
                    r#"{{"run":"w{t}","kind":"allow","tool":"t","attempt":{i},"operation":"{k:0>400}"}}"#
                ))
                .unwrap()
            })
            .collect()
    }) else {
        return;
    };
    // Once a write failed, nothing more is accepted.
    let after =
        ledger.append(Decision::from_json(r#"{"run":"x","kind":"allow","tool":"t"}"#).unwrap());
    println!(
        "AFTER {}",
        after
            .map(|_| "accepted".to_string())
            .unwrap_or_else(|e| e.to_string())
    );
}

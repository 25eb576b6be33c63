//! Reading the ledger back at open: a decision of the current key epoch that the
//! writer's own key does not open stops the gate from opening, rather than leaving the
//! approval requests it held silently out.

use std::path::Path;
use std::sync::Arc;

use tally_gate::{Caller, Gate, GateError, StartRequest};
use tally_ledger::keys::AuditorKey;
use tally_ledger::{Ledger, Rotation};
use tally_policy::Recorded;

const ALICE: Caller = Caller {
    uid: Some(1000),
    operator: false,
    proxied: false,
};

/// The byte offset of the last payload byte (the AEAD tag) of the entry frame `back`
/// places before the last one, in the ledger's first segment (docs/FORMAT.md, "Log
/// segments").
fn entry_end(segment: &[u8], back: usize) -> usize {
    let (mut at, mut ends) = (80, Vec::new());
    while at + 5 <= segment.len() {
        let tag = segment[at];
        let len = u32::from_be_bytes(segment[at + 1..at + 5].try_into().expect("4 bytes")) as usize;
        if tag == 1 {
            ends.push(at + 5 + len - 1);
        }
        at += 5 + len;
    }
    ends[ends.len() - 1 - back]
}

fn segment(ledger: &Path) -> std::path::PathBuf {
    let mut found: Vec<_> = walk(ledger)
        .into_iter()
        .filter(|p| {
            std::fs::read(p)
                .map(|b| b.starts_with(b"tally segment 3\n"))
                .unwrap_or(false)
        })
        .collect();
    found.sort();
    found.into_iter().next().expect("a segment file")
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).expect("read_dir").flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[test]
fn a_decision_the_writers_key_cannot_open_stops_the_gate_from_opening() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("l");
    Ledger::init(&path, &AuditorKey::generate().public(), Rotation::default()).expect("init");
    let policy = Recorded::new("").expect("policy");
    {
        let ledger = Arc::new(Ledger::open(&path).expect("open"));
        let gate = Gate::open(Arc::clone(&ledger), policy.clone()).expect("gate");
        // One commit group each: the flipped record below is sealed, not the log's tail.
        for run in ["a", "b", "c", "d"] {
            let start = StartRequest {
                run: run.into(),
                ..StartRequest::default()
            };
            gate.start_blocking(ALICE, start).expect("start");
        }
    }
    // Reopened as it is: it reads back and opens.
    {
        let ledger = Arc::new(Ledger::open(&path).expect("open"));
        Gate::open(ledger, policy.clone()).expect("an intact ledger opens");
    }
    // One bit of an earlier start's ciphertext flipped in place (the tail is checked
    // when the ledger opens; this is a record of a sealed group).
    let file = segment(&path);
    let mut bytes = std::fs::read(&file).expect("segment");
    let at = entry_end(&bytes, 2);
    bytes[at] ^= 1;
    std::fs::write(&file, &bytes).expect("write");

    let ledger = Arc::new(Ledger::open(&path).expect("the ledger itself still opens"));
    match Gate::open(ledger, policy) {
        Err(GateError::Unavailable(why)) => {
            assert!(
                why.contains("do not open with the writer's own key"),
                "{why}"
            );
            assert!(why.contains("tally verify"), "{why}");
        }
        Err(other) => panic!("refused for another reason: {other}"),
        Ok(_) => panic!("a gate opened over a decision its own key cannot read"),
    }
}

//! Baseline for the daemon's numbers: `allow` decisions appended straight through
//! `Ledger::append_prepared` from N threads, no HTTP. `cargo run --release -p tally-daemon
//! --example ledger_baseline -- THREADS BATCH SECONDS`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tally_ledger::{AuditorKey, Decision, Ledger, Rotation};

fn main() {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let (threads, batch, seconds) = (
        args.first().copied().unwrap_or(64),
        args.get(1).copied().unwrap_or(1),
        args.get(2).copied().unwrap_or(3),
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("ledger");
    Ledger::init(&path, &AuditorKey::generate().public(), Rotation::default()).expect("init");
    let ledger = Arc::new(Ledger::open(&path).expect("open"));
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (ledger, done) = (Arc::clone(&ledger), Arc::clone(&done));
            std::thread::spawn(move || {
                while start.elapsed() < Duration::from_secs(seconds) {
                    let decisions: Vec<Decision> = (0..batch)
                        .map(|k| Decision::from_json(&format!(r#"{{"run":"b-{t}-{k}","kind":"allow","tool":"http.post","reserve_cents":3,"args":{{"n":{k}}}}}"#)).expect("json"))
                        .collect();
                    let prepared = tally_ledger::ledger::prepare(decisions).expect("prepare");
                    ledger.append_prepared(prepared).expect("append");
                    done.fetch_add(batch, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("join");
    }
    let n = done.load(Ordering::Relaxed);
    println!(
        "threads {threads} batch {batch}: {:.0} decisions/s",
        n as f64 / start.elapsed().as_secs_f64()
    );
}

//! Verifier throughput beside BLAKE3 and AEAD over the same bytes, in the same run.
//! `cargo bench -p tally-verify --bench verify` (TALLY_BENCH_RECORDS, default 1,000,000).
//!
//! The ledger is synthetic but real: genuine entries, keys, signatures and a checkpoint
//! every 1,000 entries, written by the format code straight to an export file (writing a
//! million records through fsynced appends would measure the disk, not the verifier).

/// As in the `tally` binary.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::fs::File;
use std::io::BufWriter;
use std::time::Instant;

use chacha20poly1305::aead::{AeadInPlace, KeyInit};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use tally_ledger::export::{ExportReader, ExportWriter};
use tally_ledger::format::{entry_hash, LedgerId};
use tally_ledger::keys::{agree_from_secret, AuditorKey, EpochSecrets, LedgerPublic};
use tally_ledger::{Decision, Frame};
use tally_verify::{verify, Options, Verdict};

/// A line of /proc/self/status in KiB: `VmHWM` (peak) or `VmRSS` (now).
fn status_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// CPU time (user + system, ticks of 10 ms: Linux's USER_HZ) from a `stat` file:
/// `/proc/thread-self/stat` for the calling thread, `/proc/self/stat` for the process.
fn cpu_of(stat: &str) -> std::time::Duration {
    let stat = std::fs::read_to_string(stat).unwrap_or_default();
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let ticks: u64 = rest
        .split_whitespace()
        .skip(11)
        .take(2)
        .map(|v| v.parse::<u64>().unwrap_or(0))
        .sum();
    std::time::Duration::from_millis(10 * ticks)
}

/// CPU time of the calling thread and of the whole process.
fn cpu() -> (std::time::Duration, std::time::Duration) {
    (cpu_of("/proc/thread-self/stat"), cpu_of("/proc/self/stat"))
}

fn peak_rss_kib() -> u64 {
    status_kib("VmHWM:")
}

/// A run's attempts are numbered 1, 2, 3, ...: allow `i` (odd) of run `i % 97` is that
/// run's attempt `i / 194 + 1`.
fn attempt(i: u64) -> u64 {
    i / 194 + 1
}

/// Decision `i`: odd ones are the outcome of the allow before them, as a gate records.
/// Consistent with the gate's default policy: a run's calls are about 3.9 s apart (its
/// per-tool bar is 60 a minute), the status reads poll one remote operation.
fn decision(i: u64) -> Vec<u8> {
    if i.is_multiple_of(2) {
        let d = Decision::from_json(&format!(
            r#"{{"run":"run-{}","kind":"outcome","worker":"w{}","at_ms":{},"attempt":{},"status":"ok","settled_cents":1,"remote_ref":"ea91","observed":"running"}}"#,
            (i - 1) % 97,
            (i - 1) % 8,
            20 * i,
            attempt(i - 1)
        ))
        .unwrap();
        return d.to_canonical_json();
    }
    let mut d = Decision::from_json(&format!(
        r#"{{"run":"run-{}","kind":"allow","worker":"w{}","at_ms":{},"tool":"http.get","operation":"export.status:ea91","args":{{"url":"https://api.example.com/v1/exports/ea91","i":{i}}},"effect":"read","channel":"http","attempt":{},"reserve_cents":2}}"#,
        i % 97,
        i % 8,
        20 * i,
        attempt(i)
    ))
    .unwrap();
    d.seal_args();
    d.to_canonical_json()
}

/// Write a synthetic ledger of `n` decisions; returns its public key and payload bytes.
fn synthesize(path: &std::path::Path, n: u64, auditor: &AuditorKey) -> (LedgerPublic, u64) {
    let id = LedgerId([9; 16]);
    let (ephemeral, data) = agree_from_secret([0x22; 32], &auditor.public(), id, 0).unwrap();
    let signer = EpochSecrets::from_bytes(0, [0x33; 32], [0; 32]);
    let vk = signer.verifying_key();
    let mut w = ExportWriter::new(BufWriter::with_capacity(
        1 << 20,
        File::create(path).unwrap(),
    ))
    .unwrap();
    let wall = 1_700_000_000_000u64;
    let g = signer.genesis_entry(id, wall, &auditor.public(), &ephemeral);
    let mut head = entry_hash(&g);
    w.frame(&Frame::Entry(g)).unwrap();
    let mut bytes = 0u64;
    for seq in 1..=n {
        let plain = decision(seq);
        let mut nonce = [7u8; 24];
        nonce[16..].copy_from_slice(&seq.to_be_bytes());
        let e = data.decision_entry(id, seq, 0, wall + seq, head, nonce, &plain);
        head = entry_hash(&e);
        bytes += e.len() as u64;
        w.frame(&Frame::Entry(e)).unwrap();
        if seq % 1000 == 0 || seq == n {
            let cp = signer.sign_checkpoint(id, seq + 1, head, wall + seq);
            w.frame(&Frame::Checkpoint(cp.to_text().into_bytes()))
                .unwrap();
        }
    }
    w.finish().unwrap();
    (
        LedgerPublic {
            ledger_id: id,
            verifying_key: vk,
            log_key: None,
        },
        bytes,
    )
}

fn frames(
    path: &std::path::Path,
) -> impl Iterator<Item = Result<Frame, tally_verify::SourceError>> {
    ExportReader::new(File::open(path).unwrap())
        .unwrap()
        .map(|f| f.map_err(Into::into))
}

fn main() {
    // As the `tally` binary does (cli/src/main.rs).
    let _ = rustix::thread::disable_transparent_huge_pages(true);
    let n: u64 = std::env::var("TALLY_BENCH_RECORDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("synthetic.tally");
    let auditor = AuditorKey::from_bytes([0x11; 32]);
    let t = Instant::now();
    let (public, entry_bytes) = synthesize(&path, n, &auditor);
    let file_len = std::fs::metadata(&path).unwrap().len();
    eprintln!(
        "synthesized {n} decisions ({file_len} bytes) in {:.1?}",
        t.elapsed()
    );

    // Primitives over the same bytes: BLAKE3 over every entry, AEAD open of every body.
    let key = blake3::derive_key("bench", b"");
    let t = Instant::now();
    let mut count = 0u64;
    for f in frames(&path) {
        if let Ok(Frame::Entry(e)) = f {
            std::hint::black_box(blake3::keyed_hash(&key, &e));
            count += 1;
        }
    }
    let blake3_rate = count as f64 / t.elapsed().as_secs_f64();
    let cipher = XChaCha20Poly1305::new(&[1u8; 32].into());
    let t = Instant::now();
    for f in frames(&path) {
        if let Ok(Frame::Entry(mut e)) = f {
            let (head, body) = e.split_at_mut(98);
            let _ = std::hint::black_box(cipher.decrypt_in_place_detached(
                XNonce::from_slice(&head[70..94]),
                head,
                body,
                (&[0u8; 16]).into(),
            ));
        }
    }
    let aead_rate = count as f64 / t.elapsed().as_secs_f64();

    let mut opts = Options::new(public);
    let t = Instant::now();
    let c0 = cpu();
    let report = verify(frames(&path), &opts, |_| {}, |_| {});
    let integrity = t.elapsed();
    let c1 = cpu();
    println!(
        "integrity pass CPU per entry: walk thread {:.3} us, process {:.3} us",
        (c1.0 - c0.0).as_secs_f64() * 1e6 / (n + 1) as f64,
        (c1.1 - c0.1).as_secs_f64() * 1e6 / (n + 1) as f64
    );
    assert_eq!(report.verdict(), Verdict::Intact, "{}", report.to_text());
    let rss_integrity = peak_rss_kib();
    // The same with the Merkle tree's checks inline (one thread for both hashes).
    opts.tree_thread = false;
    let t = Instant::now();
    let c0 = cpu();
    let report = verify(frames(&path), &opts, |_| {}, |_| {});
    let inline = t.elapsed();
    let c1 = cpu();
    println!(
        "integrity pass, tree inline, CPU per entry: walk thread {:.3} us, process {:.3} us",
        (c1.0 - c0.0).as_secs_f64() * 1e6 / (n + 1) as f64,
        (c1.1 - c0.1).as_secs_f64() * 1e6 / (n + 1) as f64
    );
    assert_eq!(report.verdict(), Verdict::Intact, "{}", report.to_text());
    opts.tree_thread = true;

    // The strict parse alone (record checks and the canonical-form check), 1 thread, over
    // the plaintexts of the first 100,000 decisions.
    let plaintexts: Vec<Vec<u8>> = (1..=n.min(100_000)).map(decision).collect();
    let t = Instant::now();
    for p in &plaintexts {
        std::hint::black_box(Decision::from_stored(p).unwrap());
    }
    let parse_rate = plaintexts.len() as f64 / t.elapsed().as_secs_f64();
    drop(plaintexts);

    opts.auditor = Some(AuditorKey::from_bytes([0x11; 32]));
    opts.threads = 2;
    let mut seen = 0u64;
    let t = Instant::now();
    let report = verify(frames(&path), &opts, |_| seen += 1, |_| {});
    let decrypting = t.elapsed();
    assert_eq!(report.verdict(), Verdict::Intact, "{}", report.to_text());
    assert_eq!(seen, n);

    // What `tally verify --auditor-key` does: the one fold on a thread of its own.
    let mut analysis = tally_verify::analysis::Analysis::in_background(Default::default());
    let t = Instant::now();
    // Resident memory during the report pass, at eight points: whether it levels off.
    let (mut pushed, mut resident) = (0u64, Vec::new());
    let every = (n / 8).max(1);
    let report = verify(
        frames(&path),
        &opts,
        |e| {
            analysis.push(e);
            pushed += 1;
            if pushed.is_multiple_of(every) {
                resident.push((pushed, status_kib("VmRSS:")));
            }
        },
        |_| {},
    );
    let found = analysis.finish();
    let reporting = t.elapsed();
    assert_eq!(report.verdict(), Verdict::Intact);
    let loops = found.loops.len();

    let rate = |d: std::time::Duration| (n + 1) as f64 / d.as_secs_f64();
    println!("## Verifier: {n} decisions, {} bytes of entries ({:.0} B/entry), export {file_len} bytes\n", entry_bytes, entry_bytes as f64 / n as f64);
    println!("| pass | records/s | vs primitive over the same bytes |\n|---|---|---|");
    println!(
        "| BLAKE3 keyed hash of every entry (read from the export) | {blake3_rate:.0} | 1.00 |"
    );
    println!(
        "| `verify` integrity only (chain walk, the tree on a second thread) | {:.0} | {:.2} of BLAKE3 |",
        rate(integrity),
        rate(integrity) / blake3_rate
    );
    println!(
        "| `verify` integrity only, the tree inline (1 thread) | {:.0} | {:.2} of BLAKE3 |",
        rate(inline),
        rate(inline) / blake3_rate
    );
    println!("| XChaCha20-Poly1305 open of every entry, 1 thread (read from the export) | {aead_rate:.0} | 1.00 |");
    println!("| strict parse + record checks of every decision, 1 thread (no I/O, no AEAD) | {parse_rate:.0} | - |");
    // One record costs a hash, an open and a parse; two threads can at best halve that.
    let bound = 2.0 / (1.0 / blake3_rate + 1.0 / aead_rate + 1.0 / parse_rate);
    println!("| bound for 2 threads: 2 / (hash + open + parse time per record) | {bound:.0} | - |");
    println!(
        "| `verify` with decryption + record checks (2 threads) | {:.0} | {:.2} of 1-thread AEAD |",
        rate(decrypting),
        rate(decrypting) / aead_rate
    );
    println!(
        "| `verify --auditor-key` work: verify + decrypt + the one fold (replay, audit, loops, handoffs; {} runs, {loops} loops) | {:.0} | {:.2} of integrity only ({:.1} s in all) |",
        found.handoffs.len(),
        rate(reporting),
        rate(reporting) / rate(integrity),
        reporting.as_secs_f64()
    );
    println!();
    println!(
        "peak RSS: {rss_integrity} KiB after the integrity pass, {} KiB after all passes",
        peak_rss_kib()
    );
    let points: Vec<String> = resident
        .iter()
        .map(|(k, kib)| format!("{kib} KiB at {k}"))
        .collect();
    println!("resident during the report pass: {}", points.join(", "));
}

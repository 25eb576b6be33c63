//! Durable append throughput (group commit) beside the raw cost of its primitives,
//! measured in the same run. `cargo bench -p tally-ledger --bench append`
//!
//! Prints a markdown table for docs/PERFORMANCE.md. Set TALLY_BENCH_SECS to change the
//! time per measurement (default 3).

use std::io::Write;

/// As in the `tally` binary.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::sync::Arc;
use std::time::{Duration, Instant};

use chacha20poly1305::aead::{AeadInPlace, KeyInit};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use ed25519_dalek::{Signer, SigningKey};
use tally_ledger::keys::AuditorKey;
use tally_ledger::{Decision, Ledger, Rotation};

fn secs() -> Duration {
    Duration::from_secs_f64(
        std::env::var("TALLY_BENCH_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(3.0),
    )
}

/// Run `f` repeatedly for about `secs()`; return ns per call.
fn per_op(mut f: impl FnMut()) -> f64 {
    let budget = secs() / 3;
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < budget {
        for _ in 0..64 {
            f();
        }
        n += 64;
    }
    start.elapsed().as_nanos() as f64 / n as f64
}

fn sample_decision(i: u64) -> Decision {
    Decision::from_json(&format!(
        r#"{{"run":"run-{r}","kind":"allow","worker":"w{w}","at_ms":{i},"tool":"http.get","operation":"export.status:ea91","args":{{"url":"https://api.example.com/v1/exports/ea91","attempt":{i}}},"effect":"read","channel":"http","attempt":{i},"reserve_cents":2,"limits":{{"attempts":{{"used":{i},"limit":1000000}}}}}}"#,
        r = i % 97,
        w = i % 8
    ))
    .unwrap()
}

fn dir_bytes(p: &std::path::Path) -> u64 {
    std::fs::read_dir(p)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .map(|e| {
                    let m = e.metadata().unwrap();
                    if m.is_dir() {
                        dir_bytes(&e.path())
                    } else {
                        m.len()
                    }
                })
                .sum()
        })
        .unwrap_or(0)
}

struct Run {
    label: String,
    decisions: u64,
    groups: u64,
    elapsed: Duration,
    bytes_per_decision: f64,
    /// CPU time of the whole process (every thread, user + system) while appending.
    cpu: Duration,
    /// CPU time of the ledger's commit thread (since the ledger was opened).
    commit: Duration,
}

/// CPU time the ledger's commit thread (`tally-commit`) has used, user + system.
fn commit_cpu() -> Duration {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return Duration::ZERO;
    };
    for t in tasks.filter_map(Result::ok) {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if comm.trim_end() == "tally-commit" {
            return cpu_of(&t.path().join("stat"));
        }
    }
    Duration::ZERO
}

/// CPU time the process has used, all threads, user + system (`/proc/self/stat`, in
/// ticks of 10 ms: Linux's USER_HZ).
fn cpu_time() -> Duration {
    cpu_of(std::path::Path::new("/proc/self/stat"))
}

/// User + system CPU time from a `stat` file of /proc (ticks of 10 ms).
fn cpu_of(path: &std::path::Path) -> Duration {
    let stat = std::fs::read_to_string(path).unwrap_or_default();
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<u64> = rest
        .split_whitespace()
        .skip(11)
        .take(2)
        .map(|v| v.parse().unwrap_or(0))
        .collect();
    Duration::from_millis(10 * f.iter().sum::<u64>())
}

/// How the appending threads come by their decisions.
#[derive(Clone, Copy, PartialEq)]
enum Callers {
    /// Format and parse each decision's JSON, as the CLI and the daemon do.
    Json,
    /// Clone decisions built beforehand, as a gate that embeds the ledger does: the
    /// appenders then leave the cores to the ledger.
    Built,
}

/// `threads` appenders, each calling append_batch with `batch` decisions, for secs().
fn durable(threads: usize, batch: usize, callers: Callers) -> Run {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("l");
    Ledger::init(&dir, &AuditorKey::generate().public(), Rotation::default()).unwrap();
    let ledger = Arc::new(Ledger::open(&dir).unwrap());
    let size0 = ledger.checkpoint().size;
    let pools: Vec<Vec<Decision>> = (0..threads)
        .map(|t| {
            let first = t as u64 * 1_000_000_000;
            match callers {
                Callers::Json => Vec::new(),
                Callers::Built => (0..batch)
                    .map(|k| sample_decision(first + k as u64))
                    .collect(),
            }
        })
        .collect();
    let stop = Instant::now() + secs();
    let start = Instant::now();
    let cpu0 = cpu_time();
    let handles: Vec<_> = pools
        .into_iter()
        .enumerate()
        .map(|(t, pool)| {
            let ledger = Arc::clone(&ledger);
            std::thread::spawn(move || {
                let mut i = t as u64 * 1_000_000_000;
                while Instant::now() < stop {
                    let ds: Vec<Decision> = match callers {
                        Callers::Json => {
                            (0..batch).map(|k| sample_decision(i + k as u64)).collect()
                        }
                        Callers::Built => pool.clone(),
                    };
                    i += batch as u64;
                    ledger.append_batch(ds).unwrap();
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let elapsed = start.elapsed();
    let cpu = cpu_time() - cpu0;
    let commit = commit_cpu();
    let cp = ledger.checkpoint();
    let decisions = cp.size - size0;
    let groups = ledger
        .snapshot()
        .filter(|f| matches!(f, Ok(tally_ledger::Frame::Checkpoint(_))))
        .count() as u64
        - 1;
    drop(ledger);
    let bytes = dir_bytes(&dir.join("log")) + dir_bytes(&dir.join("index"));
    Run {
        label: match callers {
            Callers::Json => format!("{threads} threads x append_batch({batch})"),
            Callers::Built => format!("{threads} threads x append_batch({batch}), built decisions"),
        },
        decisions,
        groups,
        elapsed,
        bytes_per_decision: bytes as f64 / decisions as f64,
        cpu,
        commit,
    }
}

fn main() {
    // As the `tally` binary does (cli/src/main.rs); TALLY_BENCH_THP=1 keeps them on.
    if std::env::var_os("TALLY_BENCH_THP").is_none() {
        rustix::thread::disable_transparent_huge_pages(true).unwrap();
    }
    // Raw primitives over the same sizes the ledger handles.
    let mut d = sample_decision(42);
    d.seal_args();
    let plaintext = d.to_canonical_json();
    let entry_len = 98 + plaintext.len() + 16;
    let entry = vec![7u8; entry_len];
    let key = blake3::derive_key("bench", b"");
    let t_blake3 = per_op(|| {
        std::hint::black_box(blake3::keyed_hash(&key, std::hint::black_box(&entry)));
    });
    // The Merkle tree's cost per entry: its leaf hash, and about one node hash (a tree of
    // n leaves has n - 1 nodes).
    let t_leaf = per_op(|| {
        std::hint::black_box(tally_ledger::tlog::merkle::leaf_hash(std::hint::black_box(
            &entry,
        )));
    });
    let t_node = per_op(|| {
        std::hint::black_box(tally_ledger::tlog::merkle::node_hash(
            std::hint::black_box(&[1u8; 32]),
            std::hint::black_box(&[2u8; 32]),
        ));
    });
    let cipher = XChaCha20Poly1305::new(&[1u8; 32].into());
    let mut buf = plaintext.clone();
    let t_aead = per_op(|| {
        buf.copy_from_slice(&plaintext);
        std::hint::black_box(
            cipher
                .encrypt_in_place_detached(XNonce::from_slice(&[2u8; 24]), &entry[..98], &mut buf)
                .unwrap(),
        );
    });
    let sk = SigningKey::from_bytes(&[3u8; 32]);
    let cp_text = vec![b'x'; 200];
    let t_sign = per_op(|| {
        std::hint::black_box(sk.sign(&cp_text));
    });
    let t_json = per_op(|| {
        let mut d = sample_decision(7);
        d.validate().unwrap();
        d.seal_args();
        std::hint::black_box(d.to_canonical_json());
    });
    let tmp = tempfile::tempdir().unwrap();
    let db = sled::Config::new()
        .path(tmp.path().join("s"))
        .flush_every_ms(None)
        .open()
        .unwrap();
    let mut k = 0u64;
    // What the index costs a commit group: one sled batch moving its mark (no flush).
    let t_sled = per_op(|| {
        k += 1;
        let mut batch = sled::Batch::default();
        batch.insert(b"m", &k.to_be_bytes());
        db.apply_batch(batch).unwrap();
    });
    // Its background threads would otherwise keep writing while the fsyncs below run.
    drop(db);
    let mut f = std::fs::File::create(tmp.path().join("fsync")).unwrap();
    let page = vec![0u8; 4096];
    let t_fsync = per_op(|| {
        f.write_all(&page).unwrap();
        f.sync_all().unwrap();
    });

    println!("## Primitives (ns per operation, this run)\n");
    println!("| primitive | size | ns/op |\n|---|---|---|");
    println!("| BLAKE3 keyed hash | {entry_len} B entry | {t_blake3:.0} |");
    println!("| SHA-256 Merkle leaf hash | {entry_len} B entry | {t_leaf:.0} |");
    println!("| SHA-256 Merkle node hash | 65 B | {t_node:.0} |");
    println!(
        "| XChaCha20-Poly1305 seal | {} B decision | {t_aead:.0} |",
        plaintext.len()
    );
    println!("| Ed25519 sign | 200 B checkpoint | {t_sign:.0} |");
    println!("| sled batch of the index mark (no flush) | 8 B | {t_sled:.0} |");
    println!("| write 4 KiB + fsync | 4096 B | {t_fsync:.0} |");
    println!("| parse + validate + digest + canonical JSON | 1 decision | {t_json:.0} |");
    println!();
    println!("## Durable appends (each acknowledged only after fsync and a signed checkpoint)\n");
    println!("| appenders | decisions/s | decisions per commit group | primitive bound/s | ratio | bytes on disk per decision | CPU us per decision (all threads) | commit thread CPU us per decision |");
    println!("|---|---|---|---|---|---|---|---|");
    // TALLY_BENCH_ONLY=8x1000,8x1000b (comma-separated) runs only those lines; `b` is the
    // line whose appenders clone decisions built beforehand.
    let only = std::env::var("TALLY_BENCH_ONLY").ok();
    let lines = [
        (1, 1, Callers::Json),
        (16, 1, Callers::Json),
        (64, 1, Callers::Json),
        (4, 100, Callers::Json),
        (8, 1000, Callers::Json),
        (8, 1000, Callers::Built),
    ];
    for (threads, batch, callers) in lines {
        if let Some(only) = &only {
            let name = match callers {
                Callers::Json => format!("{threads}x{batch}"),
                Callers::Built => format!("{threads}x{batch}b"),
            };
            if !only.split(',').any(|l| l == name) {
                continue;
            }
        }
        let r = durable(threads, batch, callers);
        let rate = r.decisions as f64 / r.elapsed.as_secs_f64();
        let per_group = r.decisions as f64 / r.groups.max(1) as f64;
        // What the primitives alone allow at this group size, on one core: per decision
        // one hash and one seal; per group one sled batch (the index), one signature and
        // one write + fsync. (Parsing is the caller's work, in its own thread.)
        let bound_ns = t_blake3 + t_aead + (t_sled + t_sign + t_fsync) / per_group;
        let bound = 1e9 / bound_ns;
        println!(
            "| {} | {:.0} | {:.1} | {:.0} | {:.2} | {:.0} | {:.2} | {:.2} |",
            r.label,
            rate,
            per_group,
            bound,
            rate / bound,
            r.bytes_per_decision,
            r.cpu.as_secs_f64() * 1e6 / r.decisions.max(1) as f64,
            r.commit.as_secs_f64() * 1e6 / r.decisions.max(1) as f64
        );
    }
}

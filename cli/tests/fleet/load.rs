//! The load on the fleet: workers checking and reporting outcomes on every daemon, and
//! what each answer was.

use super::*;

/// One answer a worker got (the bodies are read in assertion messages, through Debug).
#[derive(Debug, Clone)]
#[allow(dead_code)]
pub(crate) enum What {
    /// An allow acknowledged: its attempt, seq, hash and the operation asked.
    Allow {
        attempt: u64,
        seq: u64,
        hash: String,
        op: String,
    },
    /// An outcome acknowledged.
    Outcome {
        attempt: u64,
        seq: u64,
        hash: String,
    },
    /// A deny (the run's budget is done): its reason.
    Deny(String),
    /// 503: the answer's body.
    Unavailable(Value),
    /// An outcome refused after an earlier try of it was refused as unavailable: that try
    /// may have committed (the commit's answer lost with the connection).
    OutcomeInDoubt(Value),
    /// No answer (the connection broke).
    Lost(String),
    /// Anything else.
    Other(u16, Value),
}

#[derive(Debug, Clone)]
pub(crate) struct Seen {
    pub(crate) sent: Instant,
    pub(crate) got: Instant,
    pub(crate) what: What,
}

/// A worker's parameters.
#[derive(Clone)]
pub(crate) struct Work {
    pub(crate) socket: PathBuf,
    pub(crate) run: String,
    pub(crate) tag: String,
    pub(crate) reserve: u64,
    /// Shared by the daemon's workers: acknowledged allows.
    pub(crate) allows: Arc<AtomicU64>,
    pub(crate) stop: Arc<AtomicBool>,
}

/// Check, then report the outcome (retried while the gate is unavailable), until the run's
/// budget is done, the connection breaks or `stop` is set.
pub(crate) async fn worker(w: Work) -> Vec<Seen> {
    let mut seen = Vec::new();
    let mut c = match Client::unix(&w.socket).await {
        Ok(c) => c,
        Err(e) => {
            let now = Instant::now();
            seen.push(Seen {
                sent: now,
                got: now,
                what: What::Lost(e.to_string()),
            });
            return seen;
        }
    };
    let mut n = 0u64;
    while !w.stop.load(Ordering::Relaxed) {
        n += 1;
        let op = format!("{}-{n}", w.tag);
        let body = json!({
            "run": w.run, "worker": w.tag, "tool": format!("api{}", n % 4),
            "operation": op, "args": {"w": w.tag, "n": n}, "effect": "read",
            "reserve_cents": w.reserve
        });
        let sent = Instant::now();
        let r = post(&mut c, "/v1/check", &body).await;
        let got = Instant::now();
        let what = match r {
            Err(e) => What::Lost(e),
            Ok((200, a)) if a["decision"] == "allow" => What::Allow {
                attempt: a["attempt"].as_u64().expect("attempt"),
                seq: a["seq"].as_u64().expect("seq"),
                hash: a["hash"].as_str().expect("hash").to_owned(),
                op,
            },
            Ok((200, a)) => What::Deny(a["reason"].as_str().unwrap_or_default().to_owned()),
            Ok((503, a)) => What::Unavailable(a),
            Ok((s, a)) => What::Other(s, a),
        };
        let next = match &what {
            What::Allow { attempt, .. } => Some(*attempt),
            What::Unavailable(_) => {
                seen.push(Seen { sent, got, what });
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
            _ => None,
        };
        let done = !matches!(what, What::Allow { .. });
        seen.push(Seen { sent, got, what });
        if done {
            break;
        }
        w.allows.fetch_add(1, Ordering::Relaxed);
        let attempt = next.expect("attempt");
        let outcome = json!({
            "run": w.run, "attempt": attempt, "status": "ok",
            "settled_cents": w.reserve, "worker": w.tag
        });
        let mut refused = false;
        loop {
            let sent = Instant::now();
            let r = post(&mut c, "/v1/outcome", &outcome).await;
            let got = Instant::now();
            let (what, again) = match r {
                Err(e) => (What::Lost(e), false),
                Ok((200, o)) => (
                    What::Outcome {
                        attempt,
                        seq: o["seq"].as_u64().expect("seq"),
                        hash: o["hash"].as_str().expect("hash").to_owned(),
                    },
                    false,
                ),
                Ok((503, o)) => {
                    refused = true;
                    (What::Unavailable(o), true)
                }
                Ok((_, o)) if refused => (What::OutcomeInDoubt(o), false),
                Ok((s, o)) => (What::Other(s, o), false),
            };
            let lost = matches!(what, What::Lost(_));
            seen.push(Seen { sent, got, what });
            if lost {
                return seen;
            }
            if !again {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    seen
}

/// Each daemon's workers.
pub(crate) type Tasks = Vec<Vec<tokio::task::JoinHandle<Vec<Seen>>>>;

/// `WORKERS` workers on each daemon; `allows[d]` counts daemon `d`'s acknowledged allows.
/// Run `r` (budget out of reach) started, every daemon's workers on it, and 60 calls
/// allowed across the fleet: the load a fault is injected into.
pub(crate) async fn under_load(
    fleet: &Fleet,
    stop: &Arc<AtomicBool>,
) -> (Vec<Arc<AtomicU64>>, Tasks) {
    start_run(
        &fleet.socket(0),
        json!({"run": "r", "budget": {"attempts": 1_000_000, "spend_cents": 1_000_000}}),
    )
    .await;
    let (allows, tasks) = load(fleet, "r", 1, stop);
    let waited = Instant::now();
    while allows
        .iter()
        .map(|a| a.load(Ordering::Relaxed))
        .sum::<u64>()
        < 60
    {
        assert!(waited.elapsed() < Duration::from_secs(60), "no load");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    (allows, tasks)
}

/// Wait until every daemon allowed 20 more calls than now (at most `within`, else fail
/// saying after what); how long that took.
pub(crate) async fn allow_again(
    allows: &[Arc<AtomicU64>],
    within: Duration,
    after: &str,
) -> Duration {
    let now = |a: &[Arc<AtomicU64>]| -> Vec<u64> {
        a.iter().map(|a| a.load(Ordering::Relaxed)).collect()
    };
    let before = now(allows);
    let waited = Instant::now();
    while (0..DAEMONS).any(|d| allows[d].load(Ordering::Relaxed) < before[d] + 20) {
        assert!(
            waited.elapsed() < within,
            "the daemons did not allow again after {after}: {before:?} -> {:?}",
            now(allows)
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    waited.elapsed()
}

pub(crate) fn load(
    fleet: &Fleet,
    run: &str,
    reserve: u64,
    stop: &Arc<AtomicBool>,
) -> (Vec<Arc<AtomicU64>>, Tasks) {
    let allows: Vec<Arc<AtomicU64>> = (0..DAEMONS).map(|_| Arc::default()).collect();
    let tasks = (0..DAEMONS)
        .map(|d| {
            (0..WORKERS)
                .map(|w| {
                    tokio::spawn(worker(Work {
                        socket: fleet.socket(d),
                        run: run.to_owned(),
                        tag: format!("d{d}w{w}"),
                        reserve,
                        allows: Arc::clone(&allows[d]),
                        stop: Arc::clone(stop),
                    }))
                })
                .collect()
        })
        .collect();
    (allows, tasks)
}

pub(crate) async fn joined(tasks: Tasks) -> Vec<Vec<Seen>> {
    let mut out = Vec::new();
    for daemon in tasks {
        let mut seen = Vec::new();
        for t in daemon {
            seen.extend(t.await.expect("worker"));
        }
        out.push(seen);
    }
    out
}

pub(crate) fn count(seen: &[Seen], f: impl Fn(&Seen) -> bool) -> usize {
    seen.iter().filter(|s| f(s)).count()
}

pub(crate) fn is_allow(s: &Seen) -> bool {
    matches!(s.what, What::Allow { .. })
}

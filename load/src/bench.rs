//! `tally-load bench`: clients on their own connections send what the plan says, closed
//! loop or at an offered rate, and each request's latency is counted from when it was due.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tally_api::client::{Client, Method};
use tokio::sync::{mpsc, Mutex};

use crate::plan::{Mode, Plan};
use crate::report::Report;
use crate::requests::{body, call, decision};

/// Due times handed out by the pacer thread (`--even`).
type Slots = Arc<Mutex<mpsc::UnboundedReceiver<Instant>>>;

/// Run the plan: connect every client, send until the duration is over, and report.
pub(crate) async fn bench(plan: Plan) -> Result<Report, String> {
    let plan = Arc::new(plan);
    let mut connections = Vec::with_capacity(plan.clients);
    for _ in 0..plan.clients {
        connections.push(plan.target.connect().await.map_err(|e| e.to_string())?);
    }
    let start = Instant::now();
    // Open loop: request i is due at start + i * interval, whichever connection is free
    // to send it: claimed from a counter (each connection then sleeps on tokio's timer),
    // or with `--even` handed out at its time by a pacer thread.
    let next = Arc::new(AtomicU64::new(0));
    let paced = match plan.offered {
        Some(rate) if plan.even => {
            let (tx, rx) = mpsc::unbounded_channel();
            let interval = Duration::from_secs_f64(plan.batch as f64 / rate);
            let duration = plan.duration;
            std::thread::spawn(move || pace(start, interval, duration, tx));
            Some(Arc::new(Mutex::new(rx)))
        }
        _ => None,
    };
    let mut tasks = Vec::new();
    for (id, client) in connections.into_iter().enumerate() {
        let clock = Clock {
            start,
            paced: paced.clone(),
            next: Arc::clone(&next),
        };
        tasks.push(tokio::spawn(client_loop(
            Arc::clone(&plan),
            id,
            client,
            clock,
        )));
    }
    let mut requests = 0;
    let mut latencies = Vec::new();
    for t in tasks {
        let (sent, mut l) = t.await.map_err(|e| e.to_string())??;
        requests += sent;
        latencies.append(&mut l);
    }
    let elapsed = start.elapsed();
    latencies.sort_unstable();
    Ok(Report {
        mode: plan.mode,
        clients: plan.clients,
        batch: plan.batch,
        offered: plan.offered,
        even: plan.even,
        requests,
        decisions: requests * plan.batch as u64,
        elapsed,
        latencies,
    })
}

/// When a client's next request is due: shared by all clients of a run.
struct Clock {
    start: Instant,
    /// The pacer's due times (`--even`).
    paced: Option<Slots>,
    /// The next request's number, in an open loop without a pacer.
    next: Arc<AtomicU64>,
}

/// One client's requests until the run is over: how many it sent, and their latencies
/// in microseconds.
async fn client_loop(
    plan: Arc<Plan>,
    id: usize,
    mut client: Client,
    clock: Clock,
) -> Result<(u64, Vec<u64>), String> {
    let mut latencies = Vec::new();
    let mut sent = 0u64;
    let interval = plan.offered.map(|r| plan.batch as f64 / r);
    if plan.mode == Mode::Check {
        match plan.start_on.get(id % plan.start_on.len().max(1)) {
            Some(elsewhere) => {
                let mut other = elsewhere.connect().await.map_err(|e| e.to_string())?;
                start_gate_run(&mut other, id).await?;
            }
            None => start_gate_run(&mut client, id).await?,
        }
    }
    while let Some(due) = next_due(&clock, interval, plan.duration).await {
        let first = sent * plan.batch as u64;
        if plan.mode != Mode::Append {
            call(&mut client, plan.mode, id, first, plan.asks(first)).await?;
        } else {
            append(&mut client, id, first, plan.batch).await?;
        }
        latencies.push(due.elapsed().as_micros() as u64);
        sent += 1;
    }
    Ok((sent, latencies))
}

/// Start client `id`'s run on the gate, for its calls through it.
async fn start_gate_run(client: &mut Client, id: usize) -> Result<(), String> {
    let run = format!(r#"{{"run":"gate-bench-{id}-{}"}}"#, std::process::id());
    let r = client
        .request(Method::POST, "/v1/runs", Some("application/json"), run)
        .await
        .map_err(|e| e.to_string())?;
    if r.status.as_u16() != 201 {
        return Err(format!(
            "starting the run: {}",
            String::from_utf8_lossy(&r.body)
        ));
    }
    Ok(())
}

/// When the next request is due (waiting until then in an open loop), or none once the
/// run's `duration` is over.
async fn next_due(clock: &Clock, interval: Option<f64>, duration: Duration) -> Option<Instant> {
    match (&clock.paced, interval) {
        (Some(slots), _) => slots.lock().await.recv().await,
        (None, Some(iv)) => {
            let i = clock.next.fetch_add(1, Ordering::Relaxed);
            let due = clock.start + Duration::from_secs_f64(i as f64 * iv);
            if due.duration_since(clock.start) >= duration {
                return None;
            }
            tokio::time::sleep_until(due.into()).await;
            Some(due)
        }
        (None, None) => {
            let now = Instant::now();
            if now.duration_since(clock.start) >= duration {
                return None;
            }
            Some(now)
        }
    }
}

/// Append a batch of `batch` decisions from number `first` on; each must get its receipt.
async fn append(client: &mut Client, id: usize, first: u64, batch: usize) -> Result<(), String> {
    let result = if batch == 1 {
        client.append(&decision(id, first)).await
    } else {
        client.append_ndjson(body(id, first, batch)).await
    };
    match result {
        Ok(r) if r.len() == batch => Ok(()),
        Ok(r) => Err(format!("{} receipts for a batch of {}", r.len(), batch)),
        Err(e) => Err(e.to_string()),
    }
}

/// Hand out due times, each at its time (a thread sleep is precise to tens of µs), until
/// `duration` is over; a slot no connection is free to take waits in the channel, its
/// latency still counted from when it was due.
fn pace(
    start: Instant,
    interval: Duration,
    duration: Duration,
    tx: mpsc::UnboundedSender<Instant>,
) {
    for i in 0..=u32::MAX {
        let due = match interval.checked_mul(i) {
            Some(offset) if offset < duration => start + offset,
            _ => break,
        };
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        if tx.send(due).is_err() {
            break;
        }
    }
}

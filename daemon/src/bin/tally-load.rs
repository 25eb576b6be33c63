//! `tally-load`: the append daemon's load generator, and a way to run a daemon for it
//! (and for the kill -9 test) without the `tally` CLI.
//!
//! ```text
//! tally-load init  --ledger DIR                       # a ledger with a throwaway auditor key
//! tally-load serve --ledger DIR --socket PATH [...]   # tally_daemon::run
//! tally-load bench --socket PATH --clients 64 --batch 1 --seconds 5 [--offered 5000]
//! ```
//! `bench` runs closed-loop (each client sends its next request when the last is
//! acknowledged) unless `--offered` gives a target rate in decisions/s: then requests are
//! scheduled at that rate and latency is measured from each request's scheduled time,
//! so a stalled server cannot hide its queueing (no coordinated omission).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use tally_daemon::client::Client;
use tally_daemon::ServeOptions;
use tally_ledger::{AuditorKey, Ledger, Rotation};

#[derive(Parser)]
#[command(
    name = "tally-load",
    about = "load generator for the tally append daemon"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Create a ledger whose auditor key is thrown away (benchmarks only).
    Init {
        /// The new ledger's directory.
        #[arg(long)]
        ledger: PathBuf,
    },
    /// Serve a ledger until SIGTERM/SIGINT.
    Serve {
        /// The ledger directory.
        #[arg(long)]
        ledger: PathBuf,
        /// The Unix socket path.
        #[arg(long)]
        socket: PathBuf,
        /// Also listen on this loopback TCP address.
        #[arg(long)]
        listen: Option<SocketAddr>,
        /// Append requests processed at once.
        #[arg(long, default_value_t = 256)]
        max_in_flight: usize,
    },
    /// Offer load and report decisions/s and acknowledgement latency.
    Bench {
        /// The daemon's Unix socket.
        #[arg(long, conflicts_with = "tcp")]
        socket: Option<PathBuf>,
        /// The daemon's loopback TCP address.
        #[arg(long)]
        tcp: Option<SocketAddr>,
        /// Concurrent clients (one connection each).
        #[arg(long, default_value_t = 1)]
        clients: usize,
        /// Decisions per request: 1 sends one JSON object, more an NDJSON batch.
        #[arg(long, default_value_t = 1)]
        batch: usize,
        /// How long to offer load.
        #[arg(long, default_value_t = 5.0)]
        seconds: f64,
        /// Offered rate in decisions/s (open loop); closed loop when absent.
        #[arg(long)]
        offered: Option<f64>,
        /// Also print one JSON line with the results.
        #[arg(long)]
        json: bool,
    },
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Init { ledger } => match Ledger::init(
            &ledger,
            &AuditorKey::generate().public(),
            Rotation::default(),
        ) {
            Ok(_) => ExitCode::SUCCESS,
            Err(e) => fail(e),
        },
        Command::Serve {
            ledger,
            socket,
            listen,
            max_in_flight,
        } => {
            let mut options = ServeOptions::new(ledger, socket);
            options.listen = listen;
            options.max_in_flight = max_in_flight;
            match tally_daemon::run(options) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => fail(e),
            }
        }
        Command::Bench {
            socket,
            tcp,
            clients,
            batch,
            seconds,
            offered,
            json,
        } => {
            let target = match (socket, tcp) {
                (Some(s), _) => Target::Unix(s),
                (None, Some(a)) => Target::Tcp(a),
                (None, None) => return fail("give --socket PATH or --tcp ADDR"),
            };
            let runtime = match tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
            {
                Ok(r) => r,
                Err(e) => return fail(e),
            };
            let plan = Plan {
                target,
                clients: clients.max(1),
                batch: batch.max(1),
                duration: Duration::from_secs_f64(seconds),
                offered,
            };
            match runtime.block_on(bench(plan)) {
                Ok(report) => {
                    println!("{}", report.text());
                    if json {
                        println!("{}", report.json());
                    }
                    ExitCode::SUCCESS
                }
                Err(e) => fail(e),
            }
        }
    }
}

fn fail(e: impl std::fmt::Display) -> ExitCode {
    eprintln!("tally-load: {e}");
    ExitCode::from(2)
}

#[derive(Clone)]
enum Target {
    Unix(PathBuf),
    Tcp(SocketAddr),
}

impl Target {
    async fn connect(&self) -> Result<Client, tally_daemon::client::ClientError> {
        match self {
            Target::Unix(p) => Client::unix(p).await,
            Target::Tcp(a) => Client::tcp(*a).await,
        }
    }
}

struct Plan {
    target: Target,
    clients: usize,
    batch: usize,
    duration: Duration,
    offered: Option<f64>,
}

struct Report {
    clients: usize,
    batch: usize,
    offered: Option<f64>,
    requests: u64,
    decisions: u64,
    elapsed: Duration,
    /// Sorted acknowledgement latencies, microseconds.
    latencies: Vec<u64>,
}

impl Report {
    fn pct(&self, p: f64) -> f64 {
        if self.latencies.is_empty() {
            return 0.0;
        }
        let i =
            ((self.latencies.len() as f64 * p).ceil() as usize).clamp(1, self.latencies.len()) - 1;
        self.latencies[i] as f64 / 1000.0
    }

    fn rate(&self) -> f64 {
        self.decisions as f64 / self.elapsed.as_secs_f64()
    }

    fn text(&self) -> String {
        let mode = match self.offered {
            Some(r) => format!("offered {r:.0}/s"),
            None => "closed loop".into(),
        };
        format!(
            "clients {:>3}  batch {:>3}  {mode:<16}  {:>9.0} decisions/s  {:>8.0} req/s  p50 {:>7.2} ms  p99 {:>7.2} ms  max {:>7.2} ms  ({} requests in {:.1} s)",
            self.clients,
            self.batch,
            self.rate(),
            self.requests as f64 / self.elapsed.as_secs_f64(),
            self.pct(0.50),
            self.pct(0.99),
            self.pct(1.0),
            self.requests,
            self.elapsed.as_secs_f64(),
        )
    }

    fn json(&self) -> String {
        serde_json::json!({
            "clients": self.clients,
            "batch": self.batch,
            "offered_per_sec": self.offered,
            "requests": self.requests,
            "decisions": self.decisions,
            "seconds": self.elapsed.as_secs_f64(),
            "decisions_per_sec": self.rate(),
            "p50_ms": self.pct(0.50),
            "p99_ms": self.pct(0.99),
            "max_ms": self.pct(1.0),
        })
        .to_string()
    }
}

/// A realistic `allow` decision (~350 bytes on the wire).
fn decision(client: usize, n: u64) -> String {
    format!(
        concat!(
            r#"{{"run":"bench-{}-{}","kind":"allow","worker":"w{}","at_ms":{},"tool":"http.post","#,
            r#""operation":"export.create:{:x}","args":{{"url":"https://api.example.com/v1/export","body":{{"n":{}}}}},"#,
            r#""effect":"idempotent_write","idempotency_key":"k-{}-{}","channel":"http","attempt":{},"reserve_cents":3,"#,
            r#""limits":{{"attempts":{{"used":{},"limit":1000000}},"spend_cents":{{"used":{},"limit":100000000}}}}}}"#
        ),
        client,
        n % 64,
        client,
        n,
        n,
        n,
        client,
        n,
        n + 1,
        n + 1,
        3 * (n + 1)
    )
}

fn body(client: usize, first: u64, batch: usize) -> String {
    let mut b = String::with_capacity(400 * batch);
    for k in 0..batch as u64 {
        b.push_str(&decision(client, first + k));
        b.push('\n');
    }
    b
}

async fn bench(plan: Plan) -> Result<Report, String> {
    let plan = Arc::new(plan);
    let mut connections = Vec::with_capacity(plan.clients);
    for _ in 0..plan.clients {
        connections.push(plan.target.connect().await.map_err(|e| e.to_string())?);
    }
    let start = Instant::now();
    let next = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for (id, mut client) in connections.into_iter().enumerate() {
        let plan = Arc::clone(&plan);
        let next = Arc::clone(&next);
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut sent = 0u64;
            let interval = plan.offered.map(|r| plan.batch as f64 / r);
            loop {
                let due = match interval {
                    // Open loop: request i is due at start + i * interval, whoever sends it.
                    Some(iv) => {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let due = start + Duration::from_secs_f64(i as f64 * iv);
                        if due.duration_since(start) >= plan.duration {
                            break;
                        }
                        tokio::time::sleep_until(due.into()).await;
                        due
                    }
                    None => {
                        let now = Instant::now();
                        if now.duration_since(start) >= plan.duration {
                            break;
                        }
                        now
                    }
                };
                let first = sent * plan.batch as u64;
                let result = if plan.batch == 1 {
                    client.append(&decision(id, first)).await
                } else {
                    client.append_ndjson(body(id, first, plan.batch)).await
                };
                match result {
                    Ok(r) if r.len() == plan.batch => {}
                    Ok(r) => {
                        return Err(format!(
                            "{} receipts for a batch of {}",
                            r.len(),
                            plan.batch
                        ))
                    }
                    Err(e) => return Err(e.to_string()),
                }
                latencies.push(due.elapsed().as_micros() as u64);
                sent += 1;
            }
            Ok((sent, latencies))
        }));
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
        clients: plan.clients,
        batch: plan.batch,
        offered: plan.offered,
        requests,
        decisions: requests * plan.batch as u64,
        elapsed,
        latencies,
    })
}

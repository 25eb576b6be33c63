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
//! so a stalled server cannot hide its queueing (no coordinated omission); every request
//! due within `--seconds` is sent, so against a server that cannot keep up the run lasts
//! longer than that. By default each connection sleeps on tokio's timer until its request
//! is due: the timer has 1 ms granularity, so requests leave in small bursts on
//! millisecond ticks, each up to 1 ms late (counted in its latency). `--even` hands out the due times from a thread of its
//! own instead, precise to tens of microseconds: arrivals evenly spaced, as from many
//! independent agents, at the cost of one thread wakeup per request in the client.

/// The allocator `tally serve` runs with, so what is measured here is what users run.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tally_api::client::{Client, ClientError, Method};
use tally_api::{CheckAnswer, Verdict};
use tally_daemon::ServeOptions;
use tally_ledger::{AuditorKey, Ledger, Rotation};
use tokio::sync::{mpsc, Mutex};

const USAGE: &str = "usage:
  tally-load init  --ledger DIR
  tally-load serve --ledger DIR --socket PATH [--operator-socket PATH] [--policy FILE] [--listen ADDR] [--max-in-flight N]
                   [--metrics-listen ADDR] [--otlp-endpoint URL [--otlp-sample RATIO]]
  tally-load bench (--socket PATH | --tcp ADDR) [--clients N] [--batch N] [--seconds S]
                   [--check | --pairs]   # a call through the gate (check + outcome), or the same two decisions appended
                   [--offered DECISIONS_PER_SEC [--even]] [--json]";

/// A bench tool's handful of `--flag value` arguments (the `tally` CLI is where clap
/// lives). Unknown flags and missing or malformed values are refused.
struct Args {
    flags: Vec<(String, Option<String>)>,
}

impl Args {
    fn parse(
        args: impl Iterator<Item = String>,
        known: &[&str],
        switches: &[&str],
    ) -> Result<Args, String> {
        let mut flags = Vec::new();
        let mut args = args.peekable();
        while let Some(a) = args.next() {
            let Some(name) = a.strip_prefix("--") else {
                return Err(format!("unexpected argument `{a}`"));
            };
            if !known.contains(&name) && !switches.contains(&name) {
                return Err(format!("unknown flag --{name}"));
            }
            if switches.contains(&name) {
                flags.push((name.to_string(), None));
                continue;
            }
            match args.next() {
                Some(v) if !v.starts_with("--") => flags.push((name.to_string(), Some(v))),
                _ => return Err(format!("--{name} needs a value")),
            }
        }
        Ok(Args { flags })
    }

    /// Take flag `name`; every flag must be taken once (see [`Args::done`]).
    fn take(&mut self, name: &str) -> Option<Option<String>> {
        let i = self.flags.iter().position(|(n, _)| n == name)?;
        Some(self.flags.remove(i).1)
    }

    fn value<T: std::str::FromStr>(&mut self, name: &str) -> Result<Option<T>, String> {
        match self.take(name).flatten() {
            None => Ok(None),
            Some(v) => v
                .parse()
                .map(Some)
                .map_err(|_| format!("--{name}: `{v}` is not valid here")),
        }
    }

    fn required<T: std::str::FromStr>(&mut self, name: &str) -> Result<T, String> {
        self.value(name)?
            .ok_or_else(|| format!("--{name} is required"))
    }

    fn done(self) -> Result<(), String> {
        match self.flags.first() {
            None => Ok(()),
            Some((n, _)) => Err(format!(
                "--{n} is given twice, or is not a flag of this command"
            )),
        }
    }
}

fn main() -> ExitCode {
    match run(std::env::args().skip(1)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("tally-load: {e}\n{USAGE}");
            ExitCode::from(2)
        }
    }
}

fn run(mut argv: impl Iterator<Item = String>) -> Result<ExitCode, String> {
    let command = argv.next().unwrap_or_default();
    let known = [
        "ledger",
        "socket",
        "listen",
        "operator-socket",
        "policy",
        "max-in-flight",
        "tcp",
        "clients",
        "batch",
        "seconds",
        "offered",
        "metrics-listen",
        "otlp-endpoint",
        "otlp-sample",
    ];
    let mut args = Args::parse(argv, &known, &["json", "even", "check", "pairs"])?;
    match command.as_str() {
        "init" => {
            let ledger: PathBuf = args.required("ledger")?;
            args.done()?;
            Ok(
                match Ledger::init(
                    &ledger,
                    &AuditorKey::generate().public(),
                    Rotation::default(),
                ) {
                    Ok(_) => ExitCode::SUCCESS,
                    Err(e) => fail(e),
                },
            )
        }
        "serve" => {
            let mut options = ServeOptions::new(
                args.required::<PathBuf>("ledger")?,
                args.required::<PathBuf>("socket")?,
            );
            options.listen = args.value("listen")?;
            options.operator_socket = args.value("operator-socket")?;
            if let Some(path) = args.value::<PathBuf>("policy")? {
                let text = std::fs::read_to_string(&path)
                    .map_err(|e| format!("--policy {}: {e}", path.display()))?;
                options.policy = tally_policy::Recorded::new(&text)
                    .map_err(|e| format!("--policy {}: {e}", path.display()))?;
            }
            options.limits.max_in_flight = args.value("max-in-flight")?.unwrap_or(256);
            // The operator's view, for its cost (docs/PERFORMANCE.md).
            options.observe.metrics_listen = args.value("metrics-listen")?;
            options.observe.otlp_endpoint = args.value("otlp-endpoint")?;
            if let Some(r) = args.value::<f64>("otlp-sample")? {
                options.observe.otlp_sample = r;
            }
            args.done()?;
            Ok(match tally_daemon::run(options) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => fail(e),
            })
        }
        "bench" => {
            let target = match (args.value("socket")?, args.value("tcp")?) {
                (Some(s), None) => Target::Unix(s),
                (None, Some(a)) => Target::Tcp(a),
                _ => return Err("give one of --socket PATH or --tcp ADDR".into()),
            };
            let clients: usize = args.value("clients")?.unwrap_or(1);
            let batch: usize = args.value("batch")?.unwrap_or(1);
            if clients == 0 || batch == 0 {
                return Err("--clients and --batch are at least 1".into());
            }
            let seconds: f64 = args.value("seconds")?.unwrap_or(5.0);
            let duration = Duration::try_from_secs_f64(seconds)
                .map_err(|_| format!("--seconds: {seconds} is not a duration"))?;
            let offered: Option<f64> = args.value("offered")?;
            if let Some(rate) = offered {
                // Each connection needs at least a microsecond between its due times.
                let interval = Duration::try_from_secs_f64(batch as f64 / rate).ok();
                if interval.is_none_or(|i| i < Duration::from_micros(1)) {
                    return Err(format!(
                        "--offered: `{rate}` is not a rate this tool can pace: give decisions/s above zero, at most a million requests/s"
                    ));
                }
            }
            let even = args.take("even").is_some();
            let mode = match (args.take("check").is_some(), args.take("pairs").is_some()) {
                (true, true) => return Err("give one of --check and --pairs".into()),
                (true, false) => Mode::Check,
                (false, true) => Mode::Pairs,
                (false, false) => Mode::Append,
            };
            if mode != Mode::Append && (batch != 1 || offered.is_some()) {
                return Err("--check and --pairs run a closed loop of single calls: no --batch, no --offered".into());
            }
            if even && offered.is_none() {
                return Err("--even paces an open loop: give --offered too".into());
            }
            let plan = Plan {
                target,
                clients,
                batch,
                duration,
                offered,
                even,
                mode,
            };
            let json = args.take("json").is_some();
            args.done()?;
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            Ok(match runtime.block_on(bench(plan)) {
                Ok(report) => {
                    println!("{}", report.text());
                    if json {
                        println!("{}", report.json());
                    }
                    ExitCode::SUCCESS
                }
                Err(e) => fail(e),
            })
        }
        other => Err(format!("unknown command `{other}`")),
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
    async fn connect(&self) -> Result<Client, ClientError> {
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
    /// Open loop with due times from a pacer thread (`--even`).
    even: bool,
    mode: Mode,
}

/// What one iteration sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// One allow decision appended (`POST /v1/decisions`).
    Append,
    /// A call through the gate: `POST /v1/check`, then `POST /v1/outcome` (agent socket).
    Check,
    /// The same two decisions appended raw, one request each (operator socket).
    Pairs,
}

struct Report {
    mode: Mode,
    clients: usize,
    batch: usize,
    offered: Option<f64>,
    even: bool,
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
        if self.mode != Mode::Append {
            let what = if self.mode == Mode::Check {
                "gate calls (check + outcome)"
            } else {
                "appended pairs (allow + outcome)"
            };
            return format!(
                "clients {:>3}  {what:<32}  {:>8.0} calls/s  {:>8.0} req/s  p50 {:>7.2} ms  p99 {:>7.2} ms  max {:>7.2} ms  ({} calls in {:.1} s)",
                self.clients,
                self.rate(),
                2.0 * self.rate(),
                self.pct(0.50),
                self.pct(0.99),
                self.pct(1.0),
                self.requests,
                self.elapsed.as_secs_f64(),
            );
        }
        let mode = match self.offered {
            Some(r) if self.even => format!("offered {r:.0}/s even"),
            Some(r) => format!("offered {r:.0}/s"),
            None => "closed loop".into(),
        };
        format!(
            "clients {:>3}  batch {:>3}  {mode:<21}  {:>9.0} decisions/s  {:>8.0} req/s  p50 {:>7.2} ms  p99 {:>7.2} ms  max {:>7.2} ms  ({} requests in {:.1} s)",
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
            "even": self.even,
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

/// One call: through the gate (check, then outcome), or the same two decisions appended.
/// The call's latency is until its outcome is recorded too.
async fn call(client: &mut Client, mode: Mode, id: usize, n: u64) -> Result<(), String> {
    let run = format!("gate-bench-{id}-{}", std::process::id());
    let (first, second) = match mode {
        Mode::Check => (
            (
                "/v1/check",
                format!(
                    r#"{{"run":"{run}","worker":"w{id}","tool":"http.post","operation":"export.create:{n:x}","args":{{"url":"https://api.example.com/v1/export","body":{{"n":{n}}}}},"effect":"idempotent_write","idempotency_key":"k-{id}-{n}","channel":"http","reserve_cents":3}}"#
                ),
            ),
            None,
        ),
        _ => (
            ("/v1/decisions", decision(id, n)),
            Some(format!(
                r#"{{"run":"bench-{id}-{}","kind":"outcome","attempt":{},"status":"ok","settled_cents":2}}"#,
                n % 64,
                n + 1
            )),
        ),
    };
    let reply = client
        .request(Method::POST, first.0, Some("application/json"), first.1)
        .await
        .map_err(|e| e.to_string())?;
    if reply.status.as_u16() != 200 {
        return Err(format!(
            "{}: {}",
            first.0,
            String::from_utf8_lossy(&reply.body)
        ));
    }
    let outcome = match (mode, second) {
        (Mode::Check, _) => {
            let a: CheckAnswer = serde_json::from_slice(&reply.body).map_err(|e| e.to_string())?;
            let attempt = match (a.decision, a.attempt) {
                (Verdict::Allow, Some(attempt)) => attempt,
                _ => {
                    return Err(format!(
                        "the gate refused a benchmark call: {}",
                        String::from_utf8_lossy(&reply.body)
                    ))
                }
            };
            // The outcome as the benchmark has always sent it (the fields it sets only).
            (
                "/v1/outcome",
                format!(r#"{{"run":"{run}","attempt":{attempt},"status":"ok","settled_cents":2}}"#),
            )
        }
        (_, Some(o)) => ("/v1/decisions", o),
        (_, None) => return Ok(()),
    };
    let reply = client
        .request(Method::POST, outcome.0, Some("application/json"), outcome.1)
        .await
        .map_err(|e| e.to_string())?;
    if reply.status.as_u16() != 200 {
        return Err(format!(
            "{}: {}",
            outcome.0,
            String::from_utf8_lossy(&reply.body)
        ));
    }
    Ok(())
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
    for (id, mut client) in connections.into_iter().enumerate() {
        let plan = Arc::clone(&plan);
        let paced = paced.clone();
        let next = Arc::clone(&next);
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut sent = 0u64;
            let interval = plan.offered.map(|r| plan.batch as f64 / r);
            if plan.mode == Mode::Check {
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
            }
            loop {
                let due = match (&paced, interval) {
                    (Some(slots), _) => match slots.lock().await.recv().await {
                        Some(due) => due,
                        None => break,
                    },
                    (None, Some(iv)) => {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let due = start + Duration::from_secs_f64(i as f64 * iv);
                        if due.duration_since(start) >= plan.duration {
                            break;
                        }
                        tokio::time::sleep_until(due.into()).await;
                        due
                    }
                    (None, None) => {
                        let now = Instant::now();
                        if now.duration_since(start) >= plan.duration {
                            break;
                        }
                        now
                    }
                };
                let first = sent * plan.batch as u64;
                if plan.mode != Mode::Append {
                    call(&mut client, plan.mode, id, first).await?;
                    latencies.push(due.elapsed().as_micros() as u64);
                    sent += 1;
                    continue;
                }
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

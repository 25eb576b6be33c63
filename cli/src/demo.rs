//! `tally demo`: the whole story on the embedded store. Agents append their decisions
//! through the daemon's socket, the ledger is exported and verified offline with only its
//! public key, then decrypted with the auditor key: loops, consistency findings and
//! handoffs are printed, and two attacks on the export are caught.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};

use crate::cli::DemoArgs;
use crate::output::{out, outln};
use crate::Exit;
use tally_api::client::Client;
use tally_api::GateClient;
use tally_ledger::export::ExportReader;
use tally_ledger::keys::{AuditorKey, LedgerPublic};
use tally_ledger::{Ledger, Rotation};
use tally_verify::analysis::{self, Analysis};
use tally_verify::{verify, Event, Options, Report, SourceError, Verdict};

fn step(n: u32, title: &str) {
    outln!("\n== {n}. {title}\n");
}

fn verify_bytes(bytes: &[u8], options: &Options, sink: impl FnMut(Event)) -> Result<Report> {
    let reader = ExportReader::new(bytes).context("reading the export")?;
    Ok(verify(
        reader.map(|f| f.map_err(SourceError::from)),
        options,
        sink,
        |_| {},
    ))
}

pub fn run(args: &DemoArgs) -> Result<Exit> {
    let (dir, verbose) = (args.dir.as_deref(), args.verbose);
    let tmp;
    let base: PathBuf = match dir {
        Some(d) => {
            std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
            if std::fs::read_dir(d)?.next().is_some() {
                bail!(
                    "{} is not empty: give `tally demo --dir` a new or empty directory",
                    d.display()
                );
            }
            // Said in full, so the files can be found from anywhere.
            std::fs::canonicalize(d).with_context(|| format!("reading {}", d.display()))?
        }
        None => {
            tmp = tempfile::tempdir().context("creating a temporary directory")?;
            tmp.path().to_path_buf()
        }
    };
    let ledger_dir = base.join("ledger");
    let auditor_path = base.join("auditor.key");
    let socket = base.join("agent.sock");
    let operator_socket = base.join("operator.sock");
    let export = base.join("ledger.tally");
    let anchor_path = base.join("anchor.cp");
    let mut ok = true;

    outln!("tally demo: the budget gate for AI agents and the audit ledger of its decisions, end to end.");
    match dir {
        Some(_) => outln!("files: {} (kept)", base.display()),
        None => outln!(
            "files: {} (a temporary directory, removed when the demo ends; `tally demo --dir DIR` keeps them)",
            base.display()
        ),
    }

    step(1, "Keys and ledger");
    let auditor = AuditorKey::generate();
    auditor.write(&auditor_path)?;
    let public = Ledger::init(
        &ledger_dir,
        &auditor.public(),
        Rotation {
            records: 200,
            ms: 600_000,
        },
    )?;
    outln!(
        "auditor key pair  {} (0600) + auditor.pub: only this key decrypts records",
        auditor_path.display()
    );
    outln!(
        "ledger            {} id {}",
        ledger_dir.display(),
        public.ledger_id
    );
    outln!(
        "verification key  {}/ledger.pub: all an integrity check needs",
        ledger_dir.display()
    );
    outln!("key epochs        rotate every 200 entries; each new key is certified by the old one, then the old secret is destroyed");

    step(2, "Agents at work, through the gate");
    let ledger = Arc::new(Ledger::open(&ledger_dir)?);
    let corpus = crate::stories::stories()?;
    let agents = corpus.len();
    let mut runs: Vec<String> = Vec::new();
    for d in corpus.iter().flat_map(|(_, ds)| ds) {
        if !runs.contains(&d.run) {
            runs.push(d.run.clone());
        }
    }
    let start = Instant::now();
    let mut served = Served::start(&ledger, &ledger_dir, &socket, &operator_socket)?;
    let (appended, refused, gated) = served.agents(&socket, &operator_socket, corpus)?;
    let elapsed = start.elapsed();
    let checkpoint = ledger.checkpoint();
    ok &= gated;
    outln!(
        "\nAnd the history of an agent platform that had no gate: {} runs in {agents} stories:",
        runs.len()
    );
    for line in wrapped(&runs, 86) {
        outln!("  {line}");
    }
    outln!("A retry storm, polling past its allowance, a payment retried while its outcome was");
    outln!("unknown, an overspend and a forged override went unchecked there; act 6 finds them.");
    outln!(
        "Their {appended} decisions were imported on the operator socket in {}: no reply came",
        tally_verify::text::duration(elapsed.as_millis() as u64)
    );
    outln!(
        "before its decision was on disk and sealed by a signed checkpoint. Key epoch now {}.",
        checkpoint.epoch
    );
    if refused > 0 {
        outln!("{refused} decisions were refused by the daemon (typed errors; nothing written)");
        ok = false;
    }
    let anchor = checkpoint.to_text();
    std::fs::write(&anchor_path, &anchor)?;
    if verbose {
        outln!(
            "\nThe auditor keeps this checkpoint elsewhere ({}), as an anchor:\n",
            anchor_path.display()
        );
        out!("{anchor}");
    } else {
        outln!(
            "\nThe auditor keeps the latest checkpoint (over {}, head {}…) elsewhere, as an anchor: {}",
            tally_verify::text::plural(checkpoint.size, "entry", "entries"),
            &checkpoint.head.to_string()[..16],
            anchor_path.display()
        );
    }
    let cp = ledger.rotate()?;
    outln!(
        "\nOn demand, a new key epoch: {} (the epoch {} secrets are gone).",
        cp.epoch,
        cp.epoch - 1
    );

    step(
        3,
        "A model called through tally, until the budget stops the agent",
    );
    ok &= served.model_story(&socket, &operator_socket, verbose)?;
    served.stop()?;

    step(4, "Export for offline audit");
    let (entries, checkpoints) = ledger.export(&export)?;
    drop(ledger);
    outln!(
        "{} holds {} and {}; the auditor copies it away.",
        export.display(),
        tally_verify::text::plural(entries, "entry", "entries"),
        tally_verify::text::plural(checkpoints, "checkpoint", "checkpoints")
    );
    let bytes = std::fs::read(&export)?;

    step(
        5,
        "Verify: integrity with only the public key, and the anchor",
    );
    let public = LedgerPublic::read(&ledger_dir.join("ledger.pub"))?;
    let mut options = Options::new(public);
    options
        .anchors
        .push(tally_ledger::Checkpoint::from_text(anchor.as_bytes())?);
    let report = verify_bytes(&bytes, &options, |_| {})?;
    out!("{}", report.to_text());
    ok &= report.verdict() == Verdict::Intact;

    step(
        6,
        "Decrypt with the auditor key: loops, budget consistency, handoffs",
    );
    options.auditor = Some(AuditorKey::read(&auditor_path)?);
    let mut analysis = Analysis::new(analysis::Config::default());
    let mut replay = tally_verify::analysis::Replay::new();
    let report = verify_bytes(&bytes, &options, |e| {
        analysis.push(&e);
        replay.push(&e);
    })?;
    outln!(
        "{} of {} decisions decrypted and valid.\n",
        report.decrypted.unwrap_or(0),
        report.decisions
    );
    ok &= report.verdict() == Verdict::Intact;
    let mut found = analysis.finish();
    if let Some(c) = &report.last_checkpoint {
        found.set_coverage(report.sealed, c.head.clone(), c.epoch);
    }
    let replayed = replay.finish();
    ok &= replayed.findings.is_empty() && replayed.replayed > 0;
    if verbose {
        outln!("{}", analysis::render_loops_text(&found));
        outln!("{}", analysis::render_findings_text(&found));
        outln!("{}", replayed.to_text());
        outln!("{}", analysis::render_handoffs_text(&found, None));
    } else {
        summary(&found, &replayed);
    }
    step(7, "Attacks on the export are caught");
    let mut flipped = bytes.clone();
    let at = bytes.len() / 2;
    flipped[at] ^= 0x04;
    options.auditor = None;
    let r = verify_bytes(&flipped, &options, |_| {})?;
    outln!("one bit flipped at byte {at}:");
    outln!("  {}", r.to_text().lines().next().unwrap_or_default());
    ok &= r.verdict() == Verdict::Tampered;
    let cut = cut_at_frame(&bytes, entries / 2);
    let r = verify_bytes(&bytes[..cut], &options, |_| {})?;
    outln!("export cut after {} entries:", entries / 2);
    outln!("  {}", r.to_text().lines().next().unwrap_or_default());
    ok &= r.verdict() != Verdict::Intact;

    step(8, "Do it yourself");
    if dir.is_some() {
        let d = base.display();
        outln!("tally verify {d}/ledger.tally --key {d}/ledger/ledger.pub --anchor {d}/anchor.cp");
        outln!(
            "tally loops {d}/ledger.tally --key {d}/ledger/ledger.pub --auditor-key {d}/auditor.key"
        );
        outln!("tally handoff {d}/ledger.tally --key {d}/ledger/ledger.pub --auditor-key {d}/auditor.key --run lost-post --json");
    } else {
        outln!("These files are removed now. Run `tally demo --dir DIR` to keep them, then `tally verify`,");
        outln!("`tally loops` and `tally handoff` on them (README.md has the walkthrough); `--verbose`");
        outln!("prints every loop, finding and handoff.");
    }
    if !ok {
        outln!("\nThe demo did not go as it should: see above.");
        return Ok(Exit::Findings);
    }
    Ok(Exit::Success)
}

/// The daemon serving the demo's ledger through acts 2 and 3: the gate on its sockets
/// and the model proxy on loopback, in front of the demo's model API.
struct Served {
    runtime: tokio::runtime::Runtime,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    server: Option<tokio::task::JoinHandle<Result<(), tally_daemon::DaemonError>>>,
    dana: tally_ledger::keys::ApproverKey,
    model: crate::demo_proxy::FakeModel,
    proxy: std::net::SocketAddr,
}

impl Served {
    /// Serve `ledger` on the agent and operator sockets, with the proxy on a loopback
    /// port in front of a model API of the demo's own (in this process, no network).
    fn start(
        ledger: &Arc<Ledger>,
        ledger_dir: &Path,
        socket: &Path,
        operator_socket: &Path,
    ) -> Result<Served> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        // The operator's key to the model API: the daemon holds it, the agent never does.
        let key = format!(
            "sk-demo-{}",
            hex::encode(rand_core::RngCore::next_u64(&mut rand_core::OsRng).to_be_bytes())
        );
        let model = runtime.block_on(crate::demo_proxy::FakeModel::start(&key))?;
        let proxy = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .context("finding a free loopback port for the proxy")?;
        let mut options = tally_daemon::ServeOptions::new(ledger_dir, socket);
        options.operator_socket = Some(operator_socket.to_path_buf());
        // The demo's approver: a human whose key the policy lists; and the model API.
        let dana = tally_ledger::keys::ApproverKey::generate();
        options.policy = tally_policy::Recorded::new(&format!(
            "[approvals.approvers]\ndana = \"{}\"\n{}",
            dana.public_hex(),
            crate::demo_proxy::policy(&model.url())
        ))?;
        let mut proxied = tally_daemon::ProxyServe::default();
        proxied.listen = Some(proxy);
        proxied.credentials.insert(
            crate::demo_proxy::CREDENTIAL.to_owned(),
            zeroize::Zeroizing::new(model.key().to_owned()),
        );
        options.proxy = Some(proxied);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = runtime.spawn(tally_daemon::serve(Arc::clone(ledger), options, async {
            let _ = stopped.await;
        }));
        let mut served = Served {
            runtime,
            stop: Some(stop),
            server: Some(server),
            dana,
            model,
            proxy,
        };
        let mut tries = 0;
        while !socket.exists()
            || !operator_socket.exists()
            || std::net::TcpStream::connect(proxy).is_err()
        {
            tries += 1;
            if tries > 500 || served.server.as_ref().is_some_and(|s| s.is_finished()) {
                served.stop()?;
                bail!("the daemon did not start on {}", socket.display());
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        Ok(served)
    }

    /// Act 2: agents ask the gate on the agent socket (a retry storm, a repeated payment
    /// whose outcome is unknown, a reservation over budget, an MCP client), and the
    /// recorded runs of the corpus are imported on the operator socket, one request at a
    /// time, concurrently. Returns (imported, refused, whether the gate behaved as it
    /// must).
    fn agents(
        &self,
        socket: &Path,
        operator_socket: &Path,
        corpus: Vec<(&'static str, Vec<tally_ledger::Decision>)>,
    ) -> Result<(usize, usize, bool)> {
        self.runtime.block_on(async {
            let gated = gate_story(socket, operator_socket, &self.dana).await?;
            let gated = crate::demo_mcp::story(socket).await? && gated;
            outln!(
                "  the client went away, and `tally mcp` ended its session: {}",
                standing(operator_socket, crate::demo_mcp::RUN).await?
            );
            let agents: Vec<_> = corpus
                .into_iter()
                .map(|(_, decisions)| {
                    let socket = operator_socket.to_path_buf();
                    tokio::spawn(async move {
                        let mut client = Client::unix(&socket).await?;
                        let (mut appended, mut refused) = (0, 0);
                        for d in decisions {
                            match client.append(&serde_json::to_string(&d)?).await {
                                Ok(_) => appended += 1,
                                Err(_) => refused += 1,
                            }
                        }
                        anyhow::Ok((appended, refused))
                    })
                })
                .collect();
            let (mut appended, mut refused) = (0, 0);
            for agent in agents {
                let (a, r) = agent.await??;
                appended += a;
                refused += r;
            }
            Ok((appended, refused, gated))
        })
    }

    /// Act 3: an agent loop calling the model through the proxy.
    fn model_story(&self, socket: &Path, operator_socket: &Path, verbose: bool) -> Result<bool> {
        self.runtime.block_on(crate::demo_proxy::story(
            socket,
            operator_socket,
            self.proxy,
            &self.model,
            verbose,
        ))
    }

    /// Stop the daemon and wait for it (its decisions all durable).
    fn stop(&mut self) -> Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(server) = self.server.take() {
            self.runtime.block_on(server)??;
        }
        Ok(())
    }
}

/// POST a JSON body to the gate; the JSON answer.
async fn ask(
    gate: &mut GateClient,
    path: &str,
    body: serde_json::Value,
) -> Result<serde_json::Value> {
    gate.post(path, &body)
        .await
        .with_context(|| format!("the gate's answer to {path}"))
}

fn said(a: &serde_json::Value) -> String {
    match a["decision"].as_str() {
        Some("allow") => format!("allow (attempt {})", a["attempt"]),
        Some(d) => format!(
            "{d}: {} (action {})",
            a["reason"].as_str().unwrap_or("?"),
            a["action"].as_str().unwrap_or("?")
        ),
        None => format!("error: {a}"),
    }
}

/// The gate's part of the story. Returns whether every decision was the one it must be.
async fn gate_story(
    socket: &Path,
    operator_socket: &Path,
    dana: &tally_ledger::keys::ApproverKey,
) -> Result<bool> {
    use serde_json::json;
    let mut ok = true;
    let mut c = GateClient::new(socket);

    outln!("A retry storm: 8 workers of run `export-q3` retry a failing report export.");
    ask(
        &mut c,
        "/v1/runs",
        json!({"run": "export-q3", "goal": "export the Q3 report", "budget": {"attempts": 20}}),
    )
    .await?;
    let (mut allowed, mut refused) = (0, 0);
    let mut last_refusal = String::new();
    let mut stop_reason = String::new();
    for _round in 0..3 {
        let mut tasks = Vec::new();
        for w in 0..8 {
            let socket = socket.to_path_buf();
            tasks.push(tokio::spawn(async move {
                let mut c = GateClient::new(&socket);
                let check = json!({"run": "export-q3", "worker": format!("worker-{w}"), "tool": "reports.export",
                    "operation": "export.create", "effect": "read", "args": {"quarter": 3}});
                let a = ask(&mut c, "/v1/check", check).await?;
                if a["decision"] == "allow" {
                    let out = json!({"run": "export-q3", "attempt": a["attempt"], "status": "error", "worker": format!("worker-{w}")});
                    ask(&mut c, "/v1/outcome", out).await?;
                }
                anyhow::Ok(a)
            }));
        }
        for t in tasks {
            let a = t.await??;
            if a["decision"] == "allow" {
                allowed += 1;
            } else {
                refused += 1;
                last_refusal = said(&a);
                stop_reason = a["reason"].as_str().unwrap_or_default().to_owned();
            }
        }
    }
    outln!("  24 asks: {allowed} allowed, {refused} refused ({last_refusal}). The cap is shared: no worker can reset it.");
    ok &= allowed == 3;
    // The workers stop the run with the gate's reason: the handoff then says why.
    ask(
        &mut c,
        "/v1/runs/export-q3/stop",
        json!({"reason": stop_reason}),
    )
    .await?;
    outln!("  {}", standing(operator_socket, "export-q3").await?);

    outln!("A payment whose outcome is unknown: run `lost-post` must not pay twice.");
    ask(
        &mut c,
        "/v1/runs",
        json!({"run": "lost-post", "goal": "pay invoice 4411", "budget": {"spend_nanos": 5_000_000_000u64}}),
    )
    .await?;
    let pay = json!({"run": "lost-post", "tool": "payments", "operation": "payments.create", "effect": "non_idempotent_write",
        "args": {"invoice": 4411, "cents": 12000}, "reserve_nanos": 1_200_000_000u64});
    let first = ask(&mut c, "/v1/check", pay.clone()).await?;
    outln!("  pay:   {}", said(&first));
    ask(
        &mut c,
        "/v1/outcome",
        json!({"run": "lost-post", "attempt": first["attempt"], "status": "timeout"}),
    )
    .await?;
    outln!("  the payment timed out: nobody knows whether it went through");
    let again = ask(&mut c, "/v1/check", pay).await?;
    outln!("  retry: {}", said(&again));
    ok &= first["decision"] == "allow" && again["cause"] == "outcome_unknown_non_idempotent";
    outln!(
        "  it stays open until a human checks the payment: {}",
        standing(operator_socket, "lost-post").await?
    );

    outln!("A reservation over budget: run `summarize` asks a human.");
    ask(
        &mut c,
        "/v1/runs",
        json!({"run": "summarize", "goal": "summarize the inbox", "budget": {"spend_nanos": 500_000_000}}),
    )
    .await?;
    let big = json!({"run": "summarize", "tool": "llm", "operation": "summarize", "effect": "read", "reserve_nanos": 400_000_000});
    let one = ask(&mut c, "/v1/check", big.clone()).await?;
    ask(
        &mut c,
        "/v1/outcome",
        json!({"run": "summarize", "attempt": one["attempt"], "status": "ok", "settled_nanos": 350_000_000}),
    )
    .await?;
    let two = ask(&mut c, "/v1/check", json!({"run": "summarize", "tool": "llm", "operation": "summarize.more", "effect": "read", "reserve_nanos": 400_000_000})).await?;
    outln!("  first $0.40: {}; settled $0.35", said(&one));
    outln!("  next $0.40:  {}", said(&two));
    ok &= two["decision"] == "require_approval";
    // A human looks, and grants $0.30 more for that one operation, for ten minutes.
    let mut op = GateClient::new(operator_socket);
    let at = op.run("summarize").await?.at_ms;
    let scope = tally_ledger::decision::Scope {
        nanos: Some(300_000_000),
        operation: Some("summarize.more".into()),
        ..Default::default()
    };
    let expires_ms = at + 600_000;
    let digest = tally_policy::approval::digest("summarize", "dana", &scope, expires_ms);
    let signature = tally_policy::approval::sign(dana.signing_key(), &digest);
    let approved = ask(
        &mut op,
        "/v1/approvals",
        json!({"run": "summarize", "approver": "dana", "scope": scope, "expires_ms": expires_ms,
               "digest": digest, "signature": signature, "note": "the inbox is long this week"}),
    )
    .await?;
    outln!(
        "  dana approves $0.30 more for summarize.more (signed, one use, 10 min): seq {}",
        approved["seq"]
    );
    let three = ask(&mut c, "/v1/check", json!({"run": "summarize", "tool": "llm", "operation": "summarize.more", "effect": "read", "reserve_nanos": 400_000_000})).await?;
    outln!("  asked again: {}", said(&three));
    ok &= three["decision"] == "allow";
    ask(
        &mut c,
        "/v1/outcome",
        json!({"run": "summarize", "attempt": three["attempt"], "status": "ok", "settled_nanos": 380_000_000}),
    )
    .await?;
    outln!("  settled $0.38: the inbox is summarized");
    ask(
        &mut c,
        "/v1/runs/summarize/stop",
        json!({"reason": "completed"}),
    )
    .await?;
    outln!("  {}", standing(operator_socket, "summarize").await?);
    if !ok {
        outln!("  the gate did not decide as it must (see above)");
    }
    Ok(ok)
}

/// Where `run` stands, as the gate has it, in a line: `run export-q3: stopped
/// (retries_exhausted); 3 of 20 attempts used; $0.00 settled`.
pub(crate) async fn standing(operator_socket: &Path, run: &str) -> Result<String> {
    use tally_verify::text::{plural, shown};
    let v = GateClient::new(operator_socket).run(run).await?;
    let state = match (v.state, v.stop_reason) {
        (tally_api::RunState::Stopped, Some(reason)) => format!("stopped ({reason})"),
        (state, _) => state.as_str().replace('_', " "),
    };
    let attempts = match v.limits.get(tally_api::Dimension::Attempts.as_str()) {
        Some(l) => format!("{} of {}", l.used, plural(l.limit, "attempt", "attempts")),
        None => plural(0, "attempt", "attempts"),
    };
    Ok(format!(
        "run {}: {state}; {attempts} used; {} settled",
        shown(run),
        tally_ledger::money::Nanos(v.settled_nanos)
    ))
}

/// Act 6 in about a screen: each loop and finding in a line, the replay's verdict, and
/// what the next run reads: the handoff of `lost-post` whole, the other runs the gate's
/// part of the story told in a line each.
fn summary(found: &analysis::Report, replayed: &tally_verify::replay::ReplayReport) {
    use tally_verify::text::{plural, shown};
    outln!(
        "{} found (`tally loops` lists each with its evidence):",
        plural(found.loops.len() as u64, "loop", "loops")
    );
    for l in &found.loops {
        outln!(
            "  {:<17} {} in {}: {}",
            l.pattern.as_str(),
            plural(l.count, "call", "calls"),
            l.runs
                .iter()
                .map(|r| shown(r).into_owned())
                .collect::<Vec<_>>()
                .join(", "),
            shown(l.operation.as_deref().or(l.tool.as_deref()).unwrap_or("?"))
        );
    }
    let findings = analysis::render_findings_text(found);
    let mut lines = findings.lines();
    outln!(
        "\nThe runs recorded before the gate: {} (the gate itself would have refused each):",
        lines.next().unwrap_or_default().trim_end_matches('.')
    );
    for line in lines.by_ref().take(3) {
        outln!("  {line}");
    }
    let rest = lines.count();
    if rest > 0 {
        outln!("  ... and {rest} more (`tally loops` lists them)");
    }
    outln!("\n{}", replayed.to_text().trim_end());
    outln!("\nWhat the next run of `lost-post` reads (`tally handoff --run lost-post`):\n");
    out!(
        "{}",
        analysis::render_handoffs_text(found, Some("lost-post"))
    );
    outln!("\nWhat the ledger says of the runs the gate decided for (as acts 2 and 3 told them):");
    for h in &found.handoffs {
        if GATED.contains(&h.run.as_str()) {
            outln!("  {}", handoff_line(h));
        }
    }
}

/// The runs acts 2 and 3 tell, through the gate.
const GATED: [&str; 5] = [
    "export-q3",
    "lost-post",
    "summarize",
    crate::demo_mcp::RUN,
    crate::demo_proxy::RUN,
];

/// A handoff in the words of [`standing`]: `run export-q3: stopped (retries_exhausted);
/// 3 of 20 attempts used; $0.00 settled`.
fn handoff_line(h: &analysis::Handoff) -> String {
    use tally_verify::text::{plural, shown};
    // As the gate says it: a run with no stop record is running, whatever its last call.
    let state = match (h.stop.status, &h.stop.reason) {
        (analysis::StopStatus::Stopped, Some(r)) => format!("stopped ({r})"),
        (analysis::StopStatus::Stopped, None) => "stopped".to_owned(),
        _ => "running".to_owned(),
    };
    let attempts = match h.attempts.limit {
        Some(l) => format!(
            "{} of {}",
            h.attempts.used,
            plural(l, "attempt", "attempts")
        ),
        None => plural(h.attempts.used, "attempt", "attempts"),
    };
    format!(
        "run {}: {state}; {attempts} used; {} settled",
        shown(&h.run),
        tally_ledger::money::Nanos(h.spend.settled_nanos)
    )
}

/// The byte offset just after the `n`th entry frame (and any checkpoints before it): an
/// export cut cleanly at a frame boundary, without its end marker.
fn cut_at_frame(bytes: &[u8], n: u64) -> usize {
    let mut at = 16;
    let mut seen = 0;
    while at + 5 <= bytes.len() && seen < n {
        let len = u32::from_be_bytes([bytes[at + 1], bytes[at + 2], bytes[at + 3], bytes[at + 4]])
            as usize;
        if bytes[at] == 1 {
            seen += 1;
        }
        at += 5 + len;
    }
    at
}

/// `words` joined by ", " into lines of at most `width` characters (a word longer than
/// that on a line of its own), the last ending with a full stop.
fn wrapped(words: &[String], width: usize) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    for (i, w) in words.iter().enumerate() {
        let word = if i + 1 == words.len() {
            format!("{w}.")
        } else {
            format!("{w},")
        };
        match lines.last_mut() {
            Some(line) if line.len() + 1 + word.len() <= width => {
                line.push(' ');
                line.push_str(&word);
            }
            _ => lines.push(word),
        }
    }
    lines
}

//! `tally demo`: the whole story on the embedded store. Agents append their decisions
//! through the daemon's socket, the ledger is exported and verified offline with only its
//! public key, then decrypted with the auditor key: loops, consistency findings and
//! handoffs are printed, and two attacks on the export are caught.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use tally_daemon::client::Client;
use tally_ledger::export::ExportReader;
use tally_ledger::keys::{AuditorKey, LedgerPublic};
use tally_ledger::{Ledger, Rotation};
use tally_verify::analysis::{self, scenarios::scenarios, Analysis};
use tally_verify::{verify, Event, Options, Report, SourceError, Verdict};

fn step(n: u32, title: &str) {
    println!("\n== {n}. {title}\n");
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

pub fn run(dir: Option<&Path>) -> Result<u8> {
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
            d.to_path_buf()
        }
        None => {
            tmp = tempfile::tempdir().context("creating a temporary directory")?;
            tmp.path().to_path_buf()
        }
    };
    let ledger_dir = base.join("ledger");
    let auditor_path = base.join("auditor.key");
    let socket = base.join("tally.sock");
    let export = base.join("ledger.tex");
    let anchor_path = base.join("anchor.cp");
    let mut ok = true;

    println!("tally demo: an audit ledger for an AI-agent budget gate, end to end.");
    println!("files: {}", base.display());

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
    println!(
        "auditor key pair  {} (0600) + auditor.pub: only this key decrypts records",
        auditor_path.display()
    );
    println!(
        "ledger            {} id {}",
        ledger_dir.display(),
        public.ledger_id
    );
    println!(
        "verification key  {}/ledger.pub: all an integrity check needs",
        ledger_dir.display()
    );
    println!("key epochs        rotate every 200 entries; each new key is certified by the old one, then the old secret is destroyed");

    step(2, "Agents at work, through the append daemon");
    let ledger = Arc::new(Ledger::open(&ledger_dir)?);
    let corpus = scenarios();
    let agents = corpus.len();
    let start = Instant::now();
    let (appended, refused) = run_agents(&ledger, &ledger_dir, &socket, corpus)?;
    let elapsed = start.elapsed();
    let checkpoint = ledger.checkpoint();
    println!(
        "{agents} agents appended {appended} decisions over {} in {:.0?}: each reply came only after its",
        socket.display(),
        elapsed
    );
    println!(
        "decision was fsynced and sealed by a signed checkpoint (group commit). Key epoch now {}.",
        checkpoint.epoch
    );
    if refused > 0 {
        println!("{refused} decisions were refused by the daemon (typed errors; nothing written)");
        ok = false;
    }
    println!(
        "\nThe auditor keeps this checkpoint elsewhere ({}), as an anchor:\n",
        anchor_path.display()
    );
    let anchor = checkpoint.to_text();
    std::fs::write(&anchor_path, &anchor)?;
    print!("{anchor}");
    let cp = ledger.rotate()?;
    println!(
        "\nOn demand, a new key epoch: {} (the epoch {} secrets are gone).",
        cp.epoch,
        cp.epoch - 1
    );

    step(3, "Export for offline audit");
    let (entries, checkpoints) = ledger.export(&export)?;
    drop(ledger);
    println!(
        "{} holds {entries} entries and {checkpoints} checkpoints; the auditor copies it away.",
        export.display()
    );
    let bytes = std::fs::read(&export)?;

    step(
        4,
        "Verify: integrity with only the public key, and the anchor",
    );
    let public = LedgerPublic::read(&ledger_dir.join("ledger.pub"))?;
    let mut options = Options::new(public);
    options
        .anchors
        .push(tally_ledger::Checkpoint::from_text(anchor.as_bytes())?);
    let report = verify_bytes(&bytes, &options, |_| {})?;
    print!("{}", report.to_text());
    ok &= report.verdict() == Verdict::Intact;

    step(
        5,
        "Decrypt with the auditor key: loops, budget consistency, handoffs",
    );
    options.auditor = Some(AuditorKey::read(&auditor_path)?);
    let mut analysis = Analysis::new(analysis::Config::default());
    let report = verify_bytes(&bytes, &options, |e| analysis.push(&e))?;
    println!(
        "{} of {} decisions decrypted and valid.\n",
        report.decrypted.unwrap_or(0),
        report.decisions
    );
    ok &= report.verdict() == Verdict::Intact;
    let mut found = analysis.finish();
    if let Some(c) = &report.last_checkpoint {
        found.set_coverage(report.sealed, c.head.clone(), c.epoch);
    }
    println!("{}", analysis::render_loops_text(&found));
    println!("{}", analysis::render_findings_text(&found));
    println!("{}", analysis::render_handoffs_text(&found, None));

    step(6, "Attacks on the export are caught");
    let mut flipped = bytes.clone();
    let at = bytes.len() / 2;
    flipped[at] ^= 0x04;
    options.auditor = None;
    let r = verify_bytes(&flipped, &options, |_| {})?;
    println!("one bit flipped at byte {at}:");
    println!("  {}", r.to_text().lines().next().unwrap_or_default());
    ok &= r.verdict() == Verdict::Tampered;
    let cut = cut_at_frame(&bytes, entries / 2);
    let r = verify_bytes(&bytes[..cut], &options, |_| {})?;
    println!("export cut after {} entries:", entries / 2);
    println!("  {}", r.to_text().lines().next().unwrap_or_default());
    ok &= r.verdict() != Verdict::Intact;

    step(7, "Do it yourself");
    if dir.is_some() {
        let d = base.display();
        println!("tally verify {d}/ledger.tex --key {d}/ledger/ledger.pub --anchor {d}/anchor.cp");
        println!(
            "tally loops {d}/ledger.tex --key {d}/ledger/ledger.pub --auditor-key {d}/auditor.key"
        );
        println!("tally handoff {d}/ledger.tex --key {d}/ledger/ledger.pub --auditor-key {d}/auditor.key --run lost-post --json");
    } else {
        println!("Run `tally demo --dir DIR` to keep these files, then `tally verify`, `tally loops` and");
        println!("`tally handoff` on them (README.md has the walkthrough).");
    }
    if !ok {
        println!("\nThe demo did not go as it should: see above.");
        return Ok(1);
    }
    Ok(0)
}

/// Serve the ledger on a Unix socket and let one agent per scenario append its decisions
/// one request at a time, concurrently. Returns (appended, refused).
fn run_agents(
    ledger: &Arc<Ledger>,
    ledger_dir: &Path,
    socket: &Path,
    corpus: Vec<(&'static str, Vec<tally_ledger::Decision>)>,
) -> Result<(usize, usize)> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let options = tally_daemon::ServeOptions::new(ledger_dir, socket);
        let server = tokio::spawn(tally_daemon::serve(Arc::clone(ledger), options, async {
            let _ = stopped.await;
        }));
        let mut tries = 0;
        while !socket.exists() {
            tries += 1;
            if tries > 500 {
                bail!("the daemon did not start on {}", socket.display());
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        let agents: Vec<_> = corpus
            .into_iter()
            .map(|(_, decisions)| {
                let socket = socket.to_path_buf();
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
        let _ = stop.send(());
        server.await??;
        Ok((appended, refused))
    })
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

//! `tally demo`'s acts in order: keys and ledger, agents at work through the gate, a
//! model called through the proxy, the export, its offline verification, the auditor's
//! decryption and analysis, two attacks on the export, and what to try next.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use tally_ledger::export::ExportReader;
use tally_ledger::keys::{AuditorKey, LedgerPublic};
use tally_ledger::{Ledger, Rotation};
use tally_verify::analysis::{self, Analysis};
use tally_verify::{verify, Event, Options, Report, SourceError, Verdict};

use crate::error::{bail, Context, Result};
use crate::output::{out, outln};
use crate::served::Served;
use crate::DemoOptions;

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

/// Tell the whole story; whether everything went as it must.
pub fn run(args: &DemoOptions) -> Result<bool> {
    let (dir, verbose) = (args.dir.as_deref(), args.verbose);
    // The temporary directory lives until the story ends.
    let (_tmp, base) = demo_dir(dir)?;
    let files = Files::under(&base);
    outln!("tally demo: the budget gate for AI agents and the audit ledger of its decisions, end to end.");
    match dir {
        Some(_) => outln!("files: {} (kept)", base.display()),
        None => outln!(
            "files: {} (a temporary directory, removed when the demo ends; `tally demo --dir DIR` keeps them)",
            base.display()
        ),
    }
    keys_and_ledger(&files)?;
    let (ledger, mut served, anchor, mut ok) = agents_at_work(&files, verbose)?;
    step(
        3,
        "A model called through tally, until the budget stops the agent",
    );
    ok &= served.model_story(&files.socket, &files.operator_socket, verbose)?;
    served.stop()?;
    let (bytes, entries) = export(ledger, &files.export)?;
    let (mut options, intact) = verify_with_anchor(&bytes, &files.ledger_dir, &anchor)?;
    ok &= intact;
    ok &= decrypt_and_analyse(&bytes, &mut options, &files.auditor_path, verbose)?;
    ok &= attacks(&bytes, &mut options, entries)?;
    do_it_yourself(dir.is_some().then_some(base.as_path()));
    if !ok {
        outln!("\nThe demo did not go as it should: see above.");
    }
    Ok(ok)
}

/// The demo's directory: `--dir`, new or empty (said in full, so the files can be found
/// from anywhere), or a temporary one, returned to be held until the demo ends.
fn demo_dir(dir: Option<&Path>) -> Result<(Option<tempfile::TempDir>, PathBuf)> {
    match dir {
        Some(d) => {
            std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
            if std::fs::read_dir(d)?.next().is_some() {
                bail!(
                    "{} is not empty: give `tally demo --dir` a new or empty directory",
                    d.display()
                );
            }
            let base =
                std::fs::canonicalize(d).with_context(|| format!("reading {}", d.display()))?;
            Ok((None, base))
        }
        None => {
            let tmp = tempfile::tempdir().context("creating a temporary directory")?;
            let base = tmp.path().to_path_buf();
            Ok((Some(tmp), base))
        }
    }
}

/// The demo's files, in its directory.
struct Files {
    ledger_dir: PathBuf,
    auditor_path: PathBuf,
    socket: PathBuf,
    operator_socket: PathBuf,
    export: PathBuf,
    anchor_path: PathBuf,
}

impl Files {
    fn under(base: &Path) -> Files {
        Files {
            ledger_dir: base.join("ledger"),
            auditor_path: base.join("auditor.key"),
            socket: base.join("agent.sock"),
            operator_socket: base.join("operator.sock"),
            export: base.join("ledger.tally"),
            anchor_path: base.join("anchor.cp"),
        }
    }
}

/// Act 1: the auditor key pair and a new ledger.
fn keys_and_ledger(files: &Files) -> Result<()> {
    step(1, "Keys and ledger");
    let auditor = AuditorKey::generate();
    auditor.write(&files.auditor_path)?;
    let public = Ledger::init(
        &files.ledger_dir,
        &auditor.public(),
        Rotation {
            records: 200,
            ms: 600_000,
        },
    )?;
    outln!(
        "auditor key pair  {} (0600) + auditor.pub: only this key decrypts records",
        files.auditor_path.display()
    );
    outln!(
        "ledger            {} id {}",
        files.ledger_dir.display(),
        public.ledger_id
    );
    outln!(
        "verification key  {}/ledger.pub: all an integrity check needs",
        files.ledger_dir.display()
    );
    outln!("key epochs        rotate every 200 entries; each new key is certified by the old one, then the old secret is destroyed");
    Ok(())
}

/// Act 2: the stories' agents through the served gate, and the history imported; the
/// auditor's anchor written, then a new key epoch. The ledger, the daemon still serving,
/// the anchor's text, and whether every decision went as it must.
fn agents_at_work(files: &Files, verbose: bool) -> Result<(Arc<Ledger>, Served, String, bool)> {
    step(2, "Agents at work, through the gate");
    let ledger = Arc::new(Ledger::open(&files.ledger_dir)?);
    let corpus = crate::stories::stories()?;
    let agents = corpus.len();
    let mut runs: Vec<String> = Vec::new();
    for d in corpus.iter().flat_map(|(_, ds)| ds) {
        if !runs.contains(&d.run) {
            runs.push(d.run.clone());
        }
    }
    let start = Instant::now();
    let served = Served::start(
        &ledger,
        &files.ledger_dir,
        &files.socket,
        &files.operator_socket,
    )?;
    let (appended, refused, gated) =
        served.agents(&files.socket, &files.operator_socket, corpus)?;
    let elapsed = start.elapsed();
    let checkpoint = ledger.checkpoint();
    let mut ok = gated;
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
    std::fs::write(&files.anchor_path, &anchor)?;
    if verbose {
        outln!(
            "\nThe auditor keeps this checkpoint elsewhere ({}), as an anchor:\n",
            files.anchor_path.display()
        );
        out!("{anchor}");
    } else {
        outln!(
            "\nThe auditor keeps the latest checkpoint (over {}, head {}…) elsewhere, as an anchor: {}",
            tally_verify::text::plural(checkpoint.size, "entry", "entries"),
            &checkpoint.head.to_string()[..16],
            files.anchor_path.display()
        );
    }
    let cp = ledger.rotate()?;
    outln!(
        "\nOn demand, a new key epoch: {} (the epoch {} secrets are gone).",
        cp.epoch,
        cp.epoch - 1
    );
    Ok((ledger, served, anchor, ok))
}

/// Act 4: the export, the ledger closed; its bytes and entry count.
fn export(ledger: Arc<Ledger>, export: &Path) -> Result<(Vec<u8>, u64)> {
    step(4, "Export for offline audit");
    let (entries, checkpoints) = ledger.export(export)?;
    drop(ledger);
    outln!(
        "{} holds {} and {}; the auditor copies it away.",
        export.display(),
        tally_verify::text::plural(entries, "entry", "entries"),
        tally_verify::text::plural(checkpoints, "checkpoint", "checkpoints")
    );
    Ok((std::fs::read(export)?, entries))
}

/// Act 5: the export verified with the public key and the anchor; the options, and
/// whether it is intact.
fn verify_with_anchor(bytes: &[u8], ledger_dir: &Path, anchor: &str) -> Result<(Options, bool)> {
    step(
        5,
        "Verify: integrity with only the public key, and the anchor",
    );
    let public = LedgerPublic::read(&ledger_dir.join("ledger.pub"))?;
    let mut options = Options::new(public);
    options
        .anchors
        .push(tally_ledger::Checkpoint::from_text(anchor.as_bytes())?);
    let report = verify_bytes(bytes, &options, |_| {})?;
    out!("{}", report.to_text());
    Ok((options, report.verdict() == Verdict::Intact))
}

/// Act 6: decrypted with the auditor key, analysed and replayed; whether it is intact
/// and the replay found nothing.
fn decrypt_and_analyse(
    bytes: &[u8],
    options: &mut Options,
    auditor_path: &Path,
    verbose: bool,
) -> Result<bool> {
    step(
        6,
        "Decrypt with the auditor key: loops, budget consistency, handoffs",
    );
    options.auditor = Some(AuditorKey::read(auditor_path)?);
    let mut analysis = Analysis::new(analysis::Config::default());
    let mut replay = tally_verify::analysis::Replay::new();
    let report = verify_bytes(bytes, options, |e| {
        analysis.push(&e);
        replay.push(&e);
    })?;
    outln!(
        "{} of {} decisions decrypted and valid.\n",
        report.decrypted.unwrap_or(0),
        report.decisions
    );
    let mut ok = report.verdict() == Verdict::Intact;
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
    Ok(ok)
}

/// Act 7: a flipped bit and a cut export, each caught without the auditor key.
fn attacks(bytes: &[u8], options: &mut Options, entries: u64) -> Result<bool> {
    step(7, "Attacks on the export are caught");
    let mut flipped = bytes.to_vec();
    let at = bytes.len() / 2;
    flipped[at] ^= 0x04;
    options.auditor = None;
    let r = verify_bytes(&flipped, options, |_| {})?;
    outln!("one bit flipped at byte {at}:");
    outln!("  {}", r.to_text().lines().next().unwrap_or_default());
    let mut ok = r.verdict() == Verdict::Tampered;
    let cut = cut_at_frame(bytes, entries / 2);
    let r = verify_bytes(&bytes[..cut], options, |_| {})?;
    outln!("export cut after {} entries:", entries / 2);
    outln!("  {}", r.to_text().lines().next().unwrap_or_default());
    ok &= r.verdict() != Verdict::Intact;
    Ok(ok)
}

/// Act 8: the commands to run on the kept files (`kept`: the `--dir` given), or how to
/// keep them.
fn do_it_yourself(kept: Option<&Path>) {
    step(8, "Do it yourself");
    if let Some(base) = kept {
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
    crate::mcp::RUN,
    crate::model::RUN,
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

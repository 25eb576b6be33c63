//! What each subcommand does. Errors are `anyhow` here, at the edge, with context that
//! says what to do next.

use std::fs::File;
use std::io::{self, BufRead, IsTerminal, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use tally_ledger::export::ExportReader;
use tally_ledger::keys::{read_auditor_public, AuditorKey, LedgerPublic};
use tally_ledger::{Checkpoint, Decision, Frame, Ledger, Rotation};
use tally_verify::analysis::{self, Analysis};
use tally_verify::{Event, Options, Report, SourceError, Verdict};

use crate::cli::{ReadArgs, Thresholds};

/// What a command ends with: its exit code.
pub type Code = u8;

pub fn keygen(out: &Path, approver: bool) -> Result<Code> {
    if out.extension().is_some_and(|e| e == "pub") {
        bail!(
            "{} ends in .pub, where the public half goes: give the secret key's path (e.g. dana.key)",
            out.display()
        );
    }
    if approver {
        let key = tally_ledger::keys::ApproverKey::generate();
        key.write(out)
            .with_context(|| format!("writing {} (it must not exist yet)", out.display()))?;
        let name = out
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "approver".into());
        eprintln!(
            "wrote {} (secret, 0600) and {}; list the approver in the policy:",
            out.display(),
            out.with_extension("pub").display()
        );
        println!("[approvals.approvers]\n{name} = \"{}\"", key.public_hex());
        return Ok(0);
    }
    let key = AuditorKey::generate();
    key.write(out)
        .with_context(|| format!("writing {} (it must not exist yet)", out.display()))?;
    eprintln!(
        "wrote {} (secret, 0600) and {} (public: give it to `tally init --recipient`)",
        out.display(),
        out.with_extension("pub").display()
    );
    Ok(0)
}

pub fn init(ledger: &Path, recipient: &Path, rotation: Rotation) -> Result<Code> {
    let recipient = read_auditor_public(recipient).context("reading the auditor public key")?;
    let public = Ledger::init(ledger, &recipient, rotation)?;
    eprintln!(
        "created ledger {} in {}; its verification key is {}",
        public.ledger_id,
        ledger.display(),
        ledger.join("ledger.pub").display()
    );
    Ok(0)
}

fn open(ledger: &Path) -> Result<Ledger> {
    Ledger::open(ledger).with_context(|| {
        format!(
            "opening ledger {} (if `tally serve` holds it, use its API instead)",
            ledger.display()
        )
    })
}

pub fn append(ledger: &Path, json: Option<&str>, batch: usize) -> Result<Code> {
    let ledger = open(ledger)?;
    let stdout = io::stdout();
    let mut out = stdout.lock();
    if let Some(text) = json {
        let d = Decision::from_json(text).context("the decision argument")?;
        let r = ledger.append(d)?;
        writeln!(out, "{}", serde_json::to_string(&r)?)?;
        return Ok(0);
    }
    let stdin = io::stdin();
    let mut pending: Vec<Decision> = Vec::new();
    let mut first_line = 1;
    for (i, line) in stdin.lock().lines().enumerate() {
        let line = line.context("reading stdin")?;
        if line.trim().is_empty() {
            continue;
        }
        if pending.is_empty() {
            first_line = i + 1;
        }
        let d = Decision::from_json(&line).with_context(|| format!("stdin line {}", i + 1))?;
        d.validate()
            .with_context(|| format!("stdin line {}", i + 1))?;
        pending.push(d);
        if pending.len() >= batch.max(1) {
            flush(&ledger, &mut pending, first_line, &mut out)?;
        }
    }
    flush(&ledger, &mut pending, first_line, &mut out)?;
    Ok(0)
}

fn flush(
    ledger: &Ledger,
    pending: &mut Vec<Decision>,
    first_line: usize,
    out: &mut impl Write,
) -> Result<()> {
    if pending.is_empty() {
        return Ok(());
    }
    let receipts = ledger
        .append_batch(std::mem::take(pending))
        .with_context(|| {
            format!("batch starting at stdin line {first_line}: nothing of it was written")
        })?;
    for r in receipts {
        writeln!(out, "{}", serde_json::to_string(&r)?)?;
    }
    Ok(())
}

pub fn checkpoint(ledger: &Path) -> Result<Code> {
    let ledger = open(ledger)?;
    print!("{}", ledger.checkpoint().to_text());
    Ok(0)
}

pub fn rotate(ledger: &Path) -> Result<Code> {
    let ledger = open(ledger)?;
    let cp = ledger.rotate()?;
    eprintln!(
        "now in key epoch {}; the previous epoch's secrets are destroyed",
        cp.epoch
    );
    Ok(0)
}

pub fn export(ledger: &Path, out: &Path) -> Result<Code> {
    let ledger = open(ledger)?;
    let (entries, checkpoints) = ledger.export(out)?;
    eprintln!(
        "exported {entries} entries and {checkpoints} checkpoints to {}",
        out.display()
    );
    Ok(0)
}

/// The verifier's inputs, read from the command line.
pub struct Audit {
    pub options: Options,
    pub path: PathBuf,
    pub json: bool,
}

impl Audit {
    pub fn from_args(read: &ReadArgs, auditor_key: Option<&Path>) -> Result<Audit> {
        let public = LedgerPublic::read(&read.key).with_context(|| {
            format!(
                "reading the ledger verification key {} (the ledger's ledger.pub)",
                read.key.display()
            )
        })?;
        let mut options = Options::new(public);
        options.require_anchor = read.require_anchor;
        options.threads = std::thread::available_parallelism().map_or(2, |n| n.get());
        if let Some(k) = auditor_key {
            options.auditor = Some(
                AuditorKey::read(k)
                    .with_context(|| format!("reading the auditor key {}", k.display()))?,
            );
        }
        for a in &read.anchors {
            let text =
                std::fs::read(a).with_context(|| format!("reading anchor {}", a.display()))?;
            let cp = Checkpoint::from_text(&text)
                .with_context(|| format!("anchor {} is not a tally checkpoint", a.display()))?;
            options.anchors.push(cp);
        }
        Ok(Audit {
            options,
            path: read.path.clone(),
            json: read.json,
        })
    }

    /// Verify, handing every decrypted decision to `sink`.
    pub fn run(&self, sink: impl FnMut(Event)) -> Result<Report> {
        let progress = Progress::new();
        if self.path.is_dir() {
            let scratch = tempfile::tempdir().context("creating a scratch directory")?;
            let store = tally_ledger::store::open_copy(&self.path, scratch.path())
                .with_context(|| format!("reading the store in {}", self.path.display()))?;
            let frames = store
                .frames()
                .map(|f| f.map_err(|e| SourceError::Store(e.to_string())));
            Ok(tally_verify::verify(frames, &self.options, sink, |n| {
                progress.show(n)
            }))
        } else {
            let file = File::open(&self.path)
                .with_context(|| format!("opening {}", self.path.display()))?;
            let reader = ExportReader::new(file)
                .with_context(|| format!("{} is not a tally export", self.path.display()))?;
            let frames = reader.map(|f: Result<Frame, _>| f.map_err(SourceError::from));
            Ok(tally_verify::verify(frames, &self.options, sink, |n| {
                progress.show(n)
            }))
        }
    }
}

/// A progress line on a terminal; silent when stderr is not one.
struct Progress {
    on: bool,
}

impl Progress {
    fn new() -> Progress {
        Progress {
            on: io::stderr().is_terminal(),
        }
    }

    fn show(&self, entries: u64) {
        if self.on {
            eprint!("\r\x1b[2Kverifying: {entries} entries");
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if self.on {
            eprint!("\r\x1b[2K");
        }
    }
}

pub fn verify(read: &ReadArgs, auditor_key: Option<&Path>) -> Result<Code> {
    let audit = Audit::from_args(read, auditor_key)?;
    // With the auditor key: the consistency audit and the replay of every gate decision
    // (SPEC 5.8), from the same policy core the gate decided with.
    let mut analysis = auditor_key.map(|_| Analysis::new(analysis::Config::default()));
    let mut replay = auditor_key.map(|_| tally_verify::replay::Replay::new());
    let report = audit.run(|e| {
        if let Some(a) = analysis.as_mut() {
            a.push(&e);
        }
        if let Some(r) = replay.as_mut() {
            r.push(&e);
        }
    })?;
    if report.auditor_key_mismatch {
        bail!(
            "the auditor key {} is not this ledger's recipient: nothing can be decrypted with it",
            auditor_key
                .map(|p| p.display().to_string())
                .unwrap_or_default()
        );
    }
    let found = analysis.map(Analysis::finish);
    let replayed = replay.map(tally_verify::replay::Replay::finish);
    let inconsistent = found
        .as_ref()
        .is_some_and(|f| !f.findings.is_empty() || f.findings_omitted > 0)
        || replayed
            .as_ref()
            .is_some_and(|r| !r.findings.is_empty() || r.omitted > 0);
    if audit.json {
        let mut value = serde_json::to_value(&report)?;
        if let (serde_json::Value::Object(map), Some(f), Some(r)) = (&mut value, &found, &replayed)
        {
            map.insert(
                "audit".into(),
                serde_json::json!({"findings": f.findings, "findings_omitted": f.findings_omitted}),
            );
            map.insert("replay".into(), serde_json::to_value(r)?);
        }
        println!("{}", serde_json::to_string_pretty(&value)?);
    } else {
        print!("{}", report.to_text());
        if let (Some(f), Some(r)) = (&found, &replayed) {
            println!("\n{}", analysis::render_findings_text(f));
            print!("{}", r.to_text());
        }
    }
    let code = report.verdict().exit_code();
    // Intact but inconsistent is a finding (exit 1); tampering and incomplete evidence
    // keep their own codes.
    Ok(if code == 0 && inconsistent { 1 } else { code })
}

/// Verify with the auditor key and run the analysis over every decision. Refuses a
/// ledger that does not verify unless `force`; then every page says so.
fn analyse(
    read: &ReadArgs,
    auditor_key: &Path,
    force: bool,
    thresholds: &Thresholds,
) -> Result<Option<(Report, analysis::Report)>> {
    let audit = Audit::from_args(read, Some(auditor_key))?;
    let mut analysis = Analysis::new(config(thresholds));
    let report = audit.run(|e| analysis.push(&e))?;
    if report.auditor_key_mismatch {
        bail!(
            "the auditor key {} is not this ledger's recipient: nothing can be decrypted with it",
            auditor_key.display()
        );
    }
    if report.verdict() == Verdict::Tampered && !force {
        eprint!("{}", report.to_text());
        eprintln!("tally: refusing to report on a ledger that does not verify (use --force to report anyway)");
        return Ok(None);
    }
    let mut found = analysis.finish();
    if let Some(cp) = &report.last_checkpoint {
        found.set_coverage(report.sealed, cp.head.clone(), cp.epoch);
    }
    Ok(Some((report, found)))
}

/// The documented defaults, with each threshold given on the command line over it.
fn config(t: &Thresholds) -> analysis::Config {
    let mut c = analysis::Config::default();
    let set = |field: &mut u64, given: Option<u64>| {
        if let Some(v) = given {
            *field = v;
        }
    };
    set(&mut c.repeat_min, t.repeat_min);
    set(&mut c.repeat_window_ms, t.repeat_window_ms);
    set(&mut c.burst_min, t.burst_min);
    set(&mut c.burst_window_ms, t.burst_window_ms);
    set(&mut c.storm_min_failures, t.storm_min_failures);
    set(&mut c.storm_window_ms, t.storm_window_ms);
    set(&mut c.storm_min_sources, t.storm_min_sources);
    set(&mut c.retry_after_ignored_min, t.retry_after_ignored_min);
    set(&mut c.poll_stall_min, t.poll_stall_min);
    c
}

/// The warning every page carries when a report is forced over a broken chain.
fn unverified_banner(report: &Report) -> Option<String> {
    (report.verdict() == Verdict::Tampered).then(|| {
        let first = report
            .first_break()
            .map(|f| f.to_string())
            .unwrap_or_default();
        format!("WARNING: this ledger did NOT verify ({first}); what follows may be false.\n")
    })
}

/// Text with the banner above and below, or JSON wrapped with the verification result.
fn emit(report: &Report, json: bool, text: String, json_body: String, key: &str) -> Result<()> {
    if json {
        let body: serde_json::Value = serde_json::from_str(&json_body)?;
        let wrapped = serde_json::json!({
            "verification": {
                "verdict": report.verdict(),
                "first_bad": report.first_break(),
                "sealed": report.sealed,
                "entries": report.entries,
            },
            key: body,
        });
        println!("{}", serde_json::to_string_pretty(&wrapped)?);
    } else {
        let banner = unverified_banner(report).unwrap_or_default();
        print!("{banner}{text}{banner}");
    }
    Ok(())
}

fn analysis_code(report: &Report, found: &analysis::Report) -> Code {
    match report.verdict() {
        Verdict::Tampered => 1,
        _ if !found.findings.is_empty() => 1,
        v => v.exit_code(),
    }
}

pub fn loops(
    read: &ReadArgs,
    auditor_key: &Path,
    force: bool,
    thresholds: &Thresholds,
) -> Result<Code> {
    let Some((report, found)) = analyse(read, auditor_key, force, thresholds)? else {
        return Ok(1);
    };
    let text = format!(
        "{}\n{}",
        analysis::render_loops_text(&found),
        analysis::render_findings_text(&found)
    );
    let json = format!(
        "{{\"loops\":{},\"findings\":{}}}",
        analysis::render_loops_json(&found),
        analysis::render_findings_json(&found)
    );
    emit(&report, read.json, text, json, "analysis")?;
    Ok(analysis_code(&report, &found))
}

pub fn handoff(
    read: &ReadArgs,
    auditor_key: &Path,
    run: Option<&str>,
    force: bool,
    thresholds: &Thresholds,
) -> Result<Code> {
    let Some((report, found)) = analyse(read, auditor_key, force, thresholds)? else {
        return Ok(1);
    };
    if let Some(run) = run {
        if found.handoff(run).is_none() {
            bail!("no run named {run:?} in this ledger");
        }
    }
    let text = analysis::render_handoffs_text(&found, run);
    let json = analysis::render_handoffs_json(&found, run);
    emit(&report, read.json, text, json, "handoffs")?;
    Ok(analysis_code(&report, &found))
}

pub(crate) fn read_policy(path: &std::path::Path) -> Result<tally_policy::Recorded> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the policy {}", path.display()))?;
    tally_policy::Recorded::new(&text).with_context(|| format!("{}", path.display()))
}

/// `tally policy check FILE`: validate, then print the policy with its defaults.
pub fn policy_check(path: &std::path::Path) -> Result<Code> {
    let recorded = read_policy(path)?;
    println!("# {}: valid; digest {}", path.display(), recorded.digest);
    print!("{}", recorded.policy.to_toml());
    Ok(0)
}

//! The readers: `tally verify`, and the reports (`loops`, `handoff`) that verify,
//! decrypt and analyse first.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use tally_ledger::keys::{AuditorKey, LedgerPublic};
use tally_ledger::Checkpoint;
use tally_verify::analysis;
use tally_verify::audit::{Audit, Ledger, Verified};
use tally_verify::text::terminal_safe;
use tally_verify::{Options, Verdict};

use super::{is_stdio, read_policy, Progress};
use crate::cli::{LoopsArgs, ReadArgs, ReportArgs, Rules, VerifyArgs};
use crate::output::{errln, out, outln};
use crate::Exit;

/// The ledgers of one audit as the arguments name them: the audit, and what its
/// messages name each ledger's key by.
pub struct Audits {
    pub audit: Audit,
    /// Each ledger's key file, in the same order (for messages).
    pub keys: Vec<PathBuf>,
    pub json: bool,
}

impl Audits {
    pub fn from_args(read: &ReadArgs, auditor_key: Option<&Path>) -> Result<Audits> {
        check_ledger_count(read)?;
        let mut ledgers = open_ledgers(read, auditor_key)?;
        for a in &read.anchors {
            add_anchor(&mut ledgers, &read.keys, a)?;
        }
        Ok(Audits {
            audit: Audit { ledgers },
            keys: read.keys.clone(),
            json: read.json,
        })
    }

    /// The progress line while verifying (one ledger at a time only).
    fn progress(&self) -> Progress {
        Progress::new("verifying").on_if(self.audit.ledgers.len() == 1)
    }
}

/// Refuse a ledger list the audit cannot read: a key missing or extra, too many ledgers,
/// or standard input named twice.
fn check_ledger_count(read: &ReadArgs) -> Result<()> {
    if read.paths.len() != read.keys.len() {
        bail!(
            "{} ledgers and {} --key: give each ledger its ledger.pub, in the order of the ledgers",
            read.paths.len(),
            read.keys.len()
        );
    }
    if read.paths.len() >= usize::from(u16::MAX) {
        bail!(
            "{} ledgers: at most {} can be read as one",
            read.paths.len(),
            u16::MAX - 1
        );
    }
    if read.paths.iter().filter(|p| is_stdio(p)).count() > 1 {
        bail!("standard input (-) can be only one of the ledgers");
    }
    Ok(())
}

/// Each ledger with its verification key and options, sharing the machine's threads;
/// two keys of one ledger are refused.
fn open_ledgers(read: &ReadArgs, auditor_key: Option<&Path>) -> Result<Vec<Ledger>> {
    let n = read.paths.len();
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let mut ledgers: Vec<Ledger> = Vec::with_capacity(n);
    for (path, key) in read.paths.iter().zip(&read.keys) {
        let public = LedgerPublic::read(key).with_context(|| {
            format!(
                "reading the ledger verification key {} (the ledger's ledger.pub)",
                key.display()
            )
        })?;
        if let Some(i) = ledgers
            .iter()
            .position(|l| l.options.public.ledger_id == public.ledger_id)
        {
            bail!(
                "{} and {} are keys of the same ledger {}: give each ledger once",
                read.keys[i].display(),
                key.display(),
                public.ledger_id
            );
        }
        let mut options = Options::new(public);
        options.require_anchor = read.require_anchor;
        options.threads = (threads / n).max(1);
        if let Some(k) = auditor_key {
            options.auditor = Some(
                AuditorKey::read(k)
                    .with_context(|| format!("reading the auditor key {}", k.display()))?,
            );
        }
        ledgers.push(Ledger::new(path.clone(), options));
    }
    Ok(ledgers)
}

/// Give the anchor file `a` (a tree anchor or a checkpoint) to the ledger it is of; an
/// anchor of none of them is refused.
fn add_anchor(ledgers: &mut [Ledger], keys: &[PathBuf], a: &Path) -> Result<()> {
    let n = ledgers.len();
    let text = std::fs::read(a).with_context(|| format!("reading anchor {}", a.display()))?;
    if let Some((id, anchor)) = crate::prove::tree_anchor(&text, a) {
        match ledgers.iter_mut().find(|l| l.options.public.ledger_id == id) {
            Some(l) => l.options.tree_anchors.push(anchor),
            None if n == 1 => bail!(
                "anchor {} is a checkpoint of ledger {id}, but {} is the key of ledger {}: give an anchor of this ledger",
                a.display(),
                keys[0].display(),
                ledgers[0].options.public.ledger_id
            ),
            None => bail!(
                "anchor {} is a checkpoint of ledger {id}, which none of the --key files is the key of: give an anchor of one of these ledgers",
                a.display()
            ),
        }
        return Ok(());
    }
    let cp = Checkpoint::from_text(&text)
        .with_context(|| format!("anchor {} is not a tally checkpoint", a.display()))?;
    // Ids first, as minisign compares key ids: another ledger's anchor is a mistake.
    match ledgers
        .iter_mut()
        .find(|l| l.options.public.ledger_id == cp.ledger_id)
    {
        Some(l) => l.options.anchors.push(cp),
        None if n == 1 => bail!(
            "anchor {} is a checkpoint of ledger {}, but {} is the key of ledger {}: give an anchor of this ledger",
            a.display(),
            cp.ledger_id,
            keys[0].display(),
            ledgers[0].options.public.ledger_id
        ),
        None => bail!(
            "anchor {} is a checkpoint of ledger {}, which none of the --key files is the key of: give an anchor of one of these ledgers",
            a.display(),
            cp.ledger_id
        ),
    }
    Ok(())
}

/// `tally verify`.
pub fn verify(args: &VerifyArgs) -> Result<Exit> {
    let VerifyArgs {
        read,
        auditor_key,
        rules,
        witness_policy,
        ask_witnesses,
        witness_ca,
        no_walk,
    } = args;
    if *no_walk {
        return crate::no_walk::run(read);
    }
    let (auditor_key, witness_policy, ask_witnesses) = (
        auditor_key.as_deref(),
        witness_policy.as_deref(),
        *ask_witnesses,
    );
    let mut audits = Audits::from_args(read, auditor_key)?;
    if let Some(p) = witness_policy {
        let cas = crate::witness::ca_files(witness_ca)?;
        crate::witness::apply_policy(&mut audits.audit.ledgers, p, ask_witnesses, &cas)?;
    }
    // With the auditor key: the replay of every gate decision (SECURITY.md 5.8) and the
    // consistency audit of every record, in one fold through the policy core the gate
    // decided with.
    let config = match auditor_key {
        Some(_) => Some(config(rules)?),
        None => None,
    };
    let progress = audits.progress();
    let report = audits.audit.run(config, |n| progress.show(n))?;
    drop(progress);
    usage_errors(&report.verified, &audits, auditor_key)?;
    if audits.json {
        outln!("{}", serde_json::to_string_pretty(&report.to_json())?);
    } else {
        out!("{}", terminal_safe(&report.to_text()));
    }
    // An inconsistency is exit 1 over incomplete evidence too, as for loops and handoff.
    Ok(if report.inconsistent() {
        Exit::Findings
    } else {
        report.verdict().into()
    })
}

/// The mistakes a report cannot speak for (exit 2): another ledger's `ledger.pub`, or an
/// auditor key that is not the recipient of an intact genesis. A genesis that does not
/// verify is tampering, and the keyless walk's report says so first.
fn usage_errors(verified: &Verified, audits: &Audits, auditor_key: Option<&Path>) -> Result<()> {
    for ((path, report), key) in verified.reports.iter().zip(&audits.keys) {
        if let Some(m) = &report.key_mismatch {
            bail!(
                "{} is the verification key of ledger {}, but {} holds ledger {}: give that ledger's ledger.pub (--key)",
                key.display(),
                m.key_ledger_id,
                path.display(),
                m.ledger_id
            );
        }
        if report.auditor_key_mismatch && report.verdict() != Verdict::Tampered {
            bail!(
                "the auditor key {} is not the recipient of {}: nothing can be decrypted with it",
                auditor_key
                    .map(|p| p.display().to_string())
                    .unwrap_or_default(),
                match verified.single() {
                    Some(_) => "this ledger".to_owned(),
                    None => format!("ledger {}", path.display()),
                }
            );
        }
    }
    Ok(())
}

/// The refusal to report on a ledger that does not verify: the verification on stderr,
/// and with `--json` a document on stdout that says so (schemas in docs/schemas/).
fn refuse(verified: &Verified, json: bool) -> Result<()> {
    const WHY: &str =
        "refusing to report on a ledger that does not verify (use --force to report anyway)";
    errln!("{}", terminal_safe(verified.to_text().trim_end()));
    errln!("tally: {WHY}");
    if json {
        let doc = serde_json::json!({
            "version": analysis::REPORT_VERSION,
            "verification": verified.verification_json(),
            "refused": WHY,
        });
        outln!("{}", serde_json::to_string_pretty(&doc)?);
    }
    Ok(())
}

/// Verify with the auditor key and run the analysis over every decision. Refuses a
/// ledger that does not verify unless `force`; then every page says so.
pub(crate) fn analyse(
    read: &ReadArgs,
    auditor_key: &Path,
    force: bool,
    rules: &Rules,
) -> Result<Option<(Verified, analysis::Report)>> {
    let audits = Audits::from_args(read, Some(auditor_key))?;
    let config = config(rules)?;
    let progress = audits.progress();
    let (verified, found) = audits.audit.analyse(config, |n| progress.show(n))?;
    drop(progress);
    usage_errors(&verified, &audits, Some(auditor_key))?;
    if verified.verdict() == Verdict::Tampered && !force {
        refuse(&verified, read.json)?;
        return Ok(None);
    }
    Ok(Some((verified, found)))
}

/// Verify with the auditor key, handing every decrypted decision to `sink` in seq
/// order (`tally policy backtest`). Refuses a ledger that does not verify unless
/// `force`, as [`analyse`] does.
pub(crate) fn walk(
    read: &ReadArgs,
    auditor_key: &Path,
    force: bool,
    sink: impl FnMut(tally_verify::Event),
) -> Result<Option<Verified>> {
    let audits = Audits::from_args(read, Some(auditor_key))?;
    let progress = audits.progress();
    let verified = audits.audit.verify(sink, |n| progress.show(n))?;
    drop(progress);
    usage_errors(&verified, &audits, Some(auditor_key))?;
    if verified.verdict() == Verdict::Tampered && !force {
        refuse(&verified, read.json)?;
        return Ok(None);
    }
    Ok(Some(verified))
}

/// The configuration runs are read under: the policy given, else the gate's defaults.
fn config(rules: &Rules) -> Result<analysis::Config> {
    let mut c = analysis::Config::default();
    if let Some(path) = &rules.policy {
        c.policy = std::sync::Arc::new(read_policy(path)?.policy);
    }
    Ok(c)
}

/// Text with the banner above and below, or one JSON document: the report's fields
/// (`version` and its lists, from `json_parts`) beside `verification`.
pub(crate) fn emit(
    verified: &Verified,
    json: bool,
    text: String,
    json_parts: &[String],
) -> Result<()> {
    if json {
        let mut doc = serde_json::Map::new();
        for part in json_parts {
            if let serde_json::Value::Object(fields) = serde_json::from_str(part)? {
                doc.extend(fields);
            }
        }
        doc.insert("verification".into(), verified.verification_json());
        outln!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        let banner = verified.banner().unwrap_or_default();
        out!("{}", terminal_safe(&format!("{banner}{text}{banner}")));
    }
    Ok(())
}

/// The exit code of a report over `findings` audit findings (of `run`, if given): a
/// chain that did not verify, an inconsistency or a merge finding is 1, incomplete
/// evidence 3.
pub(crate) fn analysis_code(verified: &Verified, findings: u64, run: Option<&str>) -> Exit {
    match verified.verdict() {
        Verdict::Tampered => Exit::Findings,
        _ if findings > 0 || verified.merge_findings(run) > 0 => Exit::Findings,
        v => v.into(),
    }
}

/// `tally loops`.
pub fn loops(args: &LoopsArgs) -> Result<Exit> {
    let LoopsArgs {
        read,
        auditor_key,
        force,
        rules,
    } = args;
    let Some((verified, found)) = analyse(read, auditor_key, *force, rules)? else {
        return Ok(Exit::Findings);
    };
    let text = format!(
        "{}\n{}",
        analysis::render_loops_text(&found),
        analysis::render_findings_text(&found)
    );
    let json = [
        analysis::render_loops_json(&found),
        analysis::render_findings_json(&found),
    ];
    emit(&verified, read.json, text, &json)?;
    let findings = found.findings.len() as u64 + found.findings_omitted;
    Ok(analysis_code(&verified, findings, None))
}

/// `tally handoff`.
pub fn handoff(args: &ReportArgs) -> Result<Exit> {
    let ReportArgs {
        read,
        auditor_key,
        run,
        force,
        rules,
    } = args;
    let run = run.as_deref();
    let Some((verified, found)) = analyse(read, auditor_key, *force, rules)? else {
        return Ok(Exit::Findings);
    };
    // With --run, only that run's findings decide the exit code.
    let findings = match run {
        Some(run) => match found.handoff(run) {
            Some(h) => h.findings,
            None => bail!("no run named {run:?} in the ledgers read"),
        },
        None => found.findings.len() as u64 + found.findings_omitted,
    };
    let text = analysis::render_handoffs_text(&found, run);
    let json = [analysis::render_handoffs_json(&found, run)];
    emit(&verified, read.json, text, &json)?;
    Ok(analysis_code(&verified, findings, run))
}

//! The readers: `tally verify`, and the reports (`loops`, `handoff`) that verify,
//! decrypt and analyse first.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use tally_ledger::keys::{AuditorKey, LedgerPublic};
use tally_ledger::Checkpoint;
use tally_verify::analysis::{self, Analysis};
use tally_verify::text::terminal_safe;
use tally_verify::{Event, Options, Report, SourceError, Verdict};

use super::{is_stdio, read_policy, Progress};
use crate::cli::{LoopsArgs, ReadArgs, ReportArgs, Rules, VerifyArgs};
use crate::output::{errln, out, outln};
use crate::Exit;

pub struct Audit {
    pub options: Options,
    pub path: PathBuf,
    /// Show progress on a terminal (one ledger at a time only).
    pub progress: bool,
}

/// The ledgers of one audit: one, or the several ledgers of a fleet, read as one.
pub struct Audits {
    pub ledgers: Vec<Audit>,
    /// Each ledger's key file, in the same order (for messages).
    pub keys: Vec<PathBuf>,
    pub json: bool,
}

/// What the verifier found: one report per ledger, and for several, the merge's.
pub struct Verified {
    pub reports: Vec<(PathBuf, Report)>,
    pub merge: Option<tally_verify::merge::MergeReport>,
}

impl Verified {
    /// The worst of the ledgers' verdicts.
    pub fn verdict(&self) -> Verdict {
        let verdicts = || self.reports.iter().map(|(_, r)| r.verdict());
        if verdicts().any(|v| v == Verdict::Tampered) {
            Verdict::Tampered
        } else if verdicts().any(|v| v == Verdict::Incomplete) {
            Verdict::Incomplete
        } else {
            Verdict::Intact
        }
    }

    /// The one report of a one-ledger audit.
    fn single(&self) -> Option<&Report> {
        match self.reports.as_slice() {
            [(_, r)] => Some(r),
            _ => None,
        }
    }

    /// How many findings the merge made (of `run`'s records only, if given; findings
    /// beyond those listed count for every run).
    fn merge_findings(&self, run: Option<&str>) -> u64 {
        self.merge.as_ref().map_or(0, |m| {
            let listed = m
                .findings
                .iter()
                .filter(|f| run.is_none_or(|r| f.run == r))
                .count() as u64;
            listed + m.omitted
        })
    }

    /// Every ledger's report as text, each under its path.
    fn to_text(&self) -> String {
        match self.single() {
            Some(r) => r.to_text(),
            None => {
                let n = self.reports.len();
                let worst = |v: Verdict| {
                    self.reports
                        .iter()
                        .enumerate()
                        .filter(|(_, (_, r))| r.verdict() == v)
                        .map(|(i, _)| (i + 1).to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                };
                let mut out = match self.verdict() {
                    Verdict::Intact if self.merge.is_some() => {
                        format!("INTACT: all {n} ledgers verified and sealed, read as one\n")
                    }
                    Verdict::Intact => format!("INTACT: all {n} ledgers verified and sealed\n"),
                    Verdict::Tampered => format!(
                        "TAMPERED: ledger {} of {n} did not verify\n",
                        worst(Verdict::Tampered)
                    ),
                    Verdict::Incomplete => format!(
                        "INCOMPLETE: ledger {} of {n} is not wholly sealed\n",
                        worst(Verdict::Incomplete)
                    ),
                };
                for (i, (path, r)) in self.reports.iter().enumerate() {
                    out.push_str(&format!("ledger {} ({}):\n", i + 1, path.display()));
                    for line in r.to_text().lines() {
                        out.push_str(&format!("  {line}\n"));
                    }
                }
                if let Some(m) = &self.merge {
                    let total: u64 = m.decisions.iter().sum();
                    out.push_str(&format!(
                        "merged: {total} decisions of {} ledgers in state version order\n",
                        self.reports.len()
                    ));
                    out.push_str(&m.to_text());
                }
                out
            }
        }
    }
}

impl Audits {
    pub fn from_args(read: &ReadArgs, auditor_key: Option<&Path>) -> Result<Audits> {
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
        let n = read.paths.len();
        let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
        let mut ledgers: Vec<Audit> = Vec::with_capacity(n);
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
            ledgers.push(Audit {
                options,
                path: path.clone(),
                progress: n == 1,
            });
        }
        for a in &read.anchors {
            let text =
                std::fs::read(a).with_context(|| format!("reading anchor {}", a.display()))?;
            if let Some((id, anchor)) = crate::prove::tree_anchor(&text, a) {
                match ledgers.iter_mut().find(|l| l.options.public.ledger_id == id) {
                    Some(l) => l.options.tree_anchors.push(anchor),
                    None if n == 1 => bail!(
                        "anchor {} is a checkpoint of ledger {id}, but {} is the key of ledger {}: give an anchor of this ledger",
                        a.display(),
                        read.keys[0].display(),
                        ledgers[0].options.public.ledger_id
                    ),
                    None => bail!(
                        "anchor {} is a checkpoint of ledger {id}, which none of the --key files is the key of: give an anchor of one of these ledgers",
                        a.display()
                    ),
                }
                continue;
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
                    read.keys[0].display(),
                    ledgers[0].options.public.ledger_id
                ),
                None => bail!(
                    "anchor {} is a checkpoint of ledger {}, which none of the --key files is the key of: give an anchor of one of these ledgers",
                    a.display(),
                    cp.ledger_id
                ),
            }
        }
        Ok(Audits {
            ledgers,
            keys: read.keys.clone(),
            json: read.json,
        })
    }

    /// Verify every ledger, handing every decrypted decision to `sink`: one ledger's in
    /// seq order, several ledgers' merged in state version order (each verified on a
    /// thread of its own while the merge reads them).
    pub fn run(&self, mut sink: impl FnMut(Event)) -> Result<Verified> {
        // Without the auditor key nothing is decrypted: each ledger is verified, nothing
        // is merged.
        let decrypting = self.ledgers.iter().all(|l| l.options.auditor.is_some());
        if !decrypting {
            let mut reports = Vec::with_capacity(self.ledgers.len());
            for audit in &self.ledgers {
                reports.push((audit.path.clone(), audit.run(|_| {})?));
            }
            return Ok(Verified {
                reports,
                merge: None,
            });
        }
        if let [one] = self.ledgers.as_slice() {
            let report = one.run(sink)?;
            return Ok(Verified {
                reports: vec![(one.path.clone(), report)],
                merge: None,
            });
        }
        std::thread::scope(|scope| {
            let mut walks = Vec::with_capacity(self.ledgers.len());
            let mut streams = Vec::with_capacity(self.ledgers.len());
            for audit in &self.ledgers {
                let (tx, rx) = std::sync::mpsc::sync_channel::<Event>(1024);
                walks.push(scope.spawn(move || {
                    audit.run(|e| {
                        // The merge stops reading only once every stream ended.
                        let _ = tx.send(e);
                    })
                }));
                streams.push(rx.into_iter());
            }
            // Ties go by ledger id: the merged order is the same whatever order the
            // ledgers were given in.
            let ids = self.ledgers.iter().map(|l| l.options.public.ledger_id);
            let merge = tally_verify::merge::merge(ids.zip(streams).collect(), &mut sink);
            let mut reports = Vec::with_capacity(walks.len());
            for (audit, walk) in self.ledgers.iter().zip(walks) {
                let report = walk
                    .join()
                    .map_err(|_| anyhow::anyhow!("verifying {} failed", audit.path.display()))??;
                reports.push((audit.path.clone(), report));
            }
            Ok(Verified {
                reports,
                merge: Some(merge),
            })
        })
    }
}

impl Audit {
    /// Verify, handing every decrypted decision to `sink`.
    pub fn run(&self, sink: impl FnMut(Event)) -> Result<Report> {
        let progress = Progress::new("verifying").on_if(self.progress);
        if self.path.is_dir() {
            let frames = match tally_verify::walk::ledger_frames(&self.path) {
                Ok(frames) => frames,
                // A log that is there but does not read back is evidence, not a usage
                // error: the walk reports it as a finding.
                Err(
                    e @ (tally_ledger::Error::Segment { .. }
                    | tally_ledger::Error::Corrupt { .. }
                    | tally_ledger::Error::Format(_)),
                ) => {
                    let why = format!("the log in {} does not read: {e}", self.path.display());
                    let frames = std::iter::once(Err(SourceError::Store(why)));
                    return Ok(tally_verify::verify(frames, &self.options, sink, |_| {}));
                }
                Err(e) => {
                    return Err(anyhow::Error::new(e)
                        .context(format!("reading the log in {}", self.path.display())))
                }
            };
            Ok(tally_verify::verify(frames, &self.options, sink, |n| {
                progress.show(n)
            }))
        } else if is_stdio(&self.path) {
            let frames = tally_verify::walk::export_frames(io::stdin().lock())
                .context("standard input is not a tally export")?;
            Ok(tally_verify::verify(frames, &self.options, sink, |n| {
                progress.show(n)
            }))
        } else {
            let file = File::open(&self.path)
                .with_context(|| format!("opening {}", self.path.display()))?;
            let frames = tally_verify::walk::export_frames(file)
                .with_context(|| format!("{} is not a tally export", self.path.display()))?;
            Ok(tally_verify::verify(frames, &self.options, sink, |n| {
                progress.show(n)
            }))
        }
    }
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
        crate::witness::apply_policy(&mut audits, p, ask_witnesses, &cas)?;
    }
    // With the auditor key: the replay of every gate decision (SECURITY.md 5.8) and the
    // consistency audit of every record, in one fold through the policy core the gate
    // decided with.
    let mut analysis = match auditor_key {
        Some(_) => Some(Analysis::in_background(config(rules)?)),
        None => None,
    };
    let verified = audits.run(|e| {
        if let Some(a) = analysis.as_mut() {
            a.push(e);
        }
    })?;
    let found = analysis.map(analysis::Background::finish);
    usage_errors(&verified, &audits, auditor_key)?;
    let inconsistent = found.as_ref().is_some_and(analysis::Report::inconsistent)
        || verified.merge_findings(None) > 0;
    let verdict = verified.verdict();
    if audits.json {
        let mut value = match verified.single() {
            Some(report) => report.to_json(),
            None => serde_json::json!({
                "version": analysis::REPORT_VERSION,
                "verdict": verdict,
                "ledgers": verified.reports.iter().enumerate().map(|(i, (path, r))| {
                    let mut v = r.to_json();
                    if let serde_json::Value::Object(map) = &mut v {
                        map.insert("ledger".into(), (i + 1).into());
                        map.insert("path".into(), path.display().to_string().into());
                    }
                    v
                }).collect::<Vec<_>>(),
                "merge": verified.merge,
            }),
        };
        if let (serde_json::Value::Object(map), Some(f)) = (&mut value, &found) {
            map.insert(
                "audit".into(),
                serde_json::json!({"findings": f.findings, "findings_omitted": f.findings_omitted,
                                   "overruns": f.overruns, "usage_refused": f.usage_refused}),
            );
            map.insert("replay".into(), serde_json::to_value(&f.replay)?);
        }
        outln!("{}", serde_json::to_string_pretty(&value)?);
    } else {
        let mut text = verified.to_text();
        if let Some(f) = &found {
            text.push('\n');
            text.push_str(&analysis::render_findings_text(f));
            text.push_str(&analysis::render_overruns_text(f));
            text.push_str(&analysis::render_usage_refused_text(f));
            text.push('\n');
            text.push_str(&f.replay.to_text());
        }
        if inconsistent && verdict != Verdict::Tampered {
            text.push_str(
                "\nINCONSISTENT: the chain verifies, but decisions in it are inconsistent (the findings above): exit 1\n",
            );
        }
        out!("{}", terminal_safe(&text));
    }
    // An inconsistency is exit 1 over incomplete evidence too, as for loops and handoff.
    Ok(if inconsistent {
        Exit::Findings
    } else {
        verdict.into()
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
            "verification": verification(verified),
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
    let mut analysis = Analysis::in_background(config(rules)?);
    let verified = audits.run(|e| analysis.push(e))?;
    let mut found = analysis.finish();
    usage_errors(&verified, &audits, Some(auditor_key))?;
    if verified.verdict() == Verdict::Tampered && !force {
        refuse(&verified, read.json)?;
        return Ok(None);
    }
    match verified.single() {
        Some(report) => {
            if let Some(cp) = &report.last_checkpoint {
                found.set_coverage(report.sealed, cp.head.clone(), cp.epoch);
            }
        }
        None => {
            let sealed: Vec<_> = verified
                .reports
                .iter()
                .map(|(_, r)| {
                    let cp = r.last_checkpoint.as_ref();
                    (r.sealed, cp.map(|c| c.head.clone()), cp.map(|c| c.epoch))
                })
                .collect();
            found.set_coverage_merged(&sealed);
        }
    }
    Ok(Some((verified, found)))
}

/// The configuration runs are read under: the policy given, else the gate's defaults.
fn config(rules: &Rules) -> Result<analysis::Config> {
    let mut c = analysis::Config::default();
    if let Some(path) = &rules.policy {
        c.policy = std::sync::Arc::new(read_policy(path)?.policy);
    }
    Ok(c)
}

/// The line every page carries when the evidence is not intact: a chain that did not
/// verify (forced), or evidence that is incomplete (exit 3), saying what is covered.
fn banner(verified: &Verified) -> Option<String> {
    let first = match verified.single() {
        Some(report) => report
            .to_text()
            .lines()
            .next()
            .unwrap_or_default()
            .to_owned(),
        None => verified
            .reports
            .iter()
            .enumerate()
            .filter(|(_, (_, r))| r.verdict() != Verdict::Intact)
            .map(|(i, (_, r))| {
                let line = r.to_text().lines().next().unwrap_or_default().to_owned();
                format!("ledger {}: {line}", i + 1)
            })
            .collect::<Vec<_>>()
            .join("; "),
    };
    let merge = match verified.merge_findings(None) {
        0 => String::new(),
        n => format!(
            "WARNING: merging the ledgers found {n} state versions out of order or shared (`tally verify` lists them).\n"
        ),
    };
    let verdict = match verified.verdict() {
        Verdict::Tampered => Some(format!(
            "WARNING: this ledger did NOT verify ({first}); what follows may be false.\n"
        )),
        Verdict::Incomplete => Some(format!(
            "NOTE: the evidence is incomplete ({first}); what follows covers only the records read.\n"
        )),
        Verdict::Intact => None,
    };
    match (verdict, merge.is_empty()) {
        (None, true) => None,
        (v, _) => Some(format!("{}{merge}", v.unwrap_or_default())),
    }
}

/// What the verifier found, as every report's JSON carries it: one ledger's, or for
/// several the verdict over them, each ledger's, and the merge's findings.
fn verification(verified: &Verified) -> serde_json::Value {
    let one = |report: &Report| {
        serde_json::json!({
            "verdict": report.verdict(),
            "ledger_id": report.ledger_id,
            "entries": report.entries,
            "sealed": report.sealed,
            "tail": report.tail,
            "first_bad": report.first_break(),
        })
    };
    match verified.single() {
        Some(report) => one(report),
        None => serde_json::json!({
            "verdict": verified.verdict(),
            "ledgers": verified.reports.iter().enumerate().map(|(i, (path, r))| {
                let mut v = one(r);
                if let serde_json::Value::Object(map) = &mut v {
                    map.insert("ledger".into(), (i + 1).into());
                    map.insert("path".into(), path.display().to_string().into());
                }
                v
            }).collect::<Vec<_>>(),
            "merge": verified.merge,
        }),
    }
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
        doc.insert("verification".into(), verification(verified));
        outln!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        let banner = banner(verified).unwrap_or_default();
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

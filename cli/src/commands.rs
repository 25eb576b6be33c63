//! What each subcommand does. Errors are `anyhow` here, at the edge, with context that
//! says what to do next. A command checks everything it can before it writes anything.

use std::fs::File;
use std::io::{self, BufRead, IsTerminal};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use tally_ledger::export::Target;
use tally_ledger::keys::{read_auditor_public, AuditorKey, LedgerPublic};
use tally_ledger::{Checkpoint, Decision, Frame, Ledger, Rotation};
use tally_verify::analysis::{self, Analysis};
use tally_verify::text::terminal_safe;
use tally_verify::{Event, Options, Report, SourceError, Verdict};

use crate::cli::{ReadArgs, Rules};
use crate::output::{errln, note, noteln, out, outln};
use crate::Exit;

/// What the audit commands end with: the verifier's exit code (0, 1 or 3).
pub type Code = u8;

/// `-` where a PATH or FILE is taken: standard input (or output).
fn is_stdio(path: &Path) -> bool {
    path.as_os_str() == "-"
}

/// Refuse an output path that exists (a dangling symlink counts: writing would follow it).
fn must_not_exist(path: &Path, what: &str) -> Result<()> {
    if path.symlink_metadata().is_ok() {
        bail!(
            "{} already exists: {what} is never overwritten; move it away or choose another path",
            path.display()
        );
    }
    Ok(())
}

pub fn keygen(out: &Path, approver: bool) -> Result<Exit> {
    if out.extension().is_some_and(|e| e == "pub") {
        bail!(
            "{} ends in .pub, where the public half goes: give the secret key's path (e.g. dana.key)",
            out.display()
        );
    }
    // Both halves are checked before either is written.
    let public = out.with_extension("pub");
    must_not_exist(out, "a key")?;
    must_not_exist(&public, "a key")?;
    if approver {
        let key = tally_ledger::keys::ApproverKey::generate();
        key.write(out)
            .with_context(|| format!("writing the key pair {}", out.display()))?;
        let name = out
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "approver".into());
        noteln!(
            "wrote {} (secret, 0600) and {}; list the approver in the policy:",
            out.display(),
            public.display()
        );
        outln!("[approvals.approvers]\n{name} = \"{}\"", key.public_hex());
        return Ok(Exit::Success);
    }
    let key = AuditorKey::generate();
    key.write(out)
        .with_context(|| format!("writing the key pair {}", out.display()))?;
    noteln!(
        "wrote {} (secret, 0600) and {} (public: give it to `tally init --recipient`)",
        out.display(),
        public.display()
    );
    Ok(Exit::Success)
}

pub fn init(ledger: &Path, recipient: &Path, rotation: Rotation) -> Result<Exit> {
    // A ledger takes its directory over (0700, a secret writer key): only a new or empty one.
    match std::fs::read_dir(ledger) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                bail!(
                    "{} is not empty: give `tally init --ledger` a new or empty directory (it becomes 0700 and holds the writer's secret key)",
                    ledger.display()
                );
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => {
            return Err(e).with_context(|| {
                format!(
                    "{}: give `tally init --ledger` a new or empty directory",
                    ledger.display()
                )
            })
        }
    }
    let recipient = read_auditor_public(recipient).context("reading the auditor public key")?;
    let public = Ledger::init(ledger, &recipient, rotation)?;
    noteln!(
        "created ledger {} in {}; its verification key is {}",
        public.ledger_id,
        ledger.display(),
        ledger.join("ledger.pub").display()
    );
    Ok(Exit::Success)
}

/// Refuse, before touching the store, a directory that is not a ledger, or one that other
/// users can enter (as `tally serve` does: only the writer may reach its files).
fn check_ledger_dir(ledger: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(ledger).with_context(|| {
        format!(
            "{}: no ledger here (create one with `tally init`)",
            ledger.display()
        )
    })?;
    if !ledger.join("ledger.pub").exists() {
        bail!(
            "{}: no ledger here (create one with `tally init`)",
            ledger.display()
        );
    }
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o077 != 0 {
        bail!(
            "{}: the ledger directory is open to other users (mode {mode:o}); run `chmod 700 {}`",
            ledger.display(),
            ledger.display()
        );
    }
    Ok(())
}

fn open(ledger: &Path) -> Result<Ledger> {
    check_ledger_dir(ledger)?;
    let opened = Ledger::open(ledger).with_context(|| {
        format!(
            "opening ledger {} (if `tally serve` holds it, use its API instead)",
            ledger.display()
        )
    })?;
    for note in opened.torn_notes() {
        errln!("tally: {note}");
    }
    Ok(opened)
}

/// One decision of the input, checked and in canonical form, and the line it came from.
struct Line {
    number: usize,
    bytes: Vec<u8>,
}

fn prepare(text: &str, number: usize, what: impl Fn() -> String) -> Result<Line> {
    let d = Decision::from_json(text).with_context(&what)?;
    // As the daemon's append refuses it: the state version orders a fleet's ledgers for
    // the auditor, and only the gate numbers its decisions (docs/FLEET.md).
    if d.state_version.is_some() {
        return Err(anyhow::anyhow!(
            "`state_version` is written by the gate alone; leave it out of appended decisions"
        ))
        .with_context(&what);
    }
    let bytes = tally_ledger::ledger::prepare(vec![d])
        .with_context(&what)?
        .pop()
        .context("prepare returned nothing")?;
    Ok(Line { number, bytes })
}

pub fn append(ledger: &Path, json: Option<&str>, batch: usize) -> Result<Exit> {
    check_ledger_dir(ledger)?;
    if let Some(text) = json.filter(|text| *text != "-") {
        let line = prepare(text, 0, || "the decision argument".into())?;
        let receipts = open(ledger)?
            .append_prepared(vec![line.bytes])
            .context("the decision argument: nothing was written")?;
        for r in &receipts {
            outln!("{}", serde_json::to_string(r)?);
        }
        return Ok(Exit::Success);
    }
    // All of the input is read and checked before the store is opened: bad input changes
    // nothing, and a retry after fixing it cannot write anything twice. The checked lines
    // wait in a spool, so memory is bounded by one batch, not by the input.
    let mut spool = Spool::fill(ledger, io::stdin().lock())?;
    let ledger = open(ledger)?;
    let progress = Progress::new("appending");
    let (total, final_line) = (spool.count, spool.final_line);
    let mut first_seq: Option<u64> = None;
    let mut done = 0;
    // The stdin line after the last one committed: where a retry starts.
    let mut next_line = spool.first_line;
    // What was committed before a failure, for its message.
    let before = |first_seq: Option<u64>, done: usize| match first_seq {
        // Seqs are consecutive: this process holds the ledger's exclusive lock.
        Some(seq) if done > 0 => format!(
            "{done} decisions before it were committed (seqs {seq}-{}, receipts above)",
            seq + done as u64 - 1
        ),
        _ => "nothing was committed".into(),
    };
    while done < total {
        let chunk = match spool.read(batch.max(1).min(total - done)) {
            Ok(chunk) => chunk,
            Err(e) => {
                let first = next_line;
                let before = before(first_seq, done);
                return Err(e).with_context(|| {
                    format!(
                        "reading the checked input back from the temporary directory {} ($TMPDIR) at stdin line {first}; {before}; lines {first}-{final_line} were not written: append them again from line {first} (e.g. `tail -n +{first}`)",
                        spool.dir.display()
                    )
                });
            }
        };
        let (first, last) = (chunk[0].number, chunk[chunk.len() - 1].number);
        let committed = ledger.append_prepared(chunk.into_iter().map(|l| l.bytes).collect());
        let receipts = match committed {
            Ok(r) => r,
            Err(e) => {
                let before = before(first_seq, done);
                return Err(e).with_context(|| {
                    format!(
                        "committing stdin lines {first}-{last}; {before}; lines {first}-{final_line} were not written: append them again from line {first} (e.g. `tail -n +{first}`)"
                    )
                });
            }
        };
        if first_seq.is_none() {
            first_seq = receipts.first().map(|r| r.seq);
        }
        for r in &receipts {
            outln!("{}", serde_json::to_string(r)?);
        }
        done += receipts.len();
        next_line = last + 1;
        progress.show_of(done as u64, total as u64);
    }
    Ok(Exit::Success)
}

/// `append`'s checked input between its two passes: each prepared decision, after its
/// stdin line number and its length (u64 little-endian each), in an unnamed file in the
/// temporary directory (never the ledger's) that the system removes when the process ends,
/// even on `kill -9`. It costs disk, about the size of the prepared input, not memory.
struct Spool {
    file: io::BufReader<File>,
    dir: PathBuf,
    /// Decisions in the spool.
    count: usize,
    /// The stdin lines of the first and the last decision.
    first_line: usize,
    final_line: usize,
    /// The longest prepared decision: a longer length read back is a bad spool.
    longest: u64,
}

impl Spool {
    /// Read, check, prepare and spool every line of `input`, or fail having written
    /// nothing to the ledger.
    fn fill(ledger: &Path, mut input: impl BufRead) -> Result<Spool> {
        use std::io::{Seek, Write};
        let dir = std::env::temp_dir();
        let spool_failed = || {
            format!(
                "nothing was written: cannot spool the checked input to the temporary directory {} ($TMPDIR), which needs room for about the size of the input: free space there or point TMPDIR at another directory",
                dir.display()
            )
        };
        // Never in the ledger: a refused append changes no byte of its directory.
        if let (Ok(tmp), Ok(led)) = (dir.canonicalize(), ledger.canonicalize()) {
            if tmp.starts_with(&led) {
                bail!(
                    "nothing was written: the temporary directory {} ($TMPDIR) is inside the ledger {}; point TMPDIR at another directory",
                    dir.display(),
                    ledger.display()
                );
            }
        }
        let file = tempfile::tempfile().with_context(spool_failed)?;
        let mut out = io::BufWriter::with_capacity(1 << 16, file);
        let (mut count, mut first_line, mut final_line, mut longest) = (0, 0, 0, 0);
        let mut text = String::new();
        for number in 1.. {
            text.clear();
            let read = input
                .read_line(&mut text)
                .with_context(|| format!("reading stdin line {number}"))?;
            if read == 0 {
                break;
            }
            // As `BufRead::lines`: without its `\n` or `\r\n`.
            if text.ends_with('\n') {
                text.pop();
                if text.ends_with('\r') {
                    text.pop();
                }
            }
            if tally_ledger::decision::is_blank_line(&text) {
                continue;
            }
            let what = || format!("stdin line {number}: nothing was written");
            let line = prepare(&text, number, what)?;
            let len = line.bytes.len() as u64;
            out.write_all(&(number as u64).to_le_bytes())
                .and_then(|()| out.write_all(&len.to_le_bytes()))
                .and_then(|()| out.write_all(&line.bytes))
                .with_context(spool_failed)?;
            if count == 0 {
                first_line = number;
            }
            count += 1;
            final_line = number;
            longest = longest.max(len);
        }
        let mut file = out
            .into_inner()
            .map_err(io::IntoInnerError::into_error)
            .with_context(spool_failed)?;
        file.rewind().with_context(spool_failed)?;
        Ok(Spool {
            file: io::BufReader::with_capacity(1 << 16, file),
            dir,
            count,
            first_line,
            final_line,
            longest,
        })
    }

    /// The next `n` decisions of the spool, in input order.
    fn read(&mut self, n: usize) -> io::Result<Vec<Line>> {
        use std::io::Read;
        let mut lines = Vec::with_capacity(n);
        for _ in 0..n {
            let (mut number, mut len) = ([0u8; 8], [0u8; 8]);
            self.file.read_exact(&mut number)?;
            self.file.read_exact(&mut len)?;
            let (number, len) = (u64::from_le_bytes(number), u64::from_le_bytes(len));
            if len > self.longest {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "the spool is damaged",
                ));
            }
            let mut bytes = vec![0u8; len as usize];
            self.file.read_exact(&mut bytes)?;
            lines.push(Line {
                number: number as usize,
                bytes,
            });
        }
        Ok(lines)
    }
}

pub fn checkpoint(ledger: &Path) -> Result<Exit> {
    check_ledger_dir(ledger)?;
    let cp = Ledger::read_checkpoint(ledger)
        .with_context(|| format!("reading the log of ledger {}", ledger.display()))?;
    out!("{}", cp.to_text());
    Ok(Exit::Success)
}

pub fn rotate(ledger: &Path) -> Result<Exit> {
    let ledger = open(ledger)?;
    let cp = ledger.rotate()?;
    noteln!(
        "now in key epoch {}; the previous epoch's secrets are destroyed",
        cp.epoch
    );
    Ok(Exit::Success)
}

pub fn export(ledger: &Path, out: &Path, force: bool) -> Result<Exit> {
    if is_stdio(out) && io::stdout().is_terminal() {
        bail!("--out - writes the export to standard output, which is a terminal: redirect it to a file or a pipe");
    }
    if !force && !is_stdio(out) && out.symlink_metadata().is_ok() {
        bail!(
            "{} already exists: give another --out, or --force to replace it",
            out.display()
        );
    }
    if !is_stdio(out) {
        let parent = out
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        if !parent.is_dir() {
            bail!(
                "{}: no directory {} to write the export in",
                out.display(),
                parent.display()
            );
        }
    }
    check_ledger_dir(ledger)?;
    // Sealed with the log key when the ledger has one (its end is signed, and the latest
    // cosigned checkpoint rides along); a ledger no build with log keys has opened yet is
    // exported with a plain end, as before.
    let public = tally_ledger::LedgerPublic::read(&ledger.join("ledger.pub"))
        .with_context(|| format!("reading {}", ledger.join("ledger.pub").display()))?;
    let key = match public.log_key {
        Some(_) => Some(
            tally_ledger::tlog::LogKey::read(ledger, public.ledger_id)
                .with_context(|| format!("reading the log key of {}", ledger.display()))?,
        ),
        None => None,
    };
    let (snapshot, root) = match &key {
        Some(_) => {
            let (s, r) = Ledger::read_sealed_snapshot(ledger)
                .with_context(|| format!("reading the log of ledger {}", ledger.display()))?;
            (s, Some(r))
        }
        None => (
            Ledger::read_snapshot(ledger)
                .with_context(|| format!("reading the log of ledger {}", ledger.display()))?,
            None,
        ),
    };
    let total = snapshot.size();
    let seal = match (&key, root) {
        (Some(k), Some(root)) => Some(tally_ledger::export::Seal {
            ledger: public.ledger_id,
            key: k,
            root,
            cosigned: tally_ledger::tlog::read_cosigned_at(ledger, total)?,
        }),
        _ => None,
    };
    let progress = Progress::new("exporting");
    let mut seen = 0u64;
    let frames = snapshot.inspect(|f| {
        if matches!(f, Ok(Frame::Entry(_))) {
            seen += 1;
            if seen == 1 || seen.is_multiple_of(4096) {
                progress.show_of(seen, total);
            }
        }
    });
    let (entries, checkpoints) = if is_stdio(out) {
        let stdout = io::stdout();
        let (mut b, counts) =
            tally_ledger::export::write_export_to(frames, io::BufWriter::new(stdout.lock()), seal)
                .context("writing the export to standard output")?;
        io::Write::flush(&mut b).context("writing the export to standard output")?;
        counts
    } else {
        let target = if force { Target::Replace } else { Target::New };
        tally_ledger::export::export_frames_to(frames, out, target, seal)
            .with_context(|| format!("exporting to {}", out.display()))?
    };
    drop(progress);
    noteln!(
        "exported {entries} entries and {checkpoints} checkpoints to {}",
        if is_stdio(out) {
            "standard output".into()
        } else {
            out.display().to_string()
        }
    );
    Ok(Exit::Success)
}

/// The verifier's inputs for one ledger, read from the command line.
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

/// A progress line on a terminal; silent when stderr is not one, and with `--quiet`.
struct Progress {
    on: bool,
    what: &'static str,
}

impl Progress {
    /// Silent unless `on`.
    fn on_if(mut self, on: bool) -> Progress {
        self.on &= on;
        self
    }

    fn new(what: &'static str) -> Progress {
        Progress {
            on: io::stderr().is_terminal() && !crate::output::quiet(),
            what,
        }
    }

    fn show(&self, entries: u64) {
        if self.on {
            note!("\r\x1b[2K{}: {entries} entries", self.what);
        }
    }

    fn show_of(&self, done: u64, total: u64) {
        if self.on {
            note!("\r\x1b[2K{}: {done} of {total}", self.what);
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if self.on {
            note!("\r\x1b[2K");
        }
    }
}

pub fn verify(
    read: &ReadArgs,
    auditor_key: Option<&Path>,
    rules: &Rules,
    witness_policy: Option<&Path>,
    ask_witnesses: bool,
) -> Result<Code> {
    let mut audits = Audits::from_args(read, auditor_key)?;
    if let Some(p) = witness_policy {
        crate::witness::apply_policy(&mut audits, p, ask_witnesses)?;
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
                serde_json::json!({"findings": f.findings, "findings_omitted": f.findings_omitted}),
            );
            map.insert("replay".into(), serde_json::to_value(&f.replay)?);
        }
        outln!("{}", serde_json::to_string_pretty(&value)?);
    } else {
        let mut text = verified.to_text();
        if let Some(f) = &found {
            text.push('\n');
            text.push_str(&analysis::render_findings_text(f));
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
    Ok(if inconsistent { 1 } else { verdict.exit_code() })
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
fn analyse(
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
fn emit(verified: &Verified, json: bool, text: String, json_parts: &[String]) -> Result<()> {
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
fn analysis_code(verified: &Verified, findings: u64, run: Option<&str>) -> Code {
    match verified.verdict() {
        Verdict::Tampered => 1,
        _ if findings > 0 || verified.merge_findings(run) > 0 => 1,
        v => v.exit_code(),
    }
}

pub fn loops(read: &ReadArgs, auditor_key: &Path, force: bool, rules: &Rules) -> Result<Code> {
    let Some((verified, found)) = analyse(read, auditor_key, force, rules)? else {
        return Ok(1);
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

pub fn handoff(
    read: &ReadArgs,
    auditor_key: &Path,
    run: Option<&str>,
    force: bool,
    rules: &Rules,
) -> Result<Code> {
    let Some((verified, found)) = analyse(read, auditor_key, force, rules)? else {
        return Ok(1);
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

/// `tally stats`: per run, attempts used of the cap (over it only by a human's grant, or
/// else an inconsistency the audit reports) and spend of the limit.
pub fn stats(
    read: &ReadArgs,
    auditor_key: &Path,
    run: Option<&str>,
    force: bool,
    rules: &Rules,
) -> Result<Exit> {
    let Some((verified, found)) = analyse(read, auditor_key, force, rules)? else {
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
    let runs: Vec<_> = found
        .handoffs
        .iter()
        .filter(|h| run.is_none_or(|r| h.run == r))
        .collect();
    let of = |used: u64, limit: Option<u64>, unit: &str| match limit {
        Some(l) => format!("{used}{unit} of {l}{unit}"),
        None => format!("{used}{unit} (no limit)"),
    };
    let mut text = format!(
        "{:<24} {:<16} {:<20} {:<14} {}\n",
        "run", "attempts", "spend settled", "held", "stop"
    );
    for h in &runs {
        let a = &h.attempts;
        let s = &h.spend;
        let over = a.limit.is_some_and(|l| a.used > l);
        text.push_str(&format!(
            "{:<24} {:<16} {:<20} {:<14} {}{}\n",
            tally_verify::text::shown(&h.run),
            of(a.used, a.limit, ""),
            of(s.settled_cents, s.limit_cents, "¢"),
            format!("{}¢", s.reserved_cents),
            h.stop
                .reason
                .map_or_else(|| "running".into(), |r| r.to_string()),
            if over {
                format!(
                    "  (over the cap by {}; {} approved)",
                    a.used - a.limit.unwrap_or(0),
                    a.approved_extra
                )
            } else {
                String::new()
            }
        ));
    }
    if !found.findings.is_empty() || found.findings_omitted > 0 {
        text.push_str(&format!(
            "\n{} inconsistencies found: `tally loops` (or `tally verify --auditor-key`) lists them\n",
            found.findings.len() as u64 + found.findings_omitted
        ));
    }
    let body: Vec<_> = runs
        .iter()
        .map(|h| {
            serde_json::json!({
                "run": h.run,
                "attempts": h.attempts,
                "spend": h.spend,
                "over_cap": h.attempts.limit.is_some_and(|l| h.attempts.used > l),
                "stop": h.stop.reason,
            })
        })
        .collect();
    let json = serde_json::to_string(
        &serde_json::json!({ "version": analysis::REPORT_VERSION, "runs": body }),
    )?;
    emit(&verified, read.json, text, &[json])?;
    Ok(Exit::from_code(analysis_code(&verified, findings, run)))
}

pub(crate) fn read_policy(path: &std::path::Path) -> Result<tally_policy::Recorded> {
    let text = if is_stdio(path) {
        io::read_to_string(io::stdin().lock()).context("reading the policy from standard input")?
    } else {
        std::fs::read_to_string(path)
            .with_context(|| format!("reading the policy {}", path.display()))?
    };
    let name = if is_stdio(path) {
        "standard input".into()
    } else {
        path.display().to_string()
    };
    tally_policy::Recorded::new(&text).with_context(|| name)
}

/// `tally policy check FILE`: validate, then print the policy with its defaults.
pub fn policy_check(path: &std::path::Path) -> Result<Exit> {
    let recorded = read_policy(path)?;
    let name = if is_stdio(path) {
        "standard input".into()
    } else {
        path.display().to_string()
    };
    outln!("# {name}: valid; digest {}", recorded.digest);
    out!("{}", recorded.policy.to_toml());
    Ok(Exit::Success)
}

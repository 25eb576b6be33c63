//! What each subcommand does. Errors are `anyhow` here, at the edge, with context that
//! says what to do next. A command checks everything it can before it writes anything.

use std::io::{self, IsTerminal};
use std::path::Path;

use anyhow::{bail, Context, Result};
use tally_ledger::export::Target;
use tally_ledger::keys::{read_auditor_public, AuditorKey};
use tally_ledger::{Frame, Ledger, Rotation};

use crate::cli::{ExportArgs, InitArgs, KeygenArgs, LedgerArgs};
use crate::output::{errln, note, noteln, out, outln};
use crate::Exit;

mod append;
mod read;
pub use append::append;
pub(crate) use read::{analyse, analysis_code, emit, walk};
pub use read::{handoff, loops, verify};

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

pub fn keygen(args: &KeygenArgs) -> Result<Exit> {
    let (out, approver) = (args.out.as_path(), args.approver);
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

pub fn init(args: &InitArgs) -> Result<Exit> {
    let (ledger, recipient) = (args.ledger.as_path(), args.recipient.as_path());
    let rotation = Rotation {
        records: args.rotate_records,
        ms: args.rotate_secs.saturating_mul(1000),
    };
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
pub fn checkpoint(ledger: &Path) -> Result<Exit> {
    check_ledger_dir(ledger)?;
    let cp = Ledger::read_checkpoint(ledger)
        .with_context(|| format!("reading the log of ledger {}", ledger.display()))?;
    out!("{}", cp.to_text());
    Ok(Exit::Success)
}

pub fn rotate(args: &LedgerArgs) -> Result<Exit> {
    let ledger = args.ledger.as_path();
    let ledger = open(ledger)?;
    let cp = ledger.rotate()?;
    noteln!(
        "now in key epoch {}; the previous epoch's secrets are destroyed",
        cp.epoch
    );
    Ok(Exit::Success)
}

pub fn export(args: &ExportArgs) -> Result<Exit> {
    let (ledger, out, force) = (args.ledger.as_path(), args.out.as_path(), args.force);
    check_export_target(out, force)?;
    check_ledger_dir(ledger)?;
    let (id, key) = read_log_key(ledger)?;
    let (snapshot, root) = read_export_snapshot(ledger, key.is_some())?;
    let total = snapshot.size();
    let seal = match (&key, root) {
        (Some(k), Some(root)) => Some(tally_ledger::export::Seal {
            ledger: id,
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
    let (entries, checkpoints) = write_export(frames, out, force, seal)?;
    drop(progress);
    noteln!(
        "exported {} and {} to {}",
        tally_verify::text::plural(entries, "entry", "entries"),
        tally_verify::text::plural(checkpoints, "checkpoint", "checkpoints"),
        if is_stdio(out) {
            "standard output".into()
        } else {
            out.display().to_string()
        }
    );
    Ok(Exit::Success)
}

/// Refuse an export target before anything is read: standard output on a terminal, a
/// path that exists without `--force`, or one in a directory that does not.
fn check_export_target(out: &Path, force: bool) -> Result<()> {
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
    Ok(())
}

/// The ledger's id and its log key, when it has one. An export is sealed with the log key
/// (its end is signed, and the latest cosigned checkpoint rides along); a ledger no build
/// with log keys has opened yet is exported with a plain end, as before.
fn read_log_key(
    ledger: &Path,
) -> Result<(tally_ledger::LedgerId, Option<tally_ledger::tlog::LogKey>)> {
    let public = tally_ledger::LedgerPublic::read(&ledger.join("ledger.pub"))
        .with_context(|| format!("reading {}", ledger.join("ledger.pub").display()))?;
    let key = match public.log_key {
        Some(_) => Some(
            tally_ledger::tlog::LogKey::read(ledger, public.ledger_id)
                .with_context(|| format!("reading the log key of {}", ledger.display()))?,
        ),
        None => None,
    };
    Ok((public.ledger_id, key))
}

/// The log's frames to export, with the Merkle root of its entries when it is `sealed`.
fn read_export_snapshot(
    ledger: &Path,
    sealed: bool,
) -> Result<(
    tally_ledger::ledger::Snapshot,
    Option<tally_ledger::merkle::TreeHash>,
)> {
    if sealed {
        let (s, r) = Ledger::read_sealed_snapshot(ledger)
            .with_context(|| format!("reading the log of ledger {}", ledger.display()))?;
        Ok((s, Some(r)))
    } else {
        Ok((
            Ledger::read_snapshot(ledger)
                .with_context(|| format!("reading the log of ledger {}", ledger.display()))?,
            None,
        ))
    }
}

/// Write the export to `out` (or standard output), returning its entry and checkpoint
/// counts.
fn write_export(
    frames: impl Iterator<Item = tally_ledger::Result<Frame>>,
    out: &Path,
    force: bool,
    seal: Option<tally_ledger::export::Seal<'_>>,
) -> Result<(u64, u64)> {
    if is_stdio(out) {
        let stdout = io::stdout();
        let (mut b, counts) =
            tally_ledger::export::write_export_to(frames, io::BufWriter::new(stdout.lock()), seal)
                .context("writing the export to standard output")?;
        io::Write::flush(&mut b).context("writing the export to standard output")?;
        Ok(counts)
    } else {
        let target = if force { Target::Replace } else { Target::New };
        Ok(
            tally_ledger::export::export_frames_to(frames, out, target, seal)
                .with_context(|| format!("exporting to {}", out.display()))?,
        )
    }
}

/// A policy file given to a report (`--policy`), read and digested as the gate records it.
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
pub fn policy_check(args: &crate::cli::PolicyCheckArgs) -> Result<Exit> {
    let path: &std::path::Path = &args.file;
    let recorded = read_policy(path)?;
    let name = if is_stdio(path) {
        "standard input".into()
    } else {
        path.display().to_string()
    };
    // An MCP server's or upstream's `url_file` is read as `tally serve` reads it (the URL
    // it holds is checked as one written in the policy would be); one not readable here
    // (a policy checked in CI, away from its secrets) is a warning.
    let unread = tally_daemon::check_url_files(&recorded.policy).with_context(|| name.clone())?;
    outln!("# {name}: valid; digest {}", recorded.digest);
    out!("{}", shown(&recorded.policy).to_toml());
    // Which model ids each price covers (its name, its aliases, its dated snapshots).
    let policy = &recorded.policy;
    let kind_of = |u: &str| policy.upstreams.get(u).map(|u| u.kind);
    for (upstream, name, ids) in policy.prices.coverage(kind_of) {
        outln!("# prices.{upstream}.{name:?} covers: {}", ids.join(", "));
    }
    // Prices older than the policy's bound: a warning; the policy is still valid.
    let today = args.today.unwrap_or_else(|| {
        use tally_record::clock::Clock;
        tally_policy::dates::Date::of_ms(tally_record::clock::SystemClock.now_ms())
    });
    for stale in recorded.policy.stale_prices(today) {
        noteln!("warning: {stale}");
    }
    for file in unread {
        noteln!("warning: {file}");
    }
    Ok(Exit::Success)
}

/// `policy` as `tally policy check` prints it: each upstream's and MCP server's URL
/// redacted (`tally_record::url::redacted`), as everywhere tally shows one (it may carry
/// a secret).
fn shown(policy: &tally_policy::Policy) -> tally_policy::Policy {
    let mut shown = policy.clone();
    for url in shown.upstreams.values_mut().filter_map(|u| u.url.as_mut()) {
        *url = tally_record::url::redacted(url);
    }
    for url in shown.mcp.values_mut().filter_map(|s| s.url.as_mut()) {
        *url = tally_record::url::redacted(url);
    }
    shown
}

/// `tally policy example NAME`: the policy tally ships for one kind of agent, as the
/// file in dist/ holds it (so what is printed is what the test suite runs under).
pub fn policy_example(args: &crate::cli::PolicyExampleArgs) -> Result<Exit> {
    let text = match args.name {
        crate::cli::PolicyExample::ClaudeCode => crate::hook::CLAUDE_CODE_POLICY,
    };
    out!("{text}");
    Ok(Exit::Success)
}

/// A progress line on a terminal; silent when stderr is not one, and with `--quiet`.
pub(crate) struct Progress {
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

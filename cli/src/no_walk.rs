//! `tally verify DIR --anchor CP --no-walk`: each C2SP anchor checked by a consistency
//! proof from the ledger directory's tree files to the tree head its log records,
//! without reading the entries (tally_verify::consistency says what that proves).

use std::path::Path;

use anyhow::{bail, Context, Result};
use tally_ledger::keys::LedgerPublic;
use tally_ledger::tlog::tiles::Tiles;
use tally_verify::consistency::{check_anchors, NoWalkReport, RecordedHead};
use tally_verify::text::terminal_safe;
use tally_verify::tree::TreeAnchor;

use crate::cli::ReadArgs;
use crate::output::{errln, out, outln};
use crate::Exit;

pub fn run(read: &ReadArgs) -> Result<Exit> {
    let ([dir], [key]) = (read.paths.as_slice(), read.keys.as_slice()) else {
        bail!("--no-walk checks one ledger directory: give one PATH and one --key");
    };
    if !dir.is_dir() {
        bail!(
            "{} is not a ledger directory: --no-walk reads a ledger directory's tree files (an export has none: verify it without --no-walk)",
            dir.display()
        );
    }
    let public = LedgerPublic::read(key).with_context(|| {
        format!(
            "reading the ledger verification key {} (the ledger's ledger.pub)",
            key.display()
        )
    })?;
    let anchors = read_anchors(read, key, &public)?;
    let head = recorded_head(dir)?;
    let origin = tally_ledger::tlog::origin(public.ledger_id);
    let report = check_anchors(
        &Tiles::new(dir),
        &origin,
        public.log_key.as_ref(),
        &head,
        &anchors,
    );
    print_report(&report, read.json)?;
    Ok(match report.exit_code() {
        0 => Exit::Success,
        1 => Exit::Findings,
        _ => Exit::Incomplete,
    })
}

/// The `--anchor` files, each a C2SP checkpoint of the ledger `key` is the key of.
fn read_anchors(read: &ReadArgs, key: &Path, public: &LedgerPublic) -> Result<Vec<TreeAnchor>> {
    let mut anchors = Vec::new();
    for a in &read.anchors {
        let text = std::fs::read(a).with_context(|| format!("reading anchor {}", a.display()))?;
        let Some((id, anchor)) = crate::prove::tree_anchor(&text, a) else {
            bail!(
                "anchor {} is not a C2SP checkpoint of a tally ledger: --no-walk proves C2SP checkpoints (`tally checkpoint` prints them); check a chain checkpoint without --no-walk",
                a.display()
            );
        };
        if id != public.ledger_id {
            bail!(
                "anchor {} is a checkpoint of ledger {id}, but {} is the key of ledger {}: give an anchor of this ledger",
                a.display(),
                key.display(),
                public.ledger_id
            );
        }
        anchors.push(anchor);
    }
    Ok(anchors)
}

/// The tree head the log in `dir` records. A log that does not read back records no tree
/// head: anchors past nothing are past its end, which is the finding, not a usage error.
fn recorded_head(dir: &Path) -> Result<RecordedHead> {
    match tally_ledger::prove::recorded_tree_head(dir) {
        Ok((size, root)) => Ok(RecordedHead { size, root }),
        Err(
            e @ (tally_ledger::Error::Segment { .. }
            | tally_ledger::Error::Corrupt { .. }
            | tally_ledger::Error::Format(_)),
        ) => {
            errln!(
                "tally: the log in {} does not read: {e}",
                terminal_safe(&dir.display().to_string())
            );
            Ok(RecordedHead {
                size: 0,
                root: None,
            })
        }
        Err(e) => {
            Err(anyhow::Error::new(e).context(format!("reading the log in {}", dir.display())))
        }
    }
}

/// The report on standard output, as JSON (with the report version and mode) or text.
fn print_report(report: &NoWalkReport, json: bool) -> Result<()> {
    if json {
        let mut v = serde_json::to_value(report)?;
        if let serde_json::Value::Object(m) = &mut v {
            m.insert(
                "version".into(),
                tally_verify::analysis::REPORT_VERSION.into(),
            );
            m.insert("mode".into(), "no_walk".into());
        }
        outln!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        out!("{}", terminal_safe(&report.to_text()));
    }
    Ok(())
}

//! `tally policy backtest`: the arguments read, the ledger walked into
//! [`tally_verify::backtest`], its report printed. Nothing is decided here.

use anyhow::{Context, Result};
use tally_verify::backtest::Backtest;

use crate::cli::PolicyBacktestArgs;
use crate::commands::{emit, walk};
use crate::Exit;

/// `tally policy backtest --policy FILE LEDGER --key K --auditor-key A`.
pub fn run(args: &PolicyBacktestArgs) -> Result<Exit> {
    let path = &args.policy;
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the policy {}", path.display()))?;
    let mut backtest = Backtest::new(&text).with_context(|| path.display().to_string())?;
    let Some(verified) = walk(&args.read, &args.auditor_key, args.force, |e| {
        backtest.push(&e)
    })?
    else {
        return Ok(Exit::Findings);
    };
    let report = backtest.finish();
    emit(
        &verified,
        args.read.json,
        report.to_text(),
        &[report.to_json()],
    )?;
    // What the new policy changes is the report, not a finding: the exit is the chain's.
    Ok(verified.verdict().into())
}

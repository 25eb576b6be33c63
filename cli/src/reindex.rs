//! `tally reindex`: rebuild a ledger's sled index from its log segments.
//!
//! The index (`DIR/index`) holds only what the log implies: the gate's derived state
//! (replayed from the log's state frames) and a sparse map from seqs to log positions.
//! Nothing that verifies reads it, so rebuilding it is always safe; the one thing in it
//! the log does not hold, state written outside any decision (an operator's pause), is
//! carried over from the old index when that still opens. The Merkle tree files
//! (`DIR/tree/`, what `tally prove` and the tiles read) are rebuilt from the entries too,
//! whole, and put in place only if their root is the one the log records.

use anyhow::{Context, Result};
use tally_ledger::Ledger;

use crate::cli::LedgerArgs;
use crate::output::{errln, outln};
use crate::Exit;

pub fn run(args: &LedgerArgs) -> Result<Exit> {
    let ledger = args.ledger.as_path();
    let done = Ledger::reindex(ledger).with_context(|| {
        format!(
            "reindexing ledger {} (if `tally serve` holds it, stop it first)",
            ledger.display()
        )
    })?;
    let n = |count: u64, one: &str, many: &str| {
        format!("{count} {}", if count == 1 { one } else { many })
    };
    outln!(
        "reindexed {}: {} in {}, {} replayed, {}",
        ledger.display(),
        n(done.entries, "entry", "entries"),
        n(done.segments, "segment", "segments"),
        n(done.state_frames, "state frame", "state frames"),
        n(done.points, "index point", "index points")
    );
    outln!(
        "rebuilt the Merkle tree files from the entries: {}",
        n(done.tree_leaves, "leaf", "leaves")
    );
    if done.old_index_unreadable {
        errln!(
            "warning: the old index did not open, so state written outside decisions (an operator's pause) is lost: pause those runs again"
        );
    } else if done.carried > 0 {
        outln!(
            "carried over {} values written outside decisions (operators' pauses)",
            done.carried
        );
    }
    if done.torn > 0 {
        outln!(
            "{} torn writes in the log, kept in place (`tally verify` names them)",
            done.torn
        );
    }
    Ok(Exit::Success)
}

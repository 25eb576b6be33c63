//! The decisions as the ledger holds them, for the tests that count what the gate
//! answered (shared by cli/tests/agents/, cli/tests/proxy_sdk/ and cli/tests/observe/
//! through `#[path]`).

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;

/// Every decision in `dir/ledger`, decrypted with `dir/auditor.key`, in seq order (the
/// daemon must be stopped); the ledger must verify intact.
pub fn decisions(dir: &Path) -> Vec<Value> {
    by_seq(dir).into_values().collect()
}

/// [`decisions`], by seq.
pub fn by_seq(dir: &Path) -> BTreeMap<u64, Value> {
    let ledger = dir.join("ledger");
    let frames: Vec<tally_ledger::Frame> = tally_ledger::segment::LogReader::open(&ledger)
        .expect("log")
        .frames()
        .map(|f| f.expect("frame"))
        .collect();
    let mut options = tally_verify::Options::new(
        tally_ledger::LedgerPublic::read(&ledger.join("ledger.pub")).expect("ledger.pub"),
    );
    options.auditor = Some(tally_ledger::AuditorKey::read(&dir.join("auditor.key")).expect("key"));
    let mut out = BTreeMap::new();
    let report = tally_verify::verify(
        frames.into_iter().map(Ok),
        &options,
        |e| {
            out.insert(e.seq.seq, serde_json::to_value(&e.decision).expect("json"));
        },
        |_| {},
    );
    assert_eq!(report.verdict(), tally_verify::Verdict::Intact);
    out
}

/// `run`'s checks (allows and refusals) of `tool`, in seq order.
pub fn checks<'a>(decisions: &'a [Value], run: &str, tool: &str) -> Vec<&'a Value> {
    decisions
        .iter()
        .filter(|d| d["run"] == run && d["tool"] == tool && d["kind"] != "outcome")
        .collect()
}

/// How many of `checks` are `kind` (`allow`, `deny`).
pub fn count(checks: &[&Value], kind: &str) -> usize {
    checks.iter().filter(|d| d["kind"] == kind).count()
}

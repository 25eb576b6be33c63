//! A run's standing as the gate has it, in a line.

use std::path::Path;

use tally_api::GateClient;

use crate::error::Result;

/// Where `run` stands, as the gate has it, in a line: `run export-q3: stopped
/// (retries_exhausted); 3 of 20 attempts used; $0.00 settled`.
pub(crate) async fn standing(operator_socket: &Path, run: &str) -> Result<String> {
    use tally_verify::text::{plural, shown};
    let v = GateClient::new(operator_socket).run(run).await?;
    let state = match (v.state, v.stop_reason) {
        (tally_api::RunState::Stopped, Some(reason)) => format!("stopped ({reason})"),
        (state, _) => state.as_str().replace('_', " "),
    };
    let attempts = match v.limits.get(&tally_api::LimitKey::Attempts) {
        Some(l) => format!("{} of {}", l.used, plural(l.limit, "attempt", "attempts")),
        None => plural(0, "attempt", "attempts"),
    };
    Ok(format!(
        "run {}: {state}; {attempts} used; {} settled",
        shown(run),
        tally_ledger::money::Nanos(v.settled_nanos)
    ))
}

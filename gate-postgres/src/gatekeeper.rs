//! The gate over this backend, as the daemon takes it: what `tally serve --state` wires
//! into the daemon (which links no database itself).

use std::sync::Arc;

use tally_ledger::Ledger;

use crate::{Options, Postgres};

/// Open the gate over `ledger` with its state in the database `options` names, reading
/// the time from `clock`: a
/// [`tally_gate::Gatekeeper`] for the daemon, or why not, said for the operator (never
/// the connection string: it may hold a password). Blocks while it connects.
pub fn gatekeeper(
    ledger: Arc<Ledger>,
    options: &Options,
    policy: tally_policy::Recorded,
    clock: Arc<dyn tally_gate::Clock>,
) -> Result<Arc<dyn tally_gate::Gatekeeper>, String> {
    let backend = Postgres::open(Arc::clone(&ledger), options).map_err(|e| e.to_string())?;
    let gate = tally_gate::Gate::with_backend(ledger, backend, policy)
        .map_err(|e| e.to_string())?
        .with_clock(clock);
    Ok(Arc::new(gate))
}

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

/// [`gatekeeper`] in the leased mode (`tally serve --state URL --leases`): runs with a
/// budget are decided at home on this daemon inside its slices (docs/FLEET.md, "The
/// leased mode"), and the holder's lease thread ticks every `setup.refresh`. Also the
/// holder's slices (their counters, for the daemon's metrics).
pub fn leased_gatekeeper(
    ledger: Arc<Ledger>,
    options: &Options,
    setup: &crate::LeaseSetup,
    policy: tally_policy::Recorded,
    clock: Arc<dyn tally_gate::Clock>,
) -> Result<(Arc<dyn tally_gate::Gatekeeper>, Arc<crate::Slices>), String> {
    let backend = crate::open_leased(Arc::clone(&ledger), options, setup, |_| None, None)
        .map_err(|e| e.to_string())?;
    let slices = Arc::clone(backend.slices());
    crate::spawn_timer(Arc::clone(&slices), setup.refresh)
        .map_err(|e| format!("cannot start the lease thread: {e}"))?;
    let gate = tally_gate::Gate::with_backend(ledger, backend, policy)
        .map_err(|e| e.to_string())?
        .with_clock(clock);
    Ok((Arc::new(gate), slices))
}

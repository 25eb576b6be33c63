//! `tally serve --state` and `--leases`: the gate's state shared in PostgreSQL, and, in
//! the leased mode, this daemon's lease holder (docs/FLEET.md).

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Result};

use crate::cli::ServeArgs as Serve;

/// The shared state the flags name, if any.
pub fn shared_state(args: &Serve) -> Result<Option<tally_daemon::SharedState>> {
    let Some(url) = args.state.as_deref() else {
        return Ok(None);
    };
    let pg = tally_gate_postgres::Options::new(url);
    let timeout = pg.timeout;
    if !args.leases {
        return Ok(Some(tally_daemon::SharedState {
            timeout,
            label: "gate state in PostgreSQL, shared".into(),
            open: Arc::new(move |ledger, policy, clock| {
                tally_gate_postgres::gatekeeper(ledger, &pg, policy, clock)
            }),
        }));
    }
    let setup = lease_setup(args)?;
    Ok(Some(tally_daemon::SharedState {
        timeout,
        label: "gate state in PostgreSQL, shared; runs decided inside leased slices".into(),
        open: Arc::new(move |ledger, policy, clock| {
            let mut setup = setup.clone();
            if setup.holder.is_empty() {
                setup.holder = format!("ledger-{}", ledger.id());
            }
            tally_gate_postgres::leased_gatekeeper(ledger, &pg, &setup, policy, clock)
                .map(|(gate, _)| gate)
        }),
    }))
}

/// The lease flags, checked (an empty holder: the ledger's id, once it is open).
fn lease_setup(args: &Serve) -> Result<tally_gate_postgres::LeaseSetup> {
    let holder = args.lease_holder.clone().unwrap_or_default();
    if args.lease_holder.is_some()
        && (holder.is_empty()
            || holder.len() > 128
            || !holder
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b)))
    {
        bail!("--lease-holder: 1 to 128 letters, digits, '-', '_' or '.'; unique in the fleet and the same across this daemon's restarts");
    }
    let ttl = Duration::from_millis(args.lease_ttl_ms);
    if ttl < Duration::from_millis(500) {
        bail!("--lease-ttl-ms: at least 500");
    }
    let refresh = Duration::from_millis(args.lease_refresh_ms.unwrap_or(args.lease_ttl_ms / 5));
    if refresh.is_zero() || refresh * 2 > ttl {
        bail!("--lease-refresh-ms: from 1 to half of --lease-ttl-ms, so a slice in use is renewed before it ends");
    }
    if args.lease_idle_ms == 0 {
        bail!("--lease-idle-ms: at least 1");
    }
    let mut setup = tally_gate_postgres::LeaseSetup::new(&holder);
    setup.leases.ttl = ttl;
    setup.leases.margin = Duration::from_millis(args.lease_margin_ms);
    setup.slices.idle = Duration::from_millis(args.lease_idle_ms);
    // A slice is not used within this much of its end: at most a fifth of its life.
    setup.slices.margin = setup.slices.margin.min(ttl / 5);
    setup.refresh = refresh;
    Ok(setup)
}

//! Opening the leased mode as `tally serve --state URL --leases` runs it: the central
//! backend, the holder's lease manager and slices, the leased backend over them, and the
//! holder's timer feeding its lease thread ([`super::spawn_ticks`]) every refresh
//! interval.

use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tally_ledger::Ledger;

use super::backend::Leased;
use super::breakers::ViewLimits;
use super::events::Sink;
use super::holder::{SliceOptions, Slices};
use super::tick::spawn_ticks;
use super::types::{Amounts, Lease};
use super::{LeaseOptions, Leases};
use crate::{Options, Postgres, PostgresError};

/// How a daemon leases.
#[derive(Clone, Debug)]
pub struct LeaseSetup {
    /// The holder's name: unique in the fleet, the same across the daemon's restarts.
    pub holder: String,
    /// How long a slice lasts, and the margin before an expired one is reclaimed.
    pub leases: LeaseOptions,
    /// How slices are sized, kept and given back.
    pub slices: SliceOptions,
    /// How often the lease thread ticks (renews, gives back idle slices, reclaims;
    /// flushes and refreshes the tools' breakers' views).
    pub refresh: Duration,
    /// How much the views of the tools' breakers keep.
    pub views: ViewLimits,
}

impl LeaseSetup {
    /// `holder` with the defaults: slices of 10 s, reclaimed 5 s past their expiry,
    /// given back idle after 5 s, ticks every 2 s (a fifth of the time to live), views
    /// kept as [`ViewLimits::default`] says.
    pub fn new(holder: &str) -> LeaseSetup {
        let leases = LeaseOptions::default();
        let refresh = leases.ttl / 5;
        LeaseSetup {
            holder: holder.to_owned(),
            leases,
            slices: SliceOptions::default(),
            refresh,
            views: ViewLimits::default(),
        }
    }
}

/// The leased backend of `ledger`'s daemon: its slices adopted from an earlier process
/// of the holder are given back first, each saying it used what `used_of` says, else
/// the use its decisions committed on it ([`Lease::committed`]: what the runs' rows
/// hold of it), else (not known: granted before its use was committed) the whole slice
/// (the conservative side). A return never settles less than the committed use.
pub fn open_leased(
    ledger: Arc<Ledger>,
    options: &Options,
    setup: &LeaseSetup,
    used_of: impl Fn(&Lease) -> Option<Amounts>,
    sink: Option<Sink>,
) -> Result<Leased, PostgresError> {
    let central = Postgres::open(ledger, options)?;
    let leases = Leases::open(options, &setup.holder, setup.leases.clone())?;
    let slices = Slices::open(
        leases,
        setup.slices.clone(),
        |l| used_of(l).or(l.committed).unwrap_or(l.granted),
        sink,
    );
    let target = central.target().to_owned();
    Leased::new(central, Arc::new(slices), setup.views).map_err(|e| PostgresError::Database {
        target,
        why: format!("cannot start the group commit's thread: {e}"),
    })
}

/// The holder's timer: a tick of `slices` every `refresh` on the lease thread, for as
/// long as the process lives (the reports are read and let go: what they say is in the
/// holder's lease metrics, [`super::LeaseMetrics::counts`]). At most one tick
/// waits: while the lease thread is behind (its database slow), a time it has not
/// taken yet is not queued behind another.
pub fn spawn_timer(slices: Arc<Slices>, refresh: Duration) -> std::io::Result<()> {
    let (times, ticks) = mpsc::sync_channel(1);
    let (done, reports) = mpsc::channel();
    spawn_ticks(slices, ticks, done)?;
    std::thread::Builder::new()
        .name("tally-lease-timer".into())
        .spawn(move || loop {
            std::thread::sleep(refresh);
            if let Err(mpsc::TrySendError::Disconnected(_)) = times.try_send(Instant::now()) {
                return;
            }
            while reports.try_recv().is_ok() {}
        })?;
    Ok(())
}

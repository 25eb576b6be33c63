//! The backend's tests' helpers: ledgers and gates over the temporary PostgreSQL cluster
//! of `tally_testkit::postgres`.
#![allow(dead_code)]

use std::path::Path;
use std::sync::Arc;

use tally_gate::Gate;
use tally_gate_postgres::{Options, Postgres};
use tally_ledger::keys::AuditorKey;
use tally_ledger::{Ledger, Rotation};
use tally_policy::Recorded;
pub use tally_testkit::postgres::Cluster;

pub mod lease;
pub mod relay;

/// A new ledger in `dir`.
pub fn ledger(dir: &Path) -> Arc<Ledger> {
    if !dir.join("ledger").exists() {
        Ledger::init(
            &dir.join("ledger"),
            &AuditorKey::generate().public(),
            Rotation::default(),
        )
        .expect("init");
    }
    Arc::new(Ledger::open(&dir.join("ledger")).expect("open"))
}

/// A gate over its own ledger in `dir`, its state in the cluster's database.
pub fn pg_gate(cluster: &Cluster, dir: &Path, policy: &str) -> Gate<Postgres> {
    let ledger = ledger(dir);
    let backend =
        Postgres::open(Arc::clone(&ledger), &Options::new(&cluster.url())).expect("postgres");
    Gate::with_backend(ledger, backend, Recorded::new(policy).expect("policy")).expect("gate")
}

/// A gate with its state in its ledger's own store.
pub fn embedded_gate(dir: &Path, policy: &str) -> Gate {
    Gate::open(ledger(dir), Recorded::new(policy).expect("policy")).expect("gate")
}

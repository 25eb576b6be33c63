//! The leased backend as the gate's state seam: a decision's transaction begun, the
//! counts and views it reports, and every slice given back on close.

use std::collections::{BTreeMap, BTreeSet};

use tally_gate::backend::{Overview, StateBackend};
use tally_gate::GateError;

use super::super::breakers::{self, BreakersTicked};
use super::txn::LeasedTxn;
use super::Leased;

impl StateBackend for Leased {
    type Txn<'a> = LeasedTxn<'a>;

    fn begin(&self) -> Result<LeasedTxn<'_>, GateError> {
        let inner = self.central.begin()?;
        Ok(LeasedTxn {
            generation: self.group.generation(),
            drained: false,
            inner,
            backend: self,
            homed: BTreeMap::new(),
            elsewhere: BTreeMap::new(),
            viewed: BTreeSet::new(),
            watched: BTreeSet::new(),
            committed: false,
        })
    }

    fn round_trips(&self) -> Option<u64> {
        self.central.round_trips()
    }

    fn networked(&self) -> bool {
        true
    }

    fn overview(&self) -> Option<Result<Overview, GateError>> {
        self.central.overview()
    }

    fn overview_apart(&self) -> bool {
        true
    }

    /// Outcomes folded into a view's breaker are kept to fold into the tool's row.
    fn observes(&self) -> bool {
        true
    }

    /// The slices' and the views' events, then the group commit's counts.
    fn lease_counts(&self) -> Option<Vec<(&'static str, u64)>> {
        let mut counts = self.slices.metrics().counts();
        counts.extend(self.group.counts());
        Some(counts)
    }

    fn breaker_outcomes_unflushed(&self) -> Option<u64> {
        Some(u64::try_from(self.unflushed()).unwrap_or(u64::MAX))
    }

    /// Every slice given back, saying what was used (the runs' rows are already
    /// written through): what was left of them is the fleet's again at once.
    fn close(&self) {
        self.group.close();
        let mut flushed = BreakersTicked::default();
        breakers::flush(&self.central, &self.views, &mut flushed);
        self.slices.metrics().breakers(&flushed);
        self.slices.close();
    }
}

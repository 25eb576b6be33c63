//! What the operator's view reads from the running daemon: the live page's snapshot and
//! the metrics' text, both from the gate's state through the reader thread (never the
//! decision thread), then shaped by `observe`. Read only.

use std::collections::BTreeMap;
use std::sync::Arc;

use tally_wire::RunState;

use crate::app::App;
use crate::observe::{build, log_bytes, metrics, wall_ms};

/// The snapshot of page `page` (0-based), built from the gate's state (read only).
pub(crate) async fn snapshot(
    app: &Arc<App>,
    page: usize,
) -> Result<tally_wire::LiveSnapshot, tally_gate::GateError> {
    // Never on the decision thread (reader.rs).
    let (standings, breakers) = app.reader.read(&app.gate).await?;
    let now = wall_ms();
    Ok(build(&app.observer, standings, breakers, page, now))
}

/// Pending approval requests the live page shows at most: a hostile agent asking again
/// and again cannot grow a page (the gate's book is bounded too).
pub(crate) const DESK_ROWS: usize = 20;

/// The human's desk on the live page (its `requests` event): the pending approval
/// requests, nearest deadline first, and the operator socket the commands to answer them
/// name. Read only: answering takes an approver's key, never the browser's.
#[derive(serde::Serialize)]
pub(crate) struct Desk {
    pub operator_socket: Option<String>,
    pub pending: usize,
    pub requests: Vec<tally_wire::ApprovalRequest>,
}

/// The desk, from the gate's approval requests (the one source `GET /v1/approvals` reads).
pub(crate) async fn desk(app: &Arc<App>) -> Result<Desk, tally_gate::GateError> {
    let gate = Arc::clone(&app.gate);
    let list = app.at_once(move || gate.approval_requests()).await?;
    let pending: Vec<_> = list
        .into_iter()
        .filter(|r| r.state == tally_wire::RequestState::Pending)
        .collect();
    Ok(Desk {
        operator_socket: app.observer.operator_socket.clone(),
        pending: pending.len(),
        requests: pending.into_iter().take(DESK_ROWS).collect(),
    })
}

/// The gate's state for a scrape, and the metrics' text.
pub(crate) async fn metrics_text(app: &Arc<App>) -> Result<String, tally_gate::GateError> {
    // Never on the decision thread (reader.rs).
    let (standings, breakers) = app.reader.read(&app.gate).await?;
    let mut by_state: BTreeMap<&'static str, i64> = BTreeMap::new();
    let mut held = 0i64;
    for s in &standings {
        *by_state.entry(s.state.as_str()).or_default() += 1;
        if s.state != RunState::Stopped {
            held = held.saturating_add(i64::try_from(s.held_nanos).unwrap_or(i64::MAX));
        }
    }
    let mut b = [("closed", 0i64), ("open", 0), ("half_open", 0)];
    for (_, br) in &breakers {
        let i = match br {
            tally_policy::Breaker::Closed { .. } => 0,
            tally_policy::Breaker::Open { .. } => 1,
            tally_policy::Breaker::HalfOpen { .. } => 2,
        };
        b[i].1 += 1;
    }
    let cp = app.ledger.checkpoint();
    let scraped = metrics::Scraped {
        open: (standings.len() as i64) - by_state.get("stopped").copied().unwrap_or(0),
        runs_by_state: by_state.into_iter().collect(),
        held_nanos: held,
        breakers: b,
        entries: i64::try_from(cp.size).unwrap_or(i64::MAX),
        bytes: i64::try_from(log_bytes(app.ledger.dir())).unwrap_or(i64::MAX),
        round_trips: app.gate.round_trips().unwrap_or(0),
        key_refusals: app.keys.as_ref().map_or_else(Vec::new, |k| {
            k.spend()
                .refusals()
                .iter()
                .map(|(r, n)| (r.as_str(), *n))
                .collect()
        }),
        lease_events: app.gate.lease_counts().unwrap_or_default(),
        breaker_outcomes_unflushed: app.gate.breaker_outcomes_unflushed().unwrap_or(0),
    };
    Ok(app.observer.metrics.encode(&scraped))
}

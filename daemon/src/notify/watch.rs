//! The watcher: looks at the gate's approval requests when a commit point nudges it (a
//! new request, an approval), and every poll interval while any is pending, and emits
//! what changed since it last looked: a new request, an answer, an expiry.
//!
//! Expiry is computed when read (a request is expired once its run's deadline passed on
//! the gate's clock), so it is emitted when the watcher first sees it: within one poll
//! interval of the deadline. A request that goes moot (its run stopped) is not notified.

use std::collections::HashMap;
use std::sync::Arc;

use futures::future::BoxFuture;
use tally_wire::{ApprovalRequest, RequestState};
use tokio::sync::watch;

use super::hub::Notify;

/// Reads the gate's approval requests (`GET /v1/approvals`'s list).
pub(crate) type Lister =
    Arc<dyn Fn() -> BoxFuture<'static, Result<Vec<ApprovalRequest>, String>> + Send + Sync>;

/// Watch until `stop` says stop.
pub(crate) async fn watch(notify: Notify, list: Lister, mut stop: watch::Receiver<bool>) {
    let Some(shared) = notify.shared.clone() else {
        return;
    };
    let poll = shared.options.poll;
    let mut known: HashMap<String, RequestState> = HashMap::new();
    loop {
        let pending = known.values().any(|s| *s == RequestState::Pending);
        tokio::select! {
            _ = shared.nudge.notified() => {}
            _ = tokio::time::sleep(poll), if pending => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        if let Ok(list) = list().await {
            known = seen(&notify, &known, list);
        }
    }
}

/// Emit what changed from `known` to `list` (the gate's requests, each in the state the
/// gate holds: an answer by id is the gate's record of it); the states as now known.
fn seen(
    notify: &Notify,
    known: &HashMap<String, RequestState>,
    list: Vec<ApprovalRequest>,
) -> HashMap<String, RequestState> {
    let mut now = HashMap::with_capacity(list.len());
    for r in list {
        let before = known.get(&r.id).copied();
        if before.is_none() {
            let mut asked = r.clone();
            asked.state = RequestState::Pending;
            notify.requested(&asked);
        }
        if matches!(before, None | Some(RequestState::Pending)) {
            match r.state {
                RequestState::Approved | RequestState::Denied => notify.answered(&r),
                RequestState::Expired => notify.expired(&r),
                _ => {}
            }
        }
        now.insert(r.id.clone(), r.state);
    }
    now
}

//! Handing requests to the ledger.
//!
//! Each request's prepared decisions go straight into the ledger's commit pipeline
//! ([`Ledger::submit_prepared`]), which merges everything queued into one commit group
//! (one checkpoint, one fsync) and writes the next group while the previous one is
//! fsynced. The ledger calls back once a request's decisions are durable and sealed; the
//! callback answers the request. So the group size follows
//! the load with no timer, and no thread per request waits on the ledger.
//!
//! Merging requests is safe: each was validated alone before it was queued, so a group
//! fails only as a whole (I/O), and then the ledger refuses everything after (poisoned).

use std::sync::{Arc, Mutex};

use tally_ledger::{Ledger, Receipt};
use tokio::sync::{oneshot, OwnedSemaphorePermit};

/// What the request handlers share about the ledger.
pub(crate) struct LedgerState {
    /// Why the ledger stopped accepting writes, once it has.
    pub failure: Mutex<Option<String>>,
}

/// What an agent is told when the ledger cannot write. The cause names files of the store
/// and keys: it goes to the operator's log only.
const FAILED: &str = "the ledger cannot write; appends are refused until the daemon is restarted (the daemon's log has the cause)";

impl LedgerState {
    pub fn failure(&self) -> Option<String> {
        self.failure
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Record that the ledger failed (the first cause goes to the log) and return what
    /// agents are told.
    pub fn fail(&self, detail: &str) -> String {
        let mut failure = self.failure.lock().unwrap_or_else(|e| e.into_inner());
        if failure.is_none() {
            // A full disk may fail the log too: never panic on it.
            use std::io::Write;
            let _ = writeln!(
                std::io::stderr(),
                "tally serve: the ledger failed a write and refuses appends until restarted: {detail}"
            );
            *failure = Some(FAILED.to_string());
        }
        FAILED.to_string()
    }
}

/// Queue one request's decisions. The answer comes once they are durable and sealed (its
/// receipts), or refused (what to tell the agent). The request's in-flight slot is released
/// when the ledger calls back, even if the client has gone away meanwhile.
pub(crate) fn submit(
    ledger: &Ledger,
    state: &Arc<LedgerState>,
    plaintexts: Vec<Vec<u8>>,
    markers: Vec<(Vec<u8>, Vec<u8>)>,
    permit: OwnedSemaphorePermit,
) -> oneshot::Receiver<Result<Vec<Receipt>, String>> {
    let (reply, answer) = oneshot::channel();
    let count = plaintexts.len();
    let state = Arc::clone(state);
    ledger.submit_with_state(plaintexts, markers, move |result| {
        let answer = match result {
            Ok(receipts) if receipts.len() == count => Ok(receipts),
            Ok(receipts) => Err(state.fail(&format!(
                "the ledger returned {} receipts for {count} decisions",
                receipts.len()
            ))),
            Err(e) => Err(state.fail(&e.to_string())),
        };
        let _ = reply.send(answer);
        drop(permit);
    });
    answer
}

//! What a commit group is made of: the appends it takes ([`Pending`]), each with the
//! [`Reply`] that answers it, and what the writer hands the sync stage ([`Applied`]).

use crate::error::{Error, Result};
use crate::format::Checkpoint;
use crate::tlog::merkle::TreeHash;

use super::Receipt;

/// Where a group member's result goes: called exactly once, with its receipts once they
/// are durable, or with the error that refused them. Dropped unanswered (a pipeline
/// thread died), it answers with an error itself.
pub(super) struct Reply(Option<Done>);

pub(super) type Done = Box<dyn FnOnce(Result<Vec<Receipt>>) + Send>;

impl Reply {
    pub(super) fn new(done: impl FnOnce(Result<Vec<Receipt>>) + Send + 'static) -> Reply {
        Reply(Some(Box::new(done)))
    }

    pub(super) fn send(mut self, result: Result<Vec<Receipt>>) {
        if let Some(done) = self.0.take() {
            done(result);
        }
    }
}

impl Drop for Reply {
    fn drop(&mut self) {
        let Some(done) = self.0.take() else {
            return;
        };
        let refused = Error::Poisoned("the commit pipeline stopped before answering".into());
        if std::thread::panicking() {
            // Dropped while unwinding (another reply's callback panicked in `refuse`): a
            // second panic here would abort the process, so this one is contained and the
            // rest of the group still answered.
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| done(Err(refused))));
        } else {
            done(Err(refused));
        }
    }
}

pub(super) struct Pending {
    pub(super) plaintexts: Vec<Vec<u8>>,
    /// Derived state written in the same atomic batch as these decisions.
    pub(super) state: Vec<(Vec<u8>, Vec<u8>)>,
    /// Start a new key epoch before this group (an explicit [`Ledger::rotate`]).
    pub(super) rotate: bool,
    /// A deferred append ([`Ledger::submit_deferred`]): when it was queued (the ledger's
    /// clock, ms). It starts no group of its own before its linger is up.
    pub(super) deferred_since: Option<u64>,
    pub(super) reply: Reply,
}

/// A group written to the log, waiting for an fsync before it is acknowledged.
pub(super) struct Applied {
    pub(super) replies: Vec<(Reply, Vec<Receipt>)>,
    pub(super) checkpoint: Checkpoint,
    /// The Merkle tree's root at the checkpoint's size.
    pub(super) root: TreeHash,
}

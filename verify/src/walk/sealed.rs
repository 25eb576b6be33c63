//! What the walk has sealed: the size and checkpoint of the last valid checkpoint read
//! while nothing was found, and the ones sealed while the tree had not yet checked the
//! frames before them (taken back should it find something there).

use tally_ledger::Checkpoint;

use super::treefeed::Unconfirmed;

/// The sealed end of the walk so far.
#[derive(Default)]
pub(super) struct Sealed {
    /// Entries sealed.
    pub(super) size: u64,
    /// The checkpoint that sealed them.
    pub(super) last: Option<Checkpoint>,
    /// Checkpoints sealed that the tree has not yet caught up with.
    unconfirmed: Unconfirmed,
}

impl Sealed {
    /// Seal the checkpoint `cp` read at `ordinal`, keeping what was sealed before until
    /// the tree has checked the frames before it.
    pub(super) fn seal(&mut self, ordinal: u64, cp: Checkpoint) {
        let before = (self.size, self.last.take());
        self.unconfirmed.sealed(ordinal, before);
        self.size = cp.size;
        self.last = Some(cp);
    }

    /// The tree has checked every frame before `done` and made its first finding at
    /// `first` (`u64::MAX`: none): take back what was sealed after that finding.
    pub(super) fn settle(&mut self, first: u64, done: u64) {
        if let Some((size, cp)) = self.unconfirmed.settle(first, done) {
            self.size = size;
            self.last = cp;
        }
    }
}

/// Checkpoints stored at the current position, as the walk met them.
#[derive(Default)]
pub(super) struct Here {
    /// Valid stored checkpoints at this position (one is honest: the store keeps one per
    /// size).
    pub(super) count: u64,
    /// The first head seen here (a checkpoint's or an anchor's).
    pub(super) head: Option<tally_ledger::format::Hash>,
    /// The text of the last checkpoint read here.
    pub(super) text: Option<Vec<u8>>,
    /// Copies of a checkpoint found here, and the index of their finding.
    pub(super) duplicates: u64,
    pub(super) duplicate: Option<usize>,
    /// A validly signed checkpoint here whose head is not the hash of the clean entry
    /// right before it, until the walk leaves this position.
    pub(super) disputed: Option<Disputed>,
}

/// A validly signed checkpoint of size `n` that signs another head than the entry right
/// before it hashes to, while that entry's own header and link were as the chain
/// expects: either the entry's bytes were changed after they were sealed, or whoever
/// holds the epoch's key signed a head that was never the chain's. A second valid
/// checkpoint of this size that agrees with the chain says the latter (a fork); without
/// one, the signature stands and the entry was changed.
pub(super) struct Disputed {
    /// The checkpoint's size, and the position of the entry before it.
    pub(super) n: u64,
    pub(super) entry: u64,
    /// The entry's hash as stored, and the head the checkpoint signs.
    pub(super) stored: tally_ledger::format::Hash,
    pub(super) signed: tally_ledger::format::Hash,
    /// The checkpoint's finding, should the checkpoint turn out to be the odd one.
    pub(super) mismatch: String,
}

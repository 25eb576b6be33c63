//! What the entries read so far established: where the chain stands (position, seq,
//! head, epoch, wall time), the epoch keys, whose ledger it is, and the last broken link
//! still waiting for a checkpoint to say which side of it was changed. `entry` moves it
//! on with each entry; `seal` reads it and settles a suspect link.

use tally_ledger::format::{ChainRule, Hash};
use tally_ledger::LedgerId;

use crate::report::KeyMismatch;

/// The chain as the walk has read it.
pub(super) struct Chain {
    /// The ledger the entries belong to: `ledger.pub`'s, or another's genesis (then
    /// `foreign`).
    pub(super) ledger_id: LedgerId,
    /// Entries read so far: where the next entry stands, and the seq findings name.
    pub(super) position: u64,
    /// The seq the chain expects next (follows the entries' claims after a break, so one
    /// duplicate or gap is one finding, not one per later entry).
    pub(super) next_seq: u64,
    pub(super) head: Hash,
    /// How entries are chained: the current rule unless the source announced another.
    pub(super) rule: ChainRule,
    pub(super) head_epoch: u32,
    pub(super) head_wall: u64,
    /// Each epoch's verifying key, in epoch order.
    pub(super) epoch_keys: Vec<[u8; 32]>,
    /// Decision entries read.
    pub(super) decisions: u64,
    /// Genesis belongs to another ledger than `ledger.pub` (reported once).
    pub(super) foreign: bool,
    pub(super) key_mismatch: Option<KeyMismatch>,
    /// Whether the entry read last had no finding of its own (its header, seq and link
    /// all as the chain expects): then a checkpoint right after it that signs another
    /// head means its bytes were changed.
    pub(super) last_clean: bool,
    /// The last broken link, while no valid checkpoint has yet vouched for the entries
    /// from it on. Once one does, that entry's previous-hash is what was written, so the
    /// entry before it is the one whose bytes were changed.
    pub(super) suspect: Option<Suspect>,
}

impl Chain {
    /// The chain before the first entry of the ledger `ledger_id`.
    pub(super) fn new(ledger_id: LedgerId) -> Chain {
        Chain {
            ledger_id,
            position: 0,
            next_seq: 0,
            head: Hash::default(),
            rule: ChainRule::LeafHash,
            head_epoch: 0,
            head_wall: 0,
            epoch_keys: Vec::new(),
            decisions: 0,
            foreign: false,
            key_mismatch: None,
            last_clean: false,
            suspect: None,
        }
    }
}

/// A broken link at `link_at`: either that entry's previous-hash or the bytes of the
/// entry before it were changed, and only a valid checkpoint after it can tell which.
pub(super) struct Suspect {
    /// The position of the entry whose link broke.
    pub(super) link_at: u64,
    /// The index of its `broken_link` finding (None if it was past `max_findings`).
    pub(super) finding: Option<usize>,
    /// Whether the entry before it had no finding of its own.
    pub(super) before_clean: bool,
    /// The hash of the entry before it as stored, and the hash the link records.
    pub(super) stored: Hash,
    pub(super) linked: Hash,
}

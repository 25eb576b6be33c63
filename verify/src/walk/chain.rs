//! What the entries read so far established: where the chain stands (position, seq,
//! head, epoch, wall time), the epoch keys, whose ledger it is, and the last broken link
//! still waiting for a checkpoint to say which side of it was changed. Only this file
//! changes it, through the methods below: `entry` moves it on with each entry, `seal`
//! settles a suspect link and resumes from a sealed head, the walk sets the chain rule
//! its source announces; everything else reads it.

use tally_ledger::format::{ChainRule, Hash};
use tally_ledger::LedgerId;

use crate::report::KeyMismatch;

/// The chain as the walk has read it.
pub(super) struct Chain {
    /// The ledger the entries belong to: `ledger.pub`'s, or another's genesis (then
    /// `foreign`).
    ledger_id: LedgerId,
    /// Entries read so far: where the next entry stands, and the seq findings name.
    position: u64,
    /// The seq the chain expects next (follows the entries' claims after a break, so one
    /// duplicate or gap is one finding, not one per later entry).
    next_seq: u64,
    head: Hash,
    /// How entries are chained: the current rule unless the source announced another.
    rule: ChainRule,
    head_epoch: u32,
    head_wall: u64,
    /// Each epoch's verifying key, in epoch order.
    epoch_keys: Vec<[u8; 32]>,
    /// Decision entries read.
    decisions: u64,
    /// Genesis belongs to another ledger than `ledger.pub` (reported once).
    foreign: bool,
    key_mismatch: Option<KeyMismatch>,
    /// Whether the entry read last had no finding of its own (its header, seq and link
    /// all as the chain expects): then a checkpoint right after it that signs another
    /// head means its bytes were changed.
    last_clean: bool,
    /// The last broken link, while no valid checkpoint has yet vouched for the entries
    /// from it on. Once one does, that entry's previous-hash is what was written, so the
    /// entry before it is the one whose bytes were changed.
    suspect: Option<Suspect>,
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

    /// The ledger the entries belong to.
    pub(super) fn ledger_id(&self) -> LedgerId {
        self.ledger_id
    }

    /// Entries read so far: where the next entry stands.
    pub(super) fn position(&self) -> u64 {
        self.position
    }

    /// The seq the chain expects next.
    pub(super) fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// The hash the next entry must link to.
    pub(super) fn head(&self) -> Hash {
        self.head
    }

    /// How entries are chained.
    pub(super) fn rule(&self) -> ChainRule {
        self.rule
    }

    /// The epoch in force, and the wall time of the last entry.
    pub(super) fn head_epoch(&self) -> u32 {
        self.head_epoch
    }

    pub(super) fn head_wall(&self) -> u64 {
        self.head_wall
    }

    /// Each epoch's verifying key, in epoch order.
    pub(super) fn epoch_keys(&self) -> &[[u8; 32]] {
        &self.epoch_keys
    }

    /// Decision entries read.
    pub(super) fn decisions(&self) -> u64 {
        self.decisions
    }

    /// Whether genesis belongs to another ledger than `ledger.pub`.
    pub(super) fn foreign(&self) -> bool {
        self.foreign
    }

    /// Whose ledger `ledger.pub` is, when it is not this one's.
    pub(super) fn key_mismatch(&self) -> Option<&KeyMismatch> {
        self.key_mismatch.as_ref()
    }

    /// Whether the entry read last had no finding of its own.
    pub(super) fn last_clean(&self) -> bool {
        self.last_clean
    }

    /// The source announced how its entries are chained.
    pub(super) fn announce(&mut self, rule: ChainRule) {
        self.rule = rule;
    }

    /// An entry is read: its position, and whether the one before it was clean (the
    /// entry read is not, until it is linked).
    pub(super) fn advance(&mut self) -> (u64, bool) {
        let at = self.position;
        self.position += 1;
        (at, std::mem::replace(&mut self.last_clean, false))
    }

    /// An entry that does not decode, hashing to `hash`: the chain goes on from its
    /// stored bytes, so one bad entry is one finding.
    pub(super) fn resync(&mut self, hash: Hash) {
        self.head = hash;
        self.next_seq = self.next_seq.saturating_add(1);
    }

    /// An entry of seq `seq` written at `wall_ms`, hashing to `hash`, is the chain's
    /// head; `clean`: it had no finding of its own.
    pub(super) fn link(&mut self, hash: Hash, seq: u64, wall_ms: u64, clean: bool) {
        self.head = hash;
        self.head_wall = wall_ms;
        self.next_seq = seq.saturating_add(1);
        self.last_clean = clean;
    }

    /// A decision entry is read.
    pub(super) fn count_decision(&mut self) {
        self.decisions += 1;
    }

    /// The genesis is of the ledger `ledger_id`, not `ledger.pub`'s: the rest is judged
    /// against it, and the mismatch reported once.
    pub(super) fn adopt(&mut self, ledger_id: LedgerId) {
        self.key_mismatch = Some(KeyMismatch {
            key_ledger_id: self.ledger_id.to_string(),
            ledger_id: ledger_id.to_string(),
        });
        self.ledger_id = ledger_id;
        self.foreign = true;
    }

    /// The key of the next epoch (the genesis's is epoch 0's).
    pub(super) fn add_key(&mut self, key: [u8; 32]) {
        self.epoch_keys.push(key);
    }

    /// Epoch `epoch` is in force, with its key `key`.
    pub(super) fn enter_epoch(&mut self, epoch: u32, key: [u8; 32]) {
        self.epoch_keys.push(key);
        self.head_epoch = epoch;
    }

    /// The link just read broke: `suspect` until a checkpoint vouches for it (None: it
    /// cannot say which side was changed).
    pub(super) fn suspect(&mut self, suspect: Option<Suspect>) {
        self.suspect = suspect;
    }

    /// The suspect link, taken to be settled by a checkpoint that vouches for it.
    pub(super) fn take_suspect(&mut self) -> Option<Suspect> {
        self.suspect.take()
    }

    /// A checkpoint disagrees with the chain: nothing tells which side of the last broken
    /// link was changed.
    pub(super) fn clear_suspect(&mut self) {
        self.suspect = None;
    }

    /// The entry before a checkpoint was changed after it was sealed: the walk goes on
    /// from the head the checkpoint signs, so the next entry's link is judged against
    /// what was sealed.
    pub(super) fn resume_from(&mut self, signed: Hash) {
        self.head = signed;
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

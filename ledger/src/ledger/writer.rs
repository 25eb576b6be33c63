//! The writer: encrypts, chains and signs one commit group, writes it to the log with the
//! state it carries, and rotates the key epoch when due.

use std::collections::BTreeMap;
use std::fs;
use std::path::PathBuf;
use std::sync::Arc;

use crate::clock::Clock;
use crate::error::{Error, Result};
use crate::format::{chain_hash, Checkpoint, Hash, LedgerId};
use crate::keys::{self, DataKey, EpochSecrets};
use crate::segment::{self, push_frame, LogWriter, TAG_CHECKPOINT, TAG_ENTRY, TAG_STATE_DELTA};
use crate::store::{Point, Store, POINT_EVERY};
use crate::tlog::merkle::{leaf_hash, TreeHash};
use crate::tlog::tiles::TreeWriter;
use crate::tree::RunLinks;

use super::group::{Applied, Pending};
use super::{files, Receipt, Rotation};

pub(super) struct Writer {
    pub(super) dir: PathBuf,
    /// Where entry, checkpoint and rotation times are read.
    pub(super) clock: Arc<dyn Clock>,
    pub(super) ledger_id: LedgerId,
    pub(super) recipient: [u8; 32],
    pub(super) rotation: Rotation,
    pub(super) next_seq: u64,
    pub(super) head: Hash,
    pub(super) last_wall: u64,
    pub(super) secrets: EpochSecrets,
    pub(super) cipher: DataKey,
    pub(super) epoch_from_seq: u64,
    pub(super) epoch_since_ms: u64,
    pub(super) nonce_prefix: [u8; 16],
    /// The last index point written: (segment, offset).
    pub(super) last_point: Option<(u64, u64)>,
    /// The last value this process wrote under each state key, the base of that key's
    /// next delta (bounded: [`MAX_BASES_BYTES`]).
    pub(super) bases: StateBases,
    /// The Merkle tree over the entries: its frontier, and the tile files it extends.
    pub(super) tree: TreeWriter,
    /// Each run's last seq, for the next decision's `prev_seq`.
    pub(super) links: RunLinks,
    /// A plaintext with its run link, reused from decision to decision.
    pub(super) linked: Vec<u8>,
}

/// A state frame's `check`, before its pairs.
pub(super) const STATE_CHECK_LEN: usize = 4;

/// The most bytes `state`'s pairs take in a state frame (tag 4): per pair the key and the
/// value (a delta is only taken when shorter) and at most 13 bytes of varints and kind.
pub(super) fn state_bound(state: &[(Vec<u8>, Vec<u8>)]) -> usize {
    state.iter().map(|(k, v)| k.len() + v.len() + 16).sum()
}

/// Most bytes of state values [`StateBases`] keeps; past it, it starts again empty (the
/// next value of each key is written whole).
pub(super) const MAX_BASES_BYTES: usize = 16 << 20;

/// The previous value of each state key this process wrote. Only a value this writer put
/// in the log is ever a base: one the index holds from log bytes lost before a crash
/// never is, so every delta decodes against the log alone (`tally reindex`).
#[derive(Default)]
pub(super) struct StateBases {
    pub(super) values: std::collections::HashMap<Vec<u8>, Vec<u8>>,
    pub(super) bytes: usize,
}

impl StateBases {
    fn get(&self, key: &[u8]) -> Option<&[u8]> {
        self.values.get(key).map(Vec::as_slice)
    }

    fn put(&mut self, key: &[u8], value: &[u8]) {
        let add = key.len() + value.len();
        if self.bytes + add > MAX_BASES_BYTES {
            self.values.clear();
            self.bytes = 0;
        }
        match self.values.get_mut(key) {
            Some(old) => {
                self.bytes = self.bytes - old.len() + value.len();
                old.clear();
                old.extend_from_slice(value);
            }
            None => {
                self.bytes += add;
                self.values.insert(key.to_vec(), value.to_vec());
            }
        }
    }
}

impl Writer {
    /// Write one group to the log (not yet durable). On failure the group comes back
    /// with the error, to be refused.
    pub(super) fn apply(
        &mut self,
        log: &LogWriter,
        store: &Store,
        group: Vec<Pending>,
    ) -> std::result::Result<Applied, (Error, Vec<Pending>)> {
        match self.write_group(log, store, &group) {
            Ok((mut receipts, checkpoint, root)) => {
                let mut replies = Vec::with_capacity(group.len());
                for p in group.into_iter().rev() {
                    let mine = receipts.split_off(receipts.len() - p.plaintexts.len());
                    replies.push((p.reply, mine));
                }
                // In submission order, so receipts are delivered in seq order.
                replies.reverse();
                Ok(Applied {
                    replies,
                    checkpoint,
                    root,
                })
            }
            Err(e) => Err((e, group)),
        }
    }

    fn write_group(
        &mut self,
        log: &LogWriter,
        store: &Store,
        group: &[Pending],
    ) -> Result<(Vec<Receipt>, Checkpoint, TreeHash)> {
        let wall = self.clock.now_ms().max(self.last_wall);
        let count: usize = group.iter().map(|p| p.plaintexts.len()).sum();
        let (first_seq, prev_hash) = (self.next_seq, self.head);
        let mut frames: Vec<u8> = Vec::with_capacity(count * 400 + 512);
        let due = self.next_seq - self.epoch_from_seq >= self.rotation.records
            || wall.saturating_sub(self.epoch_since_ms) >= self.rotation.ms;
        let rotated = group.iter().any(|p| p.rotate) || due;
        if rotated {
            let (leaf, bytes) = self.rotate(wall)?;
            self.tree.push(leaf);
            push_frame(&mut frames, TAG_ENTRY, &bytes);
        }
        let receipts = self.push_entries(&mut frames, store, group, count, wall)?;
        let checkpoint =
            self.secrets
                .sign_checkpoint(self.ledger_id, self.next_seq, self.head, wall);
        let links = self.links.pairs();
        // The group's last value of each key, in one state frame before the checkpoint.
        let mut changed: BTreeMap<&[u8], &[u8]> = BTreeMap::new();
        for (k, v) in group.iter().flat_map(|p| &p.state) {
            changed.insert(k.as_slice(), v.as_slice());
        }
        for (k, v) in &links {
            changed.insert(k.as_slice(), v.as_slice());
        }
        if !changed.is_empty() {
            let pairs: Vec<(&[u8], &[u8])> = changed.iter().map(|(k, v)| (*k, *v)).collect();
            let payload = segment::StateFrame::encode(&pairs, |k| self.bases.get(k));
            push_frame(&mut frames, TAG_STATE_DELTA, &payload);
        }
        let root = self.tree.frontier().root();
        push_frame(
            &mut frames,
            segment::TAG_TREE,
            &segment::encode_tree(self.next_seq, &root),
        );
        push_frame(&mut frames, TAG_CHECKPOINT, checkpoint.to_text().as_bytes());
        // The tree files first, then the checkpoint that covers them: a reader that sees
        // the checkpoint in the log finds the tree files at least at its size. They are
        // derived and never synced (open checks them against the log's last tree frame
        // and keeps a prefix or rebuilds): a crash between the two leaves files ahead of
        // the log, which open cuts back to it.
        self.tree.flush()?;
        #[cfg(feature = "faults")]
        crate::faults::group_ready();
        let placed = log.append(&frames, first_seq, prev_hash)?;
        #[cfg(feature = "faults")]
        crate::faults::group_appended(&self.dir);
        // Only once the frame is in the log is its value the next delta's base (a failed
        // write poisons the ledger: nothing follows it from this process).
        for (k, v) in &changed {
            self.bases.put(k, v);
        }
        let point = self.index_point(first_seq, placed.segment, placed.offset);
        // The group is whole in the log now, and will be there after a restart: an index
        // that fails to take it must not refuse it (its retry would be a second copy). The
        // fold keeps its state in memory, the index is rebuilt from the log, and the store
        // keeps the failure (`Store::failed`), which refuses every group after this one
        // (`Shared::commit_once`); this one is acknowledged once its fsync succeeds.
        if let Err(e) = store.apply_group(changed, point, (placed.segment, placed.end)) {
            debug_assert!(store.failed().is_some(), "an index error not kept: {e}");
        }
        self.last_wall = wall;
        if rotated {
            self.finish_rotation(log)?;
        }
        Ok((receipts, checkpoint, root))
    }

    /// The group's entries, each encrypted and chained in place in `frames`, its leaf
    /// pushed on the tree; their receipts.
    fn push_entries(
        &mut self,
        frames: &mut Vec<u8>,
        store: &Store,
        group: &[Pending],
        count: usize,
        wall: u64,
    ) -> Result<Vec<Receipt>> {
        let mut receipts = Vec::with_capacity(count);
        // The last seq of each run this group links is recorded with the group's state.
        self.links.begin_group();
        let mut linked = std::mem::take(&mut self.linked);
        for plaintext in group.iter().flat_map(|p| &p.plaintexts) {
            let seq = self.next_seq;
            let mut nonce = [0u8; 24];
            nonce[..16].copy_from_slice(&self.nonce_prefix);
            nonce[16..].copy_from_slice(&seq.to_be_bytes());
            linked.clear();
            linked.extend_from_slice(plaintext);
            self.links.link(store, &mut linked, seq)?;
            // Built in place in the group's frames.
            let at = segment::push_frame_with(frames, TAG_ENTRY, |out| {
                self.cipher.decision_entry_into(
                    self.ledger_id,
                    seq,
                    self.secrets.epoch,
                    wall,
                    self.head,
                    nonce,
                    &linked,
                    out,
                )
            });
            // One pass over the entry's bytes: its leaf is the tree's, and the chain's
            // input.
            let leaf = leaf_hash(&frames[at..]);
            self.head = chain_hash(&leaf);
            self.tree.push(leaf);
            self.next_seq += 1;
            receipts.push(Receipt {
                seq,
                hash: self.head,
            });
        }
        self.linked = linked;
        Ok(receipts)
    }

    /// A seq point for the index every [`POINT_EVERY`] bytes of log: where the group
    /// starting at `first_seq` was placed, if the last point is that far behind.
    fn index_point(&mut self, first_seq: u64, segment: u64, offset: u64) -> Option<Point> {
        let point = match self.last_point {
            Some((seg, off)) if seg == segment && offset - off < POINT_EVERY => None,
            _ => Some(Point {
                seq: first_seq,
                segment,
                offset,
            }),
        };
        if let Some(p) = &point {
            self.last_point = Some((p.segment, p.offset));
        }
        point
    }

    /// The old key file replaced by the new epoch's, once its certificate is durable.
    fn finish_rotation(&self, log: &LogWriter) -> Result<()> {
        log.sync()?;
        let key_path = self.dir.join(files::WRITER_KEY);
        fs::rename(self.dir.join(files::WRITER_KEY_NEXT), &key_path)
            .map_err(|e| Error::io(&key_path, e))?;
        keys::sync_parent(&key_path)
    }

    /// Start the next epoch: certify its keys with the current key, persist them as
    /// `writer.key.next`, and switch. The old secrets are dropped (zeroized) here; the old
    /// key file is replaced once the certificate is durable. Returns the certificate
    /// entry's leaf hash and bytes.
    fn rotate(&mut self, wall: u64) -> Result<(TreeHash, Vec<u8>)> {
        let epoch = self.secrets.epoch + 1;
        let seq = self.next_seq;
        let (mut next, ephemeral) = EpochSecrets::generate(epoch, &self.recipient, self.ledger_id)?;
        next.from_seq = seq;
        next.since_ms = wall;
        let bytes =
            self.secrets
                .certify_epoch(&next, &ephemeral, self.ledger_id, seq, wall, self.head);
        let next_path = self.dir.join(files::WRITER_KEY_NEXT);
        let _ = fs::remove_file(&next_path);
        next.write(&next_path, self.ledger_id)?;
        self.cipher = keys::data_key(&next.data);
        self.epoch_from_seq = seq;
        self.epoch_since_ms = wall;
        self.secrets = next;
        let leaf = leaf_hash(&bytes);
        self.head = chain_hash(&leaf);
        self.next_seq += 1;
        Ok((leaf, bytes))
    }
}

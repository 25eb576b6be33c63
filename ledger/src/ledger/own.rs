//! The writer reading back its own records: the decisions of the current key epoch,
//! decrypted with that epoch's data key, which the writer holds. It holds no other: the
//! secrets of earlier epochs are destroyed at rotation (SECURITY.md), so what it can read
//! back is at most one epoch (the rotation's `records` entries, plus one group).

use crate::decision::Decision;
use crate::error::Result;
use crate::format::{Entry, EntryType, Frame, Header};
use crate::keys;
use crate::segment::{list_segments, LogReader};

use super::pipeline::lock;
use super::Ledger;

/// What [`Ledger::read_epoch`] read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct EpochRead {
    /// The key epoch read.
    pub epoch: u32,
    /// The seq of the entry that began it.
    pub from_seq: u64,
    /// Decisions read and handed on.
    pub decisions: u64,
    /// Decision entries of the epoch that did not open or decode (`tally verify` names
    /// them); skipped.
    pub unreadable: u64,
}

impl Ledger {
    /// Hand `visit` every durable decision of the current key epoch, in seq order, with
    /// its seq: read from the log from the epoch's first entry up to the durable
    /// checkpoint, opened with the writer's own key and decoded as `verify` decodes them.
    /// Appends may continue meanwhile; what they add is not read.
    pub fn read_epoch(&self, mut visit: impl FnMut(u64, Decision)) -> Result<EpochRead> {
        let (cipher, epoch, from_seq) = {
            let w = lock(&self.shared.writer);
            (
                keys::data_key(&w.secrets.data),
                w.secrets.epoch,
                w.epoch_from_seq,
            )
        };
        let size = self.checkpoint().size;
        let mut read = EpochRead {
            epoch,
            from_seq,
            ..EpochRead::default()
        };
        let start = self.shared.store.point(from_seq)?;
        let segments = list_segments(&self.dir)?;
        let at = start.map(|p| (p.segment, p.offset));
        let mut plain = Vec::new();
        for f in LogReader::new(segments, false, at).frames() {
            let Frame::Entry(bytes) = f? else { continue };
            let header = Header::decode(&bytes)?;
            if header.seq >= size {
                break;
            }
            if header.seq < from_seq
                || header.epoch != epoch
                || header.entry_type != EntryType::Decision
            {
                continue;
            }
            let opened = Entry::decode(&bytes).ok().and_then(|e| {
                let body = cipher.open_into(&header.nonce, e.header_bytes(), e.body(), &mut plain);
                body.ok().and_then(|()| Decision::from_stored(&plain).ok())
            });
            match opened {
                Some(d) => {
                    read.decisions += 1;
                    visit(header.seq, d);
                }
                None => read.unreadable += 1,
            }
        }
        Ok(read)
    }
}

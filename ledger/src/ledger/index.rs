//! The sled index rebuilt from the log: state frames replayed, index points written.

use std::fs;
use std::path::Path;

use crate::error::{Error, Result};
use crate::format::{Frame, Header};
use crate::segment::{
    self, list_segments, sync_dir, Item, LogReader, LogWriter, StateValue, LOG_DIR,
};
use crate::store::{Point, Store, POINT_EVERY};

use super::{files, Ledger, Reindexed};

impl Ledger {
    /// Rebuild the sled index and the Merkle tree files of the ledger in `dir` from its
    /// log: the tree from the sealed entries (checked against the root the log records),
    /// derived state from the state frames, index points from the entries; values written outside commit groups
    /// ([`Ledger::put_state_durable`]) are carried over from the old index when it still
    /// opens. Takes the writer's lock ([`Error::Busy`] while a writer holds the ledger).
    /// The new index is built beside the old one and then put in its place.
    pub fn reindex(dir: &Path) -> Result<Reindexed> {
        use crate::store::{remove_index, INDEX_DIR};
        segment::refuse_old_layout(dir)?;
        if !dir.join(files::PUBLIC).exists() {
            return Err(Error::NotALedger(dir.to_path_buf()));
        }
        let _lock = LogWriter::lock(dir)?;
        recover_index(dir)?;
        let segments = list_segments(dir)?;
        let mut done = Reindexed {
            segments: segments.len() as u64,
            ..Reindexed::default()
        };
        // The tree files first: a log whose entries do not lead to the root it records
        // stops the reindex before anything is replaced.
        done.tree_leaves = crate::tree::rebuild_tree(dir, &segments)?;
        let old_path = dir.join(INDEX_DIR);
        let carried = if old_path.exists() {
            match Store::open(dir).and_then(|s| s.put_pairs()) {
                Ok(pairs) => pairs,
                Err(e @ Error::Busy(_)) => return Err(e),
                Err(_) => {
                    done.old_index_unreadable = true;
                    Vec::new()
                }
            }
        } else {
            Vec::new()
        };
        let new_path = dir.join("index.new");
        remove_index(&new_path)?;
        let store = Store::open_at(dir, &new_path)?;
        replay_into(dir, &store, LogReader::new(segments, true, None), &mut done)?;
        store.fold()?;
        done.carried = carried.len() as u64;
        store.put_durable(&carried)?;
        drop(store);
        let old = dir.join("index.old");
        remove_index(&old)?;
        if old_path.exists() {
            fs::rename(&old_path, &old).map_err(|e| Error::io(&old_path, e))?;
        }
        fs::rename(&new_path, &old_path).map_err(|e| Error::io(&new_path, e))?;
        sync_dir(dir)?;
        remove_index(&old)?;
        Ok(done)
    }
}

/// Apply one state frame read from the log to the index: each delta decodes against the
/// key's value in the index, which holds every earlier frame (the one rule the writer's
/// replay on open and `tally reindex` share).
pub(super) fn apply_state_frame(
    dir: &Path,
    store: &Store,
    frame: segment::StateFrame,
    at: (u64, u64),
) -> Result<()> {
    let mut bases = std::collections::HashMap::new();
    for (k, v) in &frame.pairs {
        if let StateValue::Delta { .. } = v {
            if let Some(b) = store.derived_get(k)? {
                bases.insert(k.clone(), b);
            }
        }
    }
    let full = frame
        .resolve(|k| bases.get(k).map(Vec::as_slice))
        .map_err(|e| Error::Segment {
            path: dir.join(LOG_DIR).join(segment::segment_name(at.0)),
            why: format!("state frame ending at byte {}: {e}", at.1),
        })?;
    store.apply_group(
        full.iter().map(|(k, v)| (k.as_slice(), v.as_slice())),
        None,
        at,
    )
}

/// Put an index back in place after a crash between a reindex's two renames (`index` to
/// `index.old`, then `index.new` to `index`), which leaves none: the one built (with what
/// `put_state_durable` wrote carried into it), never a new empty index.
pub(super) fn recover_index(dir: &Path) -> Result<()> {
    use crate::store::{remove_index, INDEX_DIR};
    let index = dir.join(INDEX_DIR);
    let old = dir.join("index.old");
    if index.exists() || !old.exists() {
        return Ok(());
    }
    // `index.old` is made only once `index.new` is built whole and synced.
    let new = dir.join("index.new");
    let from = if new.exists() { &new } else { &old };
    fs::rename(from, &index).map_err(|e| Error::io(from, e))?;
    sync_dir(dir)?;
    remove_index(&old)
}

/// Bring `store` up to the log `reader` reads: index points for its entries (one per
/// [`POINT_EVERY`] bytes of a segment), its state frames applied in order, and the mark
/// at its last checkpoint. What the writer's open (from the index's mark) and `tally
/// reindex` (from the start, into a new index) both do; counts go to `done`.
pub(super) fn replay_into(
    dir: &Path,
    store: &Store,
    mut reader: LogReader,
    done: &mut Reindexed,
) -> Result<()> {
    let mut last_point: Option<(u64, u64)> = None;
    let mut mark = None;
    while let Some(item) = reader.next() {
        let pos = reader.position();
        match item? {
            Item::Frame(Frame::Entry(bytes)) => {
                done.entries += 1;
                let Some((segment, end)) = pos else { continue };
                let offset = end - (segment::FRAME_PREFIX_LEN + bytes.len()) as u64;
                let due = match last_point {
                    Some((s, o)) => s != segment || offset - o >= POINT_EVERY,
                    None => true,
                };
                if due {
                    let seq = Header::decode(&bytes)?.seq;
                    store.apply_group(
                        std::iter::empty(),
                        Some(Point {
                            seq,
                            segment,
                            offset,
                        }),
                        (segment, offset),
                    )?;
                    last_point = Some((segment, offset));
                    done.points += 1;
                }
            }
            Item::Frame(Frame::Checkpoint(_)) => mark = pos,
            Item::State {
                frame,
                segment,
                end,
            } => {
                apply_state_frame(dir, store, frame, (segment, end))?;
                done.state_frames += 1;
                #[cfg(feature = "faults")]
                crate::faults::replayed_state_frame(done.state_frames, || {
                    let _ = store.flush();
                });
            }
            Item::Torn(_) => done.torn += 1,
            Item::Tree { .. } | Item::Frame(Frame::Cosigned(_)) => {}
        }
    }
    if let Some(m) = mark {
        store.apply_group(std::iter::empty(), None, m)?;
    }
    Ok(())
}

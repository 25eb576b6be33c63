//! Proofs from a ledger directory, read in place (no lock, no byte changed; a writer may
//! keep appending): the latest tree head, inclusion and consistency proofs from the tree
//! files, entries by seq, and tlog-proof files for entries.

use std::collections::BTreeSet;
use std::path::Path;

use crate::error::{Error, Result};
use crate::format::{Entry, EntryType, Frame, Header, LedgerId};
use crate::segment::{self, list_segments, LogReader};
use crate::tlog::merkle::{self, TreeHash};
use crate::tlog::note::Note;
use crate::tlog::proof::{ConsistencyProof, TlogProof};
use crate::tlog::tiles::Tiles;
use crate::Checkpoint;

/// The latest sealed checkpoint of the ledger in `dir` and the Merkle root at its size
/// (from its group's tree frame, checked against the tree files). The writer writes a
/// group's tree files before it appends the group's checkpoint, so files that do not
/// reach that checkpoint's root are reported, even while a writer appends.
pub fn read_tree_head(dir: &Path) -> Result<(Checkpoint, TreeHash)> {
    let segments = list_segments(dir)?;
    for (_, path) in segments.iter().rev() {
        let scan = segment::scan(path)?;
        let Some(at) = scan.last_checkpoint else {
            continue;
        };
        let cp = Checkpoint::from_text(&segment::read_payload(path, at)?)?;
        let tree = match scan.last_tree {
            Some(t) => segment::decode_tree(&segment::read_payload(path, t)?),
            None => None,
        };
        let Some((size, root)) = tree.filter(|(s, _)| *s == cp.size) else {
            return Err(Error::Corrupt {
                seq: cp.size.saturating_sub(1),
                why: "the log's last group records no Merkle tree (written before trees, or by an older build): open the ledger once with this build (tally serve, tally append or tally rotate) to build it".into(),
            });
        };
        let tiles = Tiles::new(dir);
        let from_files = merkle::root(&tiles, size).ok();
        if from_files != Some(root) {
            return Err(Error::Corrupt {
                seq: size.saturating_sub(1),
                why: format!(
                    "the tree files in {} do not match the log at size {size}: open the ledger with its writer to rebuild them",
                    dir.join(crate::tlog::tiles::TREE_DIR).display()
                ),
            });
        }
        return Ok((cp, root));
    }
    Err(Error::Corrupt {
        seq: 0,
        why: "no segment holds a checkpoint".into(),
    })
}

/// The tree head the log of the ledger in `dir` records, read without walking it: the
/// size its last checkpoint seals and the Merkle root of its group's tree frame (`None`
/// for a log written before tree frames). Nothing here is checked against the entries.
pub fn recorded_tree_head(dir: &Path) -> Result<(u64, Option<TreeHash>)> {
    let (size, tree) = crate::tree::sealed_tree(&list_segments(dir)?)?;
    Ok((size, tree.filter(|(s, _)| *s == size).map(|(_, r)| r)))
}

/// The inclusion proof of leaf `index` in the tree of `size` leaves of the ledger in `dir`.
pub fn inclusion(dir: &Path, index: u64, size: u64) -> Result<Vec<TreeHash>> {
    if index >= size {
        return Err(Error::Corrupt {
            seq: index,
            why: format!("seq {index} is not in the tree of size {size}"),
        });
    }
    merkle::inclusion_proof(&Tiles::new(dir), index, size)
}

/// The consistency proof from size `old` to size `new` of the ledger in `dir`.
pub fn consistency(dir: &Path, old: u64, new: u64) -> Result<Vec<TreeHash>> {
    merkle::consistency_proof(&Tiles::new(dir), old, new)
}

/// The root of the tree of `size` leaves of the ledger in `dir`, from its tree files.
pub fn root(dir: &Path, size: u64) -> Result<TreeHash> {
    let t = Tiles::new(dir);
    if t.count(0)? < size {
        return Err(Error::Corrupt {
            seq: size,
            why: format!("the tree files hold fewer than {size} leaves"),
        });
    }
    merkle::root(&t, size)
}

/// The stored bytes of the entries whose seqs are in `seqs`, and of the entries that
/// opened the epochs of those (genesis or epoch certificate), read from the log of the
/// ledger in `dir` in one pass: `(seq, bytes)` in seq order.
pub fn entries(dir: &Path, seqs: &BTreeSet<u64>) -> Result<Vec<(u64, Vec<u8>)>> {
    let Some(&last) = seqs.last() else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for f in LogReader::new(list_segments(dir)?, false, None).frames() {
        if let Frame::Entry(bytes) = f? {
            let seq = Header::decode(&bytes)?.seq;
            if seqs.contains(&seq) {
                out.push((seq, bytes));
            }
            if seq >= last {
                break;
            }
        }
    }
    Ok(out)
}

/// The entry that opened the epoch of `entry` (seq of it), among `opened` (the genesis and
/// epoch certificates read so far, by epoch).
fn epoch_opener(opened: &[(u32, Vec<u8>)], epoch: u32) -> Option<&[u8]> {
    opened
        .iter()
        .rev()
        .find(|(e, _)| *e == epoch)
        .map(|(_, b)| b.as_slice())
}

/// Build the tlog-proofs of the entries `seqs` of the ledger in `dir` against
/// `checkpoint` (a C2SP checkpoint note of that ledger, whose size covers them). Each
/// proof's `extra` is the entry's bytes followed, for a decision, by the bytes of the
/// entry that opened its epoch (so the auditor key can decrypt it).
pub fn tlog_proofs(
    dir: &Path,
    ledger: LedgerId,
    seqs: &BTreeSet<u64>,
    checkpoint: &Note,
    size: u64,
) -> Result<Vec<TlogProof>> {
    let Some(&last) = seqs.last() else {
        return Ok(Vec::new());
    };
    if last >= size {
        return Err(Error::Corrupt {
            seq: last,
            why: format!("seq {last} is not in the checkpoint of size {size}"),
        });
    }
    let mut opened: Vec<(u32, Vec<u8>)> = Vec::new();
    let mut out = Vec::new();
    let tiles = Tiles::new(dir);
    for f in LogReader::new(list_segments(dir)?, false, None).frames() {
        let Frame::Entry(bytes) = f? else { continue };
        let entry = Entry::decode(&bytes)?;
        let h = entry.header;
        if h.ledger_id != ledger {
            return Err(Error::Corrupt {
                seq: h.seq,
                why: "an entry of another ledger".into(),
            });
        }
        if matches!(h.entry_type, EntryType::Genesis | EntryType::Epoch) {
            opened.push((h.epoch, bytes.clone()));
        }
        if seqs.contains(&h.seq) {
            let mut extra = bytes.clone();
            if h.entry_type == EntryType::Decision {
                if let Some(o) = epoch_opener(&opened, h.epoch) {
                    extra.extend_from_slice(o);
                }
            }
            out.push(TlogProof {
                extra: Some(extra),
                index: h.seq,
                proof: merkle::inclusion_proof(&tiles, h.seq, size)?,
                checkpoint: checkpoint.clone(),
            });
        }
        if h.seq >= last {
            break;
        }
    }
    if out.len() != seqs.len() {
        return Err(Error::Corrupt {
            seq: last,
            why: "the log does not hold every entry asked for".into(),
        });
    }
    Ok(out)
}

/// The consistency proof from the tree `old` (its size) to `new` (a checkpoint note of
/// `new_size`), in the form of an add-checkpoint body.
pub fn consistency_file(
    dir: &Path,
    old: u64,
    new: &Note,
    new_size: u64,
) -> Result<ConsistencyProof> {
    Ok(ConsistencyProof {
        old,
        proof: consistency(dir, old, new_size)?,
        checkpoint: new.clone(),
    })
}

//! The writer's side of the Merkle tree and of run links: bringing the tree files up to
//! the log on open, and linking each decision to its run's previous one.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::format::{Frame, Header};
use crate::segment::LogReader;
use crate::store::Store;
use crate::tlog::merkle::{leaf_hash, Frontier, TreeHash};
use crate::tlog::tiles::{self, Tiles, TreeWriter};

/// Bring the tree files of the ledger in `dir` up to its sealed log of `size` entries,
/// whose last group recorded the root `target` (`None` for a log written before tree
/// frames). Keeps the files' prefix when it leads to `target`, else rebuilds the tree
/// from the whole log.
pub(crate) fn open_tree(
    dir: &Path,
    segments: &[(u64, PathBuf)],
    store: &Store,
    size: u64,
    target: Option<(u64, TreeHash)>,
) -> Result<TreeWriter> {
    let target = target.filter(|(s, _)| *s == size).map(|(_, r)| r);
    if let Some(root) = target {
        if let Ok(Some(w)) = catch_up(dir, segments, store, size, root) {
            return Ok(w);
        }
        // Before a tree file is rewritten: do the log's entries lead to the root its
        // last tree frame records? If not, the log is damaged and nothing is written.
        let mut f = Frontier::new();
        leaves(
            LogReader::new(segments.to_vec(), false, None),
            0,
            size,
            |leaf| {
                f.push_with(leaf, |_, _, _| {});
                Ok(())
            },
        )?;
        if f.root() != root {
            return Err(Error::TailDamaged {
                dir: dir.to_path_buf(),
                at: format!("seq {}", size.saturating_sub(1)),
                why: "the Merkle root the last tree frame records is not the root of the log's entries".into(),
            });
        }
    }
    // No root to check a prefix against, or the prefix does not lead to it: from scratch.
    let mut w = TreeWriter::empty(dir)?;
    extend(
        &mut w,
        LogReader::new(segments.to_vec(), false, None),
        0,
        size,
    )?;
    w.flush()?;
    tiles::sync(dir)?;
    if let Some(root) = target {
        if w.frontier().root() != root {
            return Err(Error::Corrupt {
                seq: size.saturating_sub(1),
                why: "the Merkle tree of the log's entries is not the one its last tree frame records".into(),
            });
        }
    }
    Ok(w)
}

/// Where [`rebuild_tree`] builds the new tree files, beside the old ones.
const REBUILD_DIR: &str = "tree.rebuild";
/// Where the old tree files go for the moment between [`rebuild_tree`]'s two renames.
const OLD_TREE_DIR: &str = "tree.old";

/// The sealed end of the log `segments`: its size (from the last checkpoint) and the tree
/// frame of that checkpoint's group, if it has one.
pub(crate) fn sealed_tree(segments: &[(u64, PathBuf)]) -> Result<(u64, Option<(u64, TreeHash)>)> {
    use crate::segment;
    for (_, path) in segments.iter().rev() {
        let scan = segment::scan(path)?;
        let (true, Some(at)) = (scan.sealed, scan.last_checkpoint) else {
            continue;
        };
        let cp = crate::Checkpoint::from_text(&segment::read_payload(path, at)?)?;
        let tree = match scan.last_tree {
            Some(t) => segment::decode_tree(&segment::read_payload(path, t)?),
            None => None,
        };
        return Ok((cp.size, tree));
    }
    Err(Error::Corrupt {
        seq: 0,
        why: "no segment holds a checkpoint".into(),
    })
}

/// Rebuild the tree files of the ledger in `dir` from the entries of its sealed log (the
/// entries are the truth; the files are derived from them), whatever the old files hold:
/// built whole in `tree.rebuild/`, checked against the root the log's last tree frame
/// records (when it has one), synced, then put in place of `tree/` by two renames. A
/// crash between the renames leaves no `tree/`, which the writer's open rebuilds; a
/// build whose root is not the log's changes nothing. Returns the leaves built. The
/// caller holds the writer's lock.
pub(crate) fn rebuild_tree(dir: &Path, segments: &[(u64, PathBuf)]) -> Result<u64> {
    use std::fs;
    let staging = dir.join(REBUILD_DIR);
    let old = dir.join(OLD_TREE_DIR);
    let remove = |p: &Path| match fs::remove_dir_all(p) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io(p, e)),
    };
    remove(&staging)?;
    remove(&old)?;
    let (size, target) = sealed_tree(segments)?;
    let target = target.filter(|(s, _)| *s == size).map(|(_, r)| r);
    fs::create_dir(&staging).map_err(|e| Error::io(&staging, e))?;
    let built = (|| {
        let mut w = TreeWriter::empty(&staging)?;
        extend(
            &mut w,
            LogReader::new(segments.to_vec(), false, None),
            0,
            size,
        )?;
        w.flush()?;
        if let Some(root) = target {
            if w.frontier().root() != root {
                return Err(Error::Corrupt {
                    seq: size.saturating_sub(1),
                    why: "the Merkle root of the log's entries is not the one its last tree frame records: the log is damaged (`tally verify` says where); the tree files were left as they were".into(),
                });
            }
        }
        tiles::sync(&staging)
    })();
    if let Err(e) = built {
        let _ = fs::remove_dir_all(&staging);
        return Err(e);
    }
    let tree = dir.join(tiles::TREE_DIR);
    if tree.exists() {
        fs::rename(&tree, &old).map_err(|e| Error::io(&tree, e))?;
    }
    let new = staging.join(tiles::TREE_DIR);
    fs::rename(&new, &tree).map_err(|e| Error::io(&new, e))?;
    crate::segment::sync_dir(dir)?;
    remove(&old)?;
    remove(&staging)?;
    Ok(size)
}

/// Resume from the files' prefix (up to `size` leaves), read the rest of the entries
/// from the log; `None` when that does not lead to `root`.
fn catch_up(
    dir: &Path,
    segments: &[(u64, PathBuf)],
    store: &Store,
    size: u64,
    root: TreeHash,
) -> Result<Option<TreeWriter>> {
    let t = Tiles::new(dir);
    let have = t.count(0)?.min(size);
    let frontier = Frontier::at(&t, have)?;
    let mut w = TreeWriter::resume(dir, frontier)?;
    if have < size {
        let start = store.point(have)?.map(|p| (p.segment, p.offset));
        extend(
            &mut w,
            LogReader::new(segments.to_vec(), false, start),
            have,
            size,
        )?;
        w.flush()?;
    }
    Ok((w.frontier().root() == root).then_some(w))
}

/// Push the leaves of the entries with seqs `from..to` that `reader` yields.
fn extend(w: &mut TreeWriter, reader: LogReader, from: u64, to: u64) -> Result<()> {
    leaves(reader, from, to, |leaf| {
        w.push(leaf);
        if w.frontier().size().is_multiple_of(65_536) {
            w.flush()?;
        }
        Ok(())
    })
}

/// The leaf hashes of the entries with seqs `from..to` that `reader` yields, in order.
fn leaves(
    reader: LogReader,
    from: u64,
    to: u64,
    mut push: impl FnMut(TreeHash) -> Result<()>,
) -> Result<()> {
    let mut next = from;
    for f in reader.frames() {
        if next >= to {
            break;
        }
        if let Frame::Entry(bytes) = f? {
            let seq = Header::decode(&bytes)?.seq;
            if seq < next {
                continue;
            }
            if seq != next {
                return Err(Error::Corrupt {
                    seq,
                    why: format!("the log skips from seq {next} to {seq}"),
                });
            }
            push(leaf_hash(&bytes))?;
            next += 1;
        }
    }
    if next != to {
        return Err(Error::Corrupt {
            seq: next,
            why: format!("the log ends at seq {next}, before its sealed size {to}"),
        });
    }
    Ok(())
}

/// The state key under which the ledger keeps the seq of a run's last decision.
pub(crate) fn link_key(run: &[u8]) -> Vec<u8> {
    [b"\0l/".as_slice(), run].concat()
}

/// Most runs whose last seq [`RunLinks`] keeps in memory; past it, it starts again empty
/// (the index has them all).
const MAX_LINKS: usize = 1 << 20;

/// The seq of each run's last decision, for the `prev_seq` links.
pub(crate) struct RunLinks {
    /// Most runs kept in memory ([`MAX_LINKS`]).
    cap: usize,
    /// Each run's last seq, and the number of the group that last linked it.
    last: HashMap<Vec<u8>, (u64, u64)>,
    /// The group being linked (counts from 1).
    group: u64,
    /// The runs the current group linked, each once.
    touched: Vec<Vec<u8>>,
}

impl Default for RunLinks {
    fn default() -> RunLinks {
        RunLinks::with_cap(MAX_LINKS)
    }
}

impl RunLinks {
    fn with_cap(cap: usize) -> RunLinks {
        RunLinks {
            cap,
            last: HashMap::new(),
            group: 0,
            touched: Vec::new(),
        }
    }

    /// Start linking a new group (forgetting the runs the last one touched).
    pub(crate) fn begin_group(&mut self) {
        self.group += 1;
        self.touched.clear();
    }

    /// Link the decision `plaintext` (canonical JSON) at `seq` to its run's previous one:
    /// `prev_seq` is spliced in as its last field (declared last, so the result is still
    /// canonical). The run's new last seq is recorded with the group's state
    /// ([`RunLinks::pairs`]). One hash lookup per decision; allocates only for a run new
    /// to this process or to the group.
    pub(crate) fn link(&mut self, store: &Store, plaintext: &mut Vec<u8>, seq: u64) -> Result<()> {
        let Some(run) = run_of(plaintext) else {
            return Ok(());
        };
        if run.is_empty() {
            return Ok(());
        }
        let group = self.group;
        let (prev, first_in_group) = match self.last.get_mut(run) {
            Some((last, stamp)) => {
                let first = *stamp != group;
                *stamp = group;
                (Some(std::mem::replace(last, seq)), first)
            }
            None => {
                let stored = store.state_get(&link_key(run))?.and_then(|v| {
                    let b: [u8; 8] = v.as_slice().try_into().ok()?;
                    Some(u64::from_be_bytes(b))
                });
                if self.last.len() >= self.cap {
                    // Keep the runs this group linked: `pairs` reads their seqs here.
                    let keep: Vec<_> = (self.touched.iter())
                        .filter_map(|r| Some((r.clone(), *self.last.get(r)?)))
                        .collect();
                    self.last.clear();
                    self.last.extend(keep);
                }
                self.last.insert(run.to_vec(), (seq, group));
                (stored, true)
            }
        };
        if first_in_group {
            self.touched.push(run.to_vec());
        }
        if let Some(p) = prev {
            if plaintext.last() == Some(&b'}') {
                plaintext.pop();
                plaintext.extend_from_slice(b",\"prev_seq\":");
                push_decimal(plaintext, p);
                plaintext.push(b'}');
            }
        }
        Ok(())
    }

    /// The state pairs recording each run's last seq in the current group.
    pub(crate) fn pairs(&self) -> Vec<(Vec<u8>, Vec<u8>)> {
        (self.touched.iter())
            .filter_map(|run| {
                let (seq, _) = self.last.get(run)?;
                Some((link_key(run), seq.to_be_bytes().to_vec()))
            })
            .collect()
    }
}

/// Append `n` in decimal (as JSON writes it) to `out`.
fn push_decimal(out: &mut Vec<u8>, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
}

/// The raw (escaped) bytes of the `run` string a canonical decision starts with.
fn run_of(plaintext: &[u8]) -> Option<&[u8]> {
    let rest = plaintext.strip_prefix(b"{\"run\":\"")?;
    let mut i = 0;
    while i < rest.len() {
        match rest[i] {
            b'\\' => i += 2,
            b'"' => return Some(&rest[..i]),
            _ => i += 1,
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::{link_key, push_decimal, run_of, RunLinks};
    use crate::store::Store;

    /// Link `runs` as one group at seqs from `seq`, record its pairs as the writer does,
    /// and return the decisions as linked.
    fn group(links: &mut RunLinks, store: &Store, seq: u64, runs: &[&str]) -> Vec<String> {
        links.begin_group();
        let mut out = Vec::new();
        for (i, run) in runs.iter().enumerate() {
            let mut d = format!(r#"{{"run":"{run}","kind":"start"}}"#).into_bytes();
            links.link(store, &mut d, seq + i as u64).unwrap();
            out.push(String::from_utf8(d).unwrap());
        }
        let pairs = links.pairs();
        let pairs = pairs.iter().map(|(k, v)| (k.as_slice(), v.as_slice()));
        store.apply_group(pairs, None, (0, seq)).unwrap();
        out
    }

    /// Past its cap the map starts again, keeping the runs of the group being linked:
    /// every link is still the run's last seq, from memory or from the index.
    #[test]
    fn links_survive_the_map_starting_again() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::open(tmp.path()).unwrap();
        let mut links = RunLinks::with_cap(2);
        let first = group(&mut links, &store, 1, &["a", "b", "a", "c", "d", "c"]);
        let linked =
            |prev: u64, run: &str| format!(r#"{{"run":"{run}","kind":"start","prev_seq":{prev}}}"#);
        let start = |run: &str| format!(r#"{{"run":"{run}","kind":"start"}}"#);
        assert_eq!(
            first,
            [
                start("a"),
                start("b"),
                linked(1, "a"),
                start("c"),
                start("d"),
                linked(4, "c")
            ]
        );
        let v = |seq: u64| Some(seq.to_be_bytes().to_vec());
        for (run, seq) in [("a", 3), ("b", 2), ("c", 6), ("d", 5)] {
            assert_eq!(
                store.state_get(&link_key(run.as_bytes())).unwrap(),
                v(seq),
                "{run}"
            );
        }
        let second = group(&mut links, &store, 7, &["b", "a", "e", "d"]);
        assert_eq!(
            second,
            [linked(2, "b"), linked(3, "a"), start("e"), linked(5, "d")]
        );
        assert_eq!(links.pairs().len(), 4);
    }

    #[test]
    fn decimals_are_written_as_json_writes_them() {
        for n in [
            0,
            1,
            9,
            10,
            99,
            100,
            12_345,
            u64::from(u32::MAX),
            u64::MAX - 1,
            u64::MAX,
        ] {
            let mut out = b"x".to_vec();
            push_decimal(&mut out, n);
            assert_eq!(out, format!("x{n}").into_bytes());
        }
    }

    #[test]
    fn run_of_reads_escaped_names() {
        assert_eq!(run_of(br#"{"run":"r1","kind":"start"}"#), Some(&b"r1"[..]));
        assert_eq!(
            run_of(br#"{"run":"a\"b\\","kind":"start"}"#),
            Some(&br#"a\"b\\"#[..])
        );
        assert_eq!(run_of(br#"{"run":"","kind":"policy"}"#), Some(&b""[..]));
        assert_eq!(run_of(br#"{"kind":"start"}"#), None);
    }
}

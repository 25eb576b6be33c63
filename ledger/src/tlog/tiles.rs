//! The Merkle tree on disk, in the form C2SP tlog-tiles serves it: `DIR/tree/L` holds,
//! for each tile level `L`, every hash of that level in order: level 0 the leaf hashes,
//! level `L` the roots of the perfect subtrees of `256^L` leaves. A tile `tile/L/N` (or its
//! partial `tile/L/N.p/W`) is the 256 (or `W`) hashes from `N * 256` of level `L`'s file.
//!
//! The files are derived from the log (`tally reindex` and the writer's open rebuild
//! them); they are written with each commit group, before the group is appended to the
//! log (a reader that sees a checkpoint finds them at least at its size), but never
//! synced: on open the writer
//! checks them against the root the log's last tree frame records, and rebuilds what does
//! not match. Readers never trust them further than the root they compare with.

use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::merkle::{range_root, Frontier, Nodes, TreeHash};
use crate::error::{Error, Result};

/// The tree's directory inside a ledger directory.
pub const TREE_DIR: &str = "tree";
/// Hashes in a full tile (tile height 8).
pub const TILE_WIDTH: u64 = 256;
/// Tree levels per tile level.
pub const TILE_HEIGHT: u8 = 8;

fn level_path(dir: &Path, level: u8) -> PathBuf {
    dir.join(TREE_DIR).join(level.to_string())
}

/// Read access to the tree files of the ledger in `dir`.
pub struct Tiles {
    dir: PathBuf,
}

impl Tiles {
    /// The tree files of the ledger in `dir` (they need not exist yet).
    pub fn new(dir: &Path) -> Tiles {
        Tiles {
            dir: dir.to_path_buf(),
        }
    }

    /// Hashes stored at tile level `level`.
    pub fn count(&self, level: u8) -> Result<u64> {
        let path = level_path(&self.dir, level);
        match fs::metadata(&path) {
            Ok(m) => Ok(m.len() / 32),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
            Err(e) => Err(Error::io(&path, e)),
        }
    }

    /// `count` hashes of tile level `level` from `index`, as stored (32 bytes each).
    pub fn read(&self, level: u8, index: u64, count: u64) -> Result<Vec<u8>> {
        let path = level_path(&self.dir, level);
        let file = File::open(&path).map_err(|e| Error::io(&path, e))?;
        let mut buf = vec![0u8; (count * 32) as usize];
        file.read_exact_at(&mut buf, index * 32)
            .map_err(|e| Error::io(&path, e))?;
        Ok(buf)
    }

    /// The tile `tile/level/n` of width `width` (1..=256) of a tree of `size` leaves, or
    /// `None` when that tree has no such tile (the tile would reach past it).
    pub fn tile(&self, size: u64, level: u8, n: u64, width: u64) -> Result<Option<Vec<u8>>> {
        if !(1..=TILE_WIDTH).contains(&width) || level > 7 {
            return Ok(None);
        }
        let at_level = size >> (u32::from(level) * 8);
        let Some(end) = n.checked_mul(TILE_WIDTH).and_then(|s| s.checked_add(width)) else {
            return Ok(None);
        };
        if end > at_level {
            return Ok(None);
        }
        self.read(level, n * TILE_WIDTH, width).map(Some)
    }
}

fn to_hashes(buf: &[u8]) -> Vec<TreeHash> {
    buf.chunks_exact(32)
        .map(|c| {
            let mut h = [0u8; 32];
            h.copy_from_slice(c);
            h
        })
        .collect()
}

impl Nodes for Tiles {
    type Error = Error;
    fn node(&self, level: u8, index: u64) -> Result<TreeHash> {
        let tile_level = level / TILE_HEIGHT;
        let rest = u32::from(level % TILE_HEIGHT);
        let buf = self.read(tile_level, index << rest, 1 << rest)?;
        Ok(range_root(&to_hashes(&buf)))
    }
}

/// The writer's end of the tree: its frontier (O(log n)) and the level files it appends
/// the new hashes to.
pub struct TreeWriter {
    dir: PathBuf,
    frontier: Frontier,
    files: Vec<File>,
    /// Each level file's length: what this writer set and wrote (it holds the writer's
    /// lock), so a flush needs no `stat`.
    lens: Vec<u64>,
    /// Hashes to append per tile level, gathered over one group.
    pending: Vec<Vec<u8>>,
}

impl TreeWriter {
    /// Resume the tree of the ledger in `dir` at `frontier` (whose size is what the files
    /// hold at level 0; higher levels are cut to match).
    pub fn resume(dir: &Path, frontier: Frontier) -> Result<TreeWriter> {
        let tree = dir.join(TREE_DIR);
        fs::create_dir_all(&tree).map_err(|e| Error::io(&tree, e))?;
        let size = frontier.size();
        let mut files = Vec::new();
        let mut lens = Vec::new();
        for level in 0..8u8 {
            let path = level_path(dir, level);
            let f = OpenOptions::new()
                .create(true)
                .read(true)
                .write(true)
                .truncate(false)
                .open(&path)
                .map_err(|e| Error::io(&path, e))?;
            let want = (size >> (u32::from(level) * 8)) * 32;
            f.set_len(want).map_err(|e| Error::io(&path, e))?;
            files.push(f);
            lens.push(want);
        }
        Ok(TreeWriter {
            dir: dir.to_path_buf(),
            frontier,
            files,
            lens,
            pending: vec![Vec::new(); 8],
        })
    }

    /// Start the tree over, empty (before a rebuild from the log).
    pub fn empty(dir: &Path) -> Result<TreeWriter> {
        TreeWriter::resume(dir, Frontier::new())
    }

    /// Append one leaf (its leaf hash); the file writes happen at [`TreeWriter::flush`].
    pub fn push(&mut self, leaf: TreeHash) {
        let pending = &mut self.pending;
        self.frontier.push_with(leaf, |level, _, h| {
            if level % TILE_HEIGHT == 0 {
                if let Some(p) = pending.get_mut(usize::from(level / TILE_HEIGHT)) {
                    p.extend_from_slice(h);
                }
            }
        });
    }

    /// Write what was pushed since the last flush to the level files (not synced).
    pub fn flush(&mut self) -> Result<()> {
        for (level, buf) in self.pending.iter_mut().enumerate() {
            if buf.is_empty() {
                continue;
            }
            let end = self.lens[level];
            self.files[level]
                .write_all_at(buf, end)
                .map_err(|e| Error::io(level_path(&self.dir, level as u8), e))?;
            self.lens[level] = end + buf.len() as u64;
            buf.clear();
        }
        Ok(())
    }

    /// The tree so far.
    pub fn frontier(&self) -> &Frontier {
        &self.frontier
    }
}

/// fsync the tree files (after a rebuild, so it is not done again after a crash).
pub fn sync(dir: &Path) -> Result<()> {
    for level in 0..8u8 {
        let path = level_path(dir, level);
        if let Ok(f) = File::open(&path) {
            f.sync_all().map_err(|e| Error::io(&path, e))?;
        }
    }
    let tree = dir.join(TREE_DIR);
    File::open(&tree)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::io(&tree, e))
}

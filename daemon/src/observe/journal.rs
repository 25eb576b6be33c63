//! The trajectories kept across a restart: every point the live view takes is appended
//! to `live.ndjson` in the ledger's directory (one JSON line, written before the page
//! can show it), and read back when the daemon starts. Not part of the audit: the ledger
//! is the record; this file only spares the operator an empty page after a restart.
//!
//! * A `write` per point, no fsync: a daemon killed (`kill -9`, a crash) loses nothing
//!   written, a machine that loses power may lose the last points.
//! * Bounded: at start only the last [`super::live::POINTS`] points of the
//!   [`super::live::MAX_RUNS`] most recently seen runs are kept (what the page shows),
//!   and the file is rewritten with exactly those; while serving it is rewritten the same
//!   way once [`COMPACT_AFTER`] lines were appended. A line that does not parse (the torn
//!   tail of a write cut by a crash, a hand-edited file) is skipped, counted and logged:
//!   the view is advisory, the daemon starts.
//! * Run names are the names agents chose, as the gate's own state holds them; the
//!   file is 0600 in the ledger's 0700 directory.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The file's name in the ledger's directory.
pub(crate) const FILE: &str = "live.ndjson";

/// Lines appended before the file is rewritten from memory.
pub(crate) const COMPACT_AFTER: u64 = 200_000;

/// One point of one run: `(dimension index in TRACKED, used, limit)` for each dimension
/// the check saw.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub(crate) struct Line {
    pub run: String,
    pub at_ms: u64,
    pub points: Vec<(u8, u64, u64)>,
}

/// The open file and how much was appended since it was last rewritten.
pub(crate) struct Journal {
    path: PathBuf,
    file: Option<std::fs::File>,
    appended: u64,
}

/// What reading the file found.
pub(crate) struct Read {
    pub lines: Vec<Line>,
    /// Lines that did not parse (skipped).
    pub bad: u64,
}

impl Journal {
    /// The lines of `dir`'s file (none if there is none).
    pub fn read(dir: &Path) -> Read {
        let path = dir.join(FILE);
        let mut read = Read {
            lines: Vec::new(),
            bad: 0,
        };
        let Ok(f) = std::fs::File::open(&path) else {
            return read;
        };
        for line in BufReader::new(f).split(b'\n') {
            let Ok(line) = line else {
                read.bad += 1;
                break;
            };
            if line.is_empty() {
                continue;
            }
            match serde_json::from_slice::<Line>(&line) {
                Ok(l) if l.points.iter().all(|p| (p.0 as usize) < 4) => read.lines.push(l),
                _ => read.bad += 1,
            }
        }
        read
    }

    /// Rewrite `dir`'s file with `lines` (a new file renamed into place), and open it to
    /// append. A file that cannot be written leaves the view in memory only.
    pub fn rewrite(dir: &Path, lines: impl Iterator<Item = Line>) -> std::io::Result<Journal> {
        let path = dir.join(FILE);
        let tmp = dir.join(format!("{FILE}.tmp"));
        {
            use std::os::unix::fs::OpenOptionsExt;
            let f = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&tmp)?;
            let mut w = std::io::BufWriter::new(f);
            for l in lines {
                serde_json::to_writer(&mut w, &l)?;
                w.write_all(b"\n")?;
            }
            w.flush()?;
        }
        std::fs::rename(&tmp, &path)?;
        let file = std::fs::OpenOptions::new().append(true).open(&path)?;
        Ok(Journal {
            path,
            file: Some(file),
            appended: 0,
        })
    }

    /// Append one line (one `write`). A failed write stops the journal (the page goes
    /// on from memory).
    pub fn append(&mut self, line: &Line) {
        let Some(f) = self.file.as_mut() else { return };
        let Ok(mut bytes) = serde_json::to_vec(line) else {
            return;
        };
        bytes.push(b'\n');
        if f.write_all(&bytes).is_err() {
            super::log_line(
                "error",
                &format!(
                    "tally serve: cannot append to {}: the live view's trajectories are kept in memory only until the next start",
                    self.path.display()
                ),
            );
            self.file = None;
        }
        self.appended += 1;
    }

    /// Whether the file should be rewritten from memory.
    pub fn due(&self) -> bool {
        self.file.is_some() && self.appended >= COMPACT_AFTER
    }
}

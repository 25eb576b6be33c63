//! The trajectories kept across a restart: every point the live view takes is appended
//! to `live.ndjson` in the ledger's directory (one JSON line per check, handed to the
//! writer thread as the point is taken), and read back when the daemon starts. Not part of the audit: the ledger
//! is the record; this file only spares the operator an empty page after a restart.
//!
//! * Written by a thread of its own (`tally-live`), never on a check's path: a check
//!   hands its line over a bounded channel ([`QUEUE`] lines; when it is full the line is
//!   dropped from the file, kept in memory, and the drop logged once). The thread writes
//!   what it has in one `write`, no fsync, then sleeps [`WRITE_EVERY`] before it takes
//!   more: at most 20 writes a second, and a check almost never has to wake it (woken
//!   per line, the thread and the wake-ups took a tenth of a busy daemon's CPU). A daemon
//!   killed (`kill -9`, a crash) loses the points not yet written (at most the last
//!   [`WRITE_EVERY`] of them), a machine that loses power may lose more; a clean stop
//!   writes them all ([`Journal::close`]).
//! * Bounded: at start only the last [`super::live::POINTS`] points of the
//!   [`super::live::MAX_RUNS`] most recently seen runs are kept (what the page shows),
//!   and the file is rewritten with exactly those; while serving it is rewritten the same
//!   way once [`COMPACT_AFTER`] lines were appended. A line that does not parse (the torn
//!   tail of a write cut by a crash, a hand-edited file) is skipped, counted and logged:
//!   the view is advisory, the daemon starts.
//! * Run names are the names agents chose, as the gate's own state holds them; the
//!   file is 0600 in the ledger's 0700 directory.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;

use serde::{Deserialize, Serialize};

/// The file's name in the ledger's directory.
pub(crate) const FILE: &str = "live.ndjson";

/// Lines appended before the file is rewritten from memory.
pub(crate) const COMPACT_AFTER: u64 = 200_000;

/// Lines waiting for the writer thread.
pub(crate) const QUEUE: usize = 65_536;

/// How long the writer thread sleeps after a write: lines handed over meanwhile wait in
/// the channel and go in the next write. At 50 ms, a gate deciding 15,000 checks a
/// second queues about 750 lines between writes, far below [`QUEUE`].
pub(crate) const WRITE_EVERY: std::time::Duration = std::time::Duration::from_millis(50);

/// One point of one run: `(dimension index in TRACKED, used, limit)` for each dimension
/// the check saw.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub(crate) struct Line {
    pub run: String,
    pub at_ms: u64,
    pub points: Vec<(u8, u64, u64)>,
}

/// What the writer thread is asked to do.
enum Job {
    /// One line, as bytes (newline included).
    Line(Vec<u8>),
    /// Rewrite the file with these lines (what memory holds), then append to it.
    Rewrite(Vec<Line>),
}

/// The writer thread's end of the file, and how much was appended since the last
/// rewrite.
pub(crate) struct Journal {
    jobs: std::sync::mpsc::SyncSender<Job>,
    /// The writer thread, joined by [`Journal::close`].
    writer: std::thread::JoinHandle<()>,
    appended: u64,
    dropped: bool,
}

/// What reading the file found.
#[cfg(test)]
pub(crate) struct Read {
    pub lines: Vec<Line>,
    /// Lines that did not parse (skipped).
    pub bad: u64,
}

impl Journal {
    /// The lines of `dir`'s file (none if there is none).
    #[cfg(test)]
    pub fn read(dir: &Path) -> Read {
        let mut lines = Vec::new();
        let bad = Journal::scan(dir, |l| lines.push(l));
        Read { lines, bad }
    }

    /// Each line of `dir`'s file that parses, in order, handed to `each` (streamed: the
    /// file is never held whole); the count of lines that did not.
    pub fn scan(dir: &Path, mut each: impl FnMut(Line)) -> u64 {
        let mut bad = 0;
        let Ok(f) = std::fs::File::open(dir.join(FILE)) else {
            return 0;
        };
        for line in BufReader::new(f).split(b'\n') {
            let Ok(line) = line else {
                bad += 1;
                break;
            };
            if line.is_empty() {
                continue;
            }
            match serde_json::from_slice::<Line>(&line) {
                Ok(l) if l.points.iter().all(|p| (p.0 as usize) < 4) => each(l),
                _ => bad += 1,
            }
        }
        bad
    }

    /// Start the thread that rewrites `dir`'s file with `lines` (a new file renamed into
    /// place), then appends to it. A file that cannot be written leaves the view in
    /// memory only (logged).
    pub fn start(dir: &Path, lines: Vec<Line>) -> std::io::Result<Journal> {
        let (jobs, queue) = std::sync::mpsc::sync_channel::<Job>(QUEUE);
        let dir = dir.to_path_buf();
        let writer = std::thread::Builder::new()
            .name("tally-live".into())
            .spawn(move || {
                // First the file as memory holds it; lines handed over meanwhile queue.
                let mut file = match rewrite(&dir, &lines) {
                    Ok(f) => f,
                    Err(e) => {
                        failed(&dir, &e);
                        None
                    }
                };
                drop(lines);
                let mut buf = Vec::new();
                while let Ok(first) = queue.recv() {
                    let mut next = Some(first);
                    // What has queued up meanwhile goes in the same write.
                    while let Some(job) = next.take() {
                        match job {
                            Job::Line(bytes) => buf.extend_from_slice(&bytes),
                            Job::Rewrite(lines) => {
                                if let Some(f) = file.as_mut() {
                                    let _ = f.write_all(&buf);
                                }
                                buf.clear();
                                file = match rewrite(&dir, &lines) {
                                    Ok(f) => f,
                                    Err(e) => {
                                        failed(&dir, &e);
                                        None
                                    }
                                };
                            }
                        }
                        next = queue.try_recv().ok();
                    }
                    if let Some(f) = file.as_mut() {
                        if let Err(e) = f.write_all(&buf) {
                            failed(&dir, &e);
                            file = None;
                        }
                    }
                    buf.clear();
                    std::thread::sleep(WRITE_EVERY);
                }
            })?;
        Ok(Journal {
            jobs,
            writer,
            appended: 0,
            dropped: false,
        })
    }

    /// Hand one line to the writer (never waits).
    pub fn append(&mut self, line: &Line) {
        let Ok(mut bytes) = serde_json::to_vec(line) else {
            return;
        };
        bytes.push(b'\n');
        if self.jobs.try_send(Job::Line(bytes)).is_err() && !self.dropped {
            self.dropped = true;
            super::log_line(
                "error",
                &format!(
                    "tally serve: the live view's trajectory file falls behind ({QUEUE} lines waiting): points are kept in memory, and some will be missing after a restart"
                ),
            );
        }
        self.appended += 1;
    }

    /// Write every line handed over and end the writer (at a clean stop: what a stop
    /// loses is only what `kill -9` would, never the last [`WRITE_EVERY`] of points).
    pub fn close(self) {
        drop(self.jobs);
        // The thread takes what is queued, writes it and ends once the channel is empty
        // and closed; a writer that panicked has nothing more to write.
        let _ = self.writer.join();
    }

    /// Whether the file should be rewritten from memory.
    pub fn due(&self) -> bool {
        self.appended >= COMPACT_AFTER
    }

    /// Have the file rewritten with `lines` (after every line handed over before).
    pub fn compact(&mut self, lines: Vec<Line>) {
        self.appended = 0;
        let _ = self.jobs.try_send(Job::Rewrite(lines));
    }
}

fn failed(dir: &Path, e: &std::io::Error) {
    super::log_line(
        "error",
        &format!(
            "tally serve: cannot write {}: {e}; the live view's trajectories are kept in memory only until the next start",
            dir.join(FILE).display()
        ),
    );
}

/// Write `lines` to a new file renamed into place as `dir`'s file; it, open to append.
fn rewrite(dir: &Path, lines: &[Line]) -> std::io::Result<Option<std::fs::File>> {
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
            serde_json::to_writer(&mut w, l)?;
            w.write_all(b"\n")?;
        }
        w.flush()?;
    }
    std::fs::rename(&tmp, &path)?;
    Ok(Some(std::fs::OpenOptions::new().append(true).open(&path)?))
}

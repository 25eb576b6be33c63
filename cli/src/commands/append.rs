//! `tally append`: every line checked before anything is written, then appended in
//! batches from a spool in bounded memory.

use std::fs::File;
use std::io::{self, BufRead};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use tally_ledger::Decision;

use super::{check_ledger_dir, open, Progress};
use crate::cli::AppendArgs;
use crate::output::outln;
use crate::Exit;

struct Line {
    number: usize,
    bytes: Vec<u8>,
}

fn prepare(text: &str, number: usize, what: impl Fn() -> String) -> Result<Line> {
    let d = Decision::from_json(text).with_context(&what)?;
    // As the daemon's append refuses it: the state version orders a fleet's ledgers for
    // the auditor, and only the gate numbers its decisions (docs/FLEET.md).
    if d.state_version.is_some() {
        return Err(anyhow::anyhow!(
            "`state_version` is written by the gate alone; leave it out of appended decisions"
        ))
        .with_context(&what);
    }
    let bytes = tally_ledger::ledger::prepare(vec![d])
        .with_context(&what)?
        .pop()
        .context("prepare returned nothing")?;
    Ok(Line { number, bytes })
}

pub fn append(args: &AppendArgs) -> Result<Exit> {
    let (ledger, json, batch) = (args.ledger.as_path(), args.json.as_deref(), args.batch);
    check_ledger_dir(ledger)?;
    if let Some(text) = json.filter(|text| *text != "-") {
        let line = prepare(text, 0, || "the decision argument".into())?;
        let receipts = open(ledger)?
            .append_prepared(vec![line.bytes])
            .context("the decision argument: nothing was written")?;
        for r in &receipts {
            outln!("{}", serde_json::to_string(r)?);
        }
        return Ok(Exit::Success);
    }
    // All of the input is read and checked before the store is opened: bad input changes
    // nothing, and a retry after fixing it cannot write anything twice. The checked lines
    // wait in a spool, so memory is bounded by one batch, not by the input.
    let mut spool = Spool::fill(ledger, io::stdin().lock())?;
    let ledger = open(ledger)?;
    let progress = Progress::new("appending");
    let (total, final_line) = (spool.count, spool.final_line);
    let mut first_seq: Option<u64> = None;
    let mut done = 0;
    // The stdin line after the last one committed: where a retry starts.
    let mut next_line = spool.first_line;
    // What was committed before a failure, for its message.
    let before = |first_seq: Option<u64>, done: usize| match first_seq {
        // Seqs are consecutive: this process holds the ledger's exclusive lock.
        Some(seq) if done == 1 => {
            format!("1 decision before it was committed (seq {seq}, its receipt above)")
        }
        Some(seq) if done > 0 => format!(
            "{done} decisions before it were committed (seqs {seq}-{}, receipts above)",
            seq + done as u64 - 1
        ),
        _ => "nothing was committed".into(),
    };
    while done < total {
        let chunk = match spool.read(batch.max(1).min(total - done)) {
            Ok(chunk) => chunk,
            Err(e) => {
                let first = next_line;
                let before = before(first_seq, done);
                return Err(e).with_context(|| {
                    format!(
                        "reading the checked input back from the temporary directory {} ($TMPDIR) at stdin line {first}; {before}; lines {first}-{final_line} were not written: append them again from line {first} (e.g. `tail -n +{first}`)",
                        spool.dir.display()
                    )
                });
            }
        };
        let (first, last) = (chunk[0].number, chunk[chunk.len() - 1].number);
        let committed = ledger.append_prepared(chunk.into_iter().map(|l| l.bytes).collect());
        let receipts = match committed {
            Ok(r) => r,
            Err(e) => {
                let before = before(first_seq, done);
                return Err(e).with_context(|| {
                    format!(
                        "committing stdin lines {first}-{last}; {before}; lines {first}-{final_line} were not written: append them again from line {first} (e.g. `tail -n +{first}`)"
                    )
                });
            }
        };
        if first_seq.is_none() {
            first_seq = receipts.first().map(|r| r.seq);
        }
        for r in &receipts {
            outln!("{}", serde_json::to_string(r)?);
        }
        done += receipts.len();
        next_line = last + 1;
        progress.show_of(done as u64, total as u64);
    }
    Ok(Exit::Success)
}

/// `append`'s checked input between its two passes: each prepared decision, after its
/// stdin line number and its length (u64 little-endian each), in an unnamed file in the
/// temporary directory (never the ledger's) that the system removes when the process ends,
/// even on `kill -9`. It costs disk, about the size of the prepared input, not memory.
struct Spool {
    file: io::BufReader<File>,
    dir: PathBuf,
    /// Decisions in the spool.
    count: usize,
    /// The stdin lines of the first and the last decision.
    first_line: usize,
    final_line: usize,
    /// The longest prepared decision: a longer length read back is a bad spool.
    longest: u64,
}

impl Spool {
    /// Read, check, prepare and spool every line of `input`, or fail having written
    /// nothing to the ledger.
    fn fill(ledger: &Path, mut input: impl BufRead) -> Result<Spool> {
        use std::io::{Seek, Write};
        let dir = std::env::temp_dir();
        let spool_failed = || {
            format!(
                "nothing was written: cannot spool the checked input to the temporary directory {} ($TMPDIR), which needs room for about the size of the input: free space there or point TMPDIR at another directory",
                dir.display()
            )
        };
        // Never in the ledger: a refused append changes no byte of its directory.
        if let (Ok(tmp), Ok(led)) = (dir.canonicalize(), ledger.canonicalize()) {
            if tmp.starts_with(&led) {
                bail!(
                    "nothing was written: the temporary directory {} ($TMPDIR) is inside the ledger {}; point TMPDIR at another directory",
                    dir.display(),
                    ledger.display()
                );
            }
        }
        let file = tempfile::tempfile().with_context(spool_failed)?;
        let mut out = io::BufWriter::with_capacity(1 << 16, file);
        let (mut count, mut first_line, mut final_line, mut longest) = (0, 0, 0, 0);
        let mut text = String::new();
        for number in 1.. {
            text.clear();
            let read = input
                .read_line(&mut text)
                .with_context(|| format!("reading stdin line {number}"))?;
            if read == 0 {
                break;
            }
            // As `BufRead::lines`: without its `\n` or `\r\n`.
            if text.ends_with('\n') {
                text.pop();
                if text.ends_with('\r') {
                    text.pop();
                }
            }
            if tally_ledger::decision::is_blank_line(&text) {
                continue;
            }
            let what = || format!("stdin line {number}: nothing was written");
            let line = prepare(&text, number, what)?;
            let len = line.bytes.len() as u64;
            out.write_all(&(number as u64).to_le_bytes())
                .and_then(|()| out.write_all(&len.to_le_bytes()))
                .and_then(|()| out.write_all(&line.bytes))
                .with_context(spool_failed)?;
            if count == 0 {
                first_line = number;
            }
            count += 1;
            final_line = number;
            longest = longest.max(len);
        }
        let mut file = out
            .into_inner()
            .map_err(io::IntoInnerError::into_error)
            .with_context(spool_failed)?;
        file.rewind().with_context(spool_failed)?;
        Ok(Spool {
            file: io::BufReader::with_capacity(1 << 16, file),
            dir,
            count,
            first_line,
            final_line,
            longest,
        })
    }

    /// The next `n` decisions of the spool, in input order.
    fn read(&mut self, n: usize) -> io::Result<Vec<Line>> {
        use std::io::Read;
        let mut lines = Vec::with_capacity(n);
        for _ in 0..n {
            let (mut number, mut len) = ([0u8; 8], [0u8; 8]);
            self.file.read_exact(&mut number)?;
            self.file.read_exact(&mut len)?;
            let (number, len) = (u64::from_le_bytes(number), u64::from_le_bytes(len));
            if len > self.longest {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "the spool is damaged",
                ));
            }
            let mut bytes = vec![0u8; len as usize];
            self.file.read_exact(&mut bytes)?;
            lines.push(Line {
                number: number as usize,
                bytes,
            });
        }
        Ok(lines)
    }
}

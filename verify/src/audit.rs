//! A whole audit, as `tally verify` runs it: one ledger, or the several ledgers of a
//! fleet read as one, each verified from its directory or its export, the decisions of
//! several merged in state version order, and (with the auditor key) the one fold of the
//! [`analysis`](crate::analysis) over them. [`Audit::run`] gives the report `tally verify`
//! prints ([`AuditReport::to_text`], [`AuditReport::to_json`]).
//!
//! This module opens the ledgers and drives the walks; `report` turns what they found
//! into the text and JSON every reader prints.

mod report;

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

use tally_ledger::export::ExportError;

use crate::analysis::{self, Analysis};
use crate::merge::merge;
use crate::walk::{export_frames, ledger_frames, verify, Options, SourceError};
use crate::{Event, Report};

pub use report::{AuditReport, Verified};

/// One ledger of an audit: where it is read from, and what it is checked against.
pub struct Ledger {
    /// A ledger directory, an export file, or `-` for an export on standard input.
    pub path: PathBuf,
    /// Its key, anchors and (to decrypt) the auditor key.
    pub options: Options,
}

/// The ledgers of one audit: one, or the several ledgers of a fleet, read as one.
pub struct Audit {
    /// In the order given: reports and merge findings number the ledgers by it.
    pub ledgers: Vec<Ledger>,
}

/// Why an audit could not read a ledger at all (what it reads and finds wrong is the
/// report's, never an error).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AuditError {
    /// A ledger directory whose log could not be opened.
    #[error("reading the log in {}", path.display())]
    Log {
        /// The directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: tally_ledger::Error,
    },
    /// An export file that could not be opened.
    #[error("opening {}", path.display())]
    Open {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// An export that does not start as one (`None`: standard input).
    #[error("{} is not a tally export", path.as_ref().map_or("standard input".into(), |p| p.display().to_string()))]
    NotExport {
        /// The file, or `None` for standard input.
        path: Option<PathBuf>,
        /// Why.
        #[source]
        source: ExportError,
    },
    /// A ledger's walk ended in a panic.
    #[error("verifying {} failed", path.display())]
    Failed {
        /// The ledger.
        path: PathBuf,
    },
}

/// Whether `path` names standard input.
fn is_stdin(path: &Path) -> bool {
    path.as_os_str() == "-"
}

impl Audit {
    /// Verify every ledger and, with `config`, analyse every decision they hold (every
    /// ledger needs the auditor key for that): `tally verify`'s report. `progress` is
    /// called with the entries read now and then, for a one-ledger audit only.
    pub fn run(
        &self,
        config: Option<analysis::Config>,
        progress: impl FnMut(u64),
    ) -> Result<AuditReport, AuditError> {
        Ok(match config {
            Some(config) => {
                let (verified, found) = self.analyse(config, progress)?;
                AuditReport {
                    verified,
                    analysis: Some(found),
                }
            }
            None => AuditReport {
                verified: self.verify(|_| {}, progress)?,
                analysis: None,
            },
        })
    }

    /// Verify every ledger and run the analysis over every decision, on a thread of its
    /// own; each run's handoff then says which checkpoint covers it.
    pub fn analyse(
        &self,
        config: analysis::Config,
        progress: impl FnMut(u64),
    ) -> Result<(Verified, analysis::Report), AuditError> {
        let mut analysis = Analysis::in_background(config);
        let verified = self.verify(|e| analysis.push(e), progress)?;
        let mut found = analysis.finish();
        match verified.single() {
            Some(report) => {
                if let Some(cp) = &report.last_checkpoint {
                    found.set_coverage(report.sealed, cp.head.clone(), cp.epoch);
                }
            }
            None => {
                let sealed: Vec<_> = verified
                    .reports
                    .iter()
                    .map(|(_, r)| {
                        let cp = r.last_checkpoint.as_ref();
                        (r.sealed, cp.map(|c| c.head.clone()), cp.map(|c| c.epoch))
                    })
                    .collect();
                found.set_coverage_merged(&sealed);
            }
        }
        Ok((verified, found))
    }

    /// Verify every ledger, handing every decrypted decision to `sink`: one ledger's in
    /// seq order, several ledgers' merged in state version order (each verified on a
    /// thread of its own while the merge reads them).
    pub fn verify(
        &self,
        mut sink: impl FnMut(Event),
        mut progress: impl FnMut(u64),
    ) -> Result<Verified, AuditError> {
        if let [one] = self.ledgers.as_slice() {
            let report = one.verify(sink, &mut progress)?;
            return Ok(Verified {
                reports: vec![(one.path.clone(), report)],
                merge: None,
            });
        }
        // Without the auditor key nothing is decrypted: each ledger is verified, nothing
        // is merged.
        let decrypting = self.ledgers.iter().all(|l| l.options.auditor.is_some());
        if !decrypting {
            let mut reports = Vec::with_capacity(self.ledgers.len());
            for ledger in &self.ledgers {
                reports.push((ledger.path.clone(), ledger.verify(|_| {}, |_| {})?));
            }
            return Ok(Verified {
                reports,
                merge: None,
            });
        }
        self.merged(&mut sink)
    }

    /// Several ledgers with the auditor key: each walked on its own thread, their
    /// decisions merged into `sink`.
    fn merged(&self, sink: &mut impl FnMut(Event)) -> Result<Verified, AuditError> {
        std::thread::scope(|scope| {
            let mut walks = Vec::with_capacity(self.ledgers.len());
            let mut streams = Vec::with_capacity(self.ledgers.len());
            for ledger in &self.ledgers {
                let (tx, rx) = std::sync::mpsc::sync_channel::<Event>(1024);
                walks.push(scope.spawn(move || {
                    ledger.verify(
                        |e| {
                            // The merge stops reading only once every stream ended.
                            let _ = tx.send(e);
                        },
                        |_| {},
                    )
                }));
                streams.push(rx.into_iter());
            }
            // Ties go by ledger id: the merged order is the same whatever order the
            // ledgers were given in.
            let ids = self.ledgers.iter().map(|l| l.options.public.ledger_id);
            let merge = merge(ids.zip(streams).collect(), sink);
            let mut reports = Vec::with_capacity(walks.len());
            for (ledger, walk) in self.ledgers.iter().zip(walks) {
                let report = walk.join().map_err(|_| AuditError::Failed {
                    path: ledger.path.clone(),
                })??;
                reports.push((ledger.path.clone(), report));
            }
            Ok(Verified {
                reports,
                merge: Some(merge),
            })
        })
    }
}

impl Ledger {
    /// A ledger read from `path` (a directory, an export, or `-`), checked by `options`.
    pub fn new(path: impl Into<PathBuf>, options: Options) -> Ledger {
        Ledger {
            path: path.into(),
            options,
        }
    }

    /// Verify this ledger, handing every decrypted decision to `sink`.
    pub fn verify(
        &self,
        sink: impl FnMut(Event),
        progress: impl FnMut(u64),
    ) -> Result<Report, AuditError> {
        let path = &self.path;
        if path.is_dir() {
            let frames = match ledger_frames(path) {
                Ok(frames) => frames,
                // A log that is there but does not read back is evidence, not a usage
                // error: the walk reports it as a finding.
                Err(
                    e @ (tally_ledger::Error::Segment { .. }
                    | tally_ledger::Error::Corrupt { .. }
                    | tally_ledger::Error::Format(_)),
                ) => {
                    let why = format!("the log in {} does not read: {e}", path.display());
                    let frames = std::iter::once(Err(SourceError::Store(why)));
                    return Ok(verify(frames, &self.options, sink, |_| {}));
                }
                Err(source) => {
                    return Err(AuditError::Log {
                        path: path.clone(),
                        source,
                    })
                }
            };
            Ok(verify(frames, &self.options, sink, progress))
        } else if is_stdin(path) {
            let frames = export_frames(io::stdin().lock())
                .map_err(|source| AuditError::NotExport { path: None, source })?;
            Ok(verify(frames, &self.options, sink, progress))
        } else {
            let file = File::open(path).map_err(|source| AuditError::Open {
                path: path.clone(),
                source,
            })?;
            let frames = export_frames(file).map_err(|source| AuditError::NotExport {
                path: Some(path.clone()),
                source,
            })?;
            Ok(verify(frames, &self.options, sink, progress))
        }
    }
}

#[cfg(test)]
mod tests;

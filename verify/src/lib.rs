//! tally's offline verifier.
//!
//! [`verify`] walks a ledger's frames (from an export file or a copy of the store) in
//! one streaming pass with nothing but the ledger's public key: it proves the chain
//! intact, checks every epoch certificate and checkpoint, matches anchors, and tells a
//! torn tail from a clean cut from an unsealed one. With the auditor key it decrypts each
//! decision and checks it against docs/FORMAT.md, handing each to the [`analysis`]
//! (loops, consistency audit, handoffs). [`Audit`] runs the whole audit `tally verify`
//! runs, of one ledger or of several read as one, and gives its report
//! ([`AuditReport::to_text`], [`AuditReport::to_json`]). It depends on `tally-ledger` for
//! the format and keys only, and opens nothing for writing.
#![forbid(unsafe_code)]

pub mod analysis;
pub mod audit;
pub mod backtest;
pub mod calibration;
pub mod consistency;
pub mod event;
pub mod finding;
mod hash;
pub mod merge;
pub mod replay;
pub mod report;
pub mod text;
pub mod tree;
pub mod walk;

pub use audit::{Audit, AuditError, AuditReport};
pub use event::{Event, Seq};
pub use finding::{Finding, FindingKind, Hashes};
pub use report::{AnchorStatus, Report, Tail, TornWrite, Verdict};
pub use walk::{verify, Options, SourceError};

//! tally's decision records: what the gate decides and the ledger stores (one JSON
//! object per decision), the typed reason codes and the one action each carries,
//! canonical JSON and the argument digest.
//!
//! No cryptography, no I/O: the ledger (bytes, keys, store), the policy core and the
//! verifier all read these types, and none of them defines its own.
#![forbid(unsafe_code)]

pub mod args;
mod canonical;
pub mod decision;
pub mod error;
mod strict;
pub mod words;

pub use args::Args;
pub use decision::{Action, Decision, Effect, Kind, Reason, Status};
pub use error::{ArgsError, DecisionError};

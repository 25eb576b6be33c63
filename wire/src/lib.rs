//! tally's wire, typed: every request, answer and error the daemon's sockets carry (the
//! agent socket's gate calls, the operator socket's, the error replies), as the types
//! the daemon serves and every client in Rust reads (`tally-api`'s [`GateClient`], the
//! hook, `tally mcp`, the CLI, `tally top`, tally-load).
//!
//! It depends on `tally-record` alone: a client links no gate, no ledger, no database.
//! The JSON each type reads and writes is the wire's, byte for byte (docs/DAEMON.md,
//! docs/GATE.md; the OpenAPI document and the JSON schemas are tested against them).
//!
//! [`GateClient`]: https://docs.rs/tally-api
#![forbid(unsafe_code)]

mod daemon;
mod error;
mod gate;

pub use daemon::Health;
pub use error::{ErrorDetail, ErrorReply};
pub use gate::{
    Approval, CheckAnswer, CheckRequest, Logged, OutcomeRequest, SettleRequest, Standing,
    StartRequest, Started, StopRequest,
};
pub use tally_record::{Action, Dimension, Hash, Reason, Receipt, Status, Verdict};

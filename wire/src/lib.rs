//! tally's wire, typed: every request, answer and error the daemon's sockets carry (the
//! agent socket's gate calls, the operator socket's, the error replies) and the codes of
//! the model proxy's refusals, as the types
//! the daemon serves and every client in Rust reads (`tally-api`'s [`GateClient`], the
//! hook, `tally mcp`, the CLI, `tally top`, tally-load).
//!
//! It depends on `tally-record` alone: a client links no gate, no ledger, no database.
//! The JSON each type reads and writes is the wire's, byte for byte (docs/DAEMON.md,
//! docs/GATE.md; the OpenAPI document and the JSON schemas are tested against them).
//!
//! [`GateClient`]: https://docs.rs/tally-api
#![forbid(unsafe_code)]

mod approval;
mod daemon;
mod error;
mod gate;
mod keys;
mod live;
mod notify;
mod proxy;

pub use approval::{ApprovalRequest, RequestState};
pub use daemon::Health;
pub use error::{ErrorCode, ErrorDetail, ErrorReply};
pub use gate::{
    Approval, CheckAnswer, CheckRequest, CheckUnavailable, Denial, LastRefusal, ListedRun, Logged,
    OutcomeRequest, RunState, SettleRequest, Standing, StartRequest, Started, StopRequest,
};
pub use keys::{KeyCreate, KeyCreated, KeyDayRefused, KeyInfo, RunToken, KEY_RUN_PREFIX};
pub use live::{
    BreakerState, LiveBreaker, LivePending, LiveRefusals, LiveRun, LiveSnapshot, Spark,
};
pub use notify::{Notification, NotifyKind};
pub use proxy::RefusalCode;
pub use tally_record::{
    Action, Closeness, Dimension, Hash, Headroom, LimitKey, Reason, Receipt, Status, Verdict,
};

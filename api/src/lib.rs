//! The gate's API for Rust: its request and answer types (re-exported from
//! `tally-wire`, the one crate that defines the daemon's wire), and the one typed client,
//! [`GateClient`], over a daemon's Unix socket.
//!
//! ```no_run
//! # async fn demo() -> Result<(), tally_api::GateError> {
//! use tally_api::{CheckRequest, GateClient, StartRequest};
//! let mut gate = GateClient::new("/run/tally/agent.sock");
//! let check: CheckRequest = serde_json::from_value(serde_json::json!({
//!     "run": "r1", "tool": "http", "operation": "export.create", "effect": "read"
//! })).expect("a check");
//! let start: StartRequest = serde_json::from_value(serde_json::json!({"run": "r1"}))
//!     .expect("a start");
//! let checked = gate.check_or_start(&check, &start).await?;
//! println!("{:?}, run started now: {}", checked.answer.decision, checked.started);
//! # Ok(()) }
//! ```
//!
//! This crate links no HTTP server, no gate, no ledger and no database: a client (the
//! hook, `tally mcp`) depends on it, never on `tally-daemon`.
#![forbid(unsafe_code)]

pub mod client;
mod gate;
pub mod wire;

pub use gate::{run_path, Acted, Checked, Dialer, GateClient, GateError, Retry, RunAction};
pub use tally_wire::{
    Approval, ApprovalRequest, CheckAnswer, CheckRequest, Denial, Dimension, ErrorCode, LimitKey,
    ListedRun, Logged, OutcomeRequest, Reason, RequestState, RunState, SettleRequest, Standing,
    StartRequest, Started, Verdict,
};

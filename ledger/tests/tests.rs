//! tally-ledger integration tests (one binary; modules by topic).

mod crash;
mod decisions;
mod pipeline;
mod review;
mod segments;
mod state;
mod store;
mod tail;
mod tlog;
mod vectors;

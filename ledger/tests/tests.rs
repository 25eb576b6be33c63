//! tally-ledger integration tests (one binary; modules by topic).

mod crash;
mod decisions;
mod pipeline_review;
mod store;
mod vectors;

//! tally-ledger integration tests (one binary; modules by topic).

mod crash;
mod decisions;
mod store;
mod vectors;

//! tally-ledger integration tests (one binary; modules by topic).

mod decisions;
mod store;
mod vectors;

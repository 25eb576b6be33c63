//! tally-ledger integration tests (one binary; modules by topic).

mod clock;
mod crash;
mod decisions;
mod deferred;
mod disk;
mod order;
mod own;
mod pipeline;
mod reindex;
mod review;
mod segments;
mod state;
mod store;
mod tail;
mod tlog;
mod vectors;

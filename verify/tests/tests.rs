//! Integration tests of tally-verify: one binary, one module per area.

mod analysis;
mod backtest;
mod layers;
mod leases;
mod merge;

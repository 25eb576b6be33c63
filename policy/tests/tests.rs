//! tally-policy's integration tests: the differential corpus (`corpus/`, docs/GATE.md, how a budget is counted as
//! data) replayed through `apply`, and focused tests of `decide` (docs/GATE.md's policies).

mod approvals;
mod bounds;
mod bugs;
mod corpus;
mod decide;
mod gates;
mod layers;
mod model;
mod review;
mod support;
mod upstreams;

//! tally-policy's integration tests: the differential corpus (`corpus/`, SPEC 3.1 as
//! data) replayed through `apply`, and focused tests of `decide` (SPEC 8's policies).

mod approvals;
mod bounds;
mod bugs;
mod corpus;
mod decide;
mod gates;
mod model;
mod review;
mod support;

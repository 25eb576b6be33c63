//! The daemon's request-body parsers (`POST /v1/decisions` in both framings, and the
//! gate routes' start, check and outcome bodies): never panic; a refusal carries a code
//! docs/DAEMON.md lists, on a line the body has; what is accepted reads back equal from
//! its own JSON. The invariants are `tally_daemon::fuzzing::{decisions, gate_bodies}`.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    tally_daemon::fuzzing::decisions(data);
    tally_daemon::fuzzing::gate_bodies(data);
});

//! Hostile names cannot bloat a run's state: the gate writes the whole state with every
//! decision, so its size is bounded by design, not by what agents choose to send.

use serde_json::json;
use tally_record::decision::MAX_TEXT_BYTES;
use tally_record::Effect;

use crate::support::{op_call, Sim};

const POLICY: &str = "[breaker]\nfailures = 1000000\n[ceiling]\nattempts = 100000\nside_effects = 100000\n[rate]\nrun_per_sec = 0\ntool_per_sec = 0\ntool_in_flight = 0\n[loops]\ntool_calls = 100000\n";

#[test]
fn a_thousand_calls_with_maximal_names_leave_a_small_state() {
    let mut sim = Sim::with_run(POLICY, json!({"attempts": 100000}));
    let long = "x".repeat(MAX_TEXT_BYTES - 16);
    for i in 0..1000u64 {
        // Distinct 1 KiB operations and remote refs, failing (so retry counts stay),
        // each a remote operation the run then knows of.
        let op = format!("{long}{i:08}");
        let call = op_call("api", &op, Effect::Read, json!({"i": i}));
        let attempt = sim.allow(&call, i * 10);
        let found = sim.outcome(
            "r1",
            attempt,
            "error",
            i * 10 + 1,
            json!({"remote_ref": format!("{long}{i:08}"), "observed": format!("{long}{i:08}")}),
        );
        assert_eq!(found, vec![]);
    }
    let size = serde_json::to_vec(sim.run("r1")).expect("json").len();
    // 256 retry counts and 256 remote operations as 64-bit keys, 20 recent calls, the
    // last observed state: far from the megabytes the names would take.
    assert!(size < 64 * 1024, "state of {size} bytes");
}

#[test]
fn a_run_that_never_reports_outcomes_is_held_at_its_in_flight_bound() {
    let mut sim = Sim::with_run(POLICY, json!({"attempts": 100000}));
    let bound = tally_policy::state::MAX_IN_FLIGHT_PER_RUN as u64;
    for i in 0..bound {
        let call = op_call("api", &format!("op{i}"), Effect::Read, json!({"i": i}));
        sim.allow(&call, i);
    }
    let call = op_call("api", "one-more", Effect::Read, json!({}));
    let refused = sim.refused(&call, bound, tally_record::Reason::RateLimitExceeded);
    assert!(refused.record.retry_after_ms.is_some());
    sim.outcome("r1", 1, "ok", bound + 1, json!({}));
    sim.allow(&call, bound + 2);
}

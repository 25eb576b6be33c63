//! The recorded runs `tally demo` imports on the operator socket: runs from before the
//! gate, each telling one story the verifier must get right (a loop, an inconsistency, a
//! handoff). They are data, `corpus/stories/*.ndjson`, one decision per line; the
//! verifier's tests read the same files.

use tally_ledger::Decision;

use crate::error::{Context, Result};

/// Every story, in the order the demo imports them.
const STORIES: &[(&str, &str)] = &[
    (
        "retry_storm",
        include_str!("../../corpus/stories/retry_storm.ndjson"),
    ),
    (
        "legit_polling",
        include_str!("../../corpus/stories/legit_polling.ndjson"),
    ),
    (
        "polling_past_allowance",
        include_str!("../../corpus/stories/polling_past_allowance.ndjson"),
    ),
    (
        "lost_post",
        include_str!("../../corpus/stories/lost_post.ndjson"),
    ),
    (
        "retry_after",
        include_str!("../../corpus/stories/retry_after.ndjson"),
    ),
    (
        "approval_deadline",
        include_str!("../../corpus/stories/approval_deadline.ndjson"),
    ),
    (
        "spend_overrun",
        include_str!("../../corpus/stories/spend_overrun.ndjson"),
    ),
    (
        "chain_depth",
        include_str!("../../corpus/stories/chain_depth.ndjson"),
    ),
    (
        "override_forged",
        include_str!("../../corpus/stories/override_forged.ndjson"),
    ),
    (
        "refund_refused",
        include_str!("../../corpus/stories/refund_refused.ndjson"),
    ),
    (
        "eight_workers",
        include_str!("../../corpus/stories/eight_workers.ndjson"),
    ),
    (
        "fleet_storm",
        include_str!("../../corpus/stories/fleet_storm.ndjson"),
    ),
    (
        "normal_run",
        include_str!("../../corpus/stories/normal_run.ndjson"),
    ),
];

/// Every story: its name and its decisions in append order.
pub fn stories() -> Result<Vec<(&'static str, Vec<Decision>)>> {
    STORIES
        .iter()
        .map(|(name, text)| {
            let decisions = text
                .lines()
                .enumerate()
                .map(|(i, line)| {
                    Decision::from_json(line)
                        .with_context(|| format!("corpus/stories/{name}.ndjson line {}", i + 1))
                })
                .collect::<Result<Vec<_>>>()?;
            Ok((*name, decisions))
        })
        .collect()
}

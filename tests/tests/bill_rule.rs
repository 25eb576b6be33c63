//! The docs say one thing about what a call settles, as the architecture test holds the
//! docs to the crate graph: every page that speaks of settling states the rule in the
//! same words, and none keeps the old rule (a settlement capped at its reservation),
//! which once stood in one page while another said the opposite.

use std::path::Path;

/// The rule, word for word (docs/GATE.md, docs/PROXY.md, docs/FORMAT.md,
/// docs/VERIFY.md).
const RULE: &str = "The upstream's bill is the truth: a call settles what its upstream reported, whatever the reservation was; usage above the reservation is an overrun, recorded on the outcome (`overrun_nanos`), listed by `tally verify`, charged to the run and its principal, and the run spends nothing more until a human grants it. An overrun is never capped away.";

/// Words of the old rule, which no page may keep.
const RETIRED: &[&str] = &[
    "at most its reservation",
    "at most the reservation",
    "not believed, and the call settles at the reservation",
    "never settle past it, whatever the upstream reports",
];

fn page(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../docs")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
    // Lines wrap anywhere: compare with white space folded.
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[test]
fn every_page_states_the_bill_rule_in_its_words_and_none_the_old_one() {
    for name in ["GATE.md", "PROXY.md", "FORMAT.md", "VERIFY.md"] {
        let text = page(name);
        assert!(
            text.contains(RULE),
            "docs/{name} does not state the rule in its words: {RULE}"
        );
    }
    for name in [
        "GATE.md",
        "PROXY.md",
        "FORMAT.md",
        "VERIFY.md",
        "REPORTS.md",
        "OPERATOR.md",
        // Its measurements name the rule of their day as history, in other words.
        "PERFORMANCE.md",
    ] {
        let text = page(name);
        for old in RETIRED {
            assert!(
                !text.contains(old),
                "docs/{name} keeps the old rule: `{old}`"
            );
        }
    }
}

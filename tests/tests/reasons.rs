//! Where the reason codes are listed, and that every list is the record crate's.
//!
//! A reason code is defined once, in `record/src/decision/codes.rs` (`Reason`, its
//! action and its meaning), decided in `tally-policy`, and listed for readers and other
//! languages in exactly these places, each checked here against `Reason::ALL`:
//!
//! * docs/GATE.md, "Reason codes": one table row per code, with its action;
//! * docs/openapi.yaml, `components.schemas.Reason`: the enum, in the same order;
//! * clients/node/src/index.d.ts, `type Reason`: the union.
//!
//! CONTRIBUTING.md, "Adding a reason code", lists the same places: a new code that is
//! missing from one of them fails here with the place named.

use std::collections::BTreeSet;
use std::path::Path;

use tally_ledger::Reason;

fn read(path: &str) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    std::fs::read_to_string(root.join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Every code, in the record crate's order.
fn codes() -> Vec<String> {
    Reason::ALL.iter().map(|r| r.as_str().to_owned()).collect()
}

/// GATE.md's reason table: `(code, action)` per row, in the table's order.
fn gate_md_table() -> Vec<(String, String)> {
    let text = read("docs/GATE.md");
    let start = text
        .find("| code | action | refused when |")
        .expect("docs/GATE.md: no `| code | action | refused when |` table");
    text[start..]
        .lines()
        .skip(2)
        .take_while(|l| l.starts_with("| `"))
        .map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            (cells[1].trim_matches('`').to_owned(), cells[2].to_owned())
        })
        .collect()
}

#[test]
fn docs_gate_md_has_one_row_per_reason_with_its_action() {
    let rows = gate_md_table();
    let listed: BTreeSet<&str> = rows.iter().map(|(c, _)| c.as_str()).collect();
    assert_eq!(listed.len(), rows.len(), "docs/GATE.md lists a code twice");
    let codes = codes();
    let defined: BTreeSet<&str> = codes.iter().map(String::as_str).collect();
    assert_eq!(
        listed, defined,
        "docs/GATE.md's reason table against Reason::ALL"
    );
    for (code, action) in &rows {
        let r = Reason::ALL
            .iter()
            .find(|r| r.as_str() == code)
            .expect("defined");
        assert_eq!(
            action,
            r.action().as_str(),
            "docs/GATE.md: `{code}`'s action"
        );
    }
}

#[test]
fn the_openapi_reason_enum_is_the_record_crates_in_its_order() {
    let text = read("docs/openapi.yaml");
    let start = text
        .find("\n    Reason:\n")
        .expect("docs/openapi.yaml: no components.schemas.Reason");
    let listed: Vec<String> = text[start..]
        .lines()
        .skip_while(|l| l.trim() != "enum:")
        .skip(1)
        .take_while(|l| l.trim_start().starts_with("- "))
        .map(|l| l.trim_start().trim_start_matches("- ").to_owned())
        .collect();
    assert_eq!(listed, codes(), "docs/openapi.yaml, Reason");
}

#[test]
fn the_node_clients_reason_type_has_every_code() {
    let text = read("clients/node/src/index.d.ts");
    let start = text
        .find("export type Reason =")
        .expect("clients/node/src/index.d.ts: no `type Reason`");
    let body = &text[start..text[start..].find(';').expect("end of type") + start];
    let listed: BTreeSet<String> = body
        .split('"')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect();
    let defined: BTreeSet<String> = codes().into_iter().collect();
    assert_eq!(listed, defined, "clients/node/src/index.d.ts, Reason");
}

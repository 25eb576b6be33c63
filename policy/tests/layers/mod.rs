//! The crate's modules depend on each other one way only (the order in lib.rs's doc):
//! each module names, in code, only modules below it. A cycle (apply <-> decide, as
//! there once was) fails here.

use std::path::Path;

/// Bottom first.
const LAYERS: &[&str] = &[
    "error",
    "prices",
    "fields",
    "tiers",
    "dates",
    "upstreams",
    "price_age",
    "price_import",
    "principals",
    "mcp_servers",
    "config",
    "approval",
    "state",
    "limits",
    "status",
    "inconsistency",
    "overrun",
    "refill",
    "start",
    "call",
    "rules",
    "refusals",
    "request",
    "decide",
    "judge",
    "apply",
    "headroom",
    "leased",
    "slices",
    "key_day",
];

/// The `crate::MODULE` paths a source file names outside comments.
pub fn named_modules(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(at) = rest.find("crate::") {
            rest = &rest[at + "crate::".len()..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                .collect();
            if !name.is_empty() && rest[name.len()..].starts_with("::") {
                out.push(name);
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

#[test]
fn each_module_names_only_modules_below_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files: Vec<String> = std::fs::read_dir(&src)
        .expect("src")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".rs") && n != "lib.rs")
        .collect();
    files.sort();
    let rank = |m: &str| LAYERS.iter().position(|l| *l == m);
    let mut wrong = Vec::new();
    for file in &files {
        let module = file.trim_end_matches(".rs");
        let own = rank(module).unwrap_or_else(|| panic!("{file}: not in LAYERS; place it"));
        let text = std::fs::read_to_string(src.join(file)).expect("read");
        for named in named_modules(&text) {
            match rank(&named) {
                Some(r) if r < own => {}
                _ => wrong.push(format!("{module} -> {named}")),
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "dependencies pointing up or sideways: {wrong:?}"
    );
}

#[test]
fn the_check_sees_a_named_module_and_ignores_comments() {
    let text = "use crate::call::{Call, View};\n//! [`crate::apply`]\nlet x = crate::state::standing(r, n); // crate::judge::x\n";
    assert_eq!(named_modules(text), vec!["call", "state"]);
}
